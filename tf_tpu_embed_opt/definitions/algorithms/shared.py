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


def check_a_positive_denominator(owner: str, values, why: str) -> None:
    """Refuses `epsilon` and `initial_accumulator_value` both 0, saying `why`
    the denominator would then be sqrt(0).

    Raises:
      ValueError: Both are 0.
    """
    if values["epsilon"] == 0 and values["initial_accumulator_value"] == 0:
        raise ValueError(
            f"{owner}: `epsilon` and `initial_accumulator_value` cannot both be "
            f"0 ({why} would divide by sqrt(0)); received "
            f"epsilon={values['epsilon']!r}, initial_accumulator_value="
            f"{values['initial_accumulator_value']!r}. Make at least one positive."
        )
