"""Centered RMSProp, the TPU engine's `centered_rms_prop`."""

from tf_tpu_embed_opt.definitions.algorithms import rms_prop
from tf_tpu_embed_opt.definitions.spec import Definition, Slot, TensorFlowFace


def update(xp, w, slots, g, lr, h):
    ms = rms_prop.moving_mean(slots["ms"], xp.square(g), h["rho"])
    mg = rms_prop.moving_mean(slots["mg"], g, h["rho"])
    denom = xp.sqrt(ms - xp.square(mg) + h["epsilon"])
    mom = rms_prop.momentum(slots, lr * g / denom, h)
    return w - mom, {"ms": ms, "mom": mom, "mg": mg}


DEFINITION = Definition(
    name="CenteredRMSProp",
    tensorflow=TensorFlowFace(
        "centered_rms_prop",
        "CenteredRMSProp",
        reference_kernel="ResourceApplyCenteredRMSProp",
    ),
    learning_rate_default=0.001,
    demo_learning_rate=0.03,
    # Same hyperparameters (names, defaults, bounds, proto fields) as RMSProp;
    # its Keras twin is RMSprop(centered=True).
    hypers=rms_prop.HYPERS,
    slots=(
        rms_prop.MS,
        rms_prop.MOM,
        Slot("mg", 0.0, "Moving mean of g.", keras_name="average_gradient"),
    ),
    rule=update,
    summary="RMSProp normalised by the variance instead of the second moment.",
    math=(
        "ms ← ms + (1−ρ)·(g² − ms);  mg ← mg + (1−ρ)·(g − mg);  "
        "mom ← μ·mom + η·g/√(ms − mg² + ε);  w ← w − mom"
    ),
    sources=(
        "TensorFlow `ApplyCenteredRMSProp` (the proto's reference); "
        "docs/tpu_semantics.md §2.8."
    ),
    zero_gradient_is_noop=False,
)
