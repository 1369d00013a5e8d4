"""Checks `to_keras` and `to_embedding` against independent oracles.

No test compares the package with itself. The oracles are:

* TensorFlow's CPU training kernels (`tf.raw_ops.ResourceSparseApply*`,
  `ResourceScatterSub`, and `ResourceApplyAdam` with beta powers 0 on the
  gathered rows), applied to a float32 table with a gradient whose duplicate
  ids the test sums itself with NumPy. `to_keras(embedding_opt)` applied to the
  same table with a `tf.IndexedSlices` gradient (duplicate ids) must agree with
  them over three steps, weights and every slot, and leave the rows (and slots)
  that were not looked up bit-for-bit unchanged (except non-lazy Adam).
* Formulas written here in NumPy from docs/tpu_semantics.md for the algorithms
  without a TF kernel: AdagradMomentum (§2.3), ProximalYogi (§2.12), Adam with
  the sum inside the square root (§2.5), and the engine order of gradient
  clipping, weight decay, update and weight clipping (§1.9).
* The golden numbers of docs/tpu_semantics.md §6 (SGD, Adagrad,
  AdagradMomentum, Adam, FTRL on the 8x4 `video` and 16x2 `user` tables).
* Stock Keras 3 optimizers (`keras.optimizers.Adam`, `SGD`, `Adagrad`, `Ftrl`,
  `RMSprop`, `Adadelta`) on dense gradients: their result must equal the
  engine's math (NumPy or TF kernels) run with the values of the converted
  embedding optimizer, its callable learning rate included.
* The documented refusals (DESIGN.md, Semantics §5 "Exact or explicit"): every
  setting that would change the math is named in the error (or in the warning
  with `strict=False`).
* Numbers worked out by hand: one row through the engine order; a row whose
  contributions cancel still being updated (§1.2); a twin's Keras `clipvalue`
  acting, like the engine's clip it converts to, on the summed row gradient;
  SGD without gradient accumulation applying each contribution as its own step
  (§1.2), which weight decay and weight clipping make differ from one summed
  step.
* Round trips: embedding -> Keras -> embedding gives an equal optimizer, and
  Keras twin -> embedding -> Keras gives an equal `get_config`.
"""

import dataclasses
import re
import sys
import warnings
from typing import Any, Callable, Mapping

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import arguments_for, as_written
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tf_tpu_embed_opt as teo
from tf_tpu_embed_opt.definitions import registry

TFE = tf.tpu.experimental.embedding

# Tolerances of a float32 computation against another float32 or float64 one.
RTOL = 1e-5
ATOL = 1e-6

ROWS, DIM = 10, 3
# Ids looked up at each step, with duplicates; rows 5, 6 and 8 are never
# looked up, and each step leaves rows looked up earlier untouched.
STEP_IDS = ((1, 4, 1, 7, 1), (4, 4, 2, 9), (0, 7, 9, 7, 3, 0))
_RNG = np.random.default_rng(20240611)
W0 = _RNG.normal(0.0, 1.0, (ROWS, DIM)).astype(np.float32)
STEP_VALUES = tuple(
    (_RNG.normal(0.0, 1.0, (len(ids), DIM)) * 1.5).astype(np.float32)
    for ids in STEP_IDS
)
# Learning rate factors per step for the callable-learning-rate runs.
RATE_FACTORS = (1.0, 0.5, 1.5)


def _f32(x):
    return tf.constant(x, tf.float32)


def _sum_duplicates(ids, values):
    """Distinct ids (ascending) and their summed rows, computed with NumPy."""
    unique, inverse = np.unique(np.asarray(ids), return_inverse=True)
    summed = np.zeros((len(unique), values.shape[1]), np.float32)
    np.add.at(summed, inverse.reshape(-1), values)
    return unique.astype(np.int32), summed


def _indexed_slices(ids, values, shape, index_dtype=tf.int32):
    return tf.IndexedSlices(
        tf.constant(values, tf.float32),
        tf.constant(ids, index_dtype),
        tf.constant(shape, tf.int64),
    )


def _slot(optimizer, table_name, slot_name):
    """The Keras optimizer's slot `slot_name` of the table `table_name`."""
    suffix = f"/{table_name}_{slot_name}"
    found = [v for v in optimizer.variables if v.path.endswith(suffix)]
    assert len(found) == 1, [v.path for v in optimizer.variables]
    return found[0].numpy()


# ---------------------------------------------------------------------------
# Oracles: TensorFlow kernels and NumPy formulas on (unique ids, summed rows).
# `state` maps "w" and the Keras slot names to NumPy arrays of the full table.
# ---------------------------------------------------------------------------


def _kernel(op, state, handles, **kwargs):
    """Runs the resource kernel `op` on float32 variables holding `state`."""
    variables = {
        key: tf.Variable(value, dtype=tf.float32) for key, value in state.items()
    }
    op(**{arg: variables[key].handle for arg, key in handles.items()}, **kwargs)
    state.update({key: variable.numpy() for key, variable in variables.items()})


def _rows(state, ids):
    return {key: value[ids].astype(np.float64) for key, value in state.items()}


def _store(state, ids, rows):
    for key, value in rows.items():
        table = state[key].astype(np.float64)
        table[ids] = value
        state[key] = table


def sgd_oracle(state, ids, g, lr, h):
    _kernel(
        tf.raw_ops.ResourceScatterSub,
        state,
        {"resource": "w"},
        indices=ids,
        updates=np.float32(lr) * g,
    )


def adagrad_oracle(state, ids, g, lr, h):
    _kernel(
        tf.raw_ops.ResourceSparseApplyAdagradV2,
        state,
        {"var": "w", "accum": "accumulator"},
        lr=_f32(lr),
        epsilon=_f32(0.0),
        grad=g,
        indices=ids,
    )


def momentum_oracle(state, ids, g, lr, h):
    _kernel(
        tf.raw_ops.ResourceSparseApplyMomentum,
        state,
        {"var": "w", "accum": "momentum"},
        lr=_f32(lr),
        grad=g,
        indices=ids,
        momentum=_f32(h["momentum"]),
        use_nesterov=h["use_nesterov"],
    )


def rms_prop_oracle(state, ids, g, lr, h):
    _kernel(
        tf.raw_ops.ResourceSparseApplyRMSProp,
        state,
        {"var": "w", "ms": "velocity", "mom": "momentum"},
        lr=_f32(lr),
        rho=_f32(h["rho"]),
        momentum=_f32(h["momentum"]),
        epsilon=_f32(h["epsilon"]),
        grad=g,
        indices=ids,
    )


def centered_rms_prop_oracle(state, ids, g, lr, h):
    _kernel(
        tf.raw_ops.ResourceSparseApplyCenteredRMSProp,
        state,
        {"var": "w", "mg": "average_gradient", "ms": "velocity", "mom": "momentum"},
        lr=_f32(lr),
        rho=_f32(h["rho"]),
        momentum=_f32(h["momentum"]),
        epsilon=_f32(h["epsilon"]),
        grad=g,
        indices=ids,
    )


def adadelta_oracle(state, ids, g, lr, h):
    _kernel(
        tf.raw_ops.ResourceSparseApplyAdadelta,
        state,
        {
            "var": "w",
            "accum": "accumulated_grad",
            "accum_update": "accumulated_delta_var",
        },
        lr=_f32(lr),
        rho=_f32(h["rho"]),
        epsilon=_f32(h["epsilon"]),
        grad=g,
        indices=ids,
    )


def proximal_adagrad_oracle(state, ids, g, lr, h):
    _kernel(
        tf.raw_ops.ResourceSparseApplyProximalAdagrad,
        state,
        {"var": "w", "accum": "accumulator"},
        lr=_f32(lr),
        l1=_f32(h["l1_regularization_strength"]),
        l2=_f32(h["l2_regularization_strength"]),
        grad=g,
        indices=ids,
    )


def ftrl_oracle(state, ids, g, lr, h):
    # FTRL-Proximal's beta is TensorFlow's l2 + beta / (2·lr) (proto comment).
    l2 = h["l2_regularization_strength"] + h["beta"] / (2 * lr)
    _kernel(
        tf.raw_ops.ResourceSparseApplyFtrlV2,
        state,
        {"var": "w", "accum": "accumulator", "linear": "linear"},
        grad=g,
        indices=ids,
        lr=_f32(lr),
        l1=_f32(h["l1_regularization_strength"]),
        l2=_f32(l2),
        l2_shrinkage=_f32(0.0),
        lr_power=_f32(h["learning_rate_power"]),
        multiply_linear_by_lr=h["multiply_linear_by_learning_rate"],
    )


def _apply_adam(variables, g, lr, h):
    tf.raw_ops.ResourceApplyAdam(
        var=variables["w"].handle,
        m=variables["momentum"].handle,
        v=variables["velocity"].handle,
        beta1_power=_f32(0.0),
        beta2_power=_f32(0.0),
        lr=_f32(lr),
        beta1=_f32(h["beta_1"]),
        beta2=_f32(h["beta_2"]),
        epsilon=_f32(h["epsilon"]),
        grad=g,
    )


def lazy_adam_oracle(state, ids, g, lr, h):
    """ApplyAdam (beta powers 0: no bias correction) on the gathered rows."""
    rows = {key: tf.Variable(state[key][ids]) for key in ("w", "momentum", "velocity")}
    _apply_adam(rows, g, lr, h)
    for key, row in rows.items():
        table = tf.Variable(state[key])
        tf.raw_ops.ResourceScatterUpdate(
            resource=table.handle, indices=ids, updates=row.numpy()
        )
        state[key] = table.numpy()


def dense_adam_oracle(state, ids, g, lr, h):
    """Non-lazy Adam: every row, with a zero gradient where none was given."""
    dense = np.zeros(state["w"].shape, np.float32)
    dense[ids] = g
    variables = {key: tf.Variable(state[key]) for key in ("w", "momentum", "velocity")}
    _apply_adam(variables, dense, lr, h)
    state.update({key: v.numpy() for key, v in variables.items()})


def adam_sum_inside_sqrt_oracle(state, ids, g, lr, h):
    """§2.5 with use_sum_inside_sqrt: w -= lr·m/sqrt(v + eps²), lazily."""
    r = _rows(state, ids)
    g = g.astype(np.float64)
    m = h["beta_1"] * r["momentum"] + (1 - h["beta_1"]) * g
    v = h["beta_2"] * r["velocity"] + (1 - h["beta_2"]) * g**2
    w = r["w"] - lr * m / np.sqrt(v + h["epsilon"] ** 2)
    _store(state, ids, {"w": w, "momentum": m, "velocity": v})


def adagrad_momentum_oracle(state, ids, g, lr, h):
    """docs/tpu_semantics.md §2.3 (SparseCore kernels, TF TPU tests)."""
    r = _rows(state, ids)
    g = g.astype(np.float64)
    if h["beta2"] == 1:
        a = r["accumulator"] + g**2
    else:
        a = h["beta2"] * r["accumulator"] + (1 - h["beta2"]) * g**2
    scaled = g * (a + h["epsilon"]) ** (-1.0 / h["exponent"])
    m = h["momentum"] * r["momentum"] + scaled
    u = h["momentum"] * m + scaled if h["use_nesterov"] else m
    _store(state, ids, {"w": r["w"] - lr * u, "accumulator": a, "momentum": m})


def proximal_yogi_oracle(state, ids, g, lr, h):
    """docs/tpu_semantics.md §2.12 (TF Addons Yogi, sign activation)."""
    r = _rows(state, ids)
    g = g.astype(np.float64)
    m = h["beta_1"] * r["m"] + (1 - h["beta_1"]) * g
    v = r["v"] + (1 - h["beta_2"]) * np.sign(g**2 - r["v"]) * g**2
    lr_eff = lr / (np.sqrt(v) + h["epsilon"])
    p = r["w"] - lr_eff * m
    l1, l2 = h["l1_regularization_strength"], h["l2_regularization_strength"]
    if l1 > 0:
        w = np.sign(p) * np.maximum(np.abs(p) - lr_eff * l1, 0.0) / (1 + lr_eff * l2)
    else:
        w = p / (1 + lr_eff * l2)
    _store(state, ids, {"w": w, "v": v, "m": m})


@dataclasses.dataclass(frozen=True)
class Case:
    """An embedding optimizer, its Keras slots and the oracle of its step."""

    id: str
    cls: str  # class name in teo.embedding (and in TensorFlow's namespace)
    lr: float
    hypers: Mapping[str, Any]
    slots: Mapping[str, float]  # Keras slot name -> initial value
    oracle: Callable[..., None]
    lazy: bool = True

    def make(self, namespace, learning_rate):
        return getattr(namespace, self.cls)(learning_rate=learning_rate, **self.hypers)


CASES = (
    Case("SGD", "SGD", 0.3, {}, {}, sgd_oracle),
    Case(
        "Adagrad",
        "Adagrad",
        0.2,
        {"initial_accumulator_value": 0.5},
        {"accumulator": 0.5},
        adagrad_oracle,
    ),
    Case(
        "AdagradMomentum-nesterov",
        "AdagradMomentum",
        0.05,
        {
            "momentum": 0.8,
            "use_nesterov": True,
            "exponent": 3.0,
            "beta2": 0.9,
            "epsilon": 0.01,
        },
        {"accumulator": 0.0, "momentum": 0.0},
        adagrad_momentum_oracle,
    ),
    Case(
        "AdagradMomentum-sum",
        "AdagradMomentum",
        0.05,
        {"momentum": 0.6, "exponent": 2.5, "beta2": 1.0, "epsilon": 0.1},
        {"accumulator": 0.0, "momentum": 0.0},
        adagrad_momentum_oracle,
    ),
    Case(
        "Adam-lazy",
        "Adam",
        0.02,
        {"beta_1": 0.8, "beta_2": 0.95, "epsilon": 1e-3, "sum_inside_sqrt": False},
        {"momentum": 0.0, "velocity": 0.0},
        lazy_adam_oracle,
    ),
    Case(
        "Adam-non-lazy",
        "Adam",
        0.02,
        {
            "beta_1": 0.8,
            "beta_2": 0.95,
            "epsilon": 1e-3,
            "lazy_adam": False,
            "sum_inside_sqrt": False,
        },
        {"momentum": 0.0, "velocity": 0.0},
        dense_adam_oracle,
        lazy=False,
    ),
    Case(
        "Adam-sum-inside-sqrt",
        "Adam",
        0.02,
        {"beta_1": 0.8, "beta_2": 0.95, "epsilon": 0.05, "sum_inside_sqrt": True},
        {"momentum": 0.0, "velocity": 0.0},
        adam_sum_inside_sqrt_oracle,
    ),
    Case(
        "FTRL",
        "FTRL",
        0.1,
        {
            "learning_rate_power": -0.6,
            "l1_regularization_strength": 0.05,
            "l2_regularization_strength": 0.02,
            "beta": 0.3,
            "initial_accumulator_value": 0.2,
        },
        {"accumulator": 0.2, "linear": 0.0},
        ftrl_oracle,
    ),
    Case(
        "FTRL-multiply-linear-by-lr",
        "FTRL",
        0.1,
        {
            "learning_rate_power": -0.5,
            "l1_regularization_strength": 0.05,
            "l2_regularization_strength": 0.02,
            "beta": 0.3,
            "initial_accumulator_value": 0.2,
            "multiply_linear_by_learning_rate": True,
        },
        {"accumulator": 0.2, "linear": 0.0},
        ftrl_oracle,
    ),
    Case(
        "Momentum",
        "Momentum",
        0.05,
        {"momentum": 0.7, "use_nesterov": False},
        {"momentum": 0.0},
        momentum_oracle,
    ),
    Case(
        "Momentum-nesterov",
        "Momentum",
        0.05,
        {"momentum": 0.7, "use_nesterov": True},
        {"momentum": 0.0},
        momentum_oracle,
    ),
    Case(
        "RMSProp",
        "RMSProp",
        0.01,
        {"rho": 0.8, "momentum": 0.5, "epsilon": 1e-3},
        {"velocity": 0.0, "momentum": 0.0},
        rms_prop_oracle,
    ),
    Case(
        "CenteredRMSProp",
        "CenteredRMSProp",
        0.01,
        {"rho": 0.8, "momentum": 0.5, "epsilon": 1e-3},
        {"velocity": 0.0, "momentum": 0.0, "average_gradient": 0.0},
        centered_rms_prop_oracle,
    ),
    Case(
        "Adadelta",
        "Adadelta",
        0.5,
        {"rho": 0.8, "epsilon": 1e-3},
        {"accumulated_grad": 0.0, "accumulated_delta_var": 0.0},
        adadelta_oracle,
    ),
    Case(
        "ProximalAdagrad",
        "ProximalAdagrad",
        0.2,
        {
            "initial_accumulator_value": 0.3,
            "l1_regularization_strength": 0.05,
            "l2_regularization_strength": 0.1,
        },
        {"accumulator": 0.3},
        proximal_adagrad_oracle,
    ),
    Case(
        "ProximalYogi",
        "ProximalYogi",
        0.05,
        {
            "beta_1": 0.8,
            "beta_2": 0.9,
            "epsilon": 1e-2,
            "l1_regularization_strength": 0.01,
            "l2_regularization_strength": 0.05,
            "initial_accumulator_value": 0.5,
        },
        {"v": 0.5, "m": 0.0},
        proximal_yogi_oracle,
    ),
)

# Hyperparameters the oracles read that the cases leave at their default.
_ORACLE_DEFAULTS = {
    "use_nesterov": False,
    "multiply_linear_by_learning_rate": False,
    "l1_regularization_strength": 0.0,
    "l2_regularization_strength": 0.0,
    "beta": 0.0,
}

TENSORFLOW_CLASSES = ("SGD", "Adagrad", "AdagradMomentum", "Adam", "FTRL")


def _run_sparse_case(case, namespace, rates):
    """Runs the twin and the oracle for three steps; checks them step by step."""
    constant = len(set(rates)) == 1
    current = {"rate": rates[0]}
    learning_rate = rates[0] if constant else (lambda: current["rate"])
    embedding_opt = case.make(namespace, learning_rate)
    keras_opt = teo.to_keras(embedding_opt)
    assert isinstance(keras_opt, keras.optimizers.Optimizer)

    table = keras.Variable(W0, name="table")
    keras_opt.build([table])
    state = {"w": W0.copy()}
    state.update(
        {
            name: np.full((ROWS, DIM), value, np.float32)
            for name, value in case.slots.items()
        }
    )
    hypers = {**_ORACLE_DEFAULTS, **case.hypers}
    touched = set()
    for ids, values, rate in zip(STEP_IDS, STEP_VALUES, rates):
        current["rate"] = rate
        before = table.numpy().copy()
        before_slots = {name: _slot(keras_opt, "table", name) for name in case.slots}
        keras_opt.apply_gradients([(_indexed_slices(ids, values, (ROWS, DIM)), table)])
        unique, summed = _sum_duplicates(ids, values)
        case.oracle(state, unique, summed, rate, hypers)

        after = table.numpy()
        np.testing.assert_allclose(after, state["w"], rtol=RTOL, atol=ATOL)
        for name in case.slots:
            np.testing.assert_allclose(
                _slot(keras_opt, "table", name),
                state[name],
                rtol=RTOL,
                atol=ATOL,
                err_msg=f"slot {name}",
            )
        untouched = np.setdiff1d(np.arange(ROWS), unique)
        if case.lazy:
            # Rows (and slot rows) not looked up in this step stay bit-exact.
            np.testing.assert_array_equal(after[untouched], before[untouched])
            for name in case.slots:
                np.testing.assert_array_equal(
                    _slot(keras_opt, "table", name)[untouched],
                    before_slots[name][untouched],
                )
        else:
            # Non-lazy Adam: rows looked up earlier (non-zero momentum) move
            # although this step does not look them up.
            for row in sorted(touched - set(unique.tolist())):
                assert not np.array_equal(after[row], before[row]), row
        touched.update(unique.tolist())


@pytest.mark.parametrize("rate_kind", ["constant", "callable"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_to_keras_sparse_matches_engine_oracle(case, rate_kind):
    factors = (1.0, 1.0, 1.0) if rate_kind == "constant" else RATE_FACTORS
    _run_sparse_case(case, teo.embedding, tuple(case.lr * f for f in factors))


@pytest.mark.parametrize(
    "case", [c for c in CASES if c.cls in TENSORFLOW_CLASSES], ids=lambda c: c.id
)
def test_to_keras_accepts_tensorflow_classes(case):
    """TensorFlow's own `tf.tpu.experimental.embedding` instances convert too."""
    _run_sparse_case(case, TFE, (case.lr,) * 3)


def test_to_keras_tensorflow_adagrad_is_the_twin():
    keras_opt = teo.to_keras(
        TFE.Adagrad(learning_rate=0.2, initial_accumulator_value=0.5)
    )
    assert type(keras_opt) is teo.optimizers.Adagrad
    config = keras_opt.get_config()
    assert config["initial_accumulator_value"] == 0.5
    assert config["epsilon"] == 0.0


def test_to_keras_covers_every_embedding_class():
    covered = {case.cls for case in CASES}
    assert covered == {d.name for d in registry.DEFINITIONS}
    assert len(covered) == 11


def test_to_keras_rms_prop_variants():
    assert teo.to_keras(teo.embedding.RMSProp()).get_config()["centered"] is False
    assert (
        teo.to_keras(teo.embedding.CenteredRMSProp()).get_config()["centered"] is True
    )
    assert type(teo.to_keras(teo.embedding.CenteredRMSProp())) is teo.optimizers.RMSprop


# ---------------------------------------------------------------------------
# Engine options: gradient clip -> w -= λ·w -> update -> weight clip (§1.9).
# ---------------------------------------------------------------------------

ENGINE_SETTINGS = {
    "clipvalue-scalar": {"clipvalue": 0.6},
    "clipvalue-asymmetric": {"clipvalue": (-0.4, 0.9)},
    "clipvalue-lower-only": {"clipvalue": (-0.3, None)},
    "weight-clip": {"clip_weight_min": -0.8, "clip_weight_max": 0.7},
    "decay": {"weight_decay_factor": 0.05},
    "decay-times-lr": {
        "weight_decay_factor": 0.5,
        "multiply_weight_decay_factor_by_learning_rate": True,
    },
    "everything": {
        "clipvalue": (-0.4, 0.9),
        "clip_weight_min": -0.8,
        "clip_weight_max": 0.7,
        "weight_decay_factor": 0.5,
        "multiply_weight_decay_factor_by_learning_rate": True,
    },
    "everything-decay-not-times-lr": {
        "clipvalue": 0.5,
        "clip_weight_min": -1.0,
        "clip_weight_max": 0.9,
        "weight_decay_factor": 0.1,
        "multiply_weight_decay_factor_by_learning_rate": False,
    },
}


def _engine_numpy_step(algorithm, w, acc, ids, g, lr, settings_):
    """Hand-written engine step on the touched rows of float64 `w` and `acc`."""
    g = g.astype(np.float64)
    clip = settings_.get("clipvalue")
    if clip is not None:
        low, high = (-clip, clip) if not isinstance(clip, tuple) else clip
        if low is not None:
            g = np.maximum(g, low)
        if high is not None:
            g = np.minimum(g, high)
    rows = w[ids]
    decay = settings_.get("weight_decay_factor")
    if decay:
        if settings_.get("multiply_weight_decay_factor_by_learning_rate"):
            decay = decay * lr
        rows = rows - decay * rows
    if algorithm == "SGD":
        rows = rows - lr * g
    else:
        acc[ids] = acc[ids] + g**2
        rows = rows - lr * g / np.sqrt(acc[ids])
    if settings_.get("clip_weight_min") is not None:
        rows = np.maximum(rows, settings_["clip_weight_min"])
    if settings_.get("clip_weight_max") is not None:
        rows = np.minimum(rows, settings_["clip_weight_max"])
    w[ids] = rows


@pytest.mark.parametrize("setting", sorted(ENGINE_SETTINGS))
@pytest.mark.parametrize("algorithm", ["SGD", "Adagrad"])
def test_to_keras_engine_options_in_engine_order(algorithm, setting):
    settings_ = ENGINE_SETTINGS[setting]
    lr = 0.3
    if algorithm == "SGD":
        embedding_opt = teo.embedding.SGD(learning_rate=lr, **settings_)
    else:
        embedding_opt = teo.embedding.Adagrad(
            learning_rate=lr, initial_accumulator_value=0.4, **settings_
        )
    keras_opt = teo.to_keras(embedding_opt)
    # Weights partly outside the clip range, so untouched rows show that only
    # looked-up rows are decayed and clipped.
    w0 = W0 * 1.5
    table = keras.Variable(w0, name="table")
    w = w0.astype(np.float64)
    acc = np.full((ROWS, DIM), 0.4)
    for ids, values in zip(STEP_IDS, STEP_VALUES):
        before = table.numpy().copy()
        keras_opt.apply_gradients([(_indexed_slices(ids, values, (ROWS, DIM)), table)])
        unique, summed = _sum_duplicates(ids, values)
        _engine_numpy_step(algorithm, w, acc, unique, summed, lr, settings_)
        np.testing.assert_allclose(table.numpy(), w, rtol=RTOL, atol=ATOL)
        untouched = np.setdiff1d(np.arange(ROWS), unique)
        np.testing.assert_array_equal(table.numpy()[untouched], before[untouched])
        if algorithm == "Adagrad":
            np.testing.assert_allclose(
                _slot(keras_opt, "table", "accumulator"), acc, rtol=RTOL, atol=ATOL
            )


def test_to_keras_engine_order_is_visible():
    """Hand-computed single row: the order matters and is the engine's."""
    embedding_opt = teo.embedding.SGD(
        learning_rate=0.5,
        clipvalue=(-1.0, 2.0),
        weight_decay_factor=0.2,
        multiply_weight_decay_factor_by_learning_rate=True,
        clip_weight_min=-3.0,
        clip_weight_max=3.5,
    )
    keras_opt = teo.to_keras(embedding_opt)
    table = keras.Variable(np.array([[4.0, -4.0, 1.0], [9.0, 9.0, 9.0]], np.float32))
    # Row 0 gets the contributions [1, -3, 5] + [2, 0, -1] = [3, -3, 4].
    gradient = _indexed_slices(
        [0, 0], np.array([[1, -3, 5], [2, 0, -1]], np.float32), (2, 3)
    )
    keras_opt.apply_gradients([(gradient, table)])
    # g clipped to [2, -1, 2]; decay λ·η = 0.1: w = [3.6, -3.6, 0.9];
    # w - 0.5·g = [2.6, -3.1, -0.1]; clipped to [-3, 3.5]: [2.6, -3.0, -0.1].
    np.testing.assert_allclose(
        table.numpy(), [[2.6, -3.0, -0.1], [9.0, 9.0, 9.0]], rtol=RTOL, atol=ATOL
    )


# ---------------------------------------------------------------------------
# Golden numbers of docs/tpu_semantics.md §6 through to_keras.
# ---------------------------------------------------------------------------

# Contributions per table whose duplicates sum to the golden row gradients:
# video rows 0 and 1: [[8, 13, 18, 23], [12, 17, 22, 27]];
# user rows 0, 1, 2: [2/3, 1]; user row 3: [6, 7].
VIDEO_IDS = [0, 1, 0, 1, 0]
VIDEO_VALUES = np.array(
    [[3, 5, 7, 9], [2, 2, 2, 2], [4, 6, 8, 10], [10, 15, 20, 25], [1, 2, 3, 4]],
    np.float32,
)
USER_IDS = [3, 0, 1, 2, 0, 3]
USER_VALUES = np.array(
    [[2, 3], [1 / 3, 0.5], [2 / 3, 1], [2 / 3, 1], [1 / 3, 0.5], [4, 4]], np.float32
)

GOLDEN = {
    "SGD": (
        lambda: teo.embedding.SGD(learning_rate=0.1),
        {
            "video0": [-0.8, -0.3, 0.2, 0.7],
            "video1": [2.8, 3.3, 3.8, 4.3],
            "user0": [-0.066667, 0.9],
            "user3": [5.4, 6.3],
        },
        {},
    ),
    "Adagrad": (
        lambda: teo.embedding.Adagrad(learning_rate=0.1, initial_accumulator_value=0.1),
        {
            "video0": [-0.099922, 0.90003, 1.900015, 2.900009],
            "video1": [3.900035, 4.900017, 5.90001, 6.900007],
            "user0": [-0.090351, 0.904654],
            "user3": [5.900139, 6.900102],
        },
        {"accumulator": [64.1, 169.1, 324.1, 529.1]},
    ),
    "AdagradMomentum": (
        lambda: teo.embedding.AdagradMomentum(
            learning_rate=0.1,
            momentum=0.9,
            use_nesterov=True,
            exponent=3,
            epsilon=0.1,
            beta2=0.9,
        ),
        {
            "video0": [-0.814465, 0.03939, 0.92832, 1.836617],
            "video1": [3.064999, 3.948676, 4.853795, 5.772533],
            "user0": [-0.241414, 0.675105],
            "user3": [5.262938, 6.222211],
        },
        {
            "accumulator": [6.4, 16.9, 32.4, 52.9],
            "momentum": [4.286658, 5.055845, 5.640419, 6.12307],
        },
    ),
    "Adam": (
        lambda: teo.embedding.Adam(
            learning_rate=0.1,
            beta_1=0.9,
            beta_2=0.999,
            epsilon=1e-7,
            sum_inside_sqrt=True,
        ),
        {
            "video0": [-0.316228, 0.683772, 1.683772, 2.683772],
            "video1": [3.683772, 4.683772, 5.683772, 6.683772],
            "user0": [-0.316228, 0.683772],
            "user3": [5.683772, 6.683772],
        },
        {
            "momentum": [0.8, 1.3, 1.8, 2.3],
            "velocity": [0.064, 0.169, 0.324, 0.529],
        },
    ),
    "FTRL": (
        lambda: teo.embedding.FTRL(
            learning_rate=0.1, learning_rate_power=-0.5, initial_accumulator_value=0.1
        ),
        {
            "video0": [-0.099922, 0.875712, 1.864884, 2.858766],
            "video1": [3.794662, 4.807025, 5.813775, 6.818028],
            "user0": [-0.090351, 0.603142],
            "user3": [5.584349, 6.584196],
        },
        {
            "accumulator": [64.1, 169.1, 324.1, 529.1],
            "linear": [8, -113.876178, -335.730996, -657.578381],
        },
    ),
}


def test_golden_gradients_sum_as_documented():
    _, video = _sum_duplicates(VIDEO_IDS, VIDEO_VALUES)
    np.testing.assert_allclose(video, [[8, 13, 18, 23], [12, 17, 22, 27]])
    _, user = _sum_duplicates(USER_IDS, USER_VALUES)
    np.testing.assert_allclose(user, [[2 / 3, 1]] * 3 + [[6, 7]], rtol=1e-6)


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_to_keras_golden_numbers(name):
    make, rows, slots = GOLDEN[name]
    keras_opt = teo.to_keras(make())
    video0 = np.arange(32, dtype=np.float32).reshape(8, 4)
    user0 = np.arange(32, dtype=np.float32).reshape(16, 2)
    video = keras.Variable(video0, name="video")
    user = keras.Variable(user0, name="user")
    keras_opt.apply_gradients(
        [
            (_indexed_slices(VIDEO_IDS, VIDEO_VALUES, (8, 4)), video),
            (_indexed_slices(USER_IDS, USER_VALUES, (16, 2)), user),
        ]
    )
    # float32 against golden numbers given to 6 decimals (slots up to ~657):
    # their rounding (5e-7) plus a few float32 ulps.
    tolerance = {"rtol": 3e-7, "atol": 1e-6}
    np.testing.assert_allclose(video.numpy()[0], rows["video0"], **tolerance)
    np.testing.assert_allclose(video.numpy()[1], rows["video1"], **tolerance)
    np.testing.assert_allclose(user.numpy()[0], rows["user0"], **tolerance)
    np.testing.assert_allclose(user.numpy()[3], rows["user3"], **tolerance)
    # Untouched rows are unchanged, bit for bit.
    np.testing.assert_array_equal(video.numpy()[2:], video0[2:])
    np.testing.assert_array_equal(user.numpy()[4:], user0[4:])
    for slot, expected in slots.items():
        np.testing.assert_allclose(
            _slot(keras_opt, "video", slot)[0], expected, **tolerance, err_msg=slot
        )


# ---------------------------------------------------------------------------
# to_embedding of stock Keras optimizers: stock Keras vs the engine's math run
# with the converted optimizer's values.
# ---------------------------------------------------------------------------

DENSE_W0 = _RNG.normal(0.0, 1.0, (4, 3)).astype(np.float32)
DENSE_GRADS = tuple(
    (_RNG.normal(0.0, 1.0, (4, 3)) * (1.0 + step)).astype(np.float32)
    for step in range(4)
)


def _rate_now(embedding_opt):
    rate = embedding_opt.learning_rate
    return float(rate()) if callable(rate) else float(rate)


def _run_stock(keras_opt, embedding_opt):
    """Four stock Keras steps; the converted learning rate read before each."""
    variable = keras.Variable(DENSE_W0)
    results, rates = [], []
    for gradient in DENSE_GRADS:
        rates.append(_rate_now(embedding_opt))
        keras_opt.apply_gradients([(tf.constant(gradient), variable)])
        results.append(variable.numpy().copy())
    return results, rates


def _convert(keras_opt, expected_class, lazy_differs=False):
    """The conversion; exact but for Keras's non-lazy rule if `lazy_differs`.

    Stock Keras RMSprop, Adadelta, Ftrl and SGD with momentum step every row of
    a sparse gradient, the engine only the looked-up rows: the conversion then
    warns about exactly that (README, `lazy`); the dense math is exact.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        embedding_opt = teo.to_embedding(keras_opt, strict=not lazy_differs)
    messages = [str(w.message) for w in caught]
    if lazy_differs:
        assert len(messages) == 1 and "lazy=False" in messages[0], messages
        assert "; " not in messages[0], messages  # the only difference
    else:
        assert not messages, messages  # an exact conversion warns about nothing
    assert type(embedding_opt) is expected_class
    return embedding_opt


ADAM_CASES = {
    "default": lambda: keras.optimizers.Adam(),
    "non-default": lambda: keras.optimizers.Adam(
        learning_rate=0.05, beta_1=0.8, beta_2=0.95, epsilon=1e-4
    ),
    "schedule": lambda: keras.optimizers.Adam(
        learning_rate=keras.optimizers.schedules.ExponentialDecay(
            0.05, decay_steps=2, decay_rate=0.5
        ),
        beta_1=0.7,
        beta_2=0.9,
        epsilon=1e-3,
    ),
}


@pytest.mark.parametrize("which", sorted(ADAM_CASES))
def test_to_embedding_stock_adam_is_exact(which):
    keras_opt = ADAM_CASES[which]()
    embedding_opt = _convert(keras_opt, teo.embedding.Adam)
    assert embedding_opt.lazy_adam is False
    assert embedding_opt.sum_inside_sqrt is False
    assert embedding_opt.beta_1 == keras_opt.beta_1
    assert embedding_opt.beta_2 == keras_opt.beta_2
    assert embedding_opt.epsilon == keras_opt.epsilon
    assert callable(embedding_opt.learning_rate)

    results, rates = _run_stock(keras_opt, embedding_opt)
    b1, b2, eps = embedding_opt.beta_1, embedding_opt.beta_2, embedding_opt.epsilon
    w = DENSE_W0.astype(np.float64)
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    for gradient, rate, result in zip(DENSE_GRADS, rates, results):
        g = gradient.astype(np.float64)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g**2
        w = w - rate * m / (np.sqrt(v) + eps)
        np.testing.assert_allclose(result, w, rtol=RTOL, atol=ATOL)


def test_to_embedding_adam_learning_rate_is_keras_bias_correction():
    keras_opt = keras.optimizers.Adam(learning_rate=0.01, beta_1=0.8, beta_2=0.9)
    embedding_opt = teo.to_embedding(keras_opt)
    variable = keras.Variable(DENSE_W0)
    for step in range(1, 4):
        expected = 0.01 * np.sqrt(1 - 0.9**step) / (1 - 0.8**step)
        np.testing.assert_allclose(
            float(embedding_opt.learning_rate()), expected, rtol=1e-6
        )
        keras_opt.apply_gradients([(tf.constant(DENSE_GRADS[0]), variable)])


def _kernel_steps(make_state, apply, rates):
    """Runs `apply(variables, gradient, rate)` over the dense gradients."""
    variables = {k: tf.Variable(v, dtype=tf.float32) for k, v in make_state().items()}
    results = []
    for gradient, rate in zip(DENSE_GRADS, rates):
        apply(variables, tf.constant(gradient), rate)
        results.append(variables["w"].numpy().copy())
    return results


def _assert_steps_close(actual, expected):
    for step, (a, e) in enumerate(zip(actual, expected)):
        np.testing.assert_allclose(a, e, rtol=RTOL, atol=ATOL, err_msg=f"step {step}")


SGD_CASES = {
    "constant": lambda: keras.optimizers.SGD(learning_rate=0.05),
    "schedule": lambda: keras.optimizers.SGD(
        learning_rate=keras.optimizers.schedules.ExponentialDecay(
            0.1, decay_steps=1, decay_rate=0.7
        )
    ),
    "clipvalue": lambda: keras.optimizers.SGD(learning_rate=0.05, clipvalue=0.5),
}


@pytest.mark.parametrize("which", sorted(SGD_CASES))
def test_to_embedding_stock_sgd_is_exact(which):
    keras_opt = SGD_CASES[which]()
    embedding_opt = _convert(keras_opt, teo.embedding.SGD)
    if which == "clipvalue":
        assert (embedding_opt.clip_gradient_min, embedding_opt.clip_gradient_max) == (
            -0.5,
            0.5,
        )
    results, rates = _run_stock(keras_opt, embedding_opt)

    def apply(variables, gradient, rate):
        if embedding_opt.clip_gradient_min is not None:
            gradient = tf.clip_by_value(
                gradient,
                embedding_opt.clip_gradient_min,
                embedding_opt.clip_gradient_max,
            )
        tf.raw_ops.ResourceApplyGradientDescent(
            var=variables["w"].handle, alpha=_f32(rate), delta=gradient
        )

    _assert_steps_close(results, _kernel_steps(lambda: {"w": DENSE_W0}, apply, rates))


@pytest.mark.parametrize("nesterov", [False, True])
def test_to_embedding_stock_sgd_momentum_is_tf1_momentum(nesterov):
    keras_opt = keras.optimizers.SGD(
        learning_rate=0.05, momentum=0.9, nesterov=nesterov
    )
    embedding_opt = _convert(keras_opt, teo.embedding.Momentum, lazy_differs=True)
    assert embedding_opt.momentum == 0.9
    assert embedding_opt.use_nesterov is nesterov
    assert embedding_opt.learning_rate == 0.05
    results, rates = _run_stock(keras_opt, embedding_opt)

    def apply(variables, gradient, rate):
        tf.raw_ops.ResourceApplyMomentum(
            var=variables["w"].handle,
            accum=variables["m"].handle,
            lr=_f32(rate),
            grad=gradient,
            momentum=_f32(embedding_opt.momentum),
            use_nesterov=embedding_opt.use_nesterov,
        )

    expected = _kernel_steps(
        lambda: {"w": DENSE_W0, "m": np.zeros_like(DENSE_W0)}, apply, rates
    )
    _assert_steps_close(results, expected)


ADAGRAD_CASES = {
    # Keras's default epsilon 1e-7: 1e-7 / (2·0.1) <= 1e-6, negligible.
    "default-epsilon": lambda: keras.optimizers.Adagrad(learning_rate=0.1),
    "epsilon-0": lambda: keras.optimizers.Adagrad(
        learning_rate=0.2, initial_accumulator_value=0.5, epsilon=0.0
    ),
    # At the bound exactly: 2e-7 / (2·0.1) = 1e-6.
    "epsilon-at-bound": lambda: keras.optimizers.Adagrad(
        learning_rate=0.1, initial_accumulator_value=0.1, epsilon=2e-7
    ),
}


@pytest.mark.parametrize("which", sorted(ADAGRAD_CASES))
def test_to_embedding_stock_adagrad_is_exact(which):
    keras_opt = ADAGRAD_CASES[which]()
    embedding_opt = _convert(keras_opt, teo.embedding.Adagrad)
    assert (
        embedding_opt.initial_accumulator_value == keras_opt.initial_accumulator_value
    )
    results, rates = _run_stock(keras_opt, embedding_opt)

    def apply(variables, gradient, rate):
        tf.raw_ops.ResourceApplyAdagradV2(
            var=variables["w"].handle,
            accum=variables["a"].handle,
            lr=_f32(rate),
            epsilon=_f32(0.0),
            grad=gradient,
        )

    initial = embedding_opt.initial_accumulator_value
    expected = _kernel_steps(
        lambda: {"w": DENSE_W0, "a": np.full_like(DENSE_W0, initial)}, apply, rates
    )
    _assert_steps_close(results, expected)


def test_adagrad_epsilon_tolerance_constant():
    from tf_tpu_embed_opt.conversions import faces

    assert faces.ADAGRAD_EPSILON_TOLERANCE == 1e-6


FTRL_CASES = {
    "default": lambda: keras.optimizers.Ftrl(learning_rate=0.1),
    "non-default": lambda: keras.optimizers.Ftrl(
        learning_rate=0.1,
        learning_rate_power=-0.6,
        initial_accumulator_value=0.2,
        l1_regularization_strength=0.05,
        l2_regularization_strength=0.02,
        beta=0.3,
    ),
    "schedule": lambda: keras.optimizers.Ftrl(
        learning_rate=keras.optimizers.schedules.ExponentialDecay(
            0.2, decay_steps=1, decay_rate=0.8
        ),
        l1_regularization_strength=0.01,
        beta=0.5,
    ),
}


@pytest.mark.parametrize("which", sorted(FTRL_CASES))
def test_to_embedding_stock_ftrl_is_exact(which):
    keras_opt = FTRL_CASES[which]()
    e = _convert(keras_opt, teo.embedding.FTRL, lazy_differs=True)
    assert e.learning_rate_power == keras_opt.learning_rate_power
    assert e.l1_regularization_strength == keras_opt.l1_regularization_strength
    assert e.l2_regularization_strength == keras_opt.l2_regularization_strength
    assert e.beta == keras_opt.beta
    assert e.initial_accumulator_value == keras_opt.initial_accumulator_value
    results, rates = _run_stock(keras_opt, e)

    def apply(variables, gradient, rate):
        tf.raw_ops.ResourceApplyFtrlV2(
            var=variables["w"].handle,
            accum=variables["a"].handle,
            linear=variables["l"].handle,
            grad=gradient,
            lr=_f32(rate),
            l1=_f32(e.l1_regularization_strength),
            l2=_f32(e.l2_regularization_strength + e.beta / (2 * rate)),
            l2_shrinkage=_f32(0.0),
            lr_power=_f32(e.learning_rate_power),
            multiply_linear_by_lr=e.multiply_linear_by_learning_rate,
        )

    expected = _kernel_steps(
        lambda: {
            "w": DENSE_W0,
            "a": np.full_like(DENSE_W0, e.initial_accumulator_value),
            "l": np.zeros_like(DENSE_W0),
        },
        apply,
        rates,
    )
    _assert_steps_close(results, expected)


RMS_CASES = {
    "default": (keras.optimizers.RMSprop, {}),
    "momentum": (
        keras.optimizers.RMSprop,
        {"learning_rate": 0.01, "rho": 0.8, "momentum": 0.5, "epsilon": 1e-3},
    ),
    "centered": (
        keras.optimizers.RMSprop,
        {
            "learning_rate": 0.01,
            "rho": 0.8,
            "momentum": 0.5,
            "epsilon": 1e-3,
            "centered": True,
        },
    ),
    "centered-no-momentum": (
        keras.optimizers.RMSprop,
        {"learning_rate": 0.02, "rho": 0.7, "centered": True},
    ),
}


@pytest.mark.parametrize("which", sorted(RMS_CASES))
def test_to_embedding_stock_rmsprop_is_exact(which):
    cls, kwargs = RMS_CASES[which]
    keras_opt = cls(**kwargs)
    centered = kwargs.get("centered", False)
    expected_class = (
        teo.embedding.CenteredRMSProp if centered else teo.embedding.RMSProp
    )
    e = _convert(keras_opt, expected_class, lazy_differs=True)
    assert (e.rho, e.momentum, e.epsilon) == (
        keras_opt.rho,
        keras_opt.momentum,
        keras_opt.epsilon,
    )
    results, rates = _run_stock(keras_opt, e)

    def apply(variables, gradient, rate):
        common = dict(
            lr=_f32(rate),
            rho=_f32(e.rho),
            momentum=_f32(e.momentum),
            epsilon=_f32(e.epsilon),
            grad=gradient,
        )
        if centered:
            tf.raw_ops.ResourceApplyCenteredRMSProp(
                var=variables["w"].handle,
                mg=variables["mg"].handle,
                ms=variables["ms"].handle,
                mom=variables["mom"].handle,
                **common,
            )
        else:
            tf.raw_ops.ResourceApplyRMSProp(
                var=variables["w"].handle,
                ms=variables["ms"].handle,
                mom=variables["mom"].handle,
                **common,
            )

    zeros = np.zeros_like(DENSE_W0)
    expected = _kernel_steps(
        lambda: {"w": DENSE_W0, "ms": zeros, "mom": zeros, "mg": zeros}, apply, rates
    )
    _assert_steps_close(results, expected)


@pytest.mark.parametrize(
    "kwargs", [{}, {"learning_rate": 0.5, "rho": 0.8, "epsilon": 1e-3}]
)
def test_to_embedding_stock_adadelta_is_exact(kwargs):
    keras_opt = keras.optimizers.Adadelta(**kwargs)
    e = _convert(keras_opt, teo.embedding.Adadelta, lazy_differs=True)
    assert (e.rho, e.epsilon) == (keras_opt.rho, keras_opt.epsilon)
    results, rates = _run_stock(keras_opt, e)

    def apply(variables, gradient, rate):
        tf.raw_ops.ResourceApplyAdadelta(
            var=variables["w"].handle,
            accum=variables["acc"].handle,
            accum_update=variables["upd"].handle,
            lr=_f32(rate),
            rho=_f32(e.rho),
            epsilon=_f32(e.epsilon),
            grad=gradient,
        )

    zeros = np.zeros_like(DENSE_W0)
    expected = _kernel_steps(
        lambda: {"w": DENSE_W0, "acc": zeros, "upd": zeros}, apply, rates
    )
    _assert_steps_close(results, expected)


@pytest.mark.parametrize(
    "rate, expected",
    [(0.01, 0.01), (0.001, 0.001), (0.3, 0.3), (1 / 3, 0.33333334)],
)
def test_to_embedding_constant_learning_rate_is_the_written_decimal(rate, expected):
    embedding_opt = teo.to_embedding(keras.optimizers.SGD(learning_rate=rate))
    assert embedding_opt.learning_rate == expected
    assert np.float32(embedding_opt.learning_rate) == np.float32(rate)


# ---------------------------------------------------------------------------
# Refusals: every setting that would change the math is named.
# ---------------------------------------------------------------------------


def _schedule():
    return keras.optimizers.schedules.ExponentialDecay(
        0.1, decay_steps=10, decay_rate=0.9
    )


REFUSALS = {
    "weight_decay": (lambda: keras.optimizers.SGD(weight_decay=0.01), ["weight_decay"]),
    "clipnorm": (lambda: keras.optimizers.Adagrad(clipnorm=1.0), ["clipnorm=1.0"]),
    "global_clipnorm": (
        lambda: keras.optimizers.Adam(global_clipnorm=2.0),
        ["global_clipnorm"],
    ),
    "use_ema": (lambda: keras.optimizers.Adam(use_ema=True), ["use_ema"]),
    "gradient_accumulation_steps": (
        lambda: keras.optimizers.Adagrad(gradient_accumulation_steps=2),
        ["gradient_accumulation_steps"],
    ),
    "amsgrad": (lambda: keras.optimizers.Adam(amsgrad=True), ["amsgrad"]),
    "l2_shrinkage": (
        lambda: keras.optimizers.Ftrl(l2_shrinkage_regularization_strength=0.1),
        ["l2_shrinkage_regularization_strength"],
    ),
    "adagrad-epsilon": (
        lambda: keras.optimizers.Adagrad(epsilon=1e-3),
        ["epsilon"],
    ),
    "adagrad-epsilon-just-above-bound": (
        lambda: keras.optimizers.Adagrad(initial_accumulator_value=0.1, epsilon=3e-7),
        ["epsilon"],
    ),
    "sgd-momentum-schedule": (
        lambda: keras.optimizers.SGD(learning_rate=_schedule(), momentum=0.9),
        ["momentum"],
    ),
    "sgd-momentum-callable": (
        lambda: keras.optimizers.SGD(learning_rate=lambda: 0.1, momentum=0.9),
        ["momentum"],
    ),
    # Keras divides every gradient by loss_scale_factor (the loss was scaled
    # by it); the engine applies the gradient it receives as it is.
    "loss_scale_factor": (
        lambda: keras.optimizers.SGD(learning_rate=0.1, loss_scale_factor=4.0),
        ["loss_scale_factor"],
    ),
    "several": (
        lambda: keras.optimizers.Adam(
            amsgrad=True, weight_decay=0.004, clipnorm=1.0, use_ema=True
        ),
        ["amsgrad", "weight_decay", "clipnorm", "use_ema"],
    ),
    "several-ftrl": (
        lambda: keras.optimizers.Ftrl(
            l2_shrinkage_regularization_strength=0.1,
            global_clipnorm=1.0,
            gradient_accumulation_steps=3,
        ),
        [
            "l2_shrinkage_regularization_strength",
            "global_clipnorm",
            "gradient_accumulation_steps",
        ],
    ),
    # This package's twins are held to the same rules.
    "twin-amsgrad": (lambda: teo.optimizers.Adam(amsgrad=True), ["amsgrad"]),
    "twin-weight_decay": (
        lambda: teo.optimizers.Adagrad(weight_decay=0.1),
        ["weight_decay"],
    ),
    "twin-l2_shrinkage": (
        lambda: teo.optimizers.Ftrl(l2_shrinkage_regularization_strength=0.2),
        ["l2_shrinkage_regularization_strength"],
    ),
    "twin-adagrad-epsilon": (
        lambda: teo.optimizers.Adagrad(epsilon=1e-2),
        ["epsilon"],
    ),
    "twin-sgd-momentum-schedule": (
        lambda: teo.optimizers.SGD(learning_rate=_schedule(), momentum=0.5),
        ["momentum"],
    ),
}

# What `strict=False` converts each refused optimizer to.
REFUSED_TARGETS = {
    "weight_decay": teo.embedding.SGD,
    "clipnorm": teo.embedding.Adagrad,
    "global_clipnorm": teo.embedding.Adam,
    "use_ema": teo.embedding.Adam,
    "gradient_accumulation_steps": teo.embedding.Adagrad,
    "amsgrad": teo.embedding.Adam,
    "l2_shrinkage": teo.embedding.FTRL,
    "adagrad-epsilon": teo.embedding.Adagrad,
    "adagrad-epsilon-just-above-bound": teo.embedding.Adagrad,
    "sgd-momentum-schedule": teo.embedding.Momentum,
    "sgd-momentum-callable": teo.embedding.Momentum,
    "loss_scale_factor": teo.embedding.SGD,
    "several": teo.embedding.Adam,
    "several-ftrl": teo.embedding.FTRL,
    "twin-amsgrad": teo.embedding.Adam,
    "twin-weight_decay": teo.embedding.Adagrad,
    "twin-l2_shrinkage": teo.embedding.FTRL,
    "twin-adagrad-epsilon": teo.embedding.Adagrad,
    "twin-sgd-momentum-schedule": teo.embedding.Momentum,
}


@pytest.mark.parametrize("which", sorted(REFUSALS))
def test_to_embedding_refuses_and_names_each_setting(which):
    make, names = REFUSALS[which]
    with pytest.raises(ValueError) as info:
        teo.to_embedding(make(), strict=True)
    message = str(info.value)
    for name in names:
        assert name in message, (name, message)
    with pytest.raises(ValueError):
        teo.to_embedding(make())  # strict=True is the default


@pytest.mark.parametrize("which", sorted(REFUSALS))
def test_to_embedding_not_strict_warns_with_the_same_list(which):
    make, names = REFUSALS[which]
    with pytest.warns(UserWarning) as record:
        embedding_opt = teo.to_embedding(make(), strict=False)
    message = " ".join(str(w.message) for w in record)
    for name in names:
        assert name in message, (name, message)
    assert type(embedding_opt) is REFUSED_TARGETS[which]
    # Each warning points at the line that called to_embedding.
    assert {w.filename for w in record} == {__file__}


@pytest.mark.parametrize(
    "keras_opt",
    [
        keras.optimizers.Nadam(),
        keras.optimizers.Adamax(),
        keras.optimizers.AdamW(),
        keras.optimizers.Lion(),
        "adam",
        None,
        teo.embedding.Adam(),
    ],
    ids=["Nadam", "Adamax", "AdamW", "Lion", "string", "None", "embedding-Adam"],
)
def test_to_embedding_unsupported_type(keras_opt):
    with pytest.raises(TypeError, match="keras_opt"):
        teo.to_embedding(keras_opt)


def _configuration(global_optimizer, table_optimizer=None):
    E = tf.tpu.experimental.embedding
    table = E.TableConfig(10, 4, optimizer=table_optimizer, name="t")
    features = {"t": E.FeatureConfig(table=table, output_shape=[2])}
    return teo.tpu_embedding_configuration(features, global_optimizer)


@pytest.mark.parametrize(
    "call, start",
    [
        (lambda twin: teo.to_proto(twin), "to_proto: argument `opt` must be"),
        (
            lambda twin: teo.to_keras(twin),
            "to_keras: argument `embedding_opt` must be",
        ),
        (
            lambda twin: _configuration(twin),
            "tpu_embedding_configuration: argument `optimizer` must be",
        ),
        (
            lambda twin: _configuration(teo.embedding.SGD(0.1), twin),
            "tpu_embedding_configuration: the optimizer of table 't' must be",
        ),
    ],
    ids=["to_proto", "to_keras", "global", "per-table"],
)
@pytest.mark.parametrize("name", ["SGD", "Adagrad", "Adam", "Ftrl"])
def test_a_keras_twin_given_for_an_embedding_optimizer_is_refused(call, start, name):
    """A twin where the embedding face is expected (a twin carries its
    definition too): a TypeError naming the argument and the conversion, not
    an AttributeError from reading embedding arguments it does not have."""
    with pytest.raises(TypeError) as refused:
        call(getattr(teo.optimizers, name)(0.1))
    message = str(refused.value)
    assert message.startswith(start), message
    assert message.endswith(
        "(a Keras optimizer; tf_tpu_embed_opt.to_embedding converts one, "
        "exactly or refused)."
    ), message


@pytest.mark.parametrize(
    "make",
    [
        lambda: keras.layers.Dense(2),
        lambda: keras.optimizers.schedules.ExponentialDecay(0.1, 1, 0.5),
    ],
    ids=["layer", "schedule"],
)
def test_a_keras_object_that_is_no_optimizer_is_not_called_one(make):
    """Only a Keras optimizer is pointed to `to_embedding`; a layer or a
    schedule was called "a Keras optimizer" too (any Keras class counted).
    Its type is named by Keras's public path."""
    given = make()
    with pytest.raises(TypeError, match="argument `embedding_opt` must be") as refused:
        teo.to_keras(given)
    where = (
        "layers" if isinstance(given, keras.layers.Layer) else "optimizers.schedules"
    )
    assert str(refused.value).endswith(f"of type keras.{where}.{type(given).__name__}.")


@pytest.mark.parametrize("stock", [True, False], ids=["keras", "twin"])
def test_a_keras_optimizer_given_for_an_embedding_one_is_named_by_its_path(stock):
    """Keras's Adam and this package's were both "of type Adam"."""
    opt = (keras.optimizers if stock else teo.optimizers).Adam(0.1)
    with pytest.raises(TypeError) as refused:
        teo.to_proto(opt)
    where = "keras.optimizers" if stock else "tf_tpu_embed_opt.optimizers"
    assert f" of type {where}.Adam (a Keras optimizer; " in str(refused.value)


def test_a_subclass_of_a_stock_class_is_refused_naming_its_base():
    """AdamW is Adam with weight decay on every element: refused pointing at
    Adam with the same settings, which is then refused naming weight_decay
    (a subclass's math is not taken for its base's)."""
    with pytest.raises(
        TypeError,
        match=r"is a keras\.optimizers\.AdamW, a subclass of "
        r"keras\.optimizers\.Adam with weight decay on every element.*"
        r"Pass keras\.optimizers\.Adam with the same settings",
    ):
        teo.to_embedding(keras.optimizers.AdamW())
    with pytest.raises(ValueError, match="weight_decay=0.004"):
        teo.to_embedding(keras.optimizers.Adam(weight_decay=0.004))

    class Mine(keras.optimizers.Adagrad):
        pass

    with pytest.raises(TypeError, match="a Mine, a subclass of .*Adagrad,"):
        teo.to_embedding(Mine())


@pytest.mark.parametrize(
    "make, said",
    [
        pytest.param(
            lambda: keras.optimizers.ScheduleFreeAdamW(),
            "keeps two sequences",
            marks=pytest.mark.skipif(
                not hasattr(keras.optimizers, "ScheduleFreeAdamW"),
                reason=f"Keras {keras.__version__} has no ScheduleFreeAdamW",
            ),
        ),
        (lambda: keras.optimizers.Lion(), "sign update"),
        (lambda: keras.optimizers.Nadam(), "Nesterov-accelerated Adam"),
        (lambda: keras.optimizers.Adafactor(), "factored over a table's rows"),
        (
            lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD()),
            "convert its inner_optimizer",
        ),
        (lambda: keras.optimizers.Adamax(), "infinity-norm"),
    ],
)
def test_a_stock_class_without_engine_counterpart_is_refused_saying_why(make, said):
    """Named by its class, with the reason, in a few lines (no repr)."""
    optimizer = make()
    with pytest.raises(TypeError) as refused:
        teo.to_embedding(optimizer)
    message = str(refused.value)
    name = type(optimizer).__name__
    assert message.startswith(
        f"to_embedding: argument `keras_opt` is keras.optimizers.{name} ("
    )
    assert said in message and "object at 0x" not in message
    assert "It converts keras.optimizers SGD, Adagrad, Adam" in message
    with pytest.raises(TypeError, match="is a builtins.object, which is no Keras"):
        teo.to_embedding(object())


def test_a_user_keras_optimizer_is_refused_by_its_path():
    """A user's own Keras optimizer is one this package does not know; a
    subclass of a Keras class refused for a reason has that reason."""

    class MyOptimizer(keras.optimizers.Optimizer):
        def update_step(self, gradient, variable, learning_rate):
            variable.assign(variable - learning_rate * gradient)

    with pytest.raises(TypeError) as refused:
        teo.to_embedding(MyOptimizer(0.1))
    assert str(refused.value).startswith(
        "to_embedding: argument `keras_opt` is "
        f"{__name__}.MyOptimizer, a Keras optimizer this package does not know. "
        "It converts keras.optimizers SGD, Adagrad, Adam"
    )
    if not hasattr(keras.optimizers, "MultiOptimizer"):  # not in Keras 3.10
        return

    class MyMulti(keras.optimizers.MultiOptimizer):
        pass

    multi = MyMulti(keras.optimizers.OptimizerMap(keras.optimizers.SGD(), {}))
    with pytest.raises(TypeError) as refused:
        teo.to_embedding(multi)
    assert str(refused.value).startswith(
        f"to_embedding: argument `keras_opt` is {__name__}.MyMulti, a "
        "keras.optimizers.MultiOptimizer (an optimizer per variable: convert "
        "the one of each table"
    )


def test_a_tf_keras_optimizer_is_refused_naming_keras_2():
    """Under TF_USE_LEGACY_KERAS=1 `tf.keras.optimizers.Adagrad` is
    tf_keras's (Keras 2): `to_embedding`, `keras_optimizer` and
    `layers.Embedding` say so, not only "no Keras optimizer"."""
    tf_keras = pytest.importorskip("tf_keras")
    keras_2 = (
        "an optimizer of tf_keras (Keras 2, which `tf.keras` is under "
        "TF_USE_LEGACY_KERAS=1), not of Keras 3; build the same optimizer "
        "from keras.optimizers"
    )
    table = tf.tpu.experimental.embedding.TableConfig(
        10, 4, optimizer=teo.embedding.Adagrad(0.1), name="t"
    )
    features = {"f": tf.tpu.experimental.embedding.FeatureConfig(table=table)}
    for optimizer in (
        tf_keras.optimizers.Adagrad(0.1),
        tf_keras.optimizers.legacy.Adam(0.1),
    ):
        with pytest.raises(TypeError) as refused:
            teo.to_embedding(optimizer)
        assert str(refused.value).startswith(
            "to_embedding: argument `keras_opt` is a tf_keras."
        )
        assert keras_2 in str(refused.value)
        if hasattr(keras.optimizers, "MultiOptimizer"):  # not in Keras 3.10
            with pytest.raises(TypeError, match="`dense_optimizer` must be") as refused:
                teo.keras_optimizer(features, optimizer)
            assert keras_2 in str(refused.value)
        with pytest.raises(TypeError, match="argument `optimizer` must be") as refused:
            teo.layers.Embedding(10, 4, optimizer=optimizer)
        assert keras_2 in str(refused.value)
    # A Keras 3 optimizer is no tf_keras one.
    with pytest.raises(TypeError) as refused:
        teo.to_embedding(keras.optimizers.Lion())
    assert "tf_keras" not in str(refused.value)


@pytest.mark.parametrize("strict", ["yes", 1, 0, None])
def test_to_embedding_strict_must_be_bool(strict):
    with pytest.raises(TypeError, match="strict"):
        teo.to_embedding(keras.optimizers.SGD(), strict=strict)


@pytest.mark.parametrize(
    "name", sorted(d.name for d in registry.DEFINITIONS if d.name != "SGD")
)
def test_to_keras_refuses_no_gradient_accumulation(name):
    embedding_opt = getattr(teo.embedding, name)(use_gradient_accumulation=False)
    with pytest.raises(ValueError, match="use_gradient_accumulation"):
        teo.to_keras(embedding_opt)


def test_to_keras_sgd_without_accumulation_is_fine():
    keras_opt = teo.to_keras(
        teo.embedding.SGD(learning_rate=0.5, use_gradient_accumulation=False)
    )
    assert type(keras_opt) is teo.optimizers.SGD
    table = keras.Variable(W0)
    keras_opt.apply_gradients(
        [(_indexed_slices([2, 2], STEP_VALUES[0][:2], (ROWS, DIM)), table)]
    )
    expected = W0.copy()
    expected[2] -= 0.5 * (STEP_VALUES[0][0] + STEP_VALUES[0][1])
    np.testing.assert_allclose(table.numpy(), expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(
    "settings_",
    [
        {"weight_decay_factor": 0.1},
        {
            "weight_decay_factor": 0.1,
            "multiply_weight_decay_factor_by_learning_rate": True,
        },
        {"clip_weight_max": 0.15},
        {"clip_weight_min": -0.15},
    ],
    ids=["decay", "decay-times-lr", "clip-max", "clip-min"],
)
def test_to_keras_refuses_sgd_without_accumulation_when_not_linear(settings_):
    """Without accumulation the engine applies each contribution as its own step
    (docs/tpu_semantics.md §1.2: weight decay "once per contribution"); with
    weight decay or weight clipping SGD is then no longer the summed step.

    E.g. w = 1, λ = 0.1, η = 0.1, contributions [1], [1] to one row: the engine
    gives ((1 − 0.1) − 0.1)·0.9 − 0.1 = 0.62, the summed step 0.9 − 0.2 = 0.7.
    """
    embedding_opt = teo.embedding.SGD(
        learning_rate=0.1, use_gradient_accumulation=False, **settings_
    )
    with pytest.raises(ValueError, match="use_gradient_accumulation"):
        teo.to_keras(embedding_opt)


@pytest.mark.parametrize(
    "name, settings_, clause",
    [
        ("SGD", {"clip_weight_min": -1.0}, "weight clipping then differs"),
        ("Adagrad", {}, "the Adagrad update then differs"),
        (
            "SGD",
            {"weight_decay_factor": 0.1, "clip_weight_max": 1.0},
            "weight decay and weight clipping then differ",
        ),
        (
            "Adam",
            {"weight_decay_factor": 0.1},
            "the Adam update and weight decay then differ",
        ),
    ],
)
def test_to_keras_names_each_reason_accumulation_matters(name, settings_, clause):
    """The refusal names every setting that makes one summed step differ from
    a step per contribution, in one clause."""
    embedding_opt = getattr(teo.embedding, name)(
        learning_rate=0.1, use_gradient_accumulation=False, **settings_
    )
    with pytest.raises(ValueError) as raised:
        teo.to_keras(embedding_opt)
    assert (
        "applies each gradient contribution as a separate step, and "
        f"{clause} from one step with the summed gradient"
    ) in str(raised.value)


@pytest.mark.parametrize(
    "value", [keras.optimizers.Adam(), "adagrad", None, 0.1], ids=repr
)
def test_to_keras_refuses_non_embedding_optimizers(value):
    with pytest.raises(TypeError, match="embedding_opt"):
        teo.to_keras(value)


# ---------------------------------------------------------------------------
# Round trips.
# ---------------------------------------------------------------------------

ENGINE_KWARGS = {
    "clip_weight_min": -2.5,
    "clip_weight_max": 3.0,
    "clipvalue": (-0.5, 0.75),
    "weight_decay_factor": 0.125,
    "multiply_weight_decay_factor_by_learning_rate": True,
}


@pytest.mark.parametrize("with_engine_options", [False, True])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_round_trip_embedding_keras_embedding(case, with_engine_options):
    extra = ENGINE_KWARGS if with_engine_options else {}
    original = getattr(teo.embedding, case.cls)(
        learning_rate=0.1, **case.hypers, **extra
    )
    back = teo.to_embedding(teo.to_keras(original))
    assert type(back) is type(original)
    assert back == original, (back, original)
    assert teo.embedding.arguments(back) == teo.embedding.arguments(original)


@pytest.mark.parametrize("name", [d.name for d in registry.DEFINITIONS])
def test_round_trip_defaults(name):
    original = getattr(teo.embedding, name)()
    back = teo.to_embedding(teo.to_keras(original))
    assert back == original, (back, original)


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(data=st.data())
@pytest.mark.parametrize("name", [d.name for d in registry.DEFINITIONS])
def test_round_trip_property(name, data):
    definition = registry.BY_NAME[name]
    arguments = data.draw(arguments_for(definition, callable_rate=False))
    # Settings with no Keras counterpart and no effect on the math are not
    # carried by a Keras optimizer (accumulation: SGD only; packing; FTRL's
    # deprecated allow_zero_accumulator).
    if not arguments["use_gradient_accumulation"]:
        arguments["use_gradient_accumulation"] = True
    arguments["low_dimensional_packing_status"] = False
    if "allow_zero_accumulator" in arguments:
        # FTRL's flag is deprecated and ignored by the engine (§2.4).
        arguments["allow_zero_accumulator"] = False
    original = getattr(teo.embedding, name)(**arguments)
    back = teo.to_embedding(teo.to_keras(original))
    # A zero decay and the multiply flag without a decay change nothing and
    # come back as the proto keeps them.
    expected = getattr(teo.embedding, name)(**as_written(arguments))
    assert back == expected, (back, original)


def _config(optimizer):
    config = optimizer.get_config()
    del config["name"]  # Keras makes names unique per instance
    return config


TWIN_ENGINE = {
    "clip_weight_min": -1.5,
    "clip_weight_max": 2.0,
    "clip_gradient_min": -0.25,
    "clip_gradient_max": 0.5,
    "weight_decay_factor": 0.01,
    "multiply_weight_decay_factor_by_learning_rate": True,
}

TWINS = {
    "SGD": lambda **kw: teo.optimizers.SGD(learning_rate=0.1, lazy=True, **kw),
    "Adagrad": lambda **kw: teo.optimizers.Adagrad(
        learning_rate=0.2, initial_accumulator_value=0.3, epsilon=0.0, **kw
    ),
    "AdagradMomentum": lambda **kw: teo.optimizers.AdagradMomentum(
        learning_rate=0.2,
        momentum=0.5,
        use_nesterov=True,
        exponent=3.0,
        beta2=0.9,
        epsilon=0.01,
        **kw,
    ),
    "Adam-engine": lambda **kw: teo.optimizers.Adam(
        learning_rate=0.01,
        beta_1=0.8,
        beta_2=0.99,
        epsilon=1e-3,
        lazy=True,
        sum_inside_sqrt=True,
        bias_correction=False,
        **kw,
    ),
    "Adam-non-lazy": lambda **kw: teo.optimizers.Adam(
        learning_rate=0.01, lazy=False, bias_correction=False, **kw
    ),
    "Ftrl": lambda **kw: teo.optimizers.Ftrl(
        learning_rate=0.1,
        learning_rate_power=-0.7,
        initial_accumulator_value=0.3,
        l1_regularization_strength=0.01,
        l2_regularization_strength=0.02,
        beta=0.5,
        multiply_linear_by_learning_rate=True,
        lazy=True,
        **kw,
    ),
    "Momentum": lambda **kw: teo.optimizers.Momentum(
        learning_rate=0.1, momentum=0.8, use_nesterov=True, **kw
    ),
    "RMSprop": lambda **kw: teo.optimizers.RMSprop(
        learning_rate=0.01, rho=0.8, momentum=0.4, epsilon=1e-4, lazy=True, **kw
    ),
    "RMSprop-centered": lambda **kw: teo.optimizers.RMSprop(
        learning_rate=0.01,
        rho=0.8,
        momentum=0.4,
        epsilon=1e-4,
        centered=True,
        lazy=True,
        **kw,
    ),
    "Adadelta": lambda **kw: teo.optimizers.Adadelta(
        learning_rate=0.5, rho=0.8, epsilon=1e-4, lazy=True, **kw
    ),
    "ProximalAdagrad": lambda **kw: teo.optimizers.ProximalAdagrad(
        learning_rate=0.1,
        initial_accumulator_value=0.2,
        l1_regularization_strength=0.01,
        l2_regularization_strength=0.02,
        **kw,
    ),
    "ProximalYogi": lambda **kw: teo.optimizers.ProximalYogi(
        learning_rate=0.1,
        beta_1=0.8,
        beta_2=0.9,
        epsilon=1e-2,
        l1_regularization_strength=0.01,
        l2_regularization_strength=0.02,
        initial_accumulator_value=0.5,
        **kw,
    ),
}


@pytest.mark.parametrize("with_engine_options", [False, True])
@pytest.mark.parametrize("which", sorted(TWINS))
def test_round_trip_keras_embedding_keras(which, with_engine_options):
    original = TWINS[which](**(TWIN_ENGINE if with_engine_options else {}))
    back = teo.to_keras(teo.to_embedding(original))
    assert type(back) is type(original)
    assert _config(back) == _config(original)


# Each refused setting with its own reason, as the engine asked lacks it:
# Keras's weight decay and non-lazy step say what Keras does and the engine
# does not, a Keras-only argument what its definition says the engine lacks.
# (Swapping the reasons between settings or engines failed no test before.)
REASONS = {
    "weight_decay": (
        lambda: keras.optimizers.SGD(0.1, weight_decay=0.01),
        "TPUEmbedding",
        [
            "weight_decay=0.01: Keras decays every element each step; the "
            "engine's weight_decay_factor decays only looked-up rows"
        ],
    ),
    "momentum": (
        lambda: keras.optimizers.SGD(0.1, momentum=0.9),
        "TPUEmbedding",
        [
            "lazy=False: on a sparse gradient Keras steps every row here, the "
            "engine only the looked-up rows"
        ],
    ),
    "momentum-schedule": (
        lambda: keras.optimizers.SGD(_schedule(), momentum=0.9),
        "TPUEmbedding",
        [
            "momentum=0.9 with a learning-rate schedule: Keras's momentum "
            "m ← μ·m − η·g equals the engine's m ← μ·m + g only for a constant "
            "learning rate"
        ],
    ),
    "l2_shrinkage": (
        lambda: teo.optimizers.Ftrl(l2_shrinkage_regularization_strength=0.1),
        "TPUEmbeddingV2",
        [
            "l2_shrinkage_regularization_strength=0.1: the engine's FTRL has no "
            "L2 shrinkage;",
            "lazy=False: on a sparse gradient Keras steps every row here",
        ],
    ),
}


@pytest.mark.parametrize("which", sorted(REASONS))
def test_each_refused_setting_says_its_own_reason(which):
    make, engine, reasons = REASONS[which]
    with pytest.raises(ValueError) as info:
        teo.to_embedding(make(), engine=engine)
    for reason in reasons:
        assert reason in str(info.value), (reason, str(info.value))


@pytest.mark.parametrize(
    "make, instead",
    [
        (lambda: teo.optimizers.ClippyAdagrad(), "or use Adagrad on the engine."),
        (
            lambda: teo.optimizers.RowWiseAdagrad(0.1),
            "or use another optimizer on the engine.",
        ),
    ],
)
def test_a_twin_no_engine_runs_names_what_to_use_instead(make, instead):
    # ClippyAdagrad keeps Adagrad's state; RowWiseAdagrad's state is no
    # other algorithm's.
    with pytest.raises(TypeError, match=re.escape(instead) + "$"):
        teo.to_embedding(make())


def test_twin_clipvalue_and_engine_clip_meeting_at_one_value_converts():
    """Clipping to [-1, 1] and then to [1, inf) leaves every gradient 1.0:
    the engine's clip [1, 1] computes that, so it converts."""
    twin = teo.optimizers.SGD(learning_rate=0.1, clipvalue=1.0, clip_gradient_min=1.0)
    embedding_opt = teo.to_embedding(twin)
    assert (embedding_opt.clip_gradient_min, embedding_opt.clip_gradient_max) == (
        1.0,
        1.0,
    )


@pytest.mark.parametrize("bound", ["clip_gradient_min", "clip_gradient_max"])
def test_a_one_sided_twin_clip_converts_to_the_same_engine_clip(bound):
    value = -0.5 if bound == "clip_gradient_min" else 0.5
    embedding_opt = teo.to_embedding(teo.optimizers.SGD(0.1, **{bound: value}))
    clip = (embedding_opt.clip_gradient_min, embedding_opt.clip_gradient_max)
    assert clip == ((value, None) if bound == "clip_gradient_min" else (None, value))


def test_the_decay_flag_without_a_decay_converts_to_no_flag():
    # Without a factor the flag changes nothing: the conversion leaves it
    # unset (and sets it where there is a factor to multiply).
    twin = teo.optimizers.Adagrad(
        0.1, multiply_weight_decay_factor_by_learning_rate=True
    )
    embedding_opt = teo.to_embedding(twin)
    assert embedding_opt.weight_decay_factor is None
    assert embedding_opt.multiply_weight_decay_factor_by_learning_rate is None
    decayed = teo.to_embedding(
        teo.optimizers.Adagrad(
            0.1,
            weight_decay_factor=0.01,
            multiply_weight_decay_factor_by_learning_rate=True,
        )
    )
    assert decayed.multiply_weight_decay_factor_by_learning_rate is True


def test_twin_clipvalue_and_engine_clip_intersect():
    twin = teo.optimizers.SGD(learning_rate=0.1, clipvalue=0.5, clip_gradient_min=-0.3)
    embedding_opt = teo.to_embedding(twin)
    assert (embedding_opt.clip_gradient_min, embedding_opt.clip_gradient_max) == (
        -0.3,
        0.5,
    )


@pytest.mark.parametrize("engine", ["TPUEmbedding", "jax-tpu-embedding"])
def test_twin_clipvalue_that_misses_the_engine_clip_is_refused(engine):
    """Clipping to [-c, c] and then to [lo, hi] is one clip only where they
    meet; otherwise every gradient becomes one value, which no engine clip
    expresses."""
    twin = teo.optimizers.Adagrad(
        0.1, clipvalue=1.0, clip_gradient_min=2.0, clip_gradient_max=3.0
    )
    with pytest.raises(ValueError, match=r"clipvalue=1.0 and the gradient clip"):
        teo.to_embedding(twin, engine=engine)


def test_the_jax_engine_without_the_jax_extra_names_it(monkeypatch):
    """Without the `[jax]` extra, converting for jax-tpu-embedding raises
    `JaxNotInstalled` naming the extra, for its own spec as for the custom
    one (its own spec raised a bare ImportError worded otherwise, which an
    `except JaxNotInstalled` missed)."""
    from tf_tpu_embed_opt import errors

    hidden = ("jax", "jaxlib", "jax_tpu_embedding", "orbax", "tensorstore")
    for name in [*hidden, *sys.modules]:
        if name.split(".")[0] in hidden:
            monkeypatch.setitem(sys.modules, name, None)  # as if not installed
    # Imported before, the custom spec's module is an attribute of its
    # package too, where `from ... import jax_custom` finds it first.
    monkeypatch.delitem(sys.modules, "tf_tpu_embed_opt.engines.jax_custom", False)
    monkeypatch.delattr(teo.engines, "jax_custom", raising=False)
    for keras_opt, what in (
        (keras.optimizers.Adagrad(0.1), "The jax-tpu-embedding engine"),
        (
            teo.optimizers.Adagrad(0.1, clip_weight_min=-1.0),
            r"to_embedding\(\.\.\., engine='jax-tpu-embedding'\) \(its custom spec\)",
        ),
    ):
        with pytest.raises(
            errors.JaxNotInstalled,
            match=rf"^{what} needs the package's `\[jax\]` extra .*Python 3.11",
        ):
            teo.to_embedding(keras_opt, engine="jax-tpu-embedding")


def test_keras_adam_twin_default_converts_like_stock_adam():
    """The twin's Keras defaults (bias correction, non-lazy) convert exactly."""
    embedding_opt = teo.to_embedding(teo.optimizers.Adam(learning_rate=0.01))
    assert type(embedding_opt) is teo.embedding.Adam
    assert embedding_opt.lazy_adam is False
    assert embedding_opt.sum_inside_sqrt is False
    assert callable(embedding_opt.learning_rate)
    np.testing.assert_allclose(
        float(embedding_opt.learning_rate()),
        0.01 * np.sqrt(1 - 0.999) / (1 - 0.9),
        rtol=1e-5,  # float32 1 - 0.999 is off by 1.3e-5 relative
    )


# ---------------------------------------------------------------------------
# Engine details: cancelling contributions, Keras clipvalue on sparse rows.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("index_dtype", [tf.int32, tf.int64], ids=["int32", "int64"])
@pytest.mark.parametrize("name", ["Adam", "Momentum"])
def test_to_keras_row_whose_gradient_sums_to_zero_is_updated(name, index_dtype):
    """§1.2: a looked-up row whose contributions cancel still gets a step."""
    case = {c.id: c for c in CASES}["Adam-lazy" if name == "Adam" else "Momentum"]
    keras_opt = teo.to_keras(case.make(teo.embedding, case.lr))
    table = keras.Variable(W0, name="table")
    state = {"w": W0.copy()}
    state.update({n: np.zeros((ROWS, DIM), np.float32) for n in case.slots})
    hypers = {**_ORACLE_DEFAULTS, **case.hypers}
    g = STEP_VALUES[0][:1]
    steps = (([2], g), ([2, 5, 2], np.concatenate([g, g, -g])))
    for ids, values in steps:
        before = table.numpy().copy()
        keras_opt.apply_gradients(
            [(_indexed_slices(ids, values, (ROWS, DIM), index_dtype), table)]
        )
        unique, summed = _sum_duplicates(ids, values)
        case.oracle(state, unique, summed, case.lr, hypers)
        np.testing.assert_allclose(table.numpy(), state["w"], rtol=RTOL, atol=ATOL)
    # Row 2's summed gradient is 0 in the second step, yet its momentum moved it.
    assert not np.array_equal(table.numpy()[2], before[2])
    np.testing.assert_array_equal(table.numpy()[[0, 1, 3, 4]], W0[[0, 1, 3, 4]])


@pytest.mark.parametrize("algorithm", ["SGD", "Adagrad"])
def test_to_embedding_twin_clipvalue_is_the_engine_clip_on_sparse_gradients(
    algorithm,
):
    """The Keras `clipvalue` of a twin becomes the engine's clip of the summed
    row gradient, so the twin must clip after summing duplicate ids (DESIGN
    Semantics §1: sparse and dense gradients that say the same thing agree).

    Row 0 gets contributions 0.4 and 0.4: the engine clips the sum 0.8 to 0.5.
    """
    if algorithm == "SGD":
        twin = teo.optimizers.SGD(learning_rate=1.0, clipvalue=0.5)
    else:
        twin = teo.optimizers.Adagrad(
            learning_rate=1.0, initial_accumulator_value=0.1, epsilon=0.0, clipvalue=0.5
        )
    embedding_opt = teo.to_embedding(twin)
    assert (embedding_opt.clip_gradient_min, embedding_opt.clip_gradient_max) == (
        -0.5,
        0.5,
    )
    table = keras.Variable(np.zeros((2, 1), np.float32))
    twin.apply_gradients(
        [(_indexed_slices([0, 0], np.array([[0.4], [0.4]]), (2, 1)), table)]
    )
    # Engine: g = clamp(0.8, -0.5, 0.5) = 0.5.
    expected = -0.5 if algorithm == "SGD" else -0.5 / np.sqrt(0.1 + 0.25)
    np.testing.assert_allclose(table.numpy(), [[expected], [0.0]], rtol=RTOL)
