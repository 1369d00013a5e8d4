"""Adagrad as the TPU engine computes it: no epsilon, accumulator first."""

from tf_tpu_embed_opt.definitions.algorithms.shared import initial_accumulator
from tf_tpu_embed_opt.definitions.spec import (
    NON_NEGATIVE,
    Definition,
    JaxFace,
    KerasArg,
    KerasFace,
    Slot,
    SparseCoreOptimizer,
    TensorFlowFace,
)

# Keras Adagrad divides by sqrt(a + ε), the engine by sqrt(a). Since a >= a0
# (the initial accumulator), the relative difference of the step is at most
# ε / (2·a0); below this bound (under float32 rounding) ε is negligible.
EPSILON_TOLERANCE = 1e-6


def epsilon_negligible(value, arguments):
    """Whether Keras's epsilon changes the step by at most `EPSILON_TOLERANCE`."""
    initial = arguments["initial_accumulator_value"]
    return initial > 0 and value / (2 * initial) <= EPSILON_TOLERANCE


def update(xp, w, slots, g, lr, h):
    a = slots["accumulators"] + xp.square(g)
    # Keras adds epsilon inside the square root; the engine has none (0).
    return w - lr * g / xp.sqrt(a + h["epsilon"]), {"accumulators": a}


KERAS = KerasFace(
    name="Adagrad",
    arguments=(
        # Keras takes 0 (with epsilon > 0); TensorFlow's engines need > 0.
        KerasArg(hyper="initial_accumulator_value", bounds=NON_NEGATIVE),
        KerasArg(
            "epsilon",
            1e-7,
            "float",
            "Added to the accumulator inside the square root (Keras-only; the "
            "engine's value is 0).",
            NON_NEGATIVE,
            engine=0.0,
            engine_lacks=(
                "the engine's Adagrad has no epsilon; it is negligible only when "
                f"epsilon / (2·initial_accumulator_value) <= {EPSILON_TOLERANCE:g}"
            ),
            negligible=epsilon_negligible,
        ),
    ),
    stock="Adagrad",
)

DEFINITION = Definition(
    name="Adagrad",
    tensorflow=TensorFlowFace(
        "adagrad",
        "Adagrad",
        tensorflow_class="Adagrad",
        checks=("initial_accumulator_value",),
        reference_kernel="ResourceApplyAdagradV2 (epsilon=0)",
    ),
    learning_rate_default=0.001,
    demo_learning_rate=5.0,
    # What TPUEmbeddingV2 hands SparseCore's op (TF 2.21 tpu_embedding_v3.py).
    sparsecore=SparseCoreOptimizer(),
    hypers=(initial_accumulator(0.1),),
    slots=(
        Slot(
            "accumulators",
            "initial_accumulator_value",
            "Σ g².",
            keras_name="accumulator",
        ),
    ),
    rule=update,
    summary="Adagrad without epsilon.",
    math="a ← a + g²;  w ← w − η·g/√a",
    sources=(
        "TensorFlow `ApplyAdagrad`; SparseCore `XlaSparseCoreAdagrad`; "
        "TF TPU tests; docs/tpu_semantics.md §2.2."
    ),
    keras=KERAS,
    jax=JaxFace(
        "AdagradOptimizerSpec",
        record="ADAGRAD",
        implied={"epsilon": 0.0},
        reasons={
            "epsilon": "jax-tpu-embedding's Adagrad divides by √a, without epsilon"
        },
        slots={"accumulators": "accumulator"},
    ),
)
