"""`to_keras(engine="TPUEmbeddingV2")` computes SparseCore's math.

The oracle is an independent NumPy transcription of the SparseCore per-row
computations (`Build*OptimizerComputation` in TensorFlow's
`tensorflow/core/tpu/kernels/sparse_core_ops_utils.cc`): each row's occurrences
are summed first (the CSR input is sorted by id), the optimizer runs once per
looked-up row, then the weight clip the op was given (TPUEmbeddingV2 gives
none). The TensorCore variant of the same transcription adds what that engine
also does: gradient clipping of the summed row gradient, weight clipping and
non-lazy Adam. The golden rows are docs/tpu_semantics.md's "SparseCore golden
rows".
"""

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import tf_tpu_embed_opt as teo

E = tf.tpu.experimental.embedding

ROWS, DIM = 6, 3
W0 = (0.1 * np.arange(ROWS * DIM) - 0.5).reshape(ROWS, DIM)
# Two steps; ids repeat within a step (row 1 three times, row 4 twice).
STEPS = [
    (
        [1, 4, 1, 1, 4, 2],
        [
            [0.5, -1.0, 2.0],
            [1.5, 0.25, -0.5],
            [-0.25, 0.75, 1.0],
            [1.0, -2.0, 0.5],
            [0.5, 0.5, -1.5],
            [-3.0, 1.0, 0.25],
        ],
    ),
    ([0, 4, 4], [[0.75, -0.5, 1.25], [-1.0, 2.0, 0.5], [0.25, 0.5, -2.0]]),
]


def _row_gradients(ids, grads):
    """Sum of each looked-up row's occurrences (gains 1, `sum` combiner)."""
    total = {}
    for i, g in zip(ids, np.asarray(grads, np.float64)):
        total[i] = total.get(i, 0.0) + g
    return total


def _sgd(w, s, g, lr, h):
    return w - lr * g, s


def _adagrad(w, s, g, lr, h):
    a = s["a"] + g * g
    return w - lr * g / np.sqrt(a), {"a": a}


def _adagrad_momentum(w, s, g, lr, h):
    if h["beta2"] == 1:
        a = s["a"] + g * g
    else:
        a = h["beta2"] * s["a"] + (1 - h["beta2"]) * g * g
    scaled = (a + h["epsilon"]) ** (-1.0 / h["exponent"]) * g
    m = h["momentum"] * s["m"] + scaled
    update = h["momentum"] * m + scaled if h["use_nesterov"] else m
    return w - lr * update, {"a": a, "m": m}


def _adam(w, s, g, lr, h):
    m = h["beta_1"] * s["m"] + (1 - h["beta_1"]) * g
    v = h["beta_2"] * s["v"] + (1 - h["beta_2"]) * g * g
    if h["sum_inside_sqrt"]:
        denom = np.sqrt(v + h["epsilon"] ** 2)
    else:
        denom = np.sqrt(v) + h["epsilon"]
    return w - lr * m / denom, {"m": m, "v": v}


def _ftrl(w, s, g, lr, h):
    p = -h["learning_rate_power"]
    a_new = s["a"] + g * g
    delta = a_new**p - s["a"] ** p
    l1, l2, beta = h["l1"], h["l2"], h["beta"]
    linear = s["l"] + g - delta * w / lr
    numer = -linear if l1 == 0 else np.clip(linear, -l1, l1) - linear
    denom = (a_new**p + beta) / lr + 2 * l2
    return numer / denom, {"a": a_new, "l": linear}


CASES = {
    "SGD": (
        _sgd,
        {},
        {},
        lambda: E.SGD(0.1, clipvalue=1.0, clip_weight_min=-0.6, clip_weight_max=0.6),
    ),
    "Adagrad": (
        _adagrad,
        {},
        {"a": 0.1},
        lambda: E.Adagrad(0.1, initial_accumulator_value=0.1, clipvalue=1.0),
    ),
    "AdagradMomentum": (
        _adagrad_momentum,
        {
            "momentum": 0.9,
            "use_nesterov": True,
            "exponent": 3.0,
            "beta2": 0.9,
            "epsilon": 0.1,
        },
        {"a": 0.0, "m": 0.0},
        lambda: E.AdagradMomentum(
            0.1,
            momentum=0.9,
            use_nesterov=True,
            exponent=3.0,
            beta2=0.9,
            epsilon=0.1,
            clip_weight_max=0.5,
        ),
    ),
    "Adam": (
        _adam,
        {"beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-7, "sum_inside_sqrt": True},
        {"m": 0.0, "v": 0.0},
        lambda: E.Adam(0.1, lazy_adam=False, clip_weight_max=0.5),
    ),
    "FTRL": (
        _ftrl,
        {"learning_rate_power": -0.5, "l1": 0.01, "l2": 0.02, "beta": 0.1},
        {"a": 0.1, "l": 0.0},
        lambda: E.FTRL(
            0.1,
            l1_regularization_strength=0.01,
            l2_regularization_strength=0.02,
            beta=0.1,
            initial_accumulator_value=0.1,
            clipvalue=2.0,
        ),
    ),
}


def transcription(name, *, tensorcore=False):
    """The table after the two steps, per the engine's per-row rule."""
    rule, hypers, slot0, make = CASES[name]
    opt = make()
    w = W0.copy()
    slots = {k: np.full_like(W0, v) for k, v in slot0.items()}
    lazy = not tensorcore or getattr(opt, "lazy_adam", True)
    for ids, grads in STEPS:
        rows = _row_gradients(ids, grads)
        if not lazy:
            rows = {r: rows.get(r, np.zeros(DIM)) for r in range(ROWS)}
        for r, g in sorted(rows.items()):
            if tensorcore:
                lo = opt.clip_gradient_min
                hi = opt.clip_gradient_max
                g = np.clip(
                    g, -np.inf if lo is None else lo, np.inf if hi is None else hi
                )
            row_slots = {k: v[r] for k, v in slots.items()}
            new, row_slots = rule(w[r], row_slots, g, 0.1, hypers)
            if tensorcore:
                lo, hi = opt.clip_weight_min, opt.clip_weight_max
                new = np.clip(
                    new, -np.inf if lo is None else lo, np.inf if hi is None else hi
                )
            w[r] = new
            for k, v in row_slots.items():
                slots[k][r] = v
    return w


def run_twin(keras_opt):
    var = tf.Variable(W0.astype(np.float32))
    for ids, grads in STEPS:
        slices = tf.IndexedSlices(
            tf.constant(grads, tf.float32),
            tf.constant(ids, tf.int64),
            tf.constant([ROWS, DIM], tf.int64),
        )
        keras_opt.apply_gradients([(slices, var)])
    return var.numpy()


# The two looked-up-twice rows after both steps, SparseCore, 6 decimals
# (docs/tpu_semantics.md, "SparseCore golden rows").
GOLDEN = {
    "SGD": {1: [-0.325, 0.125, -0.35], 4: [0.575, 0.475, 1.25]},
    "Adagrad": {
        1: [-0.296946, -0.000973, -0.099594],
        4: [0.635961, 0.612768, 1.058299],
    },
    "AdagradMomentum": {
        1: [-0.573917, 0.405109, -0.605457],
        4: [0.194758, -0.094344, 1.906184],
    },
    "Adam": {
        1: [-0.516228, 0.216228, -0.316228],
        4: [0.228255, 0.099084, 1.633782],
    },
    "FTRL": {
        1: [-0.228674, 0.011957, -0.096455],
        4: [0.500542, 0.259502, 0.872987],
    },
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_transcription_matches_golden_rows(name):
    w = transcription(name)
    for row, expected in GOLDEN[name].items():
        np.testing.assert_allclose(w[row], expected, atol=1e-6)


@pytest.mark.parametrize("name", sorted(CASES))
def test_to_keras_sparsecore_is_the_sparsecore_rule(name):
    opt = CASES[name][3]()
    with pytest.warns(UserWarning, match="TPUEmbeddingV2 drops"):
        twin = teo.to_keras(opt, engine="TPUEmbeddingV2")
    np.testing.assert_allclose(
        run_twin(twin), transcription(name), rtol=2e-5, atol=2e-6
    )


@pytest.mark.parametrize("name", sorted(CASES))
def test_engines_differ_exactly_where_the_rules_differ(name):
    opt = CASES[name][3]()
    sparsecore = transcription(name)
    tensorcore = transcription(name, tensorcore=True)
    with pytest.warns(UserWarning):
        sc_twin = run_twin(teo.to_keras(opt, engine="TPUEmbeddingV2"))
    tc_twin = run_twin(teo.to_keras(opt))
    np.testing.assert_allclose(tc_twin, tensorcore, rtol=2e-5, atol=2e-6)
    expected = ~np.isclose(sparsecore, tensorcore, rtol=1e-4, atol=1e-5)
    observed = ~np.isclose(sc_twin, tc_twin, rtol=1e-4, atol=1e-5)
    assert expected.any(), "the case must exercise a dropped setting"
    np.testing.assert_array_equal(observed, expected)


def _one_step(name, ids, grads):
    """One SparseCore step from W0 and the initial slots (the transcription)."""
    rule, hypers, slot0, _ = CASES[name]
    w = W0.copy()
    slots = {k: np.full_like(W0, v) for k, v in slot0.items()}
    for r, g in sorted(_row_gradients(ids, grads).items()):
        new, row_slots = rule(w[r], {k: v[r] for k, v in slots.items()}, g, 0.1, hypers)
        w[r] = new
    return w


@settings(max_examples=8, deadline=None)
@given(
    name=st.sampled_from(sorted(CASES)),
    ids=st.lists(st.integers(0, ROWS - 1), min_size=1, max_size=12),
    data=st.data(),
)
def test_random_duplicate_ids_follow_the_sparsecore_rule(name, ids, data):
    grads = data.draw(
        st.lists(
            st.lists(
                st.floats(-3, 3, allow_nan=False, width=32), min_size=DIM, max_size=DIM
            ),
            min_size=len(ids),
            max_size=len(ids),
        )
    )
    with pytest.warns(UserWarning):
        twin = teo.to_keras(CASES[name][3](), engine="TPUEmbeddingV2")
    var = tf.Variable(W0.astype(np.float32))
    slices = tf.IndexedSlices(
        tf.constant(grads, tf.float32),
        tf.constant(ids, tf.int64),
        tf.constant([ROWS, DIM], tf.int64),
    )
    twin.apply_gradients([(slices, var)])
    np.testing.assert_allclose(
        var.numpy(), _one_step(name, ids, grads), rtol=1e-4, atol=1e-5
    )
