"""Hyperparameters several algorithms declare identically."""

from tf_tpu_embed_opt.definitions.spec import NON_NEGATIVE, POSITIVE, Hyper

L1_REGULARIZATION = Hyper(
    "l1_regularization_strength",
    0.0,
    "float",
    "L1 regularization.",
    NON_NEGATIVE,
    proto_field="l1",
)

L2_REGULARIZATION = Hyper(
    "l2_regularization_strength",
    0.0,
    "float",
    "L2 regularization.",
    NON_NEGATIVE,
    proto_field="l2",
)


def initial_accumulator(
    default: float, doc: str = "Starting value of the accumulators."
) -> Hyper:
    """`initial_accumulator_value`: a slot start, held by the tables, not the proto."""
    return Hyper("initial_accumulator_value", default, "float", doc, POSITIVE)
