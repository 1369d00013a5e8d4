"""Momentum in TensorFlow 1's form (`m ← μ·m + g`), the TPU engine's `momentum`."""

from tf_tpu_embed_opt.definitions.spec import (
    UNIT_INTERVAL_OPEN,
    Definition,
    Hyper,
    KerasFace,
    Slot,
    TensorFlowFace,
)


def update(xp, w, slots, g, lr, h):
    m = h["momentum"] * slots["momenta"] + g
    step = g + h["momentum"] * m if h["use_nesterov"] else m
    return w - lr * step, {"momenta": m}


DEFINITION = Definition(
    name="Momentum",
    tensorflow=TensorFlowFace(
        "momentum",
        "Momentum",
        reference_kernel="ResourceApplyMomentum",
    ),
    learning_rate_default=0.01,
    demo_learning_rate=3.0,
    hypers=(
        Hyper(
            "momentum",
            0.9,
            "float",
            "Decay μ of the momentum accumulator.",
            UNIT_INTERVAL_OPEN,
        ),
        Hyper(
            "use_nesterov",
            False,
            "bool",
            "Use Nesterov momentum.",
        ),
    ),
    slots=(Slot("momenta", 0.0, "Momentum accumulator m.", keras_name="momentum"),),
    rule=update,
    summary="Heavy-ball or Nesterov momentum (TensorFlow 1 form).",
    math="m ← μ·m + g;  w ← w − η·(g + μ·m if nesterov else m)",
    sources=(
        "TensorFlow `ApplyMomentum` (the proto's reference); "
        "docs/tpu_semantics.md §2.6."
    ),
    zero_gradient_is_noop=False,
    keras=KerasFace(
        name="Momentum",
        zero_gradient_steps=lambda arguments: arguments["momentum"] != 0,
    ),
)
