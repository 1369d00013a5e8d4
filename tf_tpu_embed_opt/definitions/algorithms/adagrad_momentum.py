"""Adagrad with momentum (arXiv:2002.11803), the TPU engine's `adagrad_momentum`."""

from tf_tpu_embed_opt.definitions.spec import (
    NON_NEGATIVE,
    NON_ZERO,
    POSITIVE,
    UNIT_INTERVAL,
    Definition,
    Hyper,
    JaxFace,
    KerasArg,
    KerasFace,
    Slot,
    SparseCoreOptimizer,
    TensorFlowFace,
)


def update(xp, w, slots, g, lr, h):
    beta2 = h["beta2"]
    if beta2 == 1:
        a = slots["accumulators"] + xp.square(g)
    else:
        a = beta2 * slots["accumulators"] + (1 - beta2) * xp.square(g)
    scaled = g * xp.power(a + h["epsilon"], -1.0 / h["exponent"])
    m = h["momentum"] * slots["momenta"] + scaled
    step = h["momentum"] * m + scaled if h["use_nesterov"] else m
    return w - lr * step, {"accumulators": a, "momenta": m}


HYPERS = (
    Hyper(
        "momentum",
        0.0,
        "float",
        "Decay of the momentum accumulator (1: none, as TensorFlow allows).",
        UNIT_INTERVAL,
    ),
    Hyper(
        "use_nesterov",
        False,
        "bool",
        "Use Nesterov momentum.",
    ),
    Hyper(
        "exponent",
        2,
        "float",
        "Exponent k of the preconditioner (a + ε)^(−1/k).",
        POSITIVE,
    ),
    Hyper(
        "beta2",
        1,
        "float",
        "Decay of the accumulator; 1 keeps a running sum.",
        UNIT_INTERVAL,
    ),
    Hyper(
        "epsilon",
        1e-10,
        "float",
        "Offset added to the accumulator at every step.",
        POSITIVE,
    ),
)


def _initial(name, slot, doc):
    # jax-tpu-embedding's spec starts the slots where the user says; the
    # TensorFlow engines at 0.
    return KerasArg(
        name,
        0.0,
        "float",
        f"Starting value of the {slot} slot ({doc}; the TensorFlow engines "
        "start at 0).",
        NON_NEGATIVE,
        engine=0.0,
        keyword=True,
    )


DEFINITION = Definition(
    name="AdagradMomentum",
    tensorflow=TensorFlowFace(
        "adagrad_momentum",
        "AdagradMomentum",
        tensorflow_class="AdagradMomentum",
        checks=("epsilon", "exponent"),
    ),
    learning_rate_default=0.001,
    demo_learning_rate=0.1,
    # What TPUEmbeddingV2 hands SparseCore's op (TF 2.21 tpu_embedding_v3.py).
    sparsecore=SparseCoreOptimizer(
        attributes={
            "momentum": "beta1",
            "use_nesterov": "use_nesterov",
            "exponent": "exponent",
            "beta2": "beta2",
            "epsilon": "epsilon",
        },
    ),
    hypers=HYPERS,
    slots=(
        Slot(
            "accumulators",
            0.0,
            "Σ g² (or its moving average).",
            keras_name="accumulator",
            keras_initial="initial_accumulator_value",
        ),
        Slot(
            "momenta",
            0.0,
            "Momentum of the preconditioned gradient.",
            keras_name="momentum",
            keras_initial="initial_momentum_value",
        ),
    ),
    rule=update,
    summary="Adagrad preconditioning followed by (Nesterov) momentum.",
    math=(
        "a ← a + g² if β₂ = 1 else β₂·a + (1−β₂)·g²;  ĝ = g·(a + ε)^(−1/k);  "
        "m ← μ·m + ĝ;  w ← w − η·(μ·m + ĝ if nesterov else m)"
    ),
    sources=(
        "SparseCore `XlaSparseCoreAdagradMomentum`; TF TPU tests; "
        "docs/tpu_semantics.md §2.3 (the proto comment's formula is loose)."
    ),
    keras=KerasFace(
        name="AdagradMomentum",
        arguments=(
            # The exponent's domain is jax-tpu-embedding's, which computes
            # (a + ε)^(−1/k) for any k but 0 (its tests use k = −0.5);
            # TensorFlow's engines take k > 0.
            *(
                KerasArg.mirroring(h, NON_ZERO if h.name == "exponent" else None)
                for h in HYPERS
            ),
            _initial(
                "initial_accumulator_value",
                "accumulators",
                "jax-tpu-embedding's `initial_accumulator_value`",
            ),
            _initial(
                "initial_momentum_value",
                "momenta",
                "jax-tpu-embedding's `initial_momentum_value`",
            ),
        ),
        # The momentum keeps moving w, a decaying accumulator changes.
        zero_gradient_steps=lambda arguments: (
            arguments["momentum"] != 0 or arguments["beta2"] != 1
        ),
        # Without momentum w moves by the scaled gradient only: zero.
        zero_gradient_keeps_weights=lambda arguments: arguments["momentum"] == 0,
    ),
    jax=JaxFace(
        "AdagradMomentumOptimizerSpec",
        record="ADAGRAD_MOMENTUM",
        implied={"lazy": True},
        slots={"accumulators": "accumulator", "momenta": "momentum"},
    ),
)
