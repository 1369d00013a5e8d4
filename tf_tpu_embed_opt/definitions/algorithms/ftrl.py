"""FTRL-Proximal, the TPU engine's `ftrl`."""

from tf_tpu_embed_opt.definitions.algorithms.shared import (
    L1_REGULARIZATION,
    L2_REGULARIZATION,
    initial_accumulator,
)
from tf_tpu_embed_opt.definitions.spec import (
    JAX_ENGINE,
    NON_NEGATIVE,
    NON_POSITIVE,
    ROUNDING_KEY,
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
    # Keras-only L2 shrinkage enters the linear term's gradient (engine: 0).
    g_linear = g + 2 * h["l2_shrinkage_regularization_strength"] * w
    if h["multiply_linear_by_learning_rate"]:
        linear = slots["linears"] + lr * g_linear - delta * w
        limit = lr * l1
        quadratic = a_pow + 2 * lr * l2 + beta
    elif h.get(ROUNDING_KEY) == JAX_ENGINE:
        # jax-tpu-embedding's order (sparse_dense_matmul_grad_with_ftrl.py).
        linear = slots["linears"] + g_linear - (delta / lr) * w
        limit = l1
        quadratic = (a_pow + beta) / lr + 2 * l2
    else:
        # Keras's order, which TensorFlow's ApplyFtrlV2 shares.
        linear = slots["linears"] + (g_linear - (delta / lr) * w)
        limit = l1
        quadratic = a_pow / lr + 2 * (l2 + beta / (2.0 * lr))
    numerator = xp.minimum(xp.maximum(linear, -limit), limit) - linear
    return numerator / quadratic, {"accumulators": a, "linears": linear}


def _keras(name, sign="positive", **kwargs):
    # Keras Ftrl checks these with its own words for the values it refuses.
    error = f"`{name}` needs to be {sign} or zero. Received: {name}={{value}}."
    return KerasArg(hyper=name, keras_error=error, **kwargs)


KERAS = KerasFace(
    name="Ftrl",
    arguments=(
        _keras("learning_rate_power", "negative"),
        _keras(
            "initial_accumulator_value",
            doc="Starting value of the accumulators (the engine needs > 0).",
            bounds=NON_NEGATIVE,
        ),
        _keras("l1_regularization_strength"),
        _keras("l2_regularization_strength"),
        KerasArg(
            "l2_shrinkage_regularization_strength",
            0.0,
            "float",
            "L2 shrinkage: adds 2·λ·w to the gradient of the linear term "
            "(Keras-only; the engine's value is 0).",
            NON_NEGATIVE,
            engine=0.0,
            engine_lacks="the engine's FTRL has no L2 shrinkage",
            keras_error="`l2_shrinkage_regularization_strength` needs to be "
            "positive or zero. Received: "
            "l2_shrinkage_regularization_strength={value}.",
        ),
        _keras("beta"),
        KerasArg(hyper="multiply_linear_by_learning_rate", keyword=True),
        KerasArg(
            "initial_linear_value",
            0.0,
            "float",
            "Starting value of the linear slot (jax-tpu-embedding's "
            "`initial_linear_value`; the TensorFlow engines start at 0).",
            engine=0.0,
            keyword=True,
        ),
    ),
    stock="Ftrl",
    slots_by_variable=True,
    # w is recomputed from `linear` at every step: a row whose w does not
    # follow from its slots (any row before its first step) changes.
    zero_gradient_steps=lambda arguments: True,
)

DEFINITION = Definition(
    name="FTRL",
    tensorflow=TensorFlowFace(
        "ftrl",
        "FTRL",
        tensorflow_class="FTRL",
        checks=("initial_accumulator_value",),
        reference_kernel="ResourceApplyFtrlV2",
        # TensorFlow's FTRL takes these after the shared arguments.
        late=("multiply_linear_by_learning_rate", "allow_zero_accumulator"),
    ),
    learning_rate_default=0.001,
    demo_learning_rate=10.0,
    # What TPUEmbeddingV2 hands SparseCore's op (TF 2.21 tpu_embedding_v3.py).
    sparsecore=SparseCoreOptimizer(
        dropped={
            "allow_zero_accumulator": (
                False,
                "not passed; deprecated and ignored by the TensorCore engine "
                "too, so it changes nothing",
            )
        },
    ),
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
        ),
    ),
    slots=(
        Slot(
            "accumulators",
            "initial_accumulator_value",
            "Σ g².",
            keras_name="accumulator",
        ),
        Slot(
            "linears",
            0.0,
            "The FTRL linear term.",
            keras_name="linear",
            keras_initial="initial_linear_value",
        ),
    ),
    rule=update,
    summary="FTRL-Proximal with optional linear·η storage.",
    math=(
        "a' = a + g²;  p = −lr_power;  L ← L + g − ((a'^p − a^p)/η)·w;  "
        "w ← (clamp(L, −l1, l1) − L) / ((a'^p + β)/η + 2·l2);  a ← a'"
    ),
    sources=(
        "TensorFlow `ApplyFtrlV2` / `ApplyFtrlMultiplyLinearByLr`; SparseCore "
        "`XlaSparseCoreFtrl`; docs/tpu_semantics.md §2.4."
    ),
    keras=KERAS,
    jax=JaxFace(
        "FTRLOptimizerSpec",
        record="FTRL",
        implied={"lazy": True, "l2_shrinkage_regularization_strength": 0.0},
        reasons={
            "l2_shrinkage_regularization_strength": (
                "jax-tpu-embedding's FTRL has no L2 shrinkage"
            )
        },
        slots={"accumulators": "accumulator", "linears": "linear"},
    ),
)
