"""Frequency-aware Adagrad (F2A) as jax-tpu-embedding computes it.

Adagrad whose step is boosted for rarely seen rows: a per-element count of
the row's updates (`local_step`) against the global step. Only the
`jax-tpu-embedding` engine has it (`F2AOptimizerSpec`); the TensorFlow engines
refuse it by name. Its per-row update is the lowering in jax-tpu-embedding
0.1.0's `sparse_dense_matmul_grad_with_f2a.py`; the global step is the `step`
the engine is given (keras-rs: its iteration count, 0 at the first step), as
`F2AOptimizerSpec.get_hyperparameters` passes it (docs/tpu_semantics.md,
"jax-tpu-embedding").
"""

from tf_tpu_embed_opt.definitions.algorithms.shared import (
    L1_REGULARIZATION,
    L2_REGULARIZATION,
    initial_accumulator,
)
from tf_tpu_embed_opt.definitions.spec import (
    NON_NEGATIVE,
    POSITIVE,
    Definition,
    Hyper,
    JaxFace,
    KerasFace,
    Slot,
)


def update(xp, w, slots, g, lr, h):
    local_step = slots["local_step"] + 1
    # The global step counts from 0; the ratio uses at least 1.
    ratio = xp.maximum(h["global_step"], 1.0) / local_step
    boost = xp.minimum(xp.power(ratio, h["rho"]), h["max_lr_multiplier"])
    a = slots["accumulators"] + xp.square(g)
    regularization = (
        h["l1_regularization_strength"] * xp.sign(w)
        + h["l2_regularization_strength"] * w
    )
    step = g * boost / xp.sqrt(a) + regularization
    return w - lr * step, {"accumulators": a, "local_step": local_step}


def global_step(xp, step, h):
    """The engine's global step: the number of earlier steps (0 at the first)."""
    return {"global_step": step - 1}


HYPERS = (
    Hyper(
        "rho",
        0.5,
        "float",
        "Exponent of the frequency boost (global step / row's steps)^ρ.",
        NON_NEGATIVE,
    ),
    initial_accumulator(0.1),
    Hyper(
        "initial_local_step_value",
        0.0,
        "float",
        "Starting value of the per-row step count.",
        NON_NEGATIVE,
    ),
    L1_REGULARIZATION,
    L2_REGULARIZATION,
    Hyper(
        "max_lr_multiplier",
        1e6,
        "float",
        "Upper bound of the frequency boost.",
        POSITIVE,
    ),
)

DEFINITION = Definition(
    name="F2A",
    learning_rate_default=0.01,
    hypers=HYPERS,
    slots=(
        Slot(
            "accumulators",
            "initial_accumulator_value",
            "Σ g².",
            keras_name="accumulator",
        ),
        Slot(
            "local_step",
            "initial_local_step_value",
            "How often the row was updated.",
        ),
    ),
    rule=update,
    summary="Frequency-aware Adagrad with L1/L2 (JAX engine only).",
    math=(
        "n ← n + 1;  b = min((max(t−1, 1)/n)^ρ, max_lr_multiplier);  a ← a + g²;  "
        "w ← w − η·(b·g/√a + l1·sign(w) + l2·w)"
    ),
    sources=(
        "jax-tpu-embedding `F2AOptimizerSpec` and "
        "`sparse_dense_matmul_grad_with_f2a.py`; docs/tpu_semantics.md, "
        "jax-tpu-embedding."
    ),
    zero_gradient_is_noop=False,
    keras=KerasFace(
        name="F2A",
        # The row's step count grows and L1/L2 move w with a zero gradient.
        zero_gradient_steps=lambda arguments: True,
        # Without L1/L2 only the slots move.
        zero_gradient_keeps_weights=lambda arguments: (
            arguments["l1_regularization_strength"] == 0
            and arguments["l2_regularization_strength"] == 0
        ),
    ),
    step_hypers=global_step,
    jax=JaxFace(
        "F2AOptimizerSpec",
        record="F2A",
        implied={"lazy": True},
        slots={"accumulators": "accumulator"},
    ),
)
