"""Tests of `tf_tpu_embed_opt.optimizers.ClippyAdagrad` (Keras 3).

The oracle is TensorFlow Recommenders' `ClippyAdagrad` on legacy Keras 2,
loaded into this Keras 3 process by `tfrs_oracle.py`. The oracle
tests are skipped when `tensorflow_recommenders` or `tf_keras` is missing; CI
installs them with
`pip install --no-deps tensorflow-recommenders "tf_keras==2.21.*"` (the
`tf_keras` minor version must be TensorFlow's; `--no-deps` keeps pip from
pulling a second TensorFlow next to `tensorflow-cpu`).
"""

from __future__ import annotations

import inspect
import itertools
import math
import pathlib
from typing import Any, Dict, List, Optional, Sequence, Tuple

import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st
from tfrs_oracle import load_clippy_adagrad

from tf_tpu_embed_opt.optimizers import ClippyAdagrad

FLAG_NAMES = (
    "export_clipping_factors",
    "clip_accumulator_update",
    "use_standard_accumulator_update",
)
ALL_FLAGS = [
    dict(zip(FLAG_NAMES, bits)) for bits in itertools.product((False, True), repeat=3)
]
VALID_FLAGS = [
    f
    for f in ALL_FLAGS
    if not (f["clip_accumulator_update"] and f["use_standard_accumulator_update"])
]
THRESHOLDS = {
    "defaults": {},
    "all-terms": dict(
        learning_rate=0.3,
        initial_accumulator_value=0.5,
        variable_relative_threshold=0.05,
        accumulator_relative_threshold=1e-3,
        absolute_threshold=1e-4,
        epsilon=1e-6,
    ),
}
# Large gradients so that the adaptive clipping really acts.
GRADIENT_SCALE = 30.0
STEPS = 5
ROWS, COLUMNS = 12, 4
RTOL = 1e-6


def _flag_id(flags: Dict[str, bool]) -> str:
    return "-".join(name.split("_")[0] if on else "_" for name, on in flags.items())


TfrsClippyAdagrad, _ = load_clippy_adagrad()
# A missing TFRS fails these tests (see tests/oracles.py and conftest.py).
needs_oracle = pytest.mark.oracle("tfrs")


# --------------------------------------------------------------------------
# Helpers.


def _initial_values(seed: int) -> List[np.ndarray]:
    rng = np.random.default_rng(seed)
    table = rng.normal(size=(ROWS, COLUMNS)).astype(np.float32)
    table[0] = 0.0  # A row at zero: only the absolute threshold lets it move.
    bias = np.zeros(COLUMNS, np.float32)
    return [table, bias]


def _dense_gradients(rng: np.random.Generator) -> List[tf.Tensor]:
    table = rng.normal(size=(ROWS, COLUMNS)) * GRADIENT_SCALE
    table[rng.integers(ROWS)] = 0.0  # A row with no gradient.
    bias = rng.normal(size=COLUMNS) * GRADIENT_SCALE
    return [tf.constant(table, tf.float32), tf.constant(bias, tf.float32)]


def _sparse_gradient(
    rng: np.random.Generator, unique: bool, rows: int = ROWS
) -> tf.IndexedSlices:
    """Row-sparse gradient of a `(rows, COLUMNS)` table, ids in random order."""
    if unique:
        indices = rng.permutation(rows)[: rows // 2]
    else:
        indices = rng.integers(0, rows // 2, size=rows)  # Many repeats.
    values = rng.normal(size=(len(indices), COLUMNS)) * GRADIENT_SCALE
    return tf.IndexedSlices(
        tf.constant(values, tf.float32),
        tf.constant(indices, tf.int32),
        tf.constant([rows, COLUMNS], tf.int32),
    )


def _state(optimizer: Any, variables: Sequence[tf.Variable]) -> Dict[str, Any]:
    """Model variables, accumulators and exported clipping factors as arrays."""
    return {
        "variables": [v.numpy() for v in variables],
        "accumulators": [np.asarray(a.numpy()) for a in optimizer._accumulators],
        "clipping_factors": [float(c.numpy()) for c in optimizer.clipping_factors],
    }


def _assert_same_state(
    ours: Dict[str, Any], theirs: Dict[str, Any], rtol: float = RTOL
) -> None:
    for key in ("variables", "accumulators"):
        assert len(ours[key]) == len(theirs[key])
        for mine, other in zip(ours[key], theirs[key]):
            np.testing.assert_allclose(mine, other, rtol=rtol, atol=1e-12, err_msg=key)
    np.testing.assert_allclose(
        ours["clipping_factors"], theirs["clipping_factors"], rtol=rtol, atol=1e-12
    )


def _run(
    optimizer: Any,
    initial: Sequence[np.ndarray],
    gradient_steps: Sequence[Sequence[Any]],
    compiled: bool = False,
) -> Tuple[Dict[str, Any], List[tf.Variable]]:
    """The steps, eagerly or (`compiled`) each in one `tf.function`."""
    variables = [tf.Variable(value) for value in initial]

    def apply(gradients):
        optimizer.apply_gradients(list(zip(gradients, variables)))

    apply = tf.function(apply) if compiled else apply
    for gradients in gradient_steps:
        apply(gradients)
    return _state(optimizer, variables), variables


def _compare_with_tfrs(
    arguments: Dict[str, Any],
    initial: Sequence[np.ndarray],
    gradient_steps: Sequence[Sequence[Any]],
) -> Dict[str, Any]:
    ours, _ = _run(ClippyAdagrad(**arguments), initial, gradient_steps)
    theirs, _ = _run(TfrsClippyAdagrad(**arguments), initial, gradient_steps)
    _assert_same_state(ours, theirs)
    return ours


# --------------------------------------------------------------------------
# Against TensorFlow Recommenders.


@needs_oracle
@pytest.mark.parametrize("thresholds", list(THRESHOLDS), ids=list(THRESHOLDS))
@pytest.mark.parametrize("flags", ALL_FLAGS, ids=[_flag_id(f) for f in ALL_FLAGS])
def test_dense_matches_tfrs(flags: Dict[str, bool], thresholds: str) -> None:
    arguments = {**THRESHOLDS[thresholds], **flags}
    if flags not in VALID_FLAGS:
        for optimizer_class in (ClippyAdagrad, TfrsClippyAdagrad):
            with pytest.raises(ValueError, match="clip_accumulator_update"):
                optimizer_class(**arguments)
        return
    rng = np.random.default_rng(1)
    steps = [_dense_gradients(rng) for _ in range(STEPS)]
    state = _compare_with_tfrs(arguments, _initial_values(0), steps)
    if flags["export_clipping_factors"]:
        assert min(state["clipping_factors"]) < 1.0, "the test never clipped"


@needs_oracle
@pytest.mark.parametrize("unique", [True, False], ids=["unique-ids", "repeated-ids"])
@pytest.mark.parametrize("thresholds", list(THRESHOLDS), ids=list(THRESHOLDS))
@pytest.mark.parametrize("flags", VALID_FLAGS, ids=[_flag_id(f) for f in VALID_FLAGS])
def test_sparse_matches_tfrs(
    flags: Dict[str, bool], thresholds: str, unique: bool
) -> None:
    # With repeated ids TFRS agrees too, because `tf_keras`'s apply_gradients
    # sums the rows of an index before calling TFRS's update step.
    arguments = {**THRESHOLDS[thresholds], **flags}
    rng = np.random.default_rng(2)
    steps = [
        [_sparse_gradient(rng, unique), _dense_gradients(rng)[1]] for _ in range(STEPS)
    ]
    state = _compare_with_tfrs(arguments, _initial_values(3), steps)
    if flags["export_clipping_factors"]:
        assert min(state["clipping_factors"]) < 1.0, "the test never clipped"


@needs_oracle
def test_keras_base_options_match_tfrs() -> None:
    """Gradient clipping and weight decay happen before the Clippy step."""
    rng = np.random.default_rng(4)
    steps = [_dense_gradients(rng) for _ in range(STEPS)]
    for extra in ({"clipnorm": 1.0}, {"clipvalue": 2.0}, {"weight_decay": 0.05}):
        _compare_with_tfrs(
            {"learning_rate": 0.2, "export_clipping_factors": True, **extra},
            _initial_values(5),
            steps,
        )


@needs_oracle
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "tf.function"])
@pytest.mark.parametrize("thresholds", list(THRESHOLDS), ids=list(THRESHOLDS))
@pytest.mark.parametrize("flags", VALID_FLAGS, ids=[_flag_id(f) for f in VALID_FLAGS])
def test_float64_matches_tfrs(
    flags: Dict[str, bool], thresholds: str, compiled: bool
) -> None:
    # The accumulators start from the float64 initial value (not its float32
    # rounding), so float64 agrees to float64 rounding. In a tf.function the
    # step's `min(1, bound)` met the float64 bound as a float32 1: it failed.
    # TF Recommenders' own step fails so in a tf.function (its `tf.where`
    # meets a float32 1 too): it runs eagerly.
    arguments = {**THRESHOLDS[thresholds], **flags}
    rng = np.random.default_rng(6)
    initial = [value.astype(np.float64) for value in _initial_values(7)]
    steps = [
        [tf.cast(g, tf.float64) for g in _dense_gradients(rng)] for _ in range(STEPS)
    ]
    ours, _ = _run(ClippyAdagrad(**arguments), initial, steps, compiled)
    theirs, _ = _run(TfrsClippyAdagrad(**arguments), initial, steps)
    _assert_same_state(ours, theirs, rtol=1e-13)
    assert all(a.dtype == np.float64 for a in ours["accumulators"])


@needs_oracle
@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    flags=st.sampled_from(VALID_FLAGS),
    learning_rate=st.sampled_from([1e-3, 0.1, 1.0]),
    variable_relative_threshold=st.sampled_from([0.0, 1e-3, 0.1, 2.0]),
    accumulator_relative_threshold=st.sampled_from([0.0, 1e-4, 1e-2]),
    absolute_threshold=st.sampled_from([1e-7, 1e-3, 0.5]),
    sparse=st.booleans(),
)
def test_random_settings_match_tfrs(
    seed: int,
    flags: Dict[str, bool],
    learning_rate: float,
    variable_relative_threshold: float,
    accumulator_relative_threshold: float,
    absolute_threshold: float,
    sparse: bool,
) -> None:
    rng = np.random.default_rng(seed)
    steps = []
    for _ in range(3):
        table, bias = _dense_gradients(rng)
        if sparse:
            table = _sparse_gradient(rng, unique=bool(rng.integers(2)))
        steps.append([table, bias])
    _compare_with_tfrs(
        dict(
            learning_rate=learning_rate,
            variable_relative_threshold=variable_relative_threshold,
            accumulator_relative_threshold=accumulator_relative_threshold,
            absolute_threshold=absolute_threshold,
            **flags,
        ),
        _initial_values(seed % 1000),
        steps,
    )


# --------------------------------------------------------------------------
# The update rule itself, and sparse semantics (no oracle needed).


def _numpy_step(
    w: np.ndarray, a: np.ndarray, g: np.ndarray, arguments: Dict[str, Any]
) -> Tuple[np.ndarray, np.ndarray, float]:
    """One step of the class docstring's update rule, in float64."""
    w, a, g = (x.astype(np.float64) for x in (w, a, g))
    if arguments.get("use_standard_accumulator_update", False):
        a = a + g**2
    p = 1.0 / np.sqrt(a + arguments.get("epsilon", 1e-7))
    d = arguments.get("learning_rate", 0.001) * g * p
    t = (
        arguments.get("absolute_threshold", 1e-7)
        + arguments.get("variable_relative_threshold", 0.1) * np.abs(w)
        + arguments.get("accumulator_relative_threshold", 0.0) * np.abs(p)
    )
    moving = d != 0
    s = min(1.0, float(np.min(t[moving] / np.abs(d[moving])))) if moving.any() else 1.0
    w = w - s * d
    if not arguments.get("use_standard_accumulator_update", False):
        if arguments.get("clip_accumulator_update", False):
            a = a + (s * g) ** 2
        else:
            a = a + g**2
    return w, a, s


@pytest.mark.parametrize("thresholds", list(THRESHOLDS), ids=list(THRESHOLDS))
@pytest.mark.parametrize("flags", VALID_FLAGS, ids=[_flag_id(f) for f in VALID_FLAGS])
def test_update_rule_as_documented(flags: Dict[str, bool], thresholds: str) -> None:
    arguments = {**THRESHOLDS[thresholds], **flags, "export_clipping_factors": True}
    optimizer = ClippyAdagrad(**arguments)
    initial = _initial_values(8)
    variables = [tf.Variable(value) for value in initial]
    optimizer.build(variables)
    expected_w = [value.astype(np.float64) for value in initial]
    expected_a = [
        np.full(value.shape, optimizer.initial_accumulator_value) for value in initial
    ]
    rng = np.random.default_rng(9)
    for _ in range(STEPS):
        gradients = _dense_gradients(rng)
        optimizer.apply_gradients(list(zip(gradients, variables)))
        for i, gradient in enumerate(gradients):
            expected_w[i], expected_a[i], s = _numpy_step(
                expected_w[i], expected_a[i], gradient.numpy(), arguments
            )
            # float32 against the float64 formula, at the TFRS comparisons'
            # RTOL; weights (of order 1) may cancel to ~1e-8, whose error is
            # then a few float32 ulps of the operands, hence the atol.
            assert float(optimizer.clipping_factors[i].numpy()) == pytest.approx(
                s, rel=RTOL
            )
            np.testing.assert_allclose(
                variables[i].numpy(), expected_w[i], rtol=RTOL, atol=1e-6
            )
            np.testing.assert_allclose(
                optimizer._accumulators[i].numpy(), expected_a[i], rtol=RTOL
            )


@pytest.mark.parametrize("thresholds", list(THRESHOLDS), ids=list(THRESHOLDS))
@pytest.mark.parametrize("flags", VALID_FLAGS, ids=[_flag_id(f) for f in VALID_FLAGS])
def test_repeated_ids_equal_dense_gradient(
    flags: Dict[str, bool], thresholds: str
) -> None:
    """Repeated ids are summed: one update per looked-up row, others untouched."""
    arguments = {**THRESHOLDS[thresholds], **flags, "export_clipping_factors": True}
    rng = np.random.default_rng(10)
    sparse_steps = [[_sparse_gradient(rng, unique=False)] for _ in range(STEPS)]
    dense_steps = [[tf.convert_to_tensor(g)] for (g,) in sparse_steps]
    summed_steps = []
    for (g,) in sparse_steps:
        # Each id once, in order of first occurrence, with its rows summed.
        indices = g.indices.numpy()
        ids = list(dict.fromkeys(indices.tolist()))
        values = np.zeros((len(ids), COLUMNS), np.float32)
        np.add.at(values, [ids.index(i) for i in indices], g.values.numpy())
        summed_steps.append([tf.IndexedSlices(tf.constant(values), tf.constant(ids))])
    initial = _initial_values(11)[:1]

    sparse_state, _ = _run(ClippyAdagrad(**arguments), initial, sparse_steps)
    dense_state, _ = _run(ClippyAdagrad(**arguments), initial, dense_steps)
    summed_state, _ = _run(ClippyAdagrad(**arguments), initial, summed_steps)
    # Same rows, same shapes: the same float32 results.
    _assert_same_state(sparse_state, summed_state)
    # The dense step runs each element in another SIMD lane of TensorFlow's
    # kernels (e.g. rsqrt), which can move the last bit: compare to 1e-5.
    _assert_same_state(sparse_state, dense_state, rtol=1e-5)

    looked_up = np.unique(np.concatenate([g.indices.numpy() for (g,) in sparse_steps]))
    untouched = np.setdiff1d(np.arange(ROWS), looked_up)
    assert untouched.size, "every row was looked up; the test needs one that is not"
    np.testing.assert_array_equal(
        sparse_state["variables"][0][untouched], initial[0][untouched]
    )
    initial_accumulator = np.float32(arguments.get("initial_accumulator_value", 0.1))
    np.testing.assert_array_equal(
        sparse_state["accumulators"][0][untouched], initial_accumulator
    )
    assert not np.array_equal(
        sparse_state["variables"][0][looked_up], initial[0][looked_up]
    )


def test_sparse_clipping_factor_is_minimum_over_looked_up_rows() -> None:
    """Rows that are not looked up put no bound on the step (as in TFRS)."""
    # Row 0 is zero, so with a tiny absolute threshold it would force the
    # factor to ~0 if it took part; rows 1 and 2 alone allow a larger factor.
    table = np.ones((3, 2), np.float32)
    table[0] = 0.0
    variable = tf.Variable(table)
    optimizer = ClippyAdagrad(
        learning_rate=1.0, absolute_threshold=1e-7, export_clipping_factors=True
    )
    gradient = tf.IndexedSlices(
        tf.constant([[1.0, 2.0], [4.0, 1.0]]), tf.constant([2, 1]), tf.constant([3, 2])
    )
    optimizer.apply_gradients([(gradient, variable)])
    # Step d = g / sqrt(0.1 + 1e-7); threshold 1e-7 + 0.1 * |w| = 0.1 + 1e-7.
    p = 1.0 / math.sqrt(0.1 + 1e-7)
    expected = (0.1 + 1e-7) / (4.0 * p)
    factor = float(optimizer.clipping_factors[0].numpy())
    assert factor == pytest.approx(expected, rel=1e-5)
    np.testing.assert_array_equal(variable.numpy()[0], table[0])


def test_empty_sparse_gradient_changes_nothing() -> None:
    variable = tf.Variable(_initial_values(12)[0])
    optimizer = ClippyAdagrad(export_clipping_factors=True)
    gradient = tf.IndexedSlices(
        tf.zeros((0, COLUMNS)), tf.zeros((0,), tf.int32), tf.constant([ROWS, COLUMNS])
    )
    optimizer.apply_gradients([(gradient, variable)])
    np.testing.assert_array_equal(variable.numpy(), _initial_values(12)[0])
    np.testing.assert_array_equal(
        optimizer._accumulators[0].numpy(), np.full((ROWS, COLUMNS), 0.1, np.float32)
    )
    assert float(optimizer.clipping_factors[0].numpy()) == 1.0


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_inside_tf_function_equals_eager(sparse: bool) -> None:
    arguments = dict(learning_rate=0.5, export_clipping_factors=True)
    rng = np.random.default_rng(13)
    if sparse:
        steps = [[_sparse_gradient(rng, unique=False)] for _ in range(STEPS)]
    else:
        steps = [[_dense_gradients(rng)[0]] for _ in range(STEPS)]
    initial = _initial_values(14)[:1]
    eager_state, _ = _run(ClippyAdagrad(**arguments), initial, steps)

    optimizer = ClippyAdagrad(**arguments)
    variable = tf.Variable(initial[0])
    optimizer.build([variable])

    @tf.function
    def train_step(values: tf.Tensor, indices: Optional[tf.Tensor]) -> tf.Tensor:
        gradient = values if indices is None else tf.IndexedSlices(values, indices)
        return optimizer.apply_gradients([(gradient, variable)])

    for (gradient,) in steps:
        if sparse:
            train_step(gradient.values, gradient.indices)
        else:
            train_step(gradient, None)
    assert int(optimizer.iterations.numpy()) == STEPS
    _assert_same_state(_state(optimizer, [variable]), eager_state)


# --------------------------------------------------------------------------
# Attributes, configuration and arguments.


def test_clipping_factors_attribute() -> None:
    variables = [tf.Variable(value) for value in _initial_values(15)]
    quiet = ClippyAdagrad()
    assert quiet.clipping_factors == []
    quiet.build(variables)
    assert quiet.clipping_factors == []
    assert len(quiet.variables) == 2 + len(variables)  # iterations, lr, accums.

    loud = ClippyAdagrad(learning_rate=1.0, export_clipping_factors=True)
    assert loud.clipping_factors == []
    loud.build(variables)
    factors = loud.clipping_factors
    assert len(factors) == len(variables)
    assert len(loud.variables) == 2 + 2 * len(variables)
    assert all(tuple(f.shape) == () for f in factors)
    assert [float(f.numpy()) for f in factors] == [1.0, 1.0]
    rng = np.random.default_rng(16)
    for _ in range(STEPS):
        loud.apply_gradients(list(zip(_dense_gradients(rng), variables)))
        values = [float(f.numpy()) for f in loud.clipping_factors]
        assert all(0.0 < v <= 1.0 for v in values), values
    assert min(values) < 1.0
    # The list is a copy: callers cannot detach the optimizer's variables.
    loud.clipping_factors.clear()
    assert len(loud.clipping_factors) == len(variables)


def test_attributes() -> None:
    optimizer = ClippyAdagrad(learning_rate=0.25)
    assert int(optimizer.iterations.numpy()) == 0
    assert float(optimizer.learning_rate.numpy()) == 0.25
    variable = tf.Variable([1.0, 2.0])
    optimizer.apply_gradients([(tf.constant([0.1, 0.1]), variable)])
    assert int(optimizer.iterations.numpy()) == 1
    optimizer.learning_rate = 0.5
    assert float(optimizer.learning_rate.numpy()) == 0.5
    assert optimizer.name == "ClippyAdagrad"


def _non_default_arguments() -> Dict[str, Any]:
    return dict(
        learning_rate=0.3,
        initial_accumulator_value=0.2,
        variable_relative_threshold=0.05,
        accumulator_relative_threshold=1e-3,
        absolute_threshold=1e-5,
        epsilon=1e-6,
        export_clipping_factors=True,
        clip_accumulator_update=False,
        use_standard_accumulator_update=True,
        weight_decay=0.01,
        clipnorm=None,
        clipvalue=None,
        global_clipnorm=2.0,
        use_ema=True,
        ema_momentum=0.9,
        ema_overwrite_frequency=10,
        loss_scale_factor=128.0,
        gradient_accumulation_steps=2,
        name="my_clippy",
    )


def test_get_config_has_every_argument_and_round_trips() -> None:
    arguments = _non_default_arguments()
    parameters = inspect.signature(ClippyAdagrad.__init__).parameters
    assert set(arguments) == set(parameters) - {"self", "kwargs"}
    optimizer = ClippyAdagrad(**arguments)
    config = optimizer.get_config()
    for name, value in arguments.items():
        assert config[name] == pytest.approx(value), name
    clone = ClippyAdagrad.from_config(config)
    assert type(clone) is ClippyAdagrad
    assert clone.get_config() == config
    default_config = ClippyAdagrad().get_config()
    assert ClippyAdagrad.from_config(default_config).get_config() == default_config


def test_keras_serialization_round_trip() -> None:
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)
    optimizer = ClippyAdagrad(learning_rate=schedule, clip_accumulator_update=True)
    assert (
        keras.saving.get_registered_name(ClippyAdagrad)
        == "tf_tpu_embed_opt>ClippyAdagrad"
    )
    serialized = keras.optimizers.serialize(optimizer)
    restored = keras.optimizers.deserialize(serialized)
    assert type(restored) is ClippyAdagrad
    assert restored.clip_accumulator_update is True
    assert isinstance(
        restored._learning_rate, keras.optimizers.schedules.ExponentialDecay
    )
    assert restored.get_config() == optimizer.get_config()


@pytest.mark.parametrize(
    "arguments, error, fragments",
    [
        ({"variable_relative_threshold": -0.1}, ValueError, [">= 0", "-0.1"]),
        ({"accumulator_relative_threshold": -1e-3}, ValueError, [">= 0", "-0.001"]),
        ({"absolute_threshold": -1.0}, ValueError, [">= 0", "-1.0"]),
        ({"absolute_threshold": float("nan")}, ValueError, ["finite", "nan"]),
        ({"epsilon": -1e-7}, ValueError, [">= 0", "-1e-07"]),
        ({"initial_accumulator_value": -0.1}, ValueError, [">= 0", "-0.1"]),
        ({"initial_accumulator_value": float("inf")}, ValueError, ["finite", "inf"]),
        (
            {"initial_accumulator_value": 0.0, "epsilon": 0.0},
            ValueError,
            ["epsilon", "cannot both be 0"],
        ),
        ({"learning_rate": -0.5}, ValueError, [">= 0", "-0.5"]),
        ({"learning_rate": "fast"}, TypeError, ["LearningRateSchedule", "'fast'"]),
        ({"epsilon": "small"}, TypeError, ["real number", "'small'", "str"]),
        ({"variable_relative_threshold": True}, TypeError, ["real number", "True"]),
        ({"export_clipping_factors": 1}, TypeError, ["bool", "1", "int"]),
        ({"clip_accumulator_update": "yes"}, TypeError, ["bool", "'yes'"]),
        ({"use_standard_accumulator_update": None}, TypeError, ["bool", "None"]),
        (
            {"clip_accumulator_update": True, "use_standard_accumulator_update": True},
            ValueError,
            ["cannot both be True"],
        ),
        ({"clipnorm": 1.0, "clipvalue": 1.0}, ValueError, ["clipnorm"]),
        ({"not_an_argument": 1}, ValueError, ["not_an_argument"]),
    ],
)
def test_bad_arguments(
    arguments: Dict[str, Any], error: type, fragments: List[str]
) -> None:
    with pytest.raises(error) as raised:
        ClippyAdagrad(**arguments)
    message = str(raised.value)
    for name in arguments:
        assert name in message
    for fragment in fragments:
        assert fragment in message


def test_lenient_argument_types() -> None:
    optimizer = ClippyAdagrad(
        learning_rate=1,
        initial_accumulator_value=np.float32(0.5),
        absolute_threshold=0,
        epsilon=0,
        export_clipping_factors=np.bool_(True),
    )
    assert optimizer.get_config()["learning_rate"] == 1.0
    assert isinstance(optimizer.initial_accumulator_value, float)
    assert optimizer.export_clipping_factors is True
    assert ClippyAdagrad(learning_rate=lambda: 0.01).learning_rate == 0.01


# --------------------------------------------------------------------------
# Keras training.


# Keras' own saving of TensorFlow variables warns under NumPy 2 (any optimizer).
@pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")
def test_fit_with_embedding(tmp_path: pathlib.Path) -> None:
    keras.utils.set_random_seed(0)
    vocabulary, used = 50, 20
    model = keras.Sequential(
        [
            keras.Input((3,), dtype="int32"),
            keras.layers.Embedding(vocabulary, 4),
            keras.layers.Flatten(),
            keras.layers.Dense(1),
        ]
    )
    optimizer = ClippyAdagrad(learning_rate=0.1, export_clipping_factors=True)
    model.compile(optimizer=optimizer, loss="mse")
    rng = np.random.default_rng(17)
    x = rng.integers(0, used, size=(64, 3)).astype("int32")
    y = x.sum(axis=1, keepdims=True).astype("float32") / 30.0
    table_before = model.layers[0].embeddings.numpy().copy()
    history = model.fit(x, y, epochs=3, batch_size=16, verbose=0)

    losses = history.history["loss"]
    assert all(math.isfinite(loss) for loss in losses)
    assert losses[-1] < losses[0]
    assert int(optimizer.iterations.numpy()) == 3 * 4
    table = model.layers[0].embeddings.numpy()
    # Ids never looked up keep their row and their accumulator row.
    np.testing.assert_array_equal(table[used:], table_before[used:])
    accumulator = optimizer._accumulators[0].numpy()
    np.testing.assert_array_equal(accumulator[used:], np.float32(0.1))
    assert (accumulator[:used] > np.float32(0.1)).all()
    factors = [float(f.numpy()) for f in optimizer.clipping_factors]
    assert len(factors) == len(model.trainable_variables)
    assert all(0.0 < f <= 1.0 for f in factors)

    path = tmp_path / "model.keras"
    model.save(path)
    restored = keras.models.load_model(path)
    assert type(restored.optimizer) is ClippyAdagrad
    assert restored.optimizer.get_config() == optimizer.get_config()
    np.testing.assert_array_equal(
        restored.optimizer._accumulators[0].numpy(), accumulator
    )


# --------------------------------------------------------------------------
# A definition like the others (issue #55).


@needs_oracle
@pytest.mark.parametrize("flags", VALID_FLAGS, ids=[_flag_id(f) for f in VALID_FLAGS])
def test_the_definition_on_numpy_matches_tfrs(flags: Dict[str, bool]) -> None:
    """The rule of the definition, run on NumPy arrays as the whole variable,
    against TF Recommenders' optimizer.

    In float64 with NumPy's `1 / sqrt` for TensorFlow's `rsqrt` (each within
    an ulp, 2.2e-16, of the exact value): the step is a product and quotient
    of such results, so after `STEPS` steps each term differs by at most a
    few dozen ulps relative, far below 1e-12; `w - s·d` may cancel (the row
    that starts at 0), so the weights' bound is relative to the table's
    largest magnitude. TF Recommenders keeps its clipping factors in float32:
    one rounding of a float32, 2^-24 relative.
    """
    from tf_tpu_embed_opt.definitions import registry, rules

    definition = registry.BY_NAME["ClippyAdagrad"]
    arguments = {**THRESHOLDS["all-terms"], **flags}
    rate = arguments.pop("learning_rate")
    hypers = {h.name: arguments.get(h.name, h.default) for h in definition.hypers}
    initial = [value.astype(np.float64) for value in _initial_values(40)]
    rng = np.random.default_rng(41)
    steps = [
        [tf.cast(g, tf.float64) for g in _dense_gradients(rng)] for _ in range(STEPS)
    ]
    theirs, _ = _run(TfrsClippyAdagrad(learning_rate=rate, **arguments), initial, steps)
    for index, value in enumerate(initial):
        slots = {
            "accumulators": np.full_like(value, hypers["initial_accumulator_value"])
        }
        for gradients in steps:
            # Keras keeps the learning rate in a float32 variable.
            value, slots = definition.update(
                rules.NUMPY,
                value,
                slots,
                gradients[index].numpy(),
                float(np.float32(rate)),
                hypers,
            )
        scale = np.abs(theirs["variables"][index]).max()
        np.testing.assert_allclose(
            value, theirs["variables"][index], rtol=1e-12, atol=1e-12 * scale
        )
        np.testing.assert_allclose(
            slots["accumulators"], theirs["accumulators"][index], rtol=1e-12
        )
        if flags["export_clipping_factors"]:
            np.testing.assert_allclose(
                slots["clipping_factor"],
                theirs["clipping_factors"][index],
                rtol=2.0**-24,
            )


def test_no_engine_runs_it_and_it_takes_no_engine_option() -> None:
    import dataclasses

    from tf_tpu_embed_opt.definitions import registry

    definition = registry.BY_NAME["ClippyAdagrad"]
    assert definition in registry.KERAS_ONLY
    assert definition not in registry.JAX_ONLY + registry.DEFINITIONS
    with pytest.raises(ValueError, match="runs on no engine"):
        dataclasses.replace(
            definition, keras=dataclasses.replace(definition.keras, engine_options=True)
        )
    # Keras refuses what the class does not take, naming it.
    with pytest.raises(ValueError, match="clip_weight_min"):
        ClippyAdagrad(clip_weight_min=-1.0)


def test_arguments_are_read_only_attributes_as_on_keras() -> None:
    import tf_tpu_embed_opt as teo

    assert teo.optimizers.Adam().beta_1 == keras.optimizers.Adam().beta_1
    assert teo.optimizers.Adagrad(epsilon=1e-3).epsilon == 1e-3
    with pytest.raises(AttributeError):
        ClippyAdagrad().epsilon = 0.5
    # NumPy scalars are kept as the Python values they equal (configs are JSON).
    config = teo.optimizers.Adam(beta_1=np.float32(0.5), amsgrad=np.bool_(True))
    assert type(config.get_config()["beta_1"]) is float
    assert config.get_config()["amsgrad"] is True
    adagrad = teo.optimizers.Adagrad()
    adagrad.build([keras.Variable(np.zeros((2, 2), np.float32))])
    assert [a.shape for a in adagrad._accumulators] == [(2, 2)]


def test_the_old_module_path_imports_with_a_warning() -> None:
    import subprocess
    import sys

    code = (
        "import warnings; warnings.simplefilter('always')\n"
        "from tf_tpu_embed_opt.optimizers.clippy_adagrad import ClippyAdagrad\n"
        "import tf_tpu_embed_opt.optimizers as o\n"
        "assert ClippyAdagrad is o.ClippyAdagrad\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "clippy_adagrad moved to tf_tpu_embed_opt.optimizers" in result.stderr
