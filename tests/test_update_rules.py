"""Checks the per-row update rules and `tpu_step` against independent oracles.

No test compares the package with itself. The oracles are:

* TensorFlow's CPU training kernels (`tf.raw_ops.ResourceApply*`) run on
  float32 `tf.Variable`s, for every algorithm whose TPU proto names such a
  kernel as its reference (SGD, Adagrad, Adam, FTRL, Momentum, RMSProp,
  CenteredRMSProp, Adadelta, ProximalAdagrad). The package's rule is run with
  NumPy in float64 on the same inputs for one and for three steps, with
  different gradients and learning rates at each step, and both the weights and
  every slot are compared.
* The golden numbers of `docs/tpu_semantics.md` §6 (derived from TensorFlow's
  TPU embedding tests) for SGD, Adagrad, AdagradMomentum, Adam and FTRL.
* Hand-written formulas: Adam with `sum_inside_sqrt` (no TF kernel has it), and
  a scalar, `math`-module transcription of TF Addons' Yogi update for
  ProximalYogi (docs/tpu_semantics.md §2.12), which has no TF kernel.
* Numbers worked out by hand for the order of gradient clipping, weight decay,
  the update and weight clipping in `tpu_step`, and for the zero-gradient
  behaviour the TPU notes describe (§1.2, §1.3).
"""

import math

import numpy as np
import pytest
import tensorflow as tf
from golden import GOLDEN, GOLDEN_LR, USER_GRADS, USER_ROWS, VIDEO_GRADS, VIDEO_ROWS

from tf_tpu_embed_opt.definitions import registry, rules

# Tolerances for a float32 TensorFlow kernel against a float64 NumPy run.
RTOL_F32 = 1e-5
ATOL_F32 = 1e-6

# Learning rate of each step in the multi-step comparisons (deliberately not
# constant, so a rule that caches or mixes up the learning rate is caught).
LEARNING_RATES = (0.1, 0.07, 0.13)

SHAPE = (6, 4)


def _hypers(name, **overrides):
    """The algorithm's default hyperparameters with `overrides` applied."""
    definition = registry.BY_NAME[name]
    hypers = dict(definition.defaults)
    unknown = set(overrides) - set(hypers)
    assert not unknown, f"{name} has no hyperparameters {sorted(unknown)}"
    hypers.update(overrides)
    return hypers


def _initial_slots(definition, hypers, shape):
    return {
        slot.name: np.full(shape, slot.initial_value(hypers), dtype=np.float64)
        for slot in definition.slots
    }


def _inputs(seed, steps):
    """Float32 initial weights and `steps` different float32 gradients."""
    rng = np.random.default_rng(seed)
    w0 = rng.normal(0.0, 1.0, SHAPE).astype(np.float32)
    grads = [
        (rng.normal(0.0, 1.0, SHAPE) * (1.0 + step)).astype(np.float32)
        for step in range(steps)
    ]
    return w0, grads


def _float32_values(hypers):
    """`hypers` with every float rounded to float32, as a TF kernel sees it.

    TensorFlow's float32 kernels compute e.g. 1 − β₂ from the float32 β₂, which
    for β₂ = 0.999 is off by 1.3e-5 relative; the float64 oracle run must use
    the same parameter values to be comparable at float32 tolerances.
    """
    return {
        k: float(np.float32(v)) if isinstance(v, float) else v
        for k, v in hypers.items()
    }


def _run_numpy(name, hypers, w0, slots0, grads, lrs):
    """Runs the package's rule in float64 NumPy for len(grads) steps."""
    definition = registry.BY_NAME[name]
    w = np.asarray(w0, dtype=np.float64)
    slots = {k: np.asarray(v, dtype=np.float64) for k, v in slots0.items()}
    for g, lr in zip(grads, lrs):
        w, slots = definition.update(
            rules.NUMPY, w, dict(slots), np.asarray(g, np.float64), lr, hypers
        )
        slots = {k: np.asarray(v) for k, v in slots.items()}
    return np.asarray(w), slots


# --- TensorFlow kernels ------------------------------------------------------
#
# Each function applies one step of TensorFlow's CPU kernel to `var` and the
# slot variables `s` (keyed by the package's slot names) with gradient `g`,
# learning rate `lr` and the package's hyperparameters `h`.


def _f32(x):
    return tf.constant(x, dtype=tf.float32)


def _tf_sgd(var, s, g, lr, h):
    tf.raw_ops.ResourceApplyGradientDescent(var=var.handle, alpha=_f32(lr), delta=g)


def _tf_adagrad(var, s, g, lr, h):
    tf.raw_ops.ResourceApplyAdagradV2(
        var=var.handle,
        accum=s["accumulators"].handle,
        lr=_f32(lr),
        epsilon=_f32(0.0),
        grad=g,
        update_slots=True,
    )


def _tf_adam(var, s, g, lr, h):
    # beta powers 0: lr_t = lr·sqrt(1 − 0)/(1 − 0) = lr, i.e. no bias
    # correction; the kernel divides by sqrt(v) + ε.
    tf.raw_ops.ResourceApplyAdam(
        var=var.handle,
        m=s["momenta"].handle,
        v=s["velocities"].handle,
        beta1_power=_f32(0.0),
        beta2_power=_f32(0.0),
        lr=_f32(lr),
        beta1=_f32(h["beta_1"]),
        beta2=_f32(h["beta_2"]),
        epsilon=_f32(h["epsilon"]),
        grad=g,
        use_nesterov=False,
    )


def _tf_ftrl(var, s, g, lr, h):
    # TensorFlow's kernel has no β; the TPU proto says adding β/(2·η) to l2
    # gives the same behaviour.
    l2 = h["l2_regularization_strength"] + h["beta"] / (2.0 * lr)
    tf.raw_ops.ResourceApplyFtrlV2(
        var=var.handle,
        accum=s["accumulators"].handle,
        linear=s["linears"].handle,
        grad=g,
        lr=_f32(lr),
        l1=_f32(h["l1_regularization_strength"]),
        l2=_f32(l2),
        l2_shrinkage=_f32(0.0),
        lr_power=_f32(h["learning_rate_power"]),
        multiply_linear_by_lr=h["multiply_linear_by_learning_rate"],
    )


def _tf_momentum(var, s, g, lr, h):
    tf.raw_ops.ResourceApplyMomentum(
        var=var.handle,
        accum=s["momenta"].handle,
        lr=_f32(lr),
        grad=g,
        momentum=_f32(h["momentum"]),
        use_nesterov=h["use_nesterov"],
    )


def _tf_rms_prop(var, s, g, lr, h):
    tf.raw_ops.ResourceApplyRMSProp(
        var=var.handle,
        ms=s["ms"].handle,
        mom=s["mom"].handle,
        lr=_f32(lr),
        rho=_f32(h["rho"]),
        momentum=_f32(h["momentum"]),
        epsilon=_f32(h["epsilon"]),
        grad=g,
    )


def _tf_centered_rms_prop(var, s, g, lr, h):
    tf.raw_ops.ResourceApplyCenteredRMSProp(
        var=var.handle,
        mg=s["mg"].handle,
        ms=s["ms"].handle,
        mom=s["mom"].handle,
        lr=_f32(lr),
        rho=_f32(h["rho"]),
        momentum=_f32(h["momentum"]),
        epsilon=_f32(h["epsilon"]),
        grad=g,
    )


def _tf_adadelta(var, s, g, lr, h):
    tf.raw_ops.ResourceApplyAdadelta(
        var=var.handle,
        accum=s["accumulators"].handle,
        accum_update=s["updates"].handle,
        lr=_f32(lr),
        rho=_f32(h["rho"]),
        epsilon=_f32(h["epsilon"]),
        grad=g,
    )


def _tf_proximal_adagrad(var, s, g, lr, h):
    tf.raw_ops.ResourceApplyProximalAdagrad(
        var=var.handle,
        accum=s["accumulators"].handle,
        lr=_f32(lr),
        l1=_f32(h["l1_regularization_strength"]),
        l2=_f32(h["l2_regularization_strength"]),
        grad=g,
    )


TF_KERNELS = {
    "SGD": _tf_sgd,
    "Adagrad": _tf_adagrad,
    "Adam": _tf_adam,
    "FTRL": _tf_ftrl,
    "Momentum": _tf_momentum,
    "RMSProp": _tf_rms_prop,
    "CenteredRMSProp": _tf_centered_rms_prop,
    "Adadelta": _tf_adadelta,
    "ProximalAdagrad": _tf_proximal_adagrad,
}


def _run_tf(name, hypers, w0, slots0, grads, lrs):
    """Runs TensorFlow's float32 kernel for len(grads) steps."""
    kernel = TF_KERNELS[name]
    var = tf.Variable(np.asarray(w0, np.float32))
    slot_vars = {k: tf.Variable(np.asarray(v, np.float32)) for k, v in slots0.items()}
    for g, lr in zip(grads, lrs):
        kernel(var, slot_vars, tf.constant(np.asarray(g, np.float32)), lr, hypers)
    return var.numpy(), {k: v.numpy() for k, v in slot_vars.items()}


def _assert_matches_tf(name, hypers, w0, slots0, grads, lrs):
    got_w, got_slots = _run_numpy(
        name,
        _float32_values(hypers),
        w0,
        slots0,
        grads,
        [float(np.float32(lr)) for lr in lrs],
    )
    want_w, want_slots = _run_tf(name, hypers, w0, slots0, grads, lrs)
    np.testing.assert_allclose(
        got_w, want_w, rtol=RTOL_F32, atol=ATOL_F32, err_msg=f"{name} weights"
    )
    assert set(got_slots) == set(want_slots)
    for slot in want_slots:
        np.testing.assert_allclose(
            got_slots[slot],
            want_slots[slot],
            rtol=RTOL_F32,
            atol=ATOL_F32,
            err_msg=f"{name} slot {slot}",
        )
    return got_w, got_slots


# (algorithm, hyperparameter overrides), with a readable id each.
TF_CASES = [
    pytest.param("SGD", {}, id="sgd"),
    pytest.param("Adagrad", {"initial_accumulator_value": 0.3}, id="adagrad"),
    pytest.param("Adam", {"sum_inside_sqrt": False}, id="adam-sqrt_plus_eps-defaults"),
    pytest.param(
        "Adam",
        {"beta_1": 0.5, "beta_2": 0.8, "epsilon": 1e-2, "sum_inside_sqrt": False},
        id="adam-sqrt_plus_eps-b.5-b.8-eps1e-2",
    ),
    pytest.param("FTRL", {}, id="ftrl-defaults"),
    pytest.param(
        "FTRL",
        {
            "initial_accumulator_value": 0.2,
            "l1_regularization_strength": 0.05,
            "l2_regularization_strength": 0.1,
        },
        id="ftrl-l1-l2",
    ),
    pytest.param(
        "FTRL",
        {
            "learning_rate_power": -0.7,
            "l1_regularization_strength": 0.05,
            "l2_regularization_strength": 0.1,
            "beta": 0.3,
        },
        id="ftrl-power.7-l1-l2-beta",
    ),
    pytest.param(
        "FTRL",
        {"multiply_linear_by_learning_rate": True},
        id="ftrl-linear_by_lr",
    ),
    pytest.param(
        "FTRL",
        {
            "multiply_linear_by_learning_rate": True,
            "initial_accumulator_value": 0.2,
            "l1_regularization_strength": 0.05,
            "l2_regularization_strength": 0.1,
            "beta": 0.3,
        },
        id="ftrl-linear_by_lr-l1-l2-beta",
    ),
    pytest.param("Momentum", {"momentum": 0.5}, id="momentum-heavy_ball"),
    pytest.param(
        "Momentum", {"momentum": 0.5, "use_nesterov": True}, id="momentum-nesterov"
    ),
    pytest.param("RMSProp", {"rho": 0.8}, id="rmsprop-no_momentum"),
    pytest.param(
        "RMSProp",
        {"rho": 0.8, "momentum": 0.5, "epsilon": 1e-3},
        id="rmsprop-momentum",
    ),
    pytest.param(
        "CenteredRMSProp",
        {"rho": 0.8, "momentum": 0.5, "epsilon": 1e-3},
        id="centered_rmsprop",
    ),
    pytest.param("Adadelta", {"rho": 0.8, "epsilon": 1e-2}, id="adadelta"),
    pytest.param("Adadelta", {"rho": 0.8, "epsilon": 1e-6}, id="adadelta-eps1e-6"),
    pytest.param(
        "ProximalAdagrad",
        {"initial_accumulator_value": 0.3},
        id="proximal_adagrad-no_reg",
    ),
    pytest.param(
        "ProximalAdagrad",
        {
            "initial_accumulator_value": 0.3,
            "l1_regularization_strength": 0.05,
            "l2_regularization_strength": 0.1,
        },
        id="proximal_adagrad-l1-l2",
    ),
    pytest.param(
        "ProximalAdagrad",
        {"l2_regularization_strength": 0.2},
        id="proximal_adagrad-l2_only",
    ),
]


@pytest.mark.parametrize("steps", [1, 3], ids=["1step", "3steps"])
@pytest.mark.parametrize("name, overrides", TF_CASES)
def test_rule_matches_tensorflow_kernel(name, overrides, steps):
    hypers = _hypers(name, **overrides)
    definition = registry.BY_NAME[name]
    w0, grads = _inputs(seed=1234 + steps, steps=steps)
    slots0 = _initial_slots(definition, hypers, SHAPE)
    w, _ = _assert_matches_tf(name, hypers, w0, slots0, grads, LEARNING_RATES[:steps])
    # The comparison is not vacuous: the weights did move, far beyond the
    # tolerance.
    assert np.max(np.abs(w - w0)) > 100 * ATOL_F32


@pytest.mark.parametrize("name, overrides", TF_CASES)
def test_rule_matches_tensorflow_kernel_from_random_slots(name, overrides):
    """Same, starting from non-trivial slot values instead of the initial ones."""
    hypers = _hypers(name, **overrides)
    definition = registry.BY_NAME[name]
    rng = np.random.default_rng(99)
    w0, grads = _inputs(seed=7, steps=2)
    slots0 = {}
    for slot in definition.slots:
        if slot.name == "linears" or slot.name in ("momenta", "mom", "mg"):
            values = rng.normal(0.0, 0.5, SHAPE)
        else:  # Second-moment-like accumulators must stay positive.
            values = rng.uniform(0.5, 2.0, SHAPE)
        slots0[slot.name] = values.astype(np.float32)
    if name == "CenteredRMSProp":  # Keep ms − mg² positive.
        slots0["ms"] = (slots0["ms"] + np.square(slots0["mg"])).astype(np.float32)
    _assert_matches_tf(name, hypers, w0, slots0, grads, LEARNING_RATES[:2])


def test_every_reference_kernel_is_covered():
    """Every algorithm naming a TF reference kernel is in the comparisons."""
    declared = {d.name for d in registry.DEFINITIONS if d.reference_kernel}
    tested = {p.values[0] for p in TF_CASES}
    assert declared <= tested
    assert set(TF_KERNELS) == tested


# --- Adam with the sum inside the square root --------------------------------


def _adam_sum_inside_sqrt_by_hand(w, m, v, grads, lrs, b1, b2, eps):
    for g, lr in zip(grads, lrs):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        w = w - lr * m / np.sqrt(v + eps * eps)
    return w, m, v


@pytest.mark.parametrize("eps", [1e-7, 1e-2, 1.0], ids=["eps1e-7", "eps1e-2", "eps1"])
def test_adam_sum_inside_sqrt_matches_hand_formula(eps):
    hypers = _hypers("Adam", beta_1=0.8, beta_2=0.9, epsilon=eps, sum_inside_sqrt=True)
    w0, grads = _inputs(seed=5, steps=3)
    zeros = np.zeros(SHAPE)
    got_w, got_slots = _run_numpy(
        "Adam",
        hypers,
        w0,
        {"momenta": zeros, "velocities": zeros},
        grads,
        LEARNING_RATES,
    )
    want_w, want_m, want_v = _adam_sum_inside_sqrt_by_hand(
        w0.astype(np.float64),
        zeros,
        zeros,
        [g.astype(np.float64) for g in grads],
        LEARNING_RATES,
        0.8,
        0.9,
        eps,
    )
    np.testing.assert_allclose(got_w, want_w, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got_slots["momenta"], want_m, rtol=1e-12)
    np.testing.assert_allclose(got_slots["velocities"], want_v, rtol=1e-12)


def test_adam_sum_inside_sqrt_vs_tf_kernel_depends_on_epsilon():
    """sqrt(v + ε²) ≈ sqrt(v) + ε for a tiny ε, not for ε = 1."""
    w0, grads = _inputs(seed=11, steps=3)
    zeros = np.zeros(SHAPE, np.float32)
    slots0 = {"momenta": zeros, "velocities": zeros}
    lrs = LEARNING_RATES

    tiny = _hypers("Adam", epsilon=1e-7, sum_inside_sqrt=True)
    got_w, got_slots = _run_numpy("Adam", _float32_values(tiny), w0, slots0, grads, lrs)
    tf_w, tf_slots = _run_tf("Adam", tiny, w0, slots0, grads, lrs)
    # Not equal at float32 tolerance: where |g| is small, sqrt(v) is only ~1e-3
    # and ε = 1e-7 shifts the step by ~1e-4 relative. But the difference stays
    # tiny in absolute terms.
    assert np.max(np.abs(got_w - tf_w)) < 1e-4
    for slot in tf_slots:  # The moments never depend on the denominator.
        np.testing.assert_allclose(
            got_slots[slot], tf_slots[slot], rtol=RTOL_F32, atol=ATOL_F32
        )

    big = _hypers("Adam", epsilon=1.0, sum_inside_sqrt=True)
    got_w, _ = _run_numpy("Adam", big, w0, slots0, grads, lrs)
    tf_w, _ = _run_tf("Adam", big, w0, slots0, grads, lrs)
    assert np.max(np.abs(got_w - tf_w)) > 1e-2


# --- Golden numbers of docs/tpu_semantics.md §6 ------------------------------


def _apply_to_rows(definition, hypers, table, slots, rows, grads, lr):
    """Gathers `rows`, runs one `tpu_step` on them, scatters them back."""
    table = table.copy()
    slots = {k: v.copy() for k, v in slots.items()}
    new_rows, new_slots = rules.tpu_step(
        definition,
        rules.NUMPY,
        table[rows],
        {k: v[rows] for k, v in slots.items()},
        grads,
        lr,
        hypers,
    )
    table[rows] = new_rows
    for k in slots:
        slots[k][rows] = new_slots[k]
    return table, slots


@pytest.mark.parametrize("case", list(GOLDEN))
def test_golden_numbers_of_tpu_semantics(case):
    spec = GOLDEN[case]
    definition = registry.BY_NAME[spec["name"]]
    hypers = _hypers(spec["name"], **spec["hypers"])
    video = np.arange(32, dtype=np.float64).reshape(8, 4)
    user = np.arange(32, dtype=np.float64).reshape(16, 2)
    video_slots = _initial_slots(definition, hypers, video.shape)
    user_slots = _initial_slots(definition, hypers, user.shape)

    new_video, new_video_slots = _apply_to_rows(
        definition, hypers, video, video_slots, VIDEO_ROWS, VIDEO_GRADS, GOLDEN_LR
    )
    new_user, new_user_slots = _apply_to_rows(
        definition, hypers, user, user_slots, USER_ROWS, USER_GRADS, GOLDEN_LR
    )

    # The table prints six decimals; rounding error is at most 5e-7.
    atol = 1e-6
    np.testing.assert_allclose(new_video[0], spec["video0"], rtol=0, atol=atol)
    np.testing.assert_allclose(new_video[1], spec["video1"], rtol=0, atol=atol)
    np.testing.assert_allclose(new_user[0], spec["user0"], rtol=0, atol=atol)
    np.testing.assert_allclose(new_user[3], spec["user3"], rtol=0, atol=atol)
    assert set(spec["slots0"]) <= set(new_video_slots)
    for slot, want in spec["slots0"].items():
        np.testing.assert_allclose(
            new_video_slots[slot][0], want, rtol=0, atol=atol, err_msg=slot
        )

    # Untouched rows and their slots keep their initial values.
    np.testing.assert_array_equal(new_video[2:], video[2:])
    np.testing.assert_array_equal(new_user[4:], user[4:])
    for slot in video_slots:
        np.testing.assert_array_equal(new_video_slots[slot][2:], video_slots[slot][2:])
        np.testing.assert_array_equal(new_user_slots[slot][4:], user_slots[slot][4:])


# --- ProximalYogi against a scalar transcription of TF Addons' Yogi ----------


def _sign(x):
    return (x > 0) - (x < 0)


def _yogi_scalar(w, v, m, g, lr, beta1, beta2, eps, l1, l2):
    """One element of TF Addons' Yogi with sign activation and no bias correction.

    Written element by element with the `math` module, following
    docs/tpu_semantics.md §2.12.
    """
    m = beta1 * m + (1.0 - beta1) * g
    g2 = g * g
    v = v + (1.0 - beta2) * _sign(g2 - v) * g2
    per_coord_lr = lr / (math.sqrt(v) + eps)
    var_update = w - per_coord_lr * m
    if l1 > 0:
        new_w = _sign(var_update) * max(abs(var_update) - per_coord_lr * l1, 0.0)
    else:
        new_w = var_update
    new_w = new_w / (1.0 + per_coord_lr * l2)
    return new_w, v, m


def _yogi_reference(w0, grads, lrs, h):
    rows, cols = w0.shape
    w = [[float(w0[i][j]) for j in range(cols)] for i in range(rows)]
    v = [[h["initial_accumulator_value"]] * cols for _ in range(rows)]
    m = [[0.0] * cols for _ in range(rows)]
    for g, lr in zip(grads, lrs):
        for i in range(rows):
            for j in range(cols):
                w[i][j], v[i][j], m[i][j] = _yogi_scalar(
                    w[i][j],
                    v[i][j],
                    m[i][j],
                    float(g[i][j]),
                    lr,
                    h["beta_1"],
                    h["beta_2"],
                    h["epsilon"],
                    h["l1_regularization_strength"],
                    h["l2_regularization_strength"],
                )
    return np.array(w), np.array(v), np.array(m)


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param({}, id="defaults"),
        pytest.param(
            {
                "beta_1": 0.5,
                "beta_2": 0.8,
                "epsilon": 1e-2,
                "initial_accumulator_value": 0.5,
            },
            id="b.5-b.8-eps1e-2-v0.5",
        ),
        pytest.param({"l2_regularization_strength": 0.3}, id="l2"),
        pytest.param(
            {"l1_regularization_strength": 0.02, "l2_regularization_strength": 0.1},
            id="l1-l2",
        ),
        pytest.param({"l1_regularization_strength": 0.5}, id="big_l1"),
    ],
)
@pytest.mark.parametrize("steps", [1, 3], ids=["1step", "3steps"])
def test_proximal_yogi_matches_tfa_transcription(overrides, steps):
    hypers = _hypers("ProximalYogi", **overrides)
    definition = registry.BY_NAME["ProximalYogi"]
    w0, grads = _inputs(seed=21 + steps, steps=steps)
    lrs = LEARNING_RATES[:steps]
    got_w, got_slots = _run_numpy(
        "ProximalYogi",
        hypers,
        w0,
        _initial_slots(definition, hypers, SHAPE),
        grads,
        lrs,
    )
    want_w, want_v, want_m = _yogi_reference(w0, grads, lrs, hypers)
    np.testing.assert_allclose(got_w, want_w, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got_slots["v"], want_v, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got_slots["m"], want_m, rtol=1e-10, atol=1e-12)
    if overrides.get("l1_regularization_strength", 0) >= 0.5:
        # A strong L1 zeroes some (but not all) entries.
        assert 0 < np.count_nonzero(got_w == 0) < got_w.size


def test_proximal_yogi_without_regularization_is_plain_yogi():
    """With l1 = l2 = 0 the proximal step is the identity: w − η·m/(√v + ε)."""
    h = _hypers("ProximalYogi", beta_1=0.7, beta_2=0.9, epsilon=1e-3)
    definition = registry.BY_NAME["ProximalYogi"]
    rng = np.random.default_rng(3)
    w = rng.normal(size=SHAPE)
    slots = {"v": rng.uniform(0.1, 3.0, SHAPE), "m": rng.normal(size=SHAPE)}
    g = rng.normal(size=SHAPE) * 2
    new_w, new_slots = definition.update(rules.NUMPY, w, dict(slots), g, 0.05, h)
    m, v = new_slots["m"], new_slots["v"]
    np.testing.assert_allclose(m, 0.7 * slots["m"] + 0.3 * g, rtol=1e-12)
    np.testing.assert_allclose(
        v, slots["v"] + 0.1 * np.sign(g * g - slots["v"]) * g * g, rtol=1e-12
    )
    np.testing.assert_allclose(
        new_w, w - 0.05 * m / (np.sqrt(v) + 1e-3), rtol=1e-12, atol=1e-15
    )


def test_proximal_yogi_second_moment_is_unchanged_when_g_squared_equals_v():
    """sign(g² − v) = 0 leaves v as it is (the Yogi rule, not Adam's EMA)."""
    h = _hypers("ProximalYogi", initial_accumulator_value=4.0)
    definition = registry.BY_NAME["ProximalYogi"]
    w = np.array([1.0, 1.0, 1.0])
    slots = {"v": np.array([4.0, 4.0, 4.0]), "m": np.zeros(3)}
    g = np.array([2.0, -2.0, 3.0])
    _, new_slots = definition.update(rules.NUMPY, w, dict(slots), g, 0.1, h)
    np.testing.assert_allclose(
        new_slots["v"], [4.0, 4.0, 4.0 + 0.001 * 9.0], rtol=1e-12
    )


# --- Order of the steps in tpu_step ------------------------------------------

SGD = registry.BY_NAME["SGD"]


@pytest.mark.parametrize(
    "w, g, lr, options, want",
    [
        pytest.param(1.0, 5.0, 0.5, {}, -1.5, id="plain_sgd"),
        pytest.param(
            1.0,
            5.0,
            0.5,
            {"clip_gradient_min": -1.0, "clip_gradient_max": 2.0},
            0.0,  # g → 2: 1 − 0.5·2
            id="grad_clip_upper",
        ),
        pytest.param(
            1.0,
            -5.0,
            0.5,
            {"clip_gradient_min": -1.0, "clip_gradient_max": 2.0},
            1.5,  # g → −1: 1 + 0.5
            id="grad_clip_lower",
        ),
        pytest.param(
            1.0,
            5.0,
            0.5,
            {"clip_gradient_min": -1.0},
            -1.5,
            id="grad_clip_lower_only_inactive",
        ),
        pytest.param(
            1.0,
            2.0,
            0.5,
            {"weight_decay_factor": 0.1},
            -0.1,  # decay first: 0.9 − 1.0 (decay after would give 0.0)
            id="decay_before_update",
        ),
        pytest.param(
            1.0,
            2.0,
            0.5,
            {
                "weight_decay_factor": 0.1,
                "multiply_weight_decay_factor_by_learning_rate": True,
            },
            -0.05,  # λ·η = 0.05: 0.95 − 1.0
            id="decay_times_lr",
        ),
        pytest.param(
            1.0,
            2.0,
            0.5,
            {"weight_decay_factor": 0.0},
            0.0,
            id="decay_zero_is_off",
        ),
        pytest.param(
            1.0,
            5.0,
            0.5,
            {
                "clip_gradient_min": -1.0,
                "clip_gradient_max": 2.0,
                "weight_decay_factor": 0.1,
                "clip_weight_min": 0.0,
            },
            0.0,  # g → 2, w → 0.9, 0.9 − 1.0 = −0.1, clip at 0 → 0
            id="all_four_clip_weight_min",
        ),
        pytest.param(
            1.0,
            -5.0,
            0.5,
            {
                "clip_gradient_min": -1.0,
                "clip_gradient_max": 2.0,
                "weight_decay_factor": 0.2,
                "multiply_weight_decay_factor_by_learning_rate": True,
                "clip_weight_max": 1.2,
            },
            1.2,  # g → −1, w → 0.9, 0.9 + 0.5 = 1.4, clip at 1.2
            id="all_four_clip_weight_max",
        ),
        pytest.param(
            1.0,
            2.0,
            0.5,
            {"weight_decay_factor": 0.1, "clip_weight_min": -0.05},
            -0.05,  # weight clip after the update (before it, −0.1 would stay)
            id="weight_clip_after_update",
        ),
    ],
)
def test_tpu_step_order_with_sgd(w, g, lr, options, want):
    new_w, slots = rules.tpu_step(
        SGD, rules.NUMPY, np.array([w]), {}, np.array([g]), lr, {}, **options
    )
    np.testing.assert_allclose(new_w, [want], rtol=0, atol=1e-12)
    assert dict(slots) == {}


def test_tpu_step_element_wise_on_a_row():
    w = np.array([1.0, -2.0, 3.0, 0.5])
    g = np.array([5.0, -5.0, 0.5, 0.0])
    new_w, _ = rules.tpu_step(
        SGD,
        rules.NUMPY,
        w,
        {},
        g,
        0.5,
        {},
        clip_gradient_min=-1.0,
        clip_gradient_max=2.0,
        weight_decay_factor=0.1,
        clip_weight_min=-1.5,
        clip_weight_max=2.5,
    )
    # g → [2, −1, 0.5, 0]; w → 0.9·w = [0.9, −1.8, 2.7, 0.45];
    # minus 0.5·g → [−0.1, −1.3, 2.45, 0.45]; clip to [−1.5, 2.5] (none bind).
    np.testing.assert_allclose(new_w, [-0.1, -1.3, 2.45, 0.45], atol=1e-12)


def test_tpu_step_clips_gradient_before_slots_and_weights_only_after():
    """Adagrad: the clipped gradient reaches the accumulator; slots are not clipped."""
    adagrad = registry.BY_NAME["Adagrad"]
    new_w, slots = rules.tpu_step(
        adagrad,
        rules.NUMPY,
        np.array([1.0]),
        {"accumulators": np.array([5.0])},
        np.array([3.0]),
        0.5,
        {"initial_accumulator_value": 5.0},
        clip_gradient_max=2.0,
        clip_weight_min=-0.2,
        clip_weight_max=0.2,
    )
    # g → 2, a = 5 + 4 = 9, w = 1 − 0.5·2/3 = 2/3, clipped to 0.2; a stays 9.
    np.testing.assert_allclose(new_w, [0.2], atol=1e-12)
    np.testing.assert_allclose(slots["accumulators"], [9.0], atol=1e-12)


# --- Zero gradients (docs/tpu_semantics.md §1.2, §1.3) -----------------------


def _one_step(name, hypers, w, slots, g, lr):
    definition = registry.BY_NAME[name]
    new_w, new_slots = definition.update(rules.NUMPY, w, dict(slots), g, lr, hypers)
    return np.asarray(new_w), {k: np.asarray(v) for k, v in new_slots.items()}


NOOP_CASES = [
    pytest.param("SGD", {}, id="sgd"),
    pytest.param("Adagrad", {}, id="adagrad"),
    pytest.param("FTRL", {}, id="ftrl"),
    pytest.param(
        "FTRL",
        {
            "l1_regularization_strength": 0.05,
            "l2_regularization_strength": 0.1,
            "beta": 0.2,
            "learning_rate_power": -0.6,
        },
        id="ftrl-l1-l2-beta",
    ),
    pytest.param(
        "FTRL",
        {"multiply_linear_by_learning_rate": True, "l1_regularization_strength": 0.05},
        id="ftrl-linear_by_lr-l1",
    ),
]


@pytest.mark.parametrize("name, overrides", NOOP_CASES)
def test_zero_gradient_is_a_noop_with_consistent_slots(name, overrides):
    definition = registry.BY_NAME[name]
    hypers = _hypers(name, **overrides)
    w0, (g1,) = _inputs(seed=31, steps=1)
    w0, g1 = w0.astype(np.float64), g1.astype(np.float64)
    # One real step makes weights and slots consistent (FTRL's w = N/Q).
    w1, slots1 = _one_step(
        name, hypers, w0, _initial_slots(definition, hypers, SHAPE), g1, 0.1
    )
    w2, slots2 = _one_step(name, hypers, w1, slots1, np.zeros(SHAPE), 0.1)
    np.testing.assert_allclose(w2, w1, rtol=1e-12, atol=1e-15)
    for slot in slots1:
        np.testing.assert_allclose(slots2[slot], slots1[slot], rtol=1e-12, atol=1e-15)
    assert definition.zero_gradient_is_noop


def test_ftrl_zero_gradient_recomputes_w_from_inconsistent_slots():
    """FTRL recomputes w = N/Q from its slots (the packing note of §1.3)."""
    hypers = _hypers("FTRL")
    definition = registry.BY_NAME["FTRL"]
    w0, _ = _inputs(seed=32, steps=1)
    slots0 = _initial_slots(definition, hypers, SHAPE)  # linear = 0
    w1, slots1 = _one_step(
        "FTRL", hypers, w0.astype(np.float64), slots0, np.zeros(SHAPE), 0.1
    )
    np.testing.assert_array_equal(w1, np.zeros(SHAPE))
    np.testing.assert_array_equal(slots1["linears"], np.zeros(SHAPE))


CHANGING_CASES = [
    pytest.param("Momentum", {"momentum": 0.5}, id="momentum"),
    pytest.param(
        "Momentum", {"momentum": 0.5, "use_nesterov": True}, id="momentum-nesterov"
    ),
    pytest.param("Adam", {"sum_inside_sqrt": False}, id="adam"),
    pytest.param("RMSProp", {"rho": 0.8, "momentum": 0.5}, id="rmsprop"),
]


@pytest.mark.parametrize("name, overrides", CHANGING_CASES)
def test_zero_gradient_still_updates_rows_with_nonzero_slots(name, overrides):
    """A looked-up row whose gradient sums to 0 still moves (TPU note §1.2)."""
    definition = registry.BY_NAME[name]
    hypers = _hypers(name, **overrides)
    w0, (g1,) = _inputs(seed=41, steps=1)
    slots0 = _initial_slots(definition, hypers, SHAPE)
    # A first step gives non-zero slots; then a zero gradient.
    grads = [g1, np.zeros(SHAPE, np.float32)]
    lrs = (0.1, 0.1)
    w1, _ = _run_numpy(name, hypers, w0, slots0, grads[:1], lrs[:1])
    w2, _ = _assert_matches_tf(name, hypers, w0, slots0, grads, lrs)
    assert np.all(np.abs(w2 - w1) > 1e-6)
    assert not definition.zero_gradient_is_noop
