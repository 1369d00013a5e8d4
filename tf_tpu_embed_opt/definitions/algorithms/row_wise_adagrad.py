"""Row-wise Adagrad: FBGEMM's `EXACT_ROWWISE_ADAGRAD`, TorchRec's `RowWiseAdagrad`.

One float of state per row: the running sum of the row's mean squared
gradient. FBGEMM's CPU kernels are the oracle (docs/tpu_semantics.md,
"FBGEMM"; `tests/data/fbgemm_golden.npz`): the rule follows their order of
operations, so that float32 results agree bit for bit without weight decay.
No engine of this package runs it: the TensorFlow engines have no row-wise
algorithm, and jax-tpu-embedding's custom optimizers keep slots the shape of
the table and step rows padded to a multiple of 8 (a stack's to its widest
table), whose width the row's mean would then be over
(`Definition.engine_refusal`).
"""

from tf_tpu_embed_opt.definitions.algorithms.shared import check_a_positive_denominator
from tf_tpu_embed_opt.definitions.spec import (
    NON_NEGATIVE,
    Definition,
    Hyper,
    KerasFace,
    NarrowTables,
    Slot,
)

# FBGEMM's pooled CPU kernel sums a row's squares in this many lanes.
LANES = 8


def _sum_of_squares(xp, g, lanes):
    """Σ g² over the last axis (keepdims), in `lanes` lanes (element d into
    lane d mod `lanes`, each in order) added in adjacent pairs: FBGEMM's
    pooled CPU kernel with 8, its unpooled one with 1 (in order)."""
    squares = xp.square(g)
    dim = g.shape[-1]
    width = min(lanes, dim)
    if dim % width:
        columns = xp.split(squares, dim)
        sums = [xp.sum_in_order(columns[lane::width]) for lane in range(width)]
    else:
        # Every lane at once: the row's blocks of `width` columns in order.
        sums = xp.split(xp.sum_in_order(xp.split(squares, dim // width)), width)
    while len(sums) > 1:
        paired = [xp.sum_in_order(pair) for pair in zip(sums[0::2], sums[1::2])]
        sums = paired + sums[len(paired) * 2 :]
    return sums[0]


def update(xp, w, slots, g, lr, h):
    l2, decay = h["l2_regularization_strength"], h["decoupled_weight_decay"]
    squared = g + l2 * w if l2 else g
    lanes = LANES if h["sum_in_lanes"] else 1
    m = slots["momentum1"] + _sum_of_squares(xp, squared, lanes) / w.shape[-1]
    multiplier = lr / (xp.sqrt(m) + h["epsilon"])
    # FBGEMM rounds the product before it subtracts; XLA on CPU (JAX's
    # compiled steps) fuses both into one multiply-add, an ulp apart.
    step = g * multiplier
    if l2:
        return (1.0 - multiplier * l2) * w - step, {"momentum1": m}
    if decay:
        return (1.0 - lr * decay) * w - step, {"momentum1": m}
    return w - step, {"momentum1": m}


def check(owner, values):
    """What FBGEMM's settings cannot combine."""
    check_a_positive_denominator(owner, values, "a looked-up row with a zero gradient")
    if values["l2_regularization_strength"] and values["decoupled_weight_decay"]:
        raise ValueError(
            f"{owner}: `l2_regularization_strength` (FBGEMM's WeightDecayMode.L2) "
            "and `decoupled_weight_decay` (WeightDecayMode.DECOUPLE) are one "
            "weight-decay mode each; received l2_regularization_strength="
            f"{values['l2_regularization_strength']!r}, decoupled_weight_decay="
            f"{values['decoupled_weight_decay']!r}. Set at most one."
        )


def _float(name, default, doc):
    return Hyper(name, default, "float", doc, NON_NEGATIVE)


DEFINITION = Definition(
    name="RowWiseAdagrad",
    learning_rate_default=0.01,
    hypers=(
        _float("epsilon", 1e-8, "Added to √m in the denominator (FBGEMM's eps)."),
        _float(
            "initial_accumulator_value",
            0.0,
            "Starting value of each row's state (FBGEMM's: 0).",
        ),
        _float(
            "l2_regularization_strength",
            0.0,
            "FBGEMM's WeightDecayMode.L2: λ·w added to the gradient whose "
            "squares the state sums, and w scaled by 1 − λ·mult.",
        ),
        _float(
            "decoupled_weight_decay",
            0.0,
            "FBGEMM's WeightDecayMode.DECOUPLE: w scaled by 1 − η·λ.",
        ),
        Hyper(
            "sum_in_lanes",
            True,
            "bool",
            "Sum a row's squares in 8 lanes added in pairs, as FBGEMM's pooled "
            "CPU kernel (TorchRec's EmbeddingBagCollection) does on a float32 "
            "table; False: in order, as its unpooled one (EmbeddingCollection) "
            "does, and both do on a float16 or bfloat16 table.",
        ),
    ),
    slots=(
        Slot(
            "momentum1",
            "initial_accumulator_value",
            "Σ of the row's mean squared gradient (FBGEMM's momentum1).",
            keras_name="accumulator",
            per_row=True,
        ),
    ),
    rule=update,
    summary="Adagrad with one accumulator per row (FBGEMM's, TorchRec's default).",
    math=(
        "m ← m + Σ_d g_d²/D;  mult = η/(√m + ε);  w ← c·w − mult·g  "
        "(c = 1, 1 − mult·λ with L2 decay, 1 − η·λ decoupled)"
    ),
    sources=(
        "FBGEMM `EXACT_ROWWISE_ADAGRAD` (fbgemm_gpu/codegen/genscript/"
        "optimizers.py); its CPU kernels' order: docs/tpu_semantics.md, FBGEMM."
    ),
    check=check,
    # Measured with FBGEMM 1.9.0's CPU kernels on an FP16 table
    # (docs/tpu_semantics.md, FBGEMM; the golden "-fp16" runs).
    narrow_tables=NarrowTables(
        reference=(
            "FBGEMM keeps the row state in float32 on an FP16 table, steps in "
            "float32 and rounds the new weights to nearest; in the table's "
            "own dtype the mean squared gradient would underflow (float16) "
            "or stop growing (bfloat16)"
        ),
        # Its pooled kernel sums in lanes on float32 tables only.
        hypers={"sum_in_lanes": False},
    ),
    keras=KerasFace(
        name="RowWiseAdagrad",
        check=check,
        engine_options=False,
        # With weight decay a looked-up row with no gradient still moves:
        # FBGEMM steps only looked-up rows (lazy).
        zero_gradient_steps=lambda arguments: bool(
            arguments["l2_regularization_strength"]
            or arguments["decoupled_weight_decay"]
        ),
    ),
)
