"""ClippyAdagrad: Adagrad whose step is shrunk, per variable, to a threshold.

The algorithm of TF Recommenders' `tfrs.experimental.optimizers.ClippyAdagrad`
(Anil et al., 2023, https://arxiv.org/abs/2302.09178), which runs only on
legacy Keras 2; its Keras 3 class here gives the same float32 results, op for
op. No engine runs it: its clipping factor is a minimum over the whole
variable (`spec.VariableFactor`), and every engine steps each row on its own.
"""

import math

from tf_tpu_embed_opt.definitions.algorithms.shared import check_a_positive_denominator
from tf_tpu_embed_opt.definitions.spec import (
    NON_NEGATIVE,
    Definition,
    Hyper,
    KerasArg,
    KerasFace,
    Slot,
    VariableFactor,
)
from tf_tpu_embed_opt.definitions.values import is_real

FACTOR = "clipping_factor"


def bound(xp, w, slots, g, lr, h):
    """The largest factor each element's step allows, and the step itself.

    `threshold / |delta|` where the element moves (1 where it does not),
    summed and ordered as TF Recommenders does, every term computed even
    when its factor is 0, so that float32 results agree to the bit.
    """
    a = slots["accumulators"]
    if h["use_standard_accumulator_update"]:
        a = a + xp.square(g)
    precondition = xp.rsqrt(a + h["epsilon"])
    delta = lr * g * precondition
    threshold = (
        h["absolute_threshold"] + xp.abs(w) * h["variable_relative_threshold"]
    ) + xp.abs(precondition) * h["accumulator_relative_threshold"]
    allowed = xp.where(delta == 0, 1.0, xp.divide_no_nan(threshold, xp.abs(delta)))
    return allowed, {"w": w, "a": a, "g": g, "delta": delta}


def finish(xp, carry, factor, h):
    """The step scaled by the variable's factor, and the accumulator."""
    a = carry["a"]
    if not h["use_standard_accumulator_update"]:
        added = carry["g"]
        if h["clip_accumulator_update"]:
            added = added * factor
        a = a + xp.square(added)
    return carry["w"] - carry["delta"] * factor, {"accumulators": a}


def check(owner, values):
    """TF Recommenders' cross-argument conditions, with its reasons."""
    check_a_positive_denominator(owner, values, "the first step")
    if values["clip_accumulator_update"] and values["use_standard_accumulator_update"]:
        raise ValueError(
            f"{owner}: `clip_accumulator_update` and "
            "`use_standard_accumulator_update` cannot both be True (the "
            "standard update adds the unclipped gradient before the step); "
            "received clip_accumulator_update=True, "
            "use_standard_accumulator_update=True. Set at most one."
        )


def learning_rate(owner, value):
    """TF Recommenders' learning rates: a real number >= 0 (ints included,
    taken as floats), a schedule or a callable."""
    if callable(value):  # schedules are callables of the step
        return value
    allowed = (
        "a finite float >= 0, a keras.optimizers.schedules.LearningRateSchedule "
        "or a callable returning the learning rate"
    )
    if not is_real(value):
        raise TypeError(
            f"{owner}: `learning_rate` must be {allowed}; received "
            f"learning_rate={value!r} of type {type(value).__name__}."
        )
    if not math.isfinite(value) or value < 0:
        raise ValueError(
            f"{owner}: `learning_rate` must be {allowed}; received "
            f"learning_rate={value!r}."
        )
    return float(value)


def _threshold(name, default, doc):  # a float >= 0
    return Hyper(name, default, "float", doc, NON_NEGATIVE)


HYPERS = (
    _threshold("initial_accumulator_value", 0.1, "Starting value of the accumulators."),
    _threshold(
        "variable_relative_threshold",
        0.1,
        "Threshold factor relative to the magnitude of the variable updated.",
    ),
    _threshold(
        "accumulator_relative_threshold",
        0.0,
        "Threshold factor relative to 1/sqrt(accumulator + epsilon); a "
        "positive value (e.g. 1e-3) tightens the threshold as training goes on.",
    ),
    _threshold(
        "absolute_threshold",
        1e-7,
        "Constant part of the threshold; with 0 a variable of zeros (and "
        "accumulator_relative_threshold=0) can never move.",
    ),
    _threshold(
        "epsilon",
        1e-7,
        "Added to the accumulator under the square root; it and "
        "initial_accumulator_value may not both be 0.",
    ),
    Hyper(
        "clip_accumulator_update",
        False,
        "bool",
        "Add the clipped gradient (s·g)² to the accumulator instead of g², "
        "which helps with outlier gradients; not with "
        "use_standard_accumulator_update.",
    ),
    Hyper(
        "use_standard_accumulator_update",
        False,
        "bool",
        "Add g² to the accumulator before the step, as classical Adagrad "
        "does; not with clip_accumulator_update.",
    ),
)

_ARGUMENTS = {h.name: KerasArg(hyper=h.name) for h in HYPERS}

DEFINITION = Definition(
    name="ClippyAdagrad",
    learning_rate_default=0.001,
    hypers=HYPERS,
    slots=(
        Slot(
            "accumulators",
            "initial_accumulator_value",
            "Σ g² (Σ (s·g)² with clip_accumulator_update).",
            keras_name="accumulator",
        ),
    ),
    rule=bound,
    factor=VariableFactor(
        finish=finish,
        name=FACTOR,
        export="export_clipping_factors",
        why_not_per_row=(
            "its clipping factor is a minimum over every looked-up row of the "
            "variable, which no engine's per-row update (and no "
            "jax-tpu-embedding custom optimizer, which sees one row at a time) "
            "computes"
        ),
    ),
    state_of="Adagrad",
    summary="Adagrad with adaptive clipping of each variable's step.",
    math=(
        "p = 1/√(a + ε);  d = η·g·p;  s = min(1, min over the variable of "
        "(τ_abs + τ_w·|w| + τ_a·|p|) / |d|);  w ← w − s·d;  a ← a + g² "
        "(or (s·g)², or g² before p)"
    ),
    sources=(
        "TF Recommenders `tfrs.experimental.optimizers.ClippyAdagrad`; "
        "arXiv:2302.09178; docs/tpu_semantics.md §5.4."
    ),
    keras=KerasFace(
        name="ClippyAdagrad",
        arguments=(
            *(_ARGUMENTS[h.name] for h in HYPERS[:5]),
            KerasArg(
                "export_clipping_factors",
                False,
                "bool",
                "Keep each variable's latest clipping factor in "
                "`clipping_factors` (1.0 before any step).",
            ),
            *(_ARGUMENTS[h.name] for h in HYPERS[5:]),
        ),
        check=check,
        engine_options=False,
        learning_rate_check=learning_rate,
        name_default="ClippyAdagrad",
    ),
)
