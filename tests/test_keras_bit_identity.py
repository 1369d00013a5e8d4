"""The twins named like Keras's optimizers compute Keras's bits, on every backend.

Oracle: Keras's own optimizer of the same name, with the same arguments, in
`fit` of the same model on the same data, and in eager `apply_gradients`
steps. The twin runs Keras's operations in Keras's order, with the terms of
the hyperparameters (1 − β₁, ...) in Python floats as Keras computes them
(`rounding="keras"`, the default), so every weight and every slot is
bit-identical: compiled or not, with or without FMA, the same operations give
the same bits.

Gradients are dense here (a one-hot layer, and on JAX `keras.layers.Embedding`,
whose gradient is dense there): on TensorFlow Keras's own optimizers apply a
`tf.IndexedSlices` gradient's duplicate ids one by one, which the twins
correct on purpose (DESIGN.md, "Row gradient").
"""

# Runs without TensorFlow.

import numpy as np
import pytest

keras = pytest.importorskip("keras")

from conftest import version_independent  # noqa: E402

import tf_tpu_embed_opt as teo  # noqa: E402

BACKEND = keras.backend.backend()

# The twin and Keras's optimizer run the same Keras operations in the same
# order, so whether their bits agree does not depend on TensorFlow's version
# (every leg installs the same Keras): on TensorFlow, CI runs these once
# (`version_independent`); the JAX leg runs them on JAX.
if BACKEND == "tensorflow":
    pytestmark = version_independent

# The twins named like Keras's optimizers, with arguments off and on.
KERAS_NAMED = [
    ("SGD", {}),
    ("SGD", {"momentum": 0.9}),
    ("SGD", {"momentum": 0.9, "nesterov": True}),
    ("Adagrad", {}),
    ("Adagrad", {"initial_accumulator_value": 0.5, "epsilon": 1e-3}),
    ("Adam", {}),
    ("Adam", {"amsgrad": True}),
    ("Adam", {"weight_decay": 0.01}),
    ("Adam", {"beta_1": 0.5, "beta_2": 0.8, "epsilon": 0.3}),
    ("Ftrl", {"l1_regularization_strength": 0.01}),
    (
        "Ftrl",
        {
            "learning_rate_power": -0.7,
            "l2_regularization_strength": 0.01,
            "l2_shrinkage_regularization_strength": 0.01,
            "beta": 0.1,
            "initial_accumulator_value": 0.2,
        },
    ),
    ("RMSprop", {}),
    ("RMSprop", {"momentum": 0.5, "centered": True}),
    ("RMSprop", {"rho": 0.5, "momentum": 0.3}),
    ("Adadelta", {}),
    ("Adadelta", {"rho": 0.5, "epsilon": 1e-3}),
]


def _rate(name):
    return 0.5 if name in ("Adagrad", "Adadelta", "Ftrl") else 0.05


def _model(embedding):
    keras.backend.clear_session()  # the same layer names, hence slot names
    keras.utils.set_random_seed(0)
    if embedding:
        lookup = [keras.layers.Embedding(20, 4), keras.layers.Flatten()]
    else:
        lookup = [
            keras.layers.Lambda(
                lambda ids: keras.ops.one_hot(keras.ops.cast(ids, "int32"), 20)
            ),
            keras.layers.Flatten(),
            keras.layers.Dense(4),
        ]
    return keras.Sequential(
        [keras.Input((3,), dtype="int32"), *lookup, keras.layers.Dense(1)]
    )


def _trained(optimizer, embedding=False):
    """`_model(embedding)` trained with `optimizer`, and its losses."""
    model = _model(embedding)
    model.compile(optimizer=optimizer, loss="mse")
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 20, size=(64, 3)).astype("int32")
    labels = rng.normal(size=(64, 1)).astype("float32")
    history = model.fit(ids, labels, batch_size=16, epochs=2, verbose=0)
    return model, history.history["loss"]


def _fit(optimizer, embedding):
    model, losses = _trained(optimizer, embedding)
    weights = [keras.ops.convert_to_numpy(w) for w in model.weights]
    return weights, _variables(optimizer), losses


def _variables(optimizer):
    """The optimizer's variables, `(name, value)` in its order: Keras saves
    them by position (`.weights.h5`), so a twin keeps Keras's order."""
    return [(v.name, keras.ops.convert_to_numpy(v)) for v in optimizer.variables]


def _assert_same(ours, theirs):
    assert len(ours) == len(theirs)
    for got, want in zip(ours, theirs):
        if isinstance(got, tuple):
            assert got[0] == want[0]  # the same variable at the same place
            got, want = got[1], want[1]
        np.testing.assert_array_equal(got, want)


EMBEDDING = [False, True] if BACKEND == "jax" else [False]


@pytest.mark.parametrize(
    "embedding", EMBEDDING, ids=lambda e: "embedding" if e else "dense"
)
@pytest.mark.parametrize("name, arguments", KERAS_NAMED)
def test_fit_is_bit_identical_to_keras(name, arguments, embedding):
    ours = _fit(getattr(teo.optimizers, name)(_rate(name), **arguments), embedding)
    theirs = _fit(getattr(keras.optimizers, name)(_rate(name), **arguments), embedding)
    _assert_same(ours[0], theirs[0])  # weights
    _assert_same(ours[1], theirs[1])  # iterations, learning rate, slots
    assert ours[2] == theirs[2]  # losses
    assert ours[2][-1] != ours[2][0]  # the optimizer stepped


@pytest.mark.parametrize("name, arguments", KERAS_NAMED)
def test_eager_steps_are_bit_identical_to_keras(name, arguments):
    rng = np.random.default_rng(1)
    initial = rng.normal(size=(5, 3)).astype("float32")
    grads = [rng.normal(size=(5, 3)).astype("float32") for _ in range(4)]

    def run(optimizer):
        variable = keras.Variable(initial, name="table")
        for grad in grads:
            optimizer.apply_gradients([(keras.ops.convert_to_tensor(grad), variable)])
        return keras.ops.convert_to_numpy(variable), _variables(optimizer)

    ours = run(getattr(teo.optimizers, name)(_rate(name), **arguments))
    theirs = run(getattr(keras.optimizers, name)(_rate(name), **arguments))
    np.testing.assert_array_equal(ours[0], theirs[0])
    _assert_same(ours[1], theirs[1])


@pytest.mark.parametrize("name, arguments", KERAS_NAMED)
def test_what_keras_saves_loads_into_the_twin_and_back(name, arguments, tmp_path):
    # A model trained with Keras's class resumes with the twin (to train its
    # tables right), or goes back: `load_weights` assigns the optimizer's
    # variables by position, and each must land on the variable of its own
    # name. (Adam's, Ftrl's and Adadelta's twins built theirs in another
    # order: refused here, swapped without a word where variables share a
    # shape, Adam's moments then stepping to NaN.)
    for source, target in (
        (keras.optimizers, teo.optimizers),
        (teo.optimizers, keras.optimizers),
    ):
        trained, _ = _trained(getattr(source, name)(_rate(name), **arguments))
        path = str(tmp_path / f"{source.__name__}.weights.h5")
        trained.save_weights(path)
        optimizer = getattr(target, name)(_rate(name), **arguments)
        model = _model(False)
        model.compile(optimizer=optimizer, loss="mse")
        optimizer.build(model.trainable_variables)
        model.load_weights(path)
        _assert_same(_variables(optimizer), _variables(trained.optimizer))


def test_rounding_shows_in_the_repr_and_the_config():
    twin = teo.optimizers.Adam(0.1, rounding="jax-tpu-embedding")
    assert repr(twin) == "Adam(learning_rate=0.1, rounding='jax-tpu-embedding')"
    assert twin.get_config()["rounding"] == "jax-tpu-embedding"
    assert teo.optimizers.Adam.from_config(twin.get_config())._options == twin._options


def test_rounding_is_checked():
    with pytest.raises(
        ValueError, match=r"`rounding`.*'keras' or 'jax-tpu-embedding'.*'tpu'"
    ):
        teo.optimizers.Adam(rounding="tpu")


def test_a_saved_bias_correction_schedule_steps_as_keras_adam():
    """What a twin following Keras Adam's steps is saved as (`KerasStepSchedule`
    of Adam's bias correction, with `bias_correction=False` on the twin) steps
    as Keras's Adam itself, to the bit."""
    from tf_tpu_embed_opt.conversions.learning_rates import KerasStepSchedule

    rng = np.random.default_rng(0)
    start = rng.normal(size=(6, 3)).astype("float32")
    gradients = [rng.normal(size=(6, 3)).astype("float32") for _ in range(5)]

    def stepped(optimizer):
        variable = keras.Variable(start)
        for gradient in gradients:
            optimizer.apply([keras.ops.convert_to_tensor(gradient)], [variable])
        return keras.ops.convert_to_numpy(variable)

    arguments = {"beta_1": 0.8, "beta_2": 0.99, "bias_correction": True}
    schedule = KerasStepSchedule(0.01, "Adam", arguments)
    np.testing.assert_array_equal(
        stepped(
            teo.optimizers.Adam(
                schedule, bias_correction=False, beta_1=0.8, beta_2=0.99
            )
        ),
        stepped(keras.optimizers.Adam(0.01, beta_1=0.8, beta_2=0.99)),
    )
    restored = KerasStepSchedule.from_config(schedule.get_config())
    assert restored.get_config() == schedule.get_config()
    with pytest.raises(
        ValueError, match=r"argument `algorithm` .*\['Adam'\].*'Adagrad'"
    ):
        KerasStepSchedule(0.01, "Adagrad")


def test_a_learning_rate_following_keras_adam_shows_and_saves_its_factor():
    """The learning rate following Keras Adam's steps (what `to_embedding`
    gives a TensorFlow engine) names its factor, and is saved as a
    `KerasStepSchedule` naming it too; one whose factor is no algorithm's
    cannot be saved, and says which factor."""
    from tf_tpu_embed_opt.conversions.learning_rates import (
        KerasStepLearningRate,
        KerasStepSchedule,
    )
    from tf_tpu_embed_opt.definitions import registry

    dense = keras.optimizers.Adam(0.01, name="dense")
    factor = registry.BY_NAME["Adam"].keras.learning_rate_factor
    rate = KerasStepLearningRate(dense, 0.01, factor, {"bias_correction": True})
    assert repr(rate) == (
        "KerasStepLearningRate(0.01, times bias_correction, iterations of 'dense')"
    )
    saved = KerasStepSchedule.from_config(rate.get_config())
    assert repr(saved) == "KerasStepSchedule(0.01, times bias_correction)"
    assert repr(KerasStepSchedule(0.01)) == "KerasStepSchedule(0.01)"

    def doubled(xp, step, arguments, value):
        return 2 * value

    foreign = KerasStepLearningRate(dense, 0.01, doubled)
    assert float(foreign()) == pytest.approx(0.02)
    with pytest.raises(
        TypeError, match=r"Cannot serialize .*its factor doubled is no algorithm's"
    ):
        foreign.get_config()


# A child's steps of each optimizer of argv[1] (JSON: `(name, learning rate,
# arguments)`) on a float64 variable, JAX's x64 on: the names of those whose
# twin's bits differ from Keras's (weights or slots).
_FLOAT64_CHILD = r"""
import json
import sys

import jax

jax.config.update("jax_enable_x64", True)
import keras
import numpy as np

import tf_tpu_embed_opt as teo

rng = np.random.default_rng(1)
initial = rng.normal(size=(5, 3))
grads = [rng.normal(size=(5, 3)) for _ in range(4)]


def run(optimizer):
    variable = keras.Variable(initial, dtype="float64")
    for grad in grads:
        optimizer.apply([keras.ops.convert_to_tensor(grad, "float64")], [variable])
    values = [variable, *optimizer.variables]
    return [keras.ops.convert_to_numpy(v) for v in values], variable.dtype


differ = []
for name, rate, arguments in json.loads(sys.argv[1]):
    ours, dtype = run(getattr(teo.optimizers, name)(rate, **arguments))
    theirs, _ = run(getattr(keras.optimizers, name)(rate, **arguments))
    same = all(np.array_equal(a, b) for a, b in zip(ours, theirs))
    if dtype != "float64" or len(ours) != len(theirs) or not same:
        differ.append(f"{name} {arguments}")
print(json.dumps(differ))
"""


@pytest.mark.skipif(BACKEND != "jax", reason="jax_enable_x64 is JAX's")
def test_float64_steps_on_jax_with_x64_are_bit_identical_to_keras():
    """In float64 (JAX's x64, in a child: it is process-wide) the twins step
    as Keras's own optimizers do on JAX, bit for bit. (On TensorFlow Keras's
    Adam, Adagrad and Ftrl round some hyperparameters through float32 in
    float64, and differ from themselves on JAX: docs/differences.md.)"""
    import json
    import subprocess
    import sys

    from child_env import child_env

    optimizers = [(name, _rate(name), arguments) for name, arguments in KERAS_NAMED]
    done = subprocess.run(
        [sys.executable, "-c", _FLOAT64_CHILD, json.dumps(optimizers)],
        env=child_env(KERAS_BACKEND="jax"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
