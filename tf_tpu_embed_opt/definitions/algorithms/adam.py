"""Adam as the TPU engine computes it: no bias correction, lazy by default."""

from tf_tpu_embed_opt.definitions.spec import (
    NON_NEGATIVE,
    POSITIVE,
    UNIT_INTERVAL_OPEN,
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
    # m + (g − m)·(1 − β₁): the order of Keras, of TensorFlow's ApplyAdam and
    # of jax-tpu-embedding's lowering.
    m = slots["momenta"] + (g - slots["momenta"]) * (1 - h["beta_1"])
    v = slots["velocities"] + (xp.square(g) - slots["velocities"]) * (1 - h["beta_2"])
    new_slots = {"momenta": m, "velocities": v}
    if h["amsgrad"]:
        # Keras-only: divide by the running maximum of v.
        v = xp.maximum(slots["velocity_hat"], v)
        new_slots["velocity_hat"] = v
    if h["sum_inside_sqrt"]:
        denom = xp.sqrt(v + h["epsilon"] ** 2)
    else:
        denom = xp.sqrt(v) + h["epsilon"]
    return w - m * lr / denom, new_slots


def bias_correction(xp, step, arguments, lr):
    """Keras Adam's learning rate η·√(1 − β₂ᵗ)/(1 − β₁ᵗ) of step t (1-based).

    In Keras's order, which jax-tpu-embedding's `alpha_t` shares.
    """
    if not arguments["bias_correction"]:
        return lr
    beta_1_power = xp.power(arguments["beta_1"], step)
    beta_2_power = xp.power(arguments["beta_2"], step)
    return lr * xp.sqrt(1 - beta_2_power) / (1 - beta_1_power)


def epsilon_after_bias_correction(xp, step, h):
    """Algorithm 1's ε, added to √v̂ = √v/√(1 − β₂ᵗ): ε·√(1 − β₂ᵗ) added to √v.

    With Keras's bias correction of the learning rate this is the Adam paper's
    Algorithm 1, which jax-tpu-embedding's `AdamOptimizerSpec` computes
    (`epsilon_hat` in its `get_hyperparameters`).
    """
    if not h["algorithm_1_epsilon"]:
        return {}
    return {"epsilon": h["epsilon"] * xp.sqrt(1 - xp.power(h["beta_2"], step))}


def check_keras(owner, arguments):
    if arguments["algorithm_1_epsilon"] and (
        not arguments["bias_correction"] or arguments["sum_inside_sqrt"]
    ):
        raise ValueError(
            f"{owner}: `algorithm_1_epsilon=True` (epsilon added to the "
            "bias-corrected √v̂) needs bias_correction=True and "
            "sum_inside_sqrt=False; received "
            f"bias_correction={arguments['bias_correction']!r}, "
            f"sum_inside_sqrt={arguments['sum_inside_sqrt']!r}."
        )


def check(owner, arguments):
    if not arguments["lazy_adam"] and not arguments["use_gradient_accumulation"]:
        raise ValueError(
            f"{owner}: `lazy_adam=False` (non-lazy Adam) requires "
            "`use_gradient_accumulation=True`; received "
            "use_gradient_accumulation=False."
        )


HYPERS = (
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
)

KERAS = KerasFace(
    name="Adam",
    arguments=(
        # beta_1, beta_2, epsilon: same names, defaults and meaning. Keras
        # and jax-tpu-embedding take epsilon = 0 (√v + 0); TensorFlow's
        # engines take epsilon > 0.
        KerasArg(hyper="beta_1"),
        KerasArg(hyper="beta_2"),
        KerasArg(hyper="epsilon", bounds=NON_NEGATIVE),
        KerasArg(
            "amsgrad",
            False,
            "bool",
            "Divide by the running maximum of v (Keras-only).",
            engine=False,
            engine_lacks="the engine's Adam has no AMSGrad",
        ),
        # Keras's default (ε outside the root), not the engine's.
        KerasArg(
            hyper="sum_inside_sqrt",
            default=False,
            doc="Divide by √(v + ε²) instead of √v + ε (the engine's default).",
            keyword=True,
        ),
        KerasArg(
            "bias_correction",
            True,
            "bool",
            "Multiply the learning rate by √(1 − β₂ᵗ)/(1 − β₁ᵗ) (Keras; the "
            "engine has none).",
            engine=False,
            keyword=True,
            in_learning_rate=True,
        ),
        KerasArg(
            "algorithm_1_epsilon",
            False,
            "bool",
            "Add epsilon to the bias-corrected √v̂, as in Algorithm 1 of the "
            "Adam paper and jax-tpu-embedding (ε·√(1 − β₂ᵗ) added to √v), "
            'instead of to √v (Keras\'s "epsilon hat"); needs '
            "bias_correction=True.",
            engine=False,
            keyword=True,
        ),
    ),
    extra_slots=(
        Slot(
            "velocity_hat",
            0.0,
            "Running maximum of v (exists with amsgrad=True).",
            when=lambda arguments: arguments["amsgrad"],
        ),
    ),
    stock="Adam",
    slots_by_variable=True,
    learning_rate_factor=bias_correction,
    # The moments decay with a zero gradient, and w moves by η·m/denominator.
    zero_gradient_steps=lambda arguments: True,
    # With beta_1 = 0 the first moment is the gradient: zero, so w stays.
    zero_gradient_keeps_weights=lambda arguments: arguments["beta_1"] == 0,
    lazy_hyper="lazy_adam",
    check=check_keras,
)

DEFINITION = Definition(
    name="Adam",
    tensorflow=TensorFlowFace(
        "adam",
        "ADAM",
        tensorflow_class="Adam",
        checks=("beta_1", "beta_2", "epsilon"),
        reference_kernel="ResourceApplyAdam (beta powers 0)",
    ),
    learning_rate_default=0.001,
    demo_learning_rate=0.01,
    # What TPUEmbeddingV2 hands SparseCore's op (TF 2.21 tpu_embedding_v3.py).
    sparsecore=SparseCoreOptimizer(
        attributes={
            "beta_1": "beta1",
            "beta_2": "beta2",
            "epsilon": "epsilon",
            "sum_inside_sqrt": "use_sum_inside_sqrt",
        },
        dropped={
            "lazy_adam": (
                True,
                "SparseCore Adam is always lazy: only looked-up rows change",
            )
        },
    ),
    hypers=HYPERS,
    slots=(
        Slot("momenta", 0.0, "First moment m.", keras_name="momentum"),
        Slot("velocities", 0.0, "Second moment v.", keras_name="velocity"),
    ),
    rule=update,
    summary="Adam without bias correction (supply it through the learning rate).",
    math=(
        "m ← β₁·m + (1−β₁)·g;  v ← β₂·v + (1−β₂)·g²;  "
        "w ← w − η·m/√(v + ε²)  (or η·m/(√v + ε) without sum_inside_sqrt)"
    ),
    sources=(
        "optimization_parameters.proto; SparseCore `XlaSparseCoreAdam`; "
        "TF TPU tests; docs/tpu_semantics.md §2.5."
    ),
    zero_gradient_is_noop=False,
    check=check,
    keras=KERAS,
    step_hypers=epsilon_after_bias_correction,
    jax=JaxFace(
        "AdamOptimizerSpec",
        record="ADAM",
        implied={
            "lazy": True,
            "bias_correction": True,
            "algorithm_1_epsilon": True,
            "sum_inside_sqrt": False,
            "amsgrad": False,
        },
        reasons={
            "bias_correction": (
                "jax-tpu-embedding's Adam always corrects the bias (alpha_t = "
                "η·√(1 − β₂ᵗ)/(1 − β₁ᵗ) in AdamOptimizerSpec.get_hyperparameters)"
            ),
            "algorithm_1_epsilon": (
                "jax-tpu-embedding's Adam adds epsilon to the bias-corrected √v̂ "
                "(epsilon_hat = ε·√(1 − β₂ᵗ) added to √v); Keras adds it to √v "
                "(algorithm_1_epsilon=True on this package's Adam computes the "
                "engine's)"
            ),
            "sum_inside_sqrt": "jax-tpu-embedding's Adam divides by √v + epsilon_hat",
            "amsgrad": "jax-tpu-embedding's Adam has no AMSGrad",
        },
        slots={"momenta": "momentum", "velocities": "velocity"},
    ),
)
