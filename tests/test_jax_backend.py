"""The Keras face on Keras's JAX backend, with or without TensorFlow installed.

Runs where Keras runs on JAX (CI's JAX leg: `KERAS_BACKEND=jax`, the `[jax]`
extra, no TensorFlow); elsewhere the module is skipped. Oracles:

* Keras's own optimizers for the twins named like them: bit for bit, in
  `test_keras_bit_identity.py` (on every backend).
* The golden numbers of `docs/tpu_semantics.md` §6 (`golden.py`) for the
  twins set to the engine's math (the arguments `to_keras` gives them), with
  row-sparse `BCOO` gradients, so the lazy rule is exercised.
* For the engine-only twins, NumPy runs of the definitions' rules, which the
  TensorFlow leg pins against TensorFlow's training kernels
  (`test_update_rules.py`).
* For ClippyAdagrad, a NumPy transcription of TF Recommenders' algorithm (the
  TensorFlow leg compares the class with TF Recommenders itself).
"""

# Runs without TensorFlow.

import pathlib
import re
import subprocess
import sys
import warnings

import numpy as np
import pytest

keras = pytest.importorskip("keras")
if keras.backend.backend() != "jax":
    pytest.skip(
        "Keras runs on another backend here (set KERAS_BACKEND=jax)",
        allow_module_level=True,
    )
jax_sparse = pytest.importorskip("jax.experimental.sparse")

from child_env import child_env  # noqa: E402
from conftest import GRADIENT_OPTIONS, benchmark_harness  # noqa: E402
from golden import (  # noqa: E402
    GOLDEN,
    GOLDEN_LR,
    USER_GRADS,
    USER_ROWS,
    VIDEO_GRADS,
    VIDEO_ROWS,
)

import tf_tpu_embed_opt as teo  # noqa: E402
from tf_tpu_embed_opt.definitions import registry, rules  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _data(seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 20, size=(64, 3)).astype("int32")
    labels = rng.normal(size=(64, 1)).astype("float32")
    return ids, labels


def _fit(optimizer, epochs=3):
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((3,), dtype="int32"),
            keras.layers.Embedding(20, 4),
            keras.layers.Flatten(),
            keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer=optimizer, loss="mse")
    ids, labels = _data()
    history = model.fit(ids, labels, batch_size=16, epochs=epochs, verbose=0)
    return [w.numpy() for w in model.weights], history.history["loss"]


# The arguments `to_keras` gives each golden case's twin (the engine's math).
ENGINE_TWINS = {
    "sgd": ("SGD", {"lazy": True}),
    "adagrad": ("Adagrad", {"epsilon": 0.0}),
    "adagrad_momentum": (
        "AdagradMomentum",
        {
            "momentum": 0.9,
            "use_nesterov": True,
            "exponent": 3.0,
            "beta2": 0.9,
            "epsilon": 0.1,
        },
    ),
    "adam": ("Adam", {"sum_inside_sqrt": True, "bias_correction": False, "lazy": True}),
    "ftrl": ("Ftrl", {"lazy": True}),
}


def _bcoo(rows, grads, shape):
    indices = np.asarray(rows, dtype="int32").reshape(-1, 1)
    return jax_sparse.BCOO((np.asarray(grads, "float32"), indices), shape=shape)


@pytest.mark.parametrize("case", sorted(GOLDEN))
def test_engine_twins_give_the_golden_numbers_with_sparse_gradients(case):
    spec = GOLDEN[case]
    name, arguments = ENGINE_TWINS[case]
    video = keras.Variable(np.arange(32, dtype="float32").reshape(8, 4))
    user = keras.Variable(np.arange(32, dtype="float32").reshape(16, 2))
    optimizer = getattr(teo.optimizers, name)(GOLDEN_LR, **arguments)
    with warnings.catch_warnings():
        # Twins with lazy=True warn about dense gradients; these are sparse.
        warnings.simplefilter("ignore", UserWarning)
        optimizer.apply(
            [
                _bcoo(VIDEO_ROWS, VIDEO_GRADS, (8, 4)),
                _bcoo(USER_ROWS, USER_GRADS, (16, 2)),
            ],
            [video, user],
        )
    video, user = video.numpy(), user.numpy()
    atol = 2e-5  # six printed decimals, float32 arithmetic
    np.testing.assert_allclose(video[0], spec["video0"], rtol=0, atol=atol)
    np.testing.assert_allclose(video[1], spec["video1"], rtol=0, atol=atol)
    np.testing.assert_allclose(user[0], spec["user0"], rtol=0, atol=atol)
    np.testing.assert_allclose(user[3], spec["user3"], rtol=0, atol=atol)
    # The rows that were not looked up keep their values.
    np.testing.assert_array_equal(video[2:], np.arange(8, 32).reshape(6, 4))
    np.testing.assert_array_equal(user[4:], np.arange(8, 32).reshape(12, 2))


# Engine-only twins (the engine's defaults for their hyperparameters).
ENGINE_ONLY = [
    ("Momentum", "Momentum", {"momentum": 0.9}),
    ("AdagradMomentum", "AdagradMomentum", {"momentum": 0.5}),
    ("ProximalAdagrad", "ProximalAdagrad", {"l1_regularization_strength": 0.01}),
    ("ProximalYogi", "ProximalYogi", {}),
    ("RMSprop", "CenteredRMSProp", {"centered": True, "momentum": 0.3}),
]


def _numpy_steps(definition, optimizer, weights, gradients, rates):
    """The definition's rule in float64 NumPy with the twin's own hypers."""
    hypers = optimizer._hypers
    w = weights.astype(np.float64)
    slots = {s.name: np.full_like(w, s.initial_value(hypers)) for s in definition.slots}
    for gradient, rate in zip(gradients, rates):
        w, slots = rules.tpu_step(
            definition, rules.NUMPY, w, slots, gradient, rate, hypers
        )
    return w


@pytest.mark.parametrize("name, definition_name, arguments", ENGINE_ONLY)
def test_engine_only_twins_follow_the_rule_on_dense_gradients(
    name, definition_name, arguments
):
    rng = np.random.default_rng(1)
    weights = rng.normal(size=(6, 3))
    gradients = [rng.normal(size=(6, 3)) for _ in range(3)]
    variable = keras.Variable(weights.astype("float32"))
    optimizer = getattr(teo.optimizers, name)(0.05, **arguments)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for gradient in gradients:
            optimizer.apply([gradient.astype("float32")], [variable])
    want = _numpy_steps(
        registry.BY_NAME[definition_name], optimizer, weights, gradients, [0.05] * 3
    )
    np.testing.assert_allclose(variable.numpy(), want, rtol=2e-5, atol=2e-6)


def test_a_lazy_twin_steps_only_the_rows_of_a_sparse_gradient():
    rows = [1, 3, 1]  # row 1 twice: summed
    grads = np.array([[1.0, 2.0], [3.0, 4.0], [0.5, 0.5]], "float32")
    sparse = _bcoo(rows, grads, (5, 2))
    lazy = keras.Variable(np.ones((5, 2), "float32"))
    dense = keras.Variable(np.ones((5, 2), "float32"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        lazy_opt = teo.optimizers.Momentum(0.1, momentum=0.9, lazy=True)
        dense_opt = teo.optimizers.Momentum(0.1, momentum=0.9, lazy=True)
        for step in range(2):
            lazy_opt.apply([sparse], [lazy])
            # The second step's dense gradient is zero on rows 1 and 3 too:
            # momentum moves every row it holds.
            dense_opt.apply(
                [sparse.todense() if step == 0 else np.zeros((5, 2))], [dense]
            )
    lazy, dense = lazy.numpy(), dense.numpy()
    np.testing.assert_array_equal(lazy[[0, 2, 4]], 1.0)
    # Row 1's summed gradient (1.5, 2.5), two steps: v = g, then 0.9 g + g.
    np.testing.assert_allclose(
        lazy[1], 1 - 0.1 * (1 + 1.9) * np.array([1.5, 2.5]), rtol=1e-6
    )
    # Dense: the second step (zero gradient) still moves row 1 by momentum.
    np.testing.assert_allclose(
        dense[1], 1 - 0.1 * (1 + 0.9) * np.array([1.5, 2.5]), rtol=1e-6
    )


@pytest.mark.parametrize("options", GRADIENT_OPTIONS)
def test_keras_clipping_and_unscaling_of_a_sparse_gradient_equal_dense(options):
    """As `tf.IndexedSlices` on TensorFlow (test_optimizers.py): Keras would
    clip a `BCOO`'s entries one duplicate at a time (row 2 has three); the
    twin clips the summed rows, as the dense gradient is clipped. Within a
    few ulps: the two sum row 2's entries in orders of their own."""
    values = np.linspace(-1, 1, 10, dtype="float32").reshape(5, 2)
    sparse = _bcoo([2, 0, 2, 2, 5], values, (6, 2))
    tables = [keras.Variable(np.ones((6, 2), "float32")) for _ in range(2)]
    for gradient, table in zip([sparse, sparse.todense()], tables):
        teo.optimizers.Adagrad(0.5, epsilon=0.0, **options).apply([gradient], [table])
    np.testing.assert_allclose(tables[0].numpy(), tables[1].numpy(), rtol=1e-6)


@pytest.mark.parametrize("n_batch", [0, 1], ids=["element-sparse", "batched"])
def test_a_bcoo_of_another_layout_steps_the_rows_of_its_row_sparse_form(n_batch):
    """A `BCOO` whose entries are elements (`n_sparse=2`), or with a batch
    dimension, steps the rows it holds, bit for bit as the row-sparse
    `BCOO` of the same rows (lazily: Momentum moves no other row)."""
    steps = [([1, 4], [[1.0, -2.0], [0.5, 3.0]]), ([4, 0], [[2.0, 1.0], [-1.0, 0.25]])]
    tables = [keras.Variable(np.ones((6, 2), "float32")) for _ in range(2)]
    optimizers = [teo.optimizers.Momentum(0.1, momentum=0.9) for _ in range(2)]
    for rows, values in steps:
        row_sparse = _bcoo(rows, values, (6, 2))
        other = jax_sparse.BCOO.fromdense(row_sparse.todense(), n_batch=n_batch)
        assert (other.n_batch, other.n_sparse) == (n_batch, 2 - n_batch)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # lazy=True
            optimizers[0].apply([other], [tables[0]])
            optimizers[1].apply([row_sparse], [tables[1]])
    got, want = tables[0].numpy(), tables[1].numpy()
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(want[[2, 3, 5]], 1.0)
    assert not np.any(want[[0, 1, 4]] == 1.0)


def test_a_lazy_twin_warns_once_that_dense_gradients_step_every_row():
    variable = keras.Variable(np.ones((4, 2), "float32"))
    with pytest.warns(
        UserWarning,
        match=(
            r"Momentum\(lazy=True\) on Keras's 'jax'.*"
            r"tf_tpu_embed_opt\.layers\.Embedding"
        ),
    ):
        optimizer = teo.optimizers.Momentum(0.1, momentum=0.9)
        optimizer.build([variable])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # Keras-named defaults (lazy=False), and Adagrad (lazy makes no
        # difference), build silently.
        teo.optimizers.Adam(0.1).build([keras.Variable(np.ones(3, "float32"))])
        teo.optimizers.Adagrad(0.1).build([keras.Variable(np.ones(3, "float32"))])
        teo.optimizers.Momentum(0.1, lazy=False).build(
            [keras.Variable(np.ones(3, "float32"))]
        )


def _clippy_numpy(weights, gradients, rate, initial=0.1, relative=0.1, eps=1e-7):
    """TF Recommenders' ClippyAdagrad, transcribed (absolute threshold 1e-7)."""
    w = weights.astype(np.float64)
    a = np.full_like(w, initial)
    for g in gradients:
        p = 1 / np.sqrt(a + eps)
        d = rate * g * p
        t = 1e-7 + relative * np.abs(w)
        moving = d != 0
        bound = np.min(t[moving] / np.abs(d[moving])) if moving.any() else 1.0
        w = w - min(1.0, bound) * d
        a = a + g * g
    return w


def test_clippy_adagrad_on_jax():
    rng = np.random.default_rng(2)
    weights = rng.normal(size=(5, 3))
    gradients = [rng.normal(size=(5, 3)) for _ in range(3)]
    variable = keras.Variable(weights.astype("float32"))
    optimizer = teo.optimizers.ClippyAdagrad(
        learning_rate=0.5, export_clipping_factors=True
    )
    for gradient in gradients:
        optimizer.apply([gradient.astype("float32")], [variable])
    want = _clippy_numpy(weights, gradients, 0.5)
    np.testing.assert_allclose(variable.numpy(), want, rtol=1e-5, atol=1e-6)
    # The step was clipped (the check is not vacuous).
    assert float(optimizer.clipping_factors[0].numpy()) < 1.0
    _, loss = _fit(teo.optimizers.ClippyAdagrad(learning_rate=0.5))
    assert loss[-1] < loss[0]


_LOAD_AFTER_A_PLAIN_IMPORT = """
import sys
import tf_tpu_embed_opt
import keras
model = keras.saving.load_model(sys.argv[1])
print(type(model.optimizer).__name__, model.optimizer.get_config()["sum_inside_sqrt"])
"""


def test_saved_model_loads_after_a_plain_import(tmp_path):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    optimizer = teo.optimizers.Adam(1e-3, sum_inside_sqrt=True)
    model.compile(optimizer=optimizer, loss="mse")
    model.fit(np.ones((4, 3)), np.ones((4, 1)), verbose=0)
    path = tmp_path / "model.keras"
    model.save(path)
    env = child_env(KERAS_BACKEND="jax")
    result = subprocess.run(
        [sys.executable, "-c", _LOAD_AFTER_A_PLAIN_IMPORT, str(path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(tmp_path),
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["Adam", "True"]


def test_what_needs_tensorflow_says_so(tmp_path):
    if teo.optimizers.backend.BACKEND != "jax":  # pragma: no cover
        pytest.skip("not on JAX")
    try:
        import tensorflow  # noqa: F401
    except ModuleNotFoundError:
        pass
    else:
        pytest.skip("TensorFlow is installed here")
    for name in (
        "embedding",
        "to_proto",
        "OptimizerSpec",
        "tpu_embedding_configuration",
    ):
        with pytest.raises(
            ImportError, match=rf"tf_tpu_embed_opt\.{name} needs TensorFlow"
        ):
            getattr(teo, name)
    # What serves the jax-tpu-embedding engine loads without it; so does
    # load_into_keras (jax-tpu-embedding's checkpoints), which says so for a
    # TensorFlow checkpoint.
    for name in (
        "to_keras",
        "to_embedding",
        "check_engine",
        "keras_optimizer",
        "load_into_keras",
    ):
        assert callable(getattr(teo, name))
    # A path that holds nothing is answered about the path, not TensorFlow;
    # a TensorFlow checkpoint (its .index file) by what it needs.
    with pytest.raises(ValueError, match="'no/such/ckpt' is not a checkpoint"):
        teo.load_into_keras("no/such/ckpt", {}, None)
    prefix = tmp_path / "ckpt-1"
    (tmp_path / "ckpt-1.index").write_bytes(b"\0")
    with pytest.raises(
        teo.TensorFlowNotInstalled, match="reading the TensorFlow checkpoint"
    ):
        teo.load_into_keras(str(prefix), {}, None)
    # The TensorFlow engines say so by the public name, not a bare
    # ModuleNotFoundError (issue #29, item 5).
    with pytest.raises(teo.TensorFlowNotInstalled) as raised:
        teo.to_embedding(keras.optimizers.Adagrad(0.1))
    assert raised.type.__module__ == "tf_tpu_embed_opt.errors"
    assert str(raised.value).startswith(
        "to_embedding(..., engine='TPUEmbedding') needs TensorFlow"
    )
    assert raised.value.name == "tensorflow"
    assert "jax-tpu-embedding" in str(raised.value)
    with pytest.raises(TypeError, match="argument `embedding_opt` must be"):
        teo.to_keras("adagrad")
    # A Keras optimizer or None is no embedding optimizer with TensorFlow or
    # without (they were told to install TensorFlow); a Keras optimizer, and
    # no other Keras object, is pointed to to_embedding, as where TensorFlow
    # is installed. Its type is named by its path (errors.type_path).
    keras_note = "(a Keras optimizer; tf_tpu_embed_opt.to_embedding converts"
    for given, type_name, noted in (
        (teo.optimizers.Adam(0.1), "tf_tpu_embed_opt.optimizers.Adam", True),
        (keras.optimizers.SGD(0.1), "keras.optimizers.SGD", True),
        (keras.layers.Dense(2), "keras.layers.Dense", False),
        (None, "NoneType", False),
    ):
        with pytest.raises(
            TypeError,
            match=rf"must be an .* received .* of type {re.escape(type_name)}\b",
        ) as refused:
            teo.to_keras(given)
        assert (keras_note in str(refused.value)) == noted
    # An object of TensorFlow's own (where a part of it is missing) needs it.
    tensorflows = type("Adagrad", (), {"__module__": "tensorflow.python.tpu.x"})
    with pytest.raises(teo.TensorFlowNotInstalled, match="to_keras of Adagrad"):
        teo.to_keras(tensorflows())
    assert (
        type(
            teo.to_embedding(keras.optimizers.Adagrad(0.1), engine="jax-tpu-embedding")
        ).__name__
        == "AdagradOptimizerSpec"
    )


@benchmark_harness
def test_dense_step_benchmark_harness_reports_every_pair(tmp_path):
    """The benchmark's harness (timings are not asserted: benchmarks/)."""
    # The benchmark comes from the checkout, appended to the child's path, the
    # package from wherever this process imports it (the wheel in CI).
    runner = (
        "import runpy, sys; "
        f"sys.path.append({str(ROOT)!r}); "
        "sys.argv[0] = 'jax_dense_step'; "
        "runpy.run_module('benchmarks.jax_dense_step', run_name='__main__')"
    )
    env = child_env(KERAS_BACKEND="jax")
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            runner,
            "--rows=256",
            "--dim=4",
            "--warmup=0",
            "--repeats=2",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(tmp_path),
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [line for line in result.stdout.splitlines() if line.startswith("| ")]
    labels = [row.split("|")[1].strip() for row in rows[1:]]
    assert labels == [
        "SGD",
        "SGD momentum",
        "Adagrad",
        "Adam",
        "Ftrl",
        "RMSprop",
        "Adadelta",
    ], result.stdout
