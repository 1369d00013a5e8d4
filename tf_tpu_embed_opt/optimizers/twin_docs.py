"""The generated twin classes' signatures and docstrings, from their definitions.

A twin's constructor is Keras's: the learning rate, the algorithm's Keras
arguments (those that are not keywords), Keras's base-optimizer arguments
with the defaults the installed Keras gives them, then `**kwargs`. Its
docstring says which engine runs it, its update and its arguments
(`optimizers.twins` makes the classes).
"""

from __future__ import annotations

import inspect
from typing import Any, Dict, List

import keras

from tf_tpu_embed_opt.definitions import spec

__all__ = ["KERAS_BASE", "docstring", "signature"]

# Keras's base-optimizer arguments, in the order of its optimizers' signatures.
KERAS_BASE = (
    ("weight_decay", None),
    ("clipnorm", None),
    ("clipvalue", None),
    ("global_clipnorm", None),
    ("use_ema", False),
    ("ema_momentum", 0.99),
    ("ema_overwrite_frequency", None),
    ("loss_scale_factor", None),
    ("gradient_accumulation_steps", None),
    ("name", None),
)


def _base_defaults(definition: spec.Definition) -> Dict[str, Any]:
    """Keras's base arguments and their defaults, `name`'s as the installed
    Keras's class of the same name has it (None in Keras 3.15; the class's
    name, e.g. "adam", in older ones)."""
    defaults = dict(KERAS_BASE)
    if definition.keras.name_default is not None:
        defaults["name"] = definition.keras.name_default
    stock = definition.keras.stock
    if stock is not None:
        keras_class = getattr(keras.optimizers, stock)
        name = inspect.signature(keras_class).parameters.get("name")
        if name is not None:
            defaults["name"] = name.default
    return defaults


def signature(definition: spec.Definition) -> inspect.Signature:
    keras_face = definition.keras
    positional = inspect.Parameter.POSITIONAL_OR_KEYWORD
    parameters = [
        inspect.Parameter("self", positional),
        inspect.Parameter(
            "learning_rate", positional, default=keras_face.learning_rate
        ),
    ]
    for argument in definition.keras_arguments:
        if not argument.keyword:
            parameters.append(
                inspect.Parameter(argument.name, positional, default=argument.default)
            )
    for name, default in _base_defaults(definition).items():
        parameters.append(inspect.Parameter(name, positional, default=default))
    parameters.append(inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD))
    return inspect.Signature(parameters)


def _title(definition: spec.Definition) -> str:
    """The docstring's first line: which engine runs the algorithm."""
    if definition.tensorflow_engines:
        title = (
            f"Keras 3 twin of the TPU engine's `{definition.proto_oneof}` optimizer."
        )
    elif definition.jax is not None:
        title = (
            f"Keras 3 twin of jax-tpu-embedding's `{definition.jax.spec_class}` "
            "(the TensorFlow engines do not have it)."
        )
    elif definition.engine_refusal is not None:
        title = f"Keras 3 optimizer `{definition.name}`: {definition.summary}"
    else:
        title = (
            f"Keras 3 optimizer `{definition.name}`, which no TPU engine has "
            "built in (jax-tpu-embedding runs it as a custom optimizer)."
        )
    return title


def _paragraphs(definition: spec.Definition) -> List[str]:
    """What sets the algorithm apart: its state, how it steps a 16-bit
    table, the Keras class it mirrors; each paragraph followed by a blank."""
    lines = []
    if definition.factor is not None:
        factor = definition.factor.name.replace("_", " ")
        lines += [
            f"One {factor} `s` per model variable scales the step of all its "
            "rows. A row-sparse gradient (`tf.IndexedSlices`) steps only the "
            "looked-up rows, duplicate ids summed first; the minimum is taken "
            "over them, which is the same factor and step as for the gradient "
            "made dense (a row without gradient moves nothing and bounds "
            f"nothing); over a variable's shards it is one minimum. No engine "
            f"runs it: {definition.factor.why_not_per_row}.",
            "",
        ]
    elif definition.engine_refusal is not None:
        lines += [
            "Its state is one value per row of each 2-D variable (a table: "
            "`[rows, 1]`, 1/dim of the table); a variable without rows is "
            f"refused. No engine runs it: {definition.engine_refusal}.",
            "",
        ]
    narrow = definition.narrow_tables
    if narrow is not None:
        taken = "".join(f", {k}={v!r}" for k, v in narrow.hypers.items())
        lines += [
            "A float16 or bfloat16 table steps in float32 from its values, with "
            f"float32 state{taken}, and only its new weights round to its "
            f"dtype, to nearest: {narrow.reference}.",
            "",
        ]
    if definition.keras.stock:
        lines += [
            "Same signature and defaults as "
            f"`keras.optimizers.{definition.keras.stock}`, and the same result "
            "on dense gradients.",
            "",
        ]
    return lines


def docstring(definition: spec.Definition) -> str:
    keras_face = definition.keras
    lines = [_title(definition), "", *_paragraphs(definition)]
    per = "Engine update per row" if definition.engine_refusal is None else "Update"
    lines += [
        f"{per} (g summed over duplicate ids):",
        "",
        f"    {definition.math}",
        "",
        f"Source: {definition.sources}",
        "",
        "Args:",
        f"  learning_rate: A float, a `keras.optimizers.schedules.LearningRateSchedule`"
        f" or a callable taking no arguments. Default {keras_face.learning_rate!r}.",
    ]
    for argument in definition.keras_arguments:
        where = " (keyword)" if argument.keyword else ""
        lines.append(
            f"  {argument.name}{where}: {argument.doc} Default {argument.default!r}."
        )
    for name, variant in keras_face.variants.items():
        lines.append(f"  ({name}=True computes the engine's `{variant}`.)")
    if keras_face.engine_options:
        lines += [
            "  clip_weight_min, clip_weight_max, clip_gradient_min, clip_gradient_max,",
            "    weight_decay_factor, multiply_weight_decay_factor_by_learning_rate",
            "    (keywords): TPU-engine options; see the module docstring.",
        ]
    lines += [
        "  weight_decay, clipnorm, clipvalue, global_clipnorm, use_ema, ema_momentum,",
        "    ema_overwrite_frequency, loss_scale_factor, gradient_accumulation_steps,",
        "    name: as in every Keras optimizer.",
    ]
    return "\n".join(lines)
