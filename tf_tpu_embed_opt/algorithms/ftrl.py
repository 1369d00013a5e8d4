"""FTRL-Proximal, the TPU engine's `ftrl`."""

from tf_tpu_embed_opt.algorithms.shared import (
    L1_REGULARIZATION,
    L2_REGULARIZATION,
    initial_accumulator,
)
from tf_tpu_embed_opt.spec import (
    NON_NEGATIVE,
    NON_POSITIVE,
    Definition,
    Hyper,
    Slot,
)


def update(xp, w, slots, g, lr, h):
    power = -h["learning_rate_power"]
    a_old = slots["accumulators"]
    a = a_old + xp.square(g)
    a_pow = xp.power(a, power)
    delta = a_pow - xp.power(a_old, power)
    l1, l2, beta = (
        h["l1_regularization_strength"],
        h["l2_regularization_strength"],
        h["beta"],
    )
    if h["multiply_linear_by_learning_rate"]:
        linear = slots["linears"] + lr * g - delta * w
        limit = lr * l1
        quadratic = a_pow + 2 * lr * l2 + beta
    else:
        linear = slots["linears"] + g - (delta / lr) * w
        limit = l1
        quadratic = (a_pow + beta) / lr + 2 * l2
    numerator = xp.minimum(xp.maximum(linear, -limit), limit) - linear
    return numerator / quadratic, {"accumulators": a, "linears": linear}


DEFINITION = Definition(
    name="FTRL",
    proto_oneof="ftrl",
    op_name="FTRL",
    op_module_name="ftrl",
    learning_rate_default=0.001,
    hypers=(
        Hyper(
            "learning_rate_power",
            -0.5,
            "float",
            "Power of the accumulator in the learning-rate decay (≤ 0).",
            NON_POSITIVE,
            proto_field="lr_power",
        ),
        L1_REGULARIZATION,
        L2_REGULARIZATION,
        Hyper(
            "beta",
            0.0,
            "float",
            "β of the FTRL-Proximal paper.",
            NON_NEGATIVE,
            proto_field="beta",
        ),
        initial_accumulator(0.1),
        Hyper(
            "multiply_linear_by_learning_rate",
            False,
            "bool",
            "Store linear·η in the linear slot (tolerates η → 0).",
            proto_field="multiply_linear_by_lr",
        ),
        Hyper(
            "allow_zero_accumulator",
            False,
            "bool",
            "Deprecated; the engine ignores it (kept for TensorFlow parity).",
            proto_field="allow_zero_accumulator",
        ),
    ),
    slots=(
        Slot("accumulators", "initial_accumulator_value", "Σ g²."),
        Slot("linears", 0.0, "The FTRL linear term."),
    ),
    update=update,
    summary="FTRL-Proximal with optional linear·η storage.",
    math=(
        "a' = a + g²;  p = −lr_power;  L ← L + g − ((a'^p − a^p)/η)·w;  "
        "w ← (clamp(L, −l1, l1) − L) / ((a'^p + β)/η + 2·l2);  a ← a'"
    ),
    sources=(
        "TensorFlow `ApplyFtrlV2` / `ApplyFtrlMultiplyLinearByLr`; SparseCore "
        "`XlaSparseCoreFtrl`; docs/tpu_semantics.md §2.4."
    ),
    tensorflow_class="FTRL",
    signature=(
        "learning_rate",
        "learning_rate_power",
        "l1_regularization_strength",
        "l2_regularization_strength",
        "beta",
        "initial_accumulator_value",
        "use_gradient_accumulation",
        "clip_weight_min",
        "clip_weight_max",
        "weight_decay_factor",
        "multiply_weight_decay_factor_by_learning_rate",
        "slot_variable_creation_fn",
        "clipvalue",
        "multiply_linear_by_learning_rate",
        "allow_zero_accumulator",
        "low_dimensional_packing_status",
    ),
    reference_kernel="ResourceApplyFtrlV2",
)
