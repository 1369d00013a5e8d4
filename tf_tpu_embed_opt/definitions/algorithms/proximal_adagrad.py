"""Proximal Adagrad, the TPU engine's `proximal_adagrad`."""

from tf_tpu_embed_opt.definitions.algorithms.shared import (
    L1_REGULARIZATION,
    L2_REGULARIZATION,
    initial_accumulator,
)
from tf_tpu_embed_opt.definitions.spec import (
    Definition,
    KerasFace,
    Slot,
    TensorFlowFace,
)


def proximal_step(xp, prox, lr_eff, l1, l2):
    """`prox` shrunk by the L1/L2 proximal operator with step `lr_eff`."""
    if l1 > 0:
        shrunk = xp.sign(prox) * xp.maximum(xp.abs(prox) - lr_eff * l1, 0.0)
    else:
        shrunk = prox
    return shrunk / (1 + lr_eff * l2)


def update(xp, w, slots, g, lr, h):
    a = slots["accumulators"] + xp.square(g)
    lr_eff = lr / xp.sqrt(a)
    new_w = proximal_step(
        xp,
        w - lr_eff * g,
        lr_eff,
        h["l1_regularization_strength"],
        h["l2_regularization_strength"],
    )
    return new_w, {"accumulators": a}


DEFINITION = Definition(
    name="ProximalAdagrad",
    tensorflow=TensorFlowFace(
        "proximal_adagrad",
        "ProximalAdagrad",
        reference_kernel="ResourceApplyProximalAdagrad",
    ),
    learning_rate_default=0.001,
    demo_learning_rate=5.0,
    hypers=(
        initial_accumulator(0.1),
        L1_REGULARIZATION,
        L2_REGULARIZATION,
    ),
    slots=(
        Slot(
            "accumulators",
            "initial_accumulator_value",
            "Σ g².",
            keras_name="accumulator",
        ),
    ),
    rule=update,
    summary="Adagrad followed by an L1/L2 proximal step.",
    math=(
        "a ← a + g²;  η' = η/√a;  p = w − η'·g;  "
        "w ← sign(p)·max(|p| − η'·l1, 0)/(1 + η'·l2)"
    ),
    sources=(
        "TensorFlow `ApplyProximalAdagrad` (the proto's reference); defaults "
        "from TensorFlow 1 `ProximalAdagradParameters`; docs/tpu_semantics.md "
        "§2.10."
    ),
    zero_gradient_is_noop=False,
    keras=KerasFace(
        name="ProximalAdagrad",
        # The proximal step shrinks w even with a zero gradient.
        zero_gradient_steps=lambda arguments: (
            arguments["l1_regularization_strength"] > 0
            or arguments["l2_regularization_strength"] > 0
        ),
    ),
)
