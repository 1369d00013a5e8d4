"""Proximal Yogi, the TPU engine's `proximal_yogi` (formula inferred)."""

from tf_tpu_embed_opt.definitions.algorithms.proximal_adagrad import proximal_step
from tf_tpu_embed_opt.definitions.algorithms.shared import (
    L1_REGULARIZATION,
    L2_REGULARIZATION,
    initial_accumulator,
)
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
    beta_1, beta_2 = h["beta_1"], h["beta_2"]
    m = beta_1 * slots["m"] + (1 - beta_1) * g
    g2 = xp.square(g)
    v = slots["v"] + (1 - beta_2) * xp.sign(g2 - slots["v"]) * g2
    lr_eff = lr / (xp.sqrt(v) + h["epsilon"])
    new_w = proximal_step(
        xp,
        w - lr_eff * m,
        lr_eff,
        h["l1_regularization_strength"],
        h["l2_regularization_strength"],
    )
    return new_w, {"v": v, "m": m}


DEFINITION = Definition(
    name="ProximalYogi",
    tensorflow=TensorFlowFace(
        "proximal_yogi",
        "ProximalYogi",
    ),
    learning_rate_default=0.01,
    demo_learning_rate=0.1,
    hypers=(
        Hyper(
            "beta_1",
            0.9,
            "float",
            "Decay of the first moment.",
            UNIT_INTERVAL_OPEN,
            proto_field="beta1",
        ),
        Hyper(
            "beta_2",
            0.999,
            "float",
            "Rate of the additive second-moment update.",
            UNIT_INTERVAL_OPEN,
            proto_field="beta2",
        ),
        Hyper(
            "epsilon",
            1e-3,
            "float",
            "Added to √v; trades adaptivity against noise.",
            POSITIVE,
        ),
        L1_REGULARIZATION,
        L2_REGULARIZATION,
        initial_accumulator(1e-6, "Starting value of v."),
    ),
    slots=(
        Slot("v", "initial_accumulator_value", "Second moment (Yogi update)."),
        Slot("m", 0.0, "First moment."),
    ),
    rule=update,
    summary="Yogi with an L1/L2 proximal step; no bias correction.",
    math=(
        "m ← β₁·m + (1−β₁)·g;  v ← v + (1−β₂)·sign(g² − v)·g²;  "
        "η' = η/(√v + ε);  p = w − η'·m;  "
        "w ← sign(p)·max(|p| − η'·l1, 0)/(1 + η'·l2)"
    ),
    sources=(
        "Inferred from TF Addons `Yogi` (same parameters and defaults) with the "
        "sign activation and bias correction moved to the learning rate; not "
        "confirmed by a TPU source. Defaults from TensorFlow 1 "
        "`ProximalYogiParameters`; docs/tpu_semantics.md §2.12."
    ),
    zero_gradient_is_noop=False,
    keras=KerasFace(
        name="ProximalYogi",
        # The first moment decays and keeps moving w; the proximal step
        # shrinks w.
        zero_gradient_steps=lambda arguments: (
            arguments["beta_1"] != 0
            or arguments["l1_regularization_strength"] > 0
            or arguments["l2_regularization_strength"] > 0
        ),
    ),
)
