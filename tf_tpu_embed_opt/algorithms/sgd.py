"""Stochastic gradient descent, the TPU engine's `stochastic_gradient_descent`."""

from tf_tpu_embed_opt.spec import Definition


def update(xp, w, slots, g, lr, h):
    return w - lr * g, slots


DEFINITION = Definition(
    name="SGD",
    proto_oneof="stochastic_gradient_descent",
    op_name="StochasticGradientDescent",
    op_module_name="stochastic_gradient_descent",
    learning_rate_default=0.01,
    hypers=(),
    slots=(),
    update=update,
    summary="Plain gradient descent; no slots.",
    math="w ← w − η·g",
    sources=(
        "TensorFlow `ApplyGradientDescent`; SparseCore `XlaSparseCoreSgd`; "
        "docs/tpu_semantics.md §2.1."
    ),
    tensorflow_class="SGD",
    signature=(
        "learning_rate",
        "use_gradient_accumulation",
        "clip_weight_min",
        "clip_weight_max",
        "weight_decay_factor",
        "multiply_weight_decay_factor_by_learning_rate",
        "clipvalue",
        "low_dimensional_packing_status",
    ),
    reference_kernel="ResourceApplyGradientDescent",
)
