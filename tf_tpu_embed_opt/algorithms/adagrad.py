"""Adagrad as the TPU engine computes it: no epsilon, accumulator first."""

from tf_tpu_embed_opt.algorithms.shared import initial_accumulator
from tf_tpu_embed_opt.spec import Definition, Slot


def update(xp, w, slots, g, lr, h):
    a = slots["accumulators"] + xp.square(g)
    return w - lr * g / xp.sqrt(a), {"accumulators": a}


DEFINITION = Definition(
    name="Adagrad",
    proto_oneof="adagrad",
    op_name="Adagrad",
    op_module_name="adagrad",
    learning_rate_default=0.001,
    hypers=(initial_accumulator(0.1),),
    slots=(Slot("accumulators", "initial_accumulator_value", "Σ g²."),),
    update=update,
    summary="Adagrad without epsilon.",
    math="a ← a + g²;  w ← w − η·g/√a",
    sources=(
        "TensorFlow `ApplyAdagrad`; SparseCore `XlaSparseCoreAdagrad`; "
        "TF TPU tests; docs/tpu_semantics.md §2.2."
    ),
    tensorflow_class="Adagrad",
    reference_kernel="ResourceApplyAdagradV2 (epsilon=0)",
)
