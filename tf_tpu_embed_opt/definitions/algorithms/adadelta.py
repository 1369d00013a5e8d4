"""Adadelta, the TPU engine's `adadelta`."""

from tf_tpu_embed_opt.definitions.algorithms import rms_prop
from tf_tpu_embed_opt.definitions.spec import (
    POSITIVE,
    UNIT_INTERVAL_OPEN,
    Definition,
    Hyper,
    KerasFace,
    Slot,
    TensorFlowFace,
)


def update(xp, w, slots, g, lr, h):
    rho, eps = h["rho"], h["epsilon"]
    acc = rms_prop.moving_mean(slots["accumulators"], xp.square(g), rho)
    step = xp.sqrt(slots["updates"] + eps) * g / xp.sqrt(acc + eps)
    upd = rms_prop.moving_mean(slots["updates"], xp.square(step), rho)
    return w - lr * step, {"accumulators": acc, "updates": upd}


DEFINITION = Definition(
    name="Adadelta",
    tensorflow=TensorFlowFace(
        "adadelta",
        "Adadelta",
        reference_kernel="ResourceApplyAdadelta",
    ),
    learning_rate_default=0.001,
    demo_learning_rate=30.0,
    hypers=(
        Hyper(
            "rho",
            0.95,
            "float",
            "Decay of both moving averages.",
            UNIT_INTERVAL_OPEN,
        ),
        Hyper(
            "epsilon",
            1e-07,
            "float",
            "Added inside both square roots.",
            POSITIVE,
        ),
    ),
    slots=(
        Slot("accumulators", 0.0, "Moving mean of g².", keras_name="accumulated_grad"),
        Slot(
            "updates",
            0.0,
            "Moving mean of the squared step.",
            keras_name="accumulated_delta_var",
        ),
    ),
    rule=update,
    summary="Adadelta; defaults from Keras Adadelta.",
    math=(
        "acc ← ρ·acc + (1−ρ)·g²;  u = √(upd + ε)/√(acc + ε)·g;  w ← w − η·u;  "
        "upd ← ρ·upd + (1−ρ)·u²"
    ),
    sources=(
        "TensorFlow `ApplyAdadelta` (the proto's reference); "
        "docs/tpu_semantics.md §2.9."
    ),
    zero_gradient_is_noop=False,
    keras=KerasFace(
        name="Adadelta",
        stock="Adadelta",
        slots_by_variable=True,
        # Both moving averages decay with a zero gradient.
        zero_gradient_steps=lambda arguments: True,
        # The step is the gradient scaled by the averages' ratio: zero.
        zero_gradient_keeps_weights=lambda arguments: True,
    ),
)
