"""LaProp (arXiv:2002.04839) as jax-tpu-embedding computes it.

Only the `jax-tpu-embedding` engine has it (`LaPropOptimizerSpec`); the
TensorFlow engines refuse it by name. Its per-row update is the lowering in
jax-tpu-embedding 0.1.0's `sparse_dense_matmul_grad_with_laprop.py`, its
decay schedule `LaPropOptimizerSpec.get_decay_rate` (docs/tpu_semantics.md,
"jax-tpu-embedding").
"""

from tf_tpu_embed_opt.definitions.spec import (
    NON_NEGATIVE,
    POSITIVE,
    UNIT_INTERVAL_OPEN,
    Definition,
    Hyper,
    JaxFace,
    KerasFace,
    Slot,
)


def update(xp, w, slots, g, lr, h):
    decay = h["decay_rate"]
    nu = decay * slots["nu"] + (1 - decay) * (xp.square(g) + h["epsilon"])
    beta_1 = h["beta_1"]
    # Momentum of the normalized gradient, scaled by √(1 − β₁²).
    mu = beta_1 * slots["mu"] + xp.sqrt(1 - beta_1 * beta_1) * (g / xp.sqrt(nu))
    return w - lr * mu, {"mu": mu, "nu": nu}


def decay_rate(xp, step, h):
    """β₂·(1 − β₂ᵗ⁻¹)/(1 − β₂ᵗ): the bias correction of ν as a decay schedule.

    0 at the first step (ν is then g² + ε), β₂ in the limit.
    """
    beta_2 = h["beta_2"]
    return {
        "decay_rate": beta_2
        * (1 - xp.power(beta_2, step - 1))
        / (1 - xp.power(beta_2, step))
    }


HYPERS = (
    Hyper("beta_1", 0.9, "float", "Decay of the momentum μ.", UNIT_INTERVAL_OPEN),
    Hyper(
        "beta_2",
        0.95,
        "float",
        "Decay of the second moment ν (bias-corrected by the schedule).",
        UNIT_INTERVAL_OPEN,
    ),
    Hyper(
        "epsilon",
        1e-30,
        "float",
        "Added to g² inside the second moment.",
        POSITIVE,
    ),
    Hyper(
        "initial_slot_value",
        0.0,
        "float",
        "Starting value of both slots.",
        NON_NEGATIVE,
    ),
)

DEFINITION = Definition(
    name="LaProp",
    learning_rate_default=0.001,
    hypers=HYPERS,
    slots=(
        Slot("mu", "initial_slot_value", "Momentum of g/√ν.", keras_name="momentum"),
        Slot("nu", "initial_slot_value", "Second moment ν.", keras_name="velocity"),
    ),
    rule=update,
    summary="LaProp: momentum over the RMS-normalized gradient (JAX engine only).",
    math=(
        "d = β₂·(1−β₂ᵗ⁻¹)/(1−β₂ᵗ);  ν ← d·ν + (1−d)·(g² + ε);  "
        "μ ← β₁·μ + √(1−β₁²)·g/√ν;  w ← w − η·μ"
    ),
    sources=(
        "jax-tpu-embedding `LaPropOptimizerSpec` and "
        "`sparse_dense_matmul_grad_with_laprop.py`; docs/tpu_semantics.md, "
        "jax-tpu-embedding."
    ),
    zero_gradient_is_noop=False,
    keras=KerasFace(
        name="LaProp",
        # The momentum keeps moving w, ν decays.
        zero_gradient_steps=lambda arguments: True,
        # With β₁ = 0 the momentum is the normalized gradient: zero.
        zero_gradient_keeps_weights=lambda arguments: arguments["beta_1"] == 0,
    ),
    step_hypers=decay_rate,
    jax=JaxFace(
        "LaPropOptimizerSpec",
        fields={"beta_1": "b1", "beta_2": "b2", "epsilon": "eps"},
        implied={"lazy": True},
    ),
)
