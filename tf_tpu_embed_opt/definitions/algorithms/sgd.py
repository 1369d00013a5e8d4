"""Stochastic gradient descent, the TPU engine's `stochastic_gradient_descent`."""

from tf_tpu_embed_opt.definitions.spec import (
    UNIT_INTERVAL,
    Definition,
    JaxFace,
    KerasArg,
    KerasFace,
    Remap,
    Slot,
    SparseCoreOptimizer,
    TensorFlowFace,
)


def update(xp, w, slots, g, lr, h):
    if not h["momentum"]:
        return w - lr * g, slots
    # Keras's momentum form, on the Keras face only: the engine's SGD has none.
    m = h["momentum"] * slots["momentum"] - lr * g
    step = h["momentum"] * m - lr * g if h["nesterov"] else m
    return w + step, {"momentum": m}


KERAS = KerasFace(
    name="SGD",
    arguments=(
        KerasArg(
            "momentum",
            0.0,
            "float",
            "Keras momentum: m ← μ·m − η·g; w ← w + m (Keras-only; the engine's "
            "TensorFlow 1 form is `Momentum`).",
            UNIT_INTERVAL,
            engine=0.0,
            keras_error="`momentum` must be a float between [0, 1].",
        ),
        KerasArg(
            "nesterov",
            False,
            "bool",
            "Nesterov form of the Keras momentum.",
            engine=False,
        ),
    ),
    extra_slots=(
        Slot(
            "momentum",
            0.0,
            "Keras momentum (exists when momentum != 0).",
            when=lambda arguments: arguments["momentum"] != 0,
        ),
    ),
    stock="SGD",
    # The Keras momentum keeps moving w with a zero gradient.
    zero_gradient_steps=lambda arguments: arguments["momentum"] != 0,
    # Keras's m ← μ·m − η·g, w ← w + m is TensorFlow 1's m ← μ·m + g,
    # w ← w − η·m (the engine's Momentum) scaled by η: the same while η is
    # constant. Nesterov only changes the momentum term.
    remap=Remap(
        applies=lambda arguments: arguments["momentum"] != 0,
        algorithm="Momentum",
        hypers=lambda arguments: {
            "momentum": arguments["momentum"],
            "use_nesterov": arguments["nesterov"],
        },
        arguments=("momentum", "nesterov"),
        needs_constant_learning_rate=(
            "Keras's momentum m ← μ·m − η·g equals the engine's m ← μ·m + g "
            "only for a constant learning rate"
        ),
    ),
)

DEFINITION = Definition(
    name="SGD",
    tensorflow=TensorFlowFace(
        "stochastic_gradient_descent",
        "StochasticGradientDescent",
        tensorflow_class="SGD",
        reference_kernel="ResourceApplyGradientDescent",
    ),
    learning_rate_default=0.01,
    demo_learning_rate=10.0,
    # w − η·(g₁ + g₂) = (w − η·g₁) − η·g₂: contributions one by one are the sum.
    linear_in_gradient=True,
    # What TPUEmbeddingV2 hands SparseCore's op (TF 2.21 tpu_embedding_v3.py).
    sparsecore=SparseCoreOptimizer(),
    hypers=(),
    slots=(),
    rule=update,
    summary="Plain gradient descent; no slots.",
    math="w ← w − η·g",
    sources=(
        "TensorFlow `ApplyGradientDescent`; SparseCore `XlaSparseCoreSgd`; "
        "docs/tpu_semantics.md §2.1."
    ),
    keras=KERAS,
    jax=JaxFace(
        "SGDOptimizerSpec",
        record="SGD",
        implied={"momentum": 0.0, "nesterov": False},
        reasons={
            "momentum": (
                "jax-tpu-embedding's SGD has no momentum (AdagradMomentum is its "
                "only momentum)"
            ),
            "nesterov": "jax-tpu-embedding's SGD has no momentum",
        },
    ),
)
