"""What a Keras optimizer's settings change on an engine, each named.

`to_embedding` converts exactly or refuses: these functions list every setting
of a Keras optimizer that the engine cannot reproduce (Keras's base arguments,
a Keras-only argument of the algorithm unless its definition says the value
is negligible), compose Keras's `clipvalue` with the engine's gradient clip,
and raise (or, with `strict=False`, warn) with the list.
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, List, Tuple

from tf_tpu_embed_opt.definitions import spec
from tf_tpu_embed_opt.engines import jax_tpu_embedding as jax_engine

__all__ = [
    "base_differences",
    "gradient_clip",
    "keras_only_differences",
    "negligible",
    "refuse",
]


def base_differences(keras_opt: Any, engine: spec.Engine) -> List[str]:
    differences = []
    if keras_opt.weight_decay and not engine.tensorflow:
        differences.append(
            f"weight_decay={keras_opt.weight_decay!r}: "
            + jax_engine.option_reason("weight_decay_factor")
        )
    elif keras_opt.weight_decay:
        differences.append(
            f"weight_decay={keras_opt.weight_decay!r}: Keras decays every "
            "element each step; the engine's weight_decay_factor decays only "
            "looked-up rows (use the weight_decay_factor keyword of this "
            "package's optimizers)"
        )
    if keras_opt.clipnorm:
        differences.append(
            f"clipnorm={keras_opt.clipnorm!r}: the engine has no norm clipping"
        )
    if keras_opt.global_clipnorm:
        differences.append(
            f"global_clipnorm={keras_opt.global_clipnorm!r}: the engine has no "
            "norm clipping"
        )
    if keras_opt.use_ema:
        differences.append(
            "use_ema=True: the engine keeps no moving average of the weights"
        )
    if keras_opt.loss_scale_factor:
        differences.append(
            f"loss_scale_factor={keras_opt.loss_scale_factor!r}: Keras divides "
            "the gradients by it; the engine applies them as they come"
        )
    if keras_opt.gradient_accumulation_steps:
        differences.append(
            "gradient_accumulation_steps="
            f"{keras_opt.gradient_accumulation_steps!r}: the engine applies "
            "every step"
        )
    return differences


def keras_only_differences(
    definition: spec.Definition, arguments: Dict[str, Any]
) -> List[str]:
    """Each Keras-only argument whose value the engine cannot reproduce."""
    differences = []
    remap = definition.keras.remap
    for argument in definition.keras_arguments:
        value = arguments[argument.name]
        if argument.hyper is not None or value == argument.engine:
            continue
        if argument.name in definition.keras.variants or argument.in_learning_rate:
            continue
        if remap is not None and argument.name in remap.arguments:
            continue
        if not negligible(definition, argument, value, arguments):
            differences.append(_keras_only_difference(argument, value))
    return differences


def negligible(
    definition: spec.Definition,
    argument: spec.KerasArg,
    value: Any,
    arguments: Dict[str, Any],
) -> bool:
    """Whether a Keras-only argument's `value` changes nothing the engine
    computes (its definition's bound, or `lazy` where a zero-gradient step is
    a no-op)."""
    if argument.negligible is not None:
        return argument.negligible(value, arguments)
    if argument.name == "lazy":
        # Both rules agree where a zero-gradient step is a no-op.
        return not definition.keras.zero_gradient_steps(arguments)
    return False


def _keras_only_difference(argument: spec.KerasArg, value: Any) -> str:
    reason = argument.engine_lacks
    if argument.name == "lazy":
        reason = (
            "on a sparse gradient Keras steps every row here, the engine only "
            "the looked-up rows (lazy=True on this package's optimizer computes "
            "the engine's result)"
        )
    return f"{argument.name}={value!r}: {reason}"


def gradient_clip(keras_opt: Any, options: Dict[str, Any]) -> Tuple[Any, Any]:
    """The engine's gradient clip for Keras `clipvalue` plus the engine keywords.

    The engine clips each row's summed gradient element-wise, as Keras clips a
    dense gradient (and this package's optimizers a de-duplicated sparse one;
    stock Keras clips each duplicate of a sparse gradient, part of what this
    package fixes). Clipping to [-c, c] and then to [lo, hi] is one clip to
    their intersection.
    """
    low, high = options["clip_gradient_min"], options["clip_gradient_max"]
    if keras_opt.clipvalue:
        clip = keras_opt.clipvalue
        low = -clip if low is None else max(low, -clip)
        high = clip if high is None else min(high, clip)
        if low > high:
            raise ValueError(
                f"to_embedding: clipvalue={clip!r} and the gradient clip "
                f"[{options['clip_gradient_min']!r}, "
                f"{options['clip_gradient_max']!r}] do not intersect; the "
                "composition clips every gradient to one value, which the "
                "engine's single clip cannot express."
            )
    return low, high


def refuse(
    keras_opt: Any, differences: List[str], engine: spec.Engine, strict: bool = True
) -> None:
    """Raise (strict) or warn about settings `engine` cannot reproduce."""
    where = engine.words
    message = (
        f"to_embedding: {type(keras_opt).__name__} has settings the {where} "
        "cannot reproduce: " + "; ".join(differences) + "."
    )
    if strict:
        raise ValueError(message + " Pass strict=False to convert without them.")
    warnings.warn(message + " Converted without them.", stacklevel=3)
