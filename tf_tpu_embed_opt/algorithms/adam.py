"""Adam as the TPU engine computes it: no bias correction, lazy by default."""

from tf_tpu_embed_opt.spec import POSITIVE, UNIT_INTERVAL_OPEN, Definition, Hyper, Slot


def update(xp, w, slots, g, lr, h):
    m = h["beta_1"] * slots["momenta"] + (1 - h["beta_1"]) * g
    v = h["beta_2"] * slots["velocities"] + (1 - h["beta_2"]) * xp.square(g)
    if h["sum_inside_sqrt"]:
        denom = xp.sqrt(v + h["epsilon"] ** 2)
    else:
        denom = xp.sqrt(v) + h["epsilon"]
    return w - lr * m / denom, {"momenta": m, "velocities": v}


def check(owner, arguments):
    if not arguments["lazy_adam"] and not arguments["use_gradient_accumulation"]:
        raise ValueError(
            f"{owner}: `lazy_adam=False` (non-lazy Adam) requires "
            "`use_gradient_accumulation=True`; received "
            "use_gradient_accumulation=False."
        )


DEFINITION = Definition(
    name="Adam",
    proto_oneof="adam",
    op_name="ADAM",
    op_module_name="adam",
    learning_rate_default=0.001,
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
            "Decay of the second moment.",
            UNIT_INTERVAL_OPEN,
            proto_field="beta2",
        ),
        Hyper(
            "epsilon",
            1e-07,
            "float",
            "Numerical-stability constant.",
            POSITIVE,
            proto_field="epsilon",
        ),
        Hyper(
            "lazy_adam",
            True,
            "bool",
            "Update only looked-up rows (False: every row, every step).",
            proto_field="use_non_lazy_adam",
            proto_negated=True,
        ),
        Hyper(
            "sum_inside_sqrt",
            True,
            "bool",
            "Divide by √(v + ε²) instead of √v + ε.",
            proto_field="use_sum_inside_sqrt",
        ),
    ),
    slots=(
        Slot("momenta", 0.0, "First moment m."),
        Slot("velocities", 0.0, "Second moment v."),
    ),
    update=update,
    summary="Adam without bias correction (supply it through the learning rate).",
    math=(
        "m ← β₁·m + (1−β₁)·g;  v ← β₂·v + (1−β₂)·g²;  "
        "w ← w − η·m/√(v + ε²)  (or η·m/(√v + ε) without sum_inside_sqrt)"
    ),
    sources=(
        "optimization_parameters.proto; SparseCore `XlaSparseCoreAdam`; "
        "TF TPU tests; docs/tpu_semantics.md §2.5."
    ),
    tensorflow_class="Adam",
    zero_gradient_is_noop=False,
    reference_kernel="ResourceApplyAdam (beta powers 0)",
    check=check,
)
