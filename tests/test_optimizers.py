"""The Keras face: Keras's own optimizers as oracles, sparse against dense.

Oracles: `keras.optimizers.*` (signatures by introspection, results on dense
gradients for every base option), NumPy (`np.unique` / `np.add.at`) for the
de-duplication, and the same optimizer fed the equivalent dense gradient for
the sparse path (hypothesis over random id multisets).
"""

import inspect

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import GRADIENT_OPTIONS, keras_face, requires_xla
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tf_tpu_embed_opt as teo
from tf_tpu_embed_opt import optimizers

pytestmark = keras_face

STOCK = ["SGD", "Adagrad", "Adam", "Ftrl", "RMSprop", "Adadelta"]
TWINS = [
    "SGD",
    "Adagrad",
    "AdagradMomentum",
    "Adam",
    "Ftrl",
    "Momentum",
    "RMSprop",
    "Adadelta",
    "ProximalAdagrad",
    "ProximalYogi",
]


def run(optimizer, gradients, initial):
    variable = keras.Variable(np.array(initial, dtype="float32"))
    for gradient in gradients:
        optimizer.apply([gradient], [variable])
    return variable.numpy()


def random_gradients(seed, shape=(6, 3), steps=3):
    rng = np.random.default_rng(seed)
    return [tf.constant(rng.normal(size=shape).astype("float32")) for _ in range(steps)]


# The twins of the algorithms only jax-tpu-embedding has.
JAX_ONLY = ["LaProp", "F2A"]
# The classes of the algorithms no engine runs (issue #54: RowWiseAdagrad).
KERAS_ONLY = ["ClippyAdagrad", "RowWiseAdagrad"]


def test_public_names():
    assert sorted(optimizers.__all__) == sorted(
        TWINS + JAX_ONLY + KERAS_ONLY + ["TwinOptimizer", "deduplicate"]
    )
    for name in TWINS + JAX_ONLY + KERAS_ONLY:
        cls = getattr(teo.optimizers, name)
        assert issubclass(cls, keras.optimizers.Optimizer)
        assert keras.saving.get_registered_object(f"tf_tpu_embed_opt>{name}") is cls


class _ScheduleWithoutConfig(keras.optimizers.schedules.LearningRateSchedule):
    # Keras asks a schedule for get_config only to save it; its base class
    # raises NotImplementedError there.
    def __call__(self, step):
        return 0.1


def test_a_schedule_without_config_shows_and_converts():
    # repr(twin) raised NotImplementedError, and so did to_embedding (its
    # check of the result writes the learning rate's repr).
    twin = teo.optimizers.Adagrad(_ScheduleWithoutConfig(), epsilon=0.0)
    assert repr(twin) == (
        "Adagrad(learning_rate=<_ScheduleWithoutConfig schedule>, epsilon=0.0)"
    )
    converted = teo.to_embedding(twin)
    assert repr(converted.learning_rate).startswith(
        "KerasStepLearningRate(<_ScheduleWithoutConfig schedule>"
    )
    assert float(converted.learning_rate()) == pytest.approx(0.1)


def test_the_base_class_is_refused_naming_the_classes_to_use():
    with pytest.raises(TypeError, match=r"TwinOptimizer is the base .*Adadelta, "):
        teo.optimizers.TwinOptimizer(0.1)


@pytest.mark.parametrize("name", STOCK)
def test_signature_is_keras(name):
    ours = inspect.signature(getattr(teo.optimizers, name)).parameters.values()
    theirs = inspect.signature(getattr(keras.optimizers, name)).parameters.values()
    assert [(p.name, p.kind, p.default) for p in ours] == [
        (p.name, p.kind, p.default) for p in theirs
    ]


KERAS_OPTIONS = [
    {},
    {"weight_decay": 0.05},
    {"clipnorm": 0.5},
    {"clipvalue": 0.3},
    {"global_clipnorm": 0.7},
    {"use_ema": True, "ema_momentum": 0.9},
    {"use_ema": True, "ema_overwrite_frequency": 2},
    {"gradient_accumulation_steps": 2},
    {"loss_scale_factor": 4.0},
]

STOCK_SETTINGS = [
    ("SGD", {}),
    ("SGD", {"momentum": 0.9}),
    ("SGD", {"momentum": 0.5, "nesterov": True}),
    ("Adagrad", {}),
    ("Adagrad", {"initial_accumulator_value": 0.5, "epsilon": 1e-3}),
    ("Adagrad", {"epsilon": 0.0}),
    ("Adam", {}),
    ("Adam", {"beta_1": 0.8, "beta_2": 0.95, "epsilon": 1e-3}),
    ("Adam", {"amsgrad": True}),
    ("Ftrl", {}),
    (
        "Ftrl",
        {
            "learning_rate_power": -0.7,
            "initial_accumulator_value": 0.3,
            "l1_regularization_strength": 0.01,
            "l2_regularization_strength": 0.02,
            "l2_shrinkage_regularization_strength": 0.03,
            "beta": 0.5,
        },
    ),
    ("RMSprop", {}),
    ("RMSprop", {"rho": 0.8, "momentum": 0.5, "epsilon": 1e-3}),
    ("RMSprop", {"centered": True, "momentum": 0.3}),
    ("Adadelta", {}),
    ("Adadelta", {"rho": 0.8, "epsilon": 1e-4}),
]


@pytest.mark.parametrize(
    "name,arguments", STOCK_SETTINGS, ids=[f"{n}-{a}" for n, a in STOCK_SETTINGS]
)
def test_dense_matches_keras(name, arguments):
    gradients = random_gradients(1)
    initial = np.random.default_rng(2).normal(size=(6, 3))
    ours = run(getattr(teo.optimizers, name)(0.1, **arguments), gradients, initial)
    theirs = run(getattr(keras.optimizers, name)(0.1, **arguments), gradients, initial)
    np.testing.assert_allclose(ours, theirs, rtol=2e-6, atol=2e-7)


def _steps_on_a_table(optimizer, gradients, initial, dtype, compiled):
    """`optimizer`'s steps on a table of `dtype`, eagerly or traced."""
    variable = keras.Variable(np.asarray(initial), dtype=dtype)

    def apply(gradient):
        optimizer.apply([gradient], [variable])

    apply = tf.function(apply) if compiled else apply
    for gradient in gradients:
        apply(gradient)
    return variable


def _laprop_in_float64(initial, gradients, lr, beta_1=0.9, beta_2=0.95, eps=1e-30):
    """LaProp as docs/tpu_semantics.md writes jax-tpu-embedding's, in NumPy
    float64, and the largest |√(1 − β₁²)·g/√ν| of each element's steps."""
    w = np.array(initial, np.float64)
    mu, nu = np.zeros_like(w), np.zeros_like(w)
    largest = np.zeros_like(w)
    for t, g in enumerate(gradients, start=1):
        d = beta_2 * (1 - beta_2 ** (t - 1)) / (1 - beta_2**t)
        nu = d * nu + (1 - d) * (g * g + eps)
        term = np.sqrt(1 - beta_1 * beta_1) * g / np.sqrt(nu)
        largest = np.maximum(largest, np.abs(term))
        mu = beta_1 * mu + term
        w = w - lr * mu
    return w, largest


@pytest.mark.parametrize("rounding", ["keras", "jax-tpu-embedding"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "tf.function"])
def test_laprop_steps_a_float64_table(compiled, rounding):
    """LaProp's √(1 − β₁²) of Python numbers (`rounding="keras"`) is float32's
    value (as keras.ops and JAX compute it), which then meets the table as a
    Python number: a float64 table failed every step (the root was a float32
    tensor). The root's float32 rounding (of 1 − β₁², then of the root: at
    most 1.5 units of 2⁻²⁴ relative) is then the only error beyond float64's
    (the learning rate, 1/8, is exact in the float32 Keras keeps it in): it
    moves w by at most η·Σ|term|·2⁻²³ over the steps, each term at most
    `largest`. The engine's rounding holds the hyperparameters as float64
    scalars for a float64 table, whose root stays float64: only float64's
    own roundings, a few dozen per step of values below 4, under 1e-14."""
    rng = np.random.default_rng(5)
    initial = rng.normal(size=(6, 3))
    gradients = [rng.normal(size=(6, 3)) for _ in range(3)]
    lr = 0.125
    table = _steps_on_a_table(
        teo.optimizers.LaProp(lr, rounding=rounding),
        [tf.constant(g) for g in gradients],
        initial,
        "float64",
        compiled,
    )
    expected, largest = _laprop_in_float64(initial, gradients, lr)
    bound = 1e-14
    if rounding == "keras":
        bound = bound + lr * len(gradients) * largest * 2.0**-23
    assert table.dtype == "float64"
    assert np.all(np.abs(table.numpy() - expected) <= bound)


@pytest.mark.parametrize("x", [0.8132702392002724, 0.38367755426188344])
def test_a_root_of_python_numbers_is_the_one_keras_ops_takes(x):
    """A rule's function of Python numbers alone, on TensorFlow, is the value
    `keras.ops` gives (in float32), which the JAX twin's rule takes, not the
    float64 root rounded to float32: the two differ for these x."""
    from tf_tpu_embed_opt.optimizers.tensorflow_twin import TENSORFLOW

    assert float(np.float32(np.sqrt(x))) != float(np.sqrt(np.float32(x)))
    root = TENSORFLOW.sqrt(x)
    assert type(root) is float
    assert root == float(keras.ops.convert_to_numpy(keras.ops.sqrt(x)))


ALL_TWINS = TWINS + JAX_ONLY + KERAS_ONLY
# The variables every Keras optimizer has, beside the slots.
KERAS_OWN = ("iteration", "learning_rate")


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "tf.function"])
@pytest.mark.parametrize("dtype", ["float64", "float16", "bfloat16"])
@pytest.mark.parametrize("name", ALL_TWINS)
def test_every_twin_steps_tables_of_every_float_dtype(name, dtype, compiled):
    """A sparse step (a duplicate id) and a dense one on a table of `dtype`:
    LaProp failed on each of these dtypes, ClippyAdagrad in a `tf.function`
    (a Python number met a float32 tensor of TensorFlow's making). The table
    keeps its dtype, each slot has the dtype the table steps in
    (`Definition.step_dtype`), and the sparse step moves no row that it
    leaves in the float32 table. This holds what every dtype must do; the
    values are held elsewhere (LaProp's float64 steps above, ClippyAdagrad's
    against TF Recommenders, RowWiseAdagrad's 16-bit steps against FBGEMM's
    convention)."""
    rng = np.random.default_rng(7)
    initial = rng.uniform(-1, 1, size=(6, 3))
    sparse = tf.IndexedSlices(
        tf.constant(rng.uniform(-1, 1, size=(3, 3))),
        tf.constant([4, 1, 4]),
        tf.constant([6, 3]),
    )

    dense_values = rng.uniform(-1, 1, size=(6, 3))

    def stepped(dtype):
        gradient = tf.IndexedSlices(
            tf.cast(sparse.values, dtype), sparse.indices, sparse.dense_shape
        )
        start = tf.cast(tf.constant(initial), dtype).numpy().astype(np.float64)
        dense = tf.cast(tf.constant(dense_values), dtype)
        optimizer = getattr(teo.optimizers, name)(0.1)
        table = keras.Variable(start, dtype=dtype)

        def apply(gradient):
            optimizer.apply([gradient], [table])

        apply = tf.function(apply) if compiled else apply
        apply(gradient)
        moved = table.numpy().astype(np.float64) != start
        apply(dense)
        return optimizer, table, moved

    optimizer, table, moved = stepped(dtype)
    _, _, moved_in_float32 = stepped("float32")
    assert table.dtype == dtype
    step_dtype = optimizer._definition.step_dtype(dtype)
    slots = [v for v in optimizer.variables if v.path.split("/")[-1] not in KERAS_OWN]
    for variable in slots:
        assert variable.dtype == step_dtype, variable.path
    assert np.all(np.isfinite(table.numpy().astype(np.float64)))
    # A step below the dtype's resolution moves nothing (here bfloat16's
    # Adadelta and ClippyAdagrad, and Adam, whose β₂ = 0.999 is 1.0 in
    # bfloat16, as in Keras's own Adam), but no row moves that float32 keeps.
    assert moved_in_float32[[1, 4]].any(axis=1).all()
    assert not np.any(moved.any(axis=1) & ~moved_in_float32.any(axis=1))


@pytest.mark.parametrize("options", KERAS_OPTIONS, ids=[str(o) for o in KERAS_OPTIONS])
@pytest.mark.parametrize("name", ["Adagrad", "Adam"])
def test_dense_matches_keras_for_every_base_option(name, options):
    gradients = random_gradients(3, steps=4)
    initial = np.random.default_rng(4).normal(size=(6, 3))
    ours = getattr(teo.optimizers, name)(0.1, **options)
    theirs = getattr(keras.optimizers, name)(0.1, **options)
    np.testing.assert_allclose(
        run(ours, gradients, initial),
        run(theirs, gradients, initial),
        rtol=2e-6,
        atol=1e-7,
    )
    assert ours.iterations.numpy() == theirs.iterations.numpy()


def test_learning_rate_schedule_and_callable_as_keras():
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, 1, 0.5)
    gradients = random_gradients(5)
    initial = np.ones((6, 3))
    np.testing.assert_allclose(
        run(teo.optimizers.Adam(schedule), gradients, initial),
        run(keras.optimizers.Adam(schedule), gradients, initial),
        rtol=2e-6,
    )


def test_the_twins_seams_as_keras_has_them():
    """Survivors of the sweep of optimizers/twins.py: an int learning rate
    of 0 is told to write 0.0, as one of 1 is; the setter takes a callable
    as Keras's does; Keras's `_accumulators` exists only where the algorithm
    keeps an accumulator; a row-wise slot needs a 2-D variable (3-D too)."""
    for value, hint in ((0, "; write 0.0."), (1, "; write 1.0."), (-1, ".")):
        with pytest.raises(ValueError) as refused:
            teo.optimizers.Adagrad(learning_rate=value)
        assert str(refused.value).endswith(f"received {value!r} of type int{hint}")
    optimizer = teo.optimizers.Adagrad(0.1)
    optimizer.learning_rate = lambda: 0.25
    assert float(optimizer.learning_rate) == 0.25
    variable = keras.Variable(np.zeros((4, 2), np.float32))
    adagrad = teo.optimizers.Adagrad(0.1)
    adagrad.build([variable])
    assert len(adagrad._accumulators) == 1
    adam = teo.optimizers.Adam(0.1)
    adam.build([variable])
    with pytest.raises(AttributeError, match="^Adam keeps no accumulator.$"):
        adam._accumulators  # noqa: B018
    row_wise = teo.optimizers.RowWiseAdagrad(0.1)
    cube = keras.Variable(np.zeros((2, 3, 4), np.float32), name="cube")
    with pytest.raises(ValueError, match=r"one value per row.*shape \(2, 3, 4\)"):
        row_wise.build([cube])


@pytest.mark.parametrize("name", ["Adam", "Adagrad", "Ftrl", "RMSprop", "SGD"])
def test_slot_variables_are_named_as_keras_names_them(name):
    """`layer_variable_slot` under the optimizer, as Keras's own (a variable's
    path, not its bare name, which two layers' kernels share)."""
    layer = keras.layers.Dense(2, name="head")
    layer.build((None, 3))
    options = {"momentum": 0.5} if name == "SGD" else {}
    named = []
    for module in (teo.optimizers, keras.optimizers):
        optimizer = getattr(module, name)(0.1, **options)
        optimizer.build(layer.trainable_variables)
        named.append([v.path.split("/", 1)[1] for v in optimizer.variables])
    assert named[0] == named[1]
    assert "head_kernel" in named[0][2]
    # The slots the package makes itself (a row-wise one) are named alike.
    row_wise = teo.optimizers.RowWiseAdagrad(0.1)
    row_wise.build([layer.kernel])
    assert [v.path.split("/", 1)[1] for v in row_wise.variables][2:] == [
        "head_kernel_accumulator"
    ]


@pytest.mark.parametrize("ids", [[0], [3, 3, 3], [5, 0, 5, 2, 0], []])
def test_deduplicate_against_numpy(ids):
    values = np.arange(len(ids) * 2, dtype="float32").reshape(len(ids), 2) + 1
    got_ids, got_rows = optimizers.deduplicate(
        tf.constant(ids, tf.int32), tf.constant(values.reshape(len(ids), 2))
    )
    unique = np.unique(np.array(ids, dtype=np.int32))
    sums = np.zeros((len(unique), 2), "float32")
    np.add.at(sums, np.searchsorted(unique, ids), values)
    assert got_ids.shape == (len(ids),)
    assert list(got_ids.numpy()[: len(unique)]) == list(unique)
    np.testing.assert_array_equal(got_rows.numpy()[: len(unique)], sums)
    # Padding repeats the first entry exactly (identical rewrites only).
    for i in range(len(unique), len(ids)):
        assert got_ids.numpy()[i] == unique[0]
        np.testing.assert_array_equal(got_rows.numpy()[i], sums[0])

    # Outside XLA: one entry per distinct id, in order of first appearance.
    exact_ids, exact_rows = optimizers.deduplicate(
        tf.constant(ids, tf.int32),
        tf.constant(values.reshape(len(ids), 2)),
        static_shape=False,
    )
    order = np.argsort(exact_ids.numpy())
    assert list(exact_ids.numpy()[order]) == list(unique)
    np.testing.assert_array_equal(exact_rows.numpy()[order], sums)


def twin(name):
    """Each twin with engine options on and non-default hyperparameters."""
    engine = {
        "clip_gradient_min": -3.0,
        "clip_gradient_max": 2.5,
        "clip_weight_min": -4.0,
        "clip_weight_max": 4.0,
        "weight_decay_factor": 0.01,
        "multiply_weight_decay_factor_by_learning_rate": True,
    }
    hypers = {
        "SGD": {"momentum": 0.5, "lazy": True},
        "Adagrad": {"epsilon": 0.0},
        "AdagradMomentum": {"momentum": 0.9, "use_nesterov": True, "beta2": 0.9},
        "Adam": {"lazy": True, "sum_inside_sqrt": True, "bias_correction": False},
        "Ftrl": {"l1_regularization_strength": 0.01, "beta": 0.1, "lazy": True},
        "Momentum": {"use_nesterov": True},
        "RMSprop": {"momentum": 0.5, "centered": True, "lazy": True},
        "Adadelta": {"rho": 0.9, "lazy": True},
        "ProximalAdagrad": {"l1_regularization_strength": 0.01},
        "ProximalYogi": {"l2_regularization_strength": 0.01},
    }[name]
    return getattr(teo.optimizers, name)(0.1, **hypers, **engine)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ids=st.lists(st.integers(0, 7), min_size=1, max_size=12),
    seed=st.integers(0, 2**16),
)
@pytest.mark.parametrize("name", TWINS)
def test_sparse_equals_dense_on_touched_rows(name, ids, seed):
    rng = np.random.default_rng(seed)
    initial = rng.normal(size=(8, 3)).astype("float32")
    values = rng.normal(size=(len(ids), 3)).astype("float32")
    sparse = tf.IndexedSlices(
        tf.constant(values), tf.constant(ids, tf.int64), tf.constant([8, 3], tf.int64)
    )
    dense = tf.convert_to_tensor(sparse)
    touched = sorted(set(ids))
    untouched = [i for i in range(8) if i not in touched]

    sparse_optimizer, dense_optimizer = twin(name), twin(name)
    sparse_table = keras.Variable(initial)
    dense_table = keras.Variable(initial)
    for _ in range(2):
        sparse_optimizer.apply([sparse], [sparse_table])
        dense_optimizer.apply([dense], [dense_table])
    np.testing.assert_allclose(
        sparse_table.numpy()[touched],
        dense_table.numpy()[touched],
        rtol=1e-5,
        atol=1e-6,
    )
    np.testing.assert_array_equal(sparse_table.numpy()[untouched], initial[untouched])
    for mine, reference in zip(
        sparse_optimizer.variables[1:], dense_optimizer.variables[1:]
    ):
        if tuple(mine.shape) != (8, 3):
            continue
        np.testing.assert_allclose(
            mine.numpy()[touched], reference.numpy()[touched], rtol=1e-5, atol=1e-6
        )


def test_non_lazy_adam_updates_every_row_on_sparse_gradients():
    sparse = tf.IndexedSlices(
        tf.constant([[1.0, 2.0]]), tf.constant([1]), tf.constant([4, 2])
    )
    table = keras.Variable(np.ones((4, 2), "float32"))
    optimizer = teo.optimizers.Adam(0.1)
    optimizer.apply([sparse], [table])
    optimizer.apply([sparse], [table])
    # Non-lazy (Keras default): the momentum from step 1 moves row 1 and the
    # zero-gradient rows stay; with lazy=True the others never move.
    reference = keras.Variable(np.ones((4, 2), "float32"))
    keras_adam = keras.optimizers.Adam(0.1)
    keras_adam.apply([tf.convert_to_tensor(sparse)], [reference])
    keras_adam.apply([tf.convert_to_tensor(sparse)], [reference])
    np.testing.assert_allclose(table.numpy(), reference.numpy(), rtol=2e-6)


@pytest.mark.parametrize(
    "name,arguments", STOCK_SETTINGS, ids=[f"{n}-{a}" for n, a in STOCK_SETTINGS]
)
def test_variables_are_keras_s(name, arguments):
    # Same variables, names and order as Keras's (it saves them by position):
    # Keras-only slots exist only when used (amsgrad, SGD momentum), RMSprop
    # keeps `momentum` only with momentum, and Adam's moments, Ftrl's and
    # Adadelta's slots are made variable by variable, as Keras does.
    variables = [
        keras.Variable(np.ones(shape, "float32"), name=name)
        for name, shape in (("table", (3, 2)), ("bias", (2,)), ("other", (3, 2)))
    ]
    ours = getattr(teo.optimizers, name)(**arguments)
    theirs = getattr(keras.optimizers, name)(**arguments)
    ours.build(variables)
    theirs.build(variables)
    assert [(v.name, v.shape) for v in ours.variables] == [
        (v.name, v.shape) for v in theirs.variables
    ]


def test_slot_initial_values_follow_arguments():
    variable = keras.Variable(np.ones((3, 2), "float32"), name="table")
    optimizer = teo.optimizers.ProximalYogi(initial_accumulator_value=0.25)
    optimizer.build([variable])
    slots = {v.path.split("/")[-1]: v.numpy() for v in optimizer.variables[2:]}
    # The engine's ProximalYogi: v starts at the initial accumulator, m at 0.
    assert sorted(slots) == ["table_m", "table_v"]
    np.testing.assert_array_equal(slots["table_v"], np.full((3, 2), 0.25))
    np.testing.assert_array_equal(slots["table_m"], np.zeros((3, 2)))


BAD = [
    ("Adagrad", {"epsilon": -1.0}, ValueError, "`epsilon`"),
    (
        "Adagrad",
        {"initial_accumulator_value": -0.1},
        ValueError,
        "`initial_accumulator_value`",
    ),
    ("SGD", {"momentum": float("nan")}, ValueError, "`momentum`"),
    ("SGD", {"nesterov": 1}, TypeError, "`nesterov`"),
    ("Adam", {"beta_1": 1.0}, ValueError, "`beta_1`"),
    ("Adam", {"lazy": "yes"}, TypeError, "`lazy`"),
    ("Adam", {"epsilon": float("nan")}, ValueError, "`epsilon`"),
    (
        "Ftrl",
        {"learning_rate_power": float("nan")},
        ValueError,
        "`learning_rate_power`",
    ),
    ("RMSprop", {"centered": None}, TypeError, "`centered`"),
    # Arguments that mirror the hyperparameter take its bounds (Keras's own
    # RMSprop takes rho=1.5, and its step then grows without bound).
    ("RMSprop", {"rho": 1.5}, ValueError, r"`rho` must be in \[0, 1\)"),
    ("RMSprop", {"momentum": -0.5}, ValueError, r"`momentum` must be in \[0, 1\)"),
    ("RMSprop", {"epsilon": 0.0}, ValueError, "`epsilon` must be > 0"),
    (
        "AdagradMomentum",
        {"momentum": 1.5},
        ValueError,
        r"`momentum` must be in \[0, 1\]",
    ),
    ("AdagradMomentum", {"epsilon": -1.0}, ValueError, "`epsilon` must be > 0"),
    (
        "Momentum",
        {"clip_weight_min": 2.0, "clip_weight_max": 1.0},
        ValueError,
        "`clip_weight_min`",
    ),
    ("Momentum", {"clip_gradient_min": "a"}, TypeError, "`clip_gradient_min`"),
    ("Adadelta", {"weight_decay_factor": -0.1}, ValueError, "`weight_decay_factor`"),
    (
        "Adadelta",
        {"multiply_weight_decay_factor_by_learning_rate": 1},
        TypeError,
        "`multiply_weight_decay_factor_by_learning_rate`",
    ),
]


@pytest.mark.parametrize(
    "name,arguments,error,fragment", BAD, ids=[str(b[1]) for b in BAD]
)
def test_bad_arguments_name_the_argument(name, arguments, error, fragment):
    with pytest.raises(error, match=f"{name}.*{fragment}"):
        getattr(teo.optimizers, name)(**arguments)


def test_unknown_keyword_is_refused():
    with pytest.raises(ValueError, match="not_an_option"):
        teo.optimizers.Adagrad(not_an_option=1)
    with pytest.raises(TypeError, match="Adagrad"):
        teo.optimizers.Adagrad(
            0.1,
            0.1,
            1e-7,
            None,
            None,
            None,
            None,
            False,
            0.99,
            None,
            None,
            None,
            "x",
            1,
        )


@pytest.mark.parametrize("name", TWINS)
def test_config_round_trip(name):
    optimizer = twin(name)
    config = optimizer.get_config()
    rebuilt = type(optimizer).from_config(dict(config))
    assert rebuilt.get_config() == config
    restored = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert type(restored) is type(optimizer)
    assert restored.get_config() == config


@pytest.mark.parametrize(
    "jit", [False, pytest.param(True, marks=requires_xla)], ids=["eager", "xla"]
)
@pytest.mark.parametrize("options", GRADIENT_OPTIONS)
def test_keras_clipping_and_unscaling_of_sparse_gradients_equal_dense(options, jit):
    ids = tf.constant([2, 0, 2, 2, 5])
    values = tf.constant(np.linspace(-1, 1, 10, dtype="float32").reshape(5, 2))
    sparse = tf.IndexedSlices(values, ids, tf.constant([6, 2]))
    initial = np.ones((6, 2), "float32")
    sparse_table, dense_table = keras.Variable(initial), keras.Variable(initial)
    sparse_optimizer = teo.optimizers.Adagrad(0.5, epsilon=0.0, **options)
    dense_optimizer = teo.optimizers.Adagrad(0.5, epsilon=0.0, **options)

    def step():
        sparse_optimizer.apply([sparse], [sparse_table])

    if jit:
        step = tf.function(step, jit_compile=True)
    step()
    dense_optimizer.apply([tf.convert_to_tensor(sparse)], [dense_table])
    np.testing.assert_allclose(sparse_table.numpy(), dense_table.numpy(), rtol=1e-6)
