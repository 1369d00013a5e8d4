"""RMSProp, the TPU engine's `rms_prop`."""

from tf_tpu_embed_opt.definitions.spec import (
    POSITIVE,
    UNIT_INTERVAL_OPEN,
    Definition,
    Hyper,
    KerasArg,
    KerasFace,
    Slot,
    TensorFlowFace,
)


def update(xp, w, slots, g, lr, h):
    ms = moving_mean(slots["ms"], xp.square(g), h["rho"])
    mom = momentum(slots, lr * g / xp.sqrt(ms + h["epsilon"]), h)
    return w - mom, {"ms": ms, "mom": mom}


def moving_mean(mean, value, rho):
    """ρ·mean + (1 − ρ)·value, in Keras's order (RMSprop, Adadelta)."""
    return rho * mean + (1 - rho) * value


def momentum(slots, step, h):
    """The new `mom`: μ·mom + step; just `step` when μ = 0 (`mom` unread)."""
    if h["momentum"] == 0:
        return step
    return h["momentum"] * slots["mom"] + step


MS = Slot("ms", 0.0, "Moving mean of g².", keras_name="velocity")
# As in Keras, the Keras twin keeps `mom` only with momentum: with μ = 0 the
# engine's `mom` is the step itself and is never read.
MOM = Slot(
    "mom",
    0.0,
    "Momentum of the update.",
    keras_name="momentum",
    when=lambda arguments: arguments["momentum"] != 0,
)


HYPERS = (
    Hyper(
        "rho",
        0.9,
        "float",
        "Decay of the mean square.",
        UNIT_INTERVAL_OPEN,
    ),
    Hyper(
        "momentum",
        0.0,
        "float",
        "Momentum of the update.",
        UNIT_INTERVAL_OPEN,
    ),
    Hyper(
        "epsilon",
        1e-07,
        "float",
        "Added to the mean square inside the square root.",
        POSITIVE,
    ),
)

DEFINITION = Definition(
    name="RMSProp",
    tensorflow=TensorFlowFace(
        "rms_prop",
        "RMSProp",
        reference_kernel="ResourceApplyRMSProp",
    ),
    learning_rate_default=0.001,
    demo_learning_rate=0.03,
    hypers=HYPERS,
    slots=(MS, MOM),
    rule=update,
    summary="RMSProp with momentum; epsilon inside the square root.",
    math=("ms ← ms + (1−ρ)·(g² − ms);  mom ← μ·mom + η·g/√(ms + ε);  w ← w − mom"),
    sources=(
        "TensorFlow `ApplyRMSProp` (the proto's reference); defaults from "
        "Keras RMSprop; docs/tpu_semantics.md §2.7 (`ms` starts at 0 as in "
        "TensorFlow 1 and Keras)."
    ),
    zero_gradient_is_noop=False,
    keras=KerasFace(
        name="RMSprop",
        arguments=(
            *(KerasArg.mirroring(h) for h in HYPERS),
            KerasArg(
                "centered",
                False,
                "bool",
                "Normalise by the variance: the engine's CenteredRMSProp.",
            ),
        ),
        stock="RMSprop",
        variants={"centered": "CenteredRMSProp"},
        # The mean square (and the momentum) decay with a zero gradient.
        zero_gradient_steps=lambda arguments: True,
        # Without momentum the step is the gradient scaled: zero (centered or
        # not), so only the mean squares change.
        zero_gradient_keeps_weights=lambda arguments: arguments["momentum"] == 0,
    ),
)
