"""The embedding face's arguments, checked from the definitions alone.

The constructor signature of each embedding class and every check of its
arguments (TensorFlow's own first, in its order and with its exception types,
then this package's), with no TensorFlow: `embedding.parameters` builds its
classes on these, and the command line and the jax-tpu-embedding engine use
them where TensorFlow is not installed or not yet imported.
"""

from __future__ import annotations

import inspect
import math
from typing import Any, Callable, Dict, Mapping, Optional, Tuple, Union

from tf_tpu_embed_opt.definitions import spec, values

__all__ = [
    "LearningRate",
    "ClipValue",
    "Checked",
    "bind",
    "call_text",
    "signature",
    "takes",
    "validate",
]

LearningRate = Union[float, Callable[[], float]]
ClipValue = Union[float, Tuple[Optional[float], Optional[float]]]

_COMMON_ANNOTATIONS: Dict[str, Any] = {
    "use_gradient_accumulation": bool,
    "clip_weight_min": Optional[float],
    "clip_weight_max": Optional[float],
    "weight_decay_factor": Optional[float],
    "multiply_weight_decay_factor_by_learning_rate": Optional[bool],
    "slot_variable_creation_fn": Optional[Callable[..., Dict[str, Any]]],
    "clipvalue": Optional[ClipValue],
    "low_dimensional_packing_status": bool,
}


def _positional_capacity(fn: Callable[..., Any]) -> Optional[Tuple[int, int]]:
    """(min, max) positional arguments `fn` takes; `None` if unknowable."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    required = 0
    accepted = 0
    for p in parameters:
        if p.kind is p.VAR_POSITIONAL:
            accepted = math.inf
        elif p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            accepted += 1
            if p.default is p.empty:
                required += 1
        elif p.kind is p.KEYWORD_ONLY and p.default is p.empty:
            return (math.inf, math.inf)
    return (required, accepted)


def _takes(fn: Callable[..., Any], count: int) -> bool:
    capacity = _positional_capacity(fn)
    return capacity is None or capacity[0] <= count <= capacity[1]


def _check_learning_rate(owner: str, value: Any) -> None:
    if callable(value):
        if not _takes(value, 0):
            raise TypeError(
                f"{owner}: a callable `learning_rate` must take no arguments "
                f"(a dynamic learning rate); received {value!r}."
            )
        return
    if not values.is_real(value):
        raise TypeError(
            f"{owner}: argument `learning_rate` must be a non-negative number "
            f"or a callable taking no arguments; received {value!r} of type "
            f"{type(value).__name__}."
        )
    spec.check_real(owner, "learning_rate", value, spec.NON_NEGATIVE)


def _check_optional_real(owner: str, name: str, value: Any, bounds=None) -> None:
    if value is not None:
        spec.check_real(owner, name, value, bounds)


def _check_clipvalue(owner: str, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, tuple):
        if len(value) != 2:
            raise ValueError(
                f"{owner}: argument `clipvalue` as a tuple must be (min, max); "
                f"received {value!r}."
            )
        for bound in value:
            if bound is not None:
                spec.check_real(owner, "clipvalue", bound)
        low, high = value
        if low is not None and high is not None and low > high:
            raise ValueError(
                f"{owner}: argument `clipvalue` (min, max) must have min <= max; "
                f"received {value!r}."
            )
        return
    if not values.is_real(value):
        raise TypeError(
            f"{owner}: argument `clipvalue` must be None, a number >= 0 or "
            f"a (min, max) tuple; received {value!r} of type "
            f"{type(value).__name__}."
        )
    # TensorFlow takes c as the range (-c, c): 0 clips every gradient to 0; a
    # negative c would write a range with min > max.
    spec.check_real(owner, "clipvalue", value, spec.NON_NEGATIVE)


class _NotCallableError(TypeError, ValueError):
    """A non-callable `slot_variable_creation_fn`.

    A `TypeError` by this package's convention and a `ValueError` as
    TensorFlow raises it, so that code catching either keeps working.
    """


def _check_tensorflow_common(owner: str, values: Mapping[str, Any]) -> None:
    """TensorFlow's own checks of the shared arguments, in its order."""
    fn = values.get("slot_variable_creation_fn")
    if fn is not None and not callable(fn):
        raise _NotCallableError(
            f"{owner}: argument `slot_variable_creation_fn` must be None or "
            f"a callable taking (table, slot_names) or (table, slot_names, "
            f"initializers); received {fn!r} of type {type(fn).__name__}."
        )
    # TensorFlow reads the flag by its truth value here.
    if values["clipvalue"] is not None and not values["use_gradient_accumulation"]:
        raise ValueError(
            f"{owner}: gradient clipping (`clipvalue={values['clipvalue']!r}`) "
            "requires `use_gradient_accumulation=True`; received "
            f"use_gradient_accumulation={values['use_gradient_accumulation']!r}."
        )


def _check_common(owner: str, values: Mapping[str, Any]) -> None:
    _check_learning_rate(owner, values["learning_rate"])
    spec.check_bool(
        owner, "use_gradient_accumulation", values["use_gradient_accumulation"]
    )
    _check_optional_real(owner, "clip_weight_min", values["clip_weight_min"])
    _check_optional_real(owner, "clip_weight_max", values["clip_weight_max"])
    low, high = values["clip_weight_min"], values["clip_weight_max"]
    if low is not None and high is not None and low > high:
        raise ValueError(
            f"{owner}: `clip_weight_min` must be <= `clip_weight_max`; received "
            f"clip_weight_min={low!r}, clip_weight_max={high!r}."
        )
    _check_optional_real(
        owner, "weight_decay_factor", values["weight_decay_factor"], spec.NON_NEGATIVE
    )
    multiply = values["multiply_weight_decay_factor_by_learning_rate"]
    if multiply is not None:
        spec.check_bool(
            owner, "multiply_weight_decay_factor_by_learning_rate", multiply
        )
    fn = values.get("slot_variable_creation_fn")
    if fn is not None:
        if not (_takes(fn, 3) or _takes(fn, 2)):
            raise TypeError(
                f"{owner}: `slot_variable_creation_fn` must accept 2 positional "
                f"arguments (table, slot_names) or 3 (table, slot_names, "
                f"initializers); received {fn!r}."
            )
    _check_clipvalue(owner, values["clipvalue"])
    spec.check_bool(
        owner,
        "low_dimensional_packing_status",
        values["low_dimensional_packing_status"],
    )


def _signature(definition: spec.Definition) -> inspect.Signature:
    hypers = definition.hyper
    parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    for name in definition.parameter_names:
        if name == "learning_rate":
            default, annotation = definition.learning_rate_default, LearningRate
        elif name in hypers:
            default, annotation = hypers[name].default, hypers[name].annotation
        else:
            default = spec.COMMON_DEFAULTS[name]
            annotation = _COMMON_ANNOTATIONS[name]
        parameters.append(
            inspect.Parameter(
                name,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                default=default,
                annotation=annotation,
            )
        )
    return inspect.Signature(parameters)


def signature(definition: spec.Definition) -> inspect.Signature:
    """The constructor signature of `definition`'s embedding class."""
    return _signature(definition)


def takes(fn: Callable[..., Any], count: int) -> bool:
    """Whether `fn` can be called with `count` positional arguments."""
    return _takes(fn, count)


def bind(
    definition: spec.Definition, owner: str, args: Tuple[Any, ...], kwargs: Any
) -> Dict[str, Any]:
    """Every argument of `definition`'s embedding class by name, defaults
    applied, checked as its constructor checks them (see `validate`)."""
    values = spec.bind_arguments(owner, _signature(definition), None, args, kwargs)
    validate(definition, owner, values)
    return values


def validate(
    definition: spec.Definition, owner: str, values: Mapping[str, Any]
) -> None:
    """Raises as the embedding class's constructor raises for `values`.

    What TensorFlow refuses first, in its order and with its exception types;
    then what it accepts but would write a wrong proto from.
    """
    _check_tensorflow_common(owner, values)
    for name in definition.tensorflow_checks:
        definition.hyper[name].check(owner, values[name])
    if definition.check is not None:
        definition.check(owner, values)
    _check_common(owner, values)
    for hyper in definition.hypers:
        hyper.check(owner, values[hyper.name])
    if values["low_dimensional_packing_status"] and not (
        definition.tensorflow_class or definition.zero_gradient_is_noop
    ):
        raise ValueError(
            f"{owner}: `low_dimensional_packing_status=True` is not allowed: "
            "packing applies zero-gradient updates to rows that were not "
            f"looked up, and a zero gradient is not a no-op for {owner}."
        )


def call_text(name: str, definition: spec.Definition, values: Mapping[str, Any]) -> str:
    """`Name(learning_rate=..., <hypers>..., <other arguments not at default>)`,
    the repr of an embedding class with these arguments."""
    shown = []
    for argument, parameter in _signature(definition).parameters.items():
        if argument == "self":
            continue
        value = values[argument]
        is_hyper = argument == "learning_rate" or argument in definition.hyper
        if is_hyper or value != parameter.default:
            shown.append(f"{argument}={value!r}")
    return f"{name}({', '.join(shown)})"


class Checked:
    """An embedding class's arguments, checked, where TensorFlow is missing.

    It holds what the engines read of an embedding optimizer (its hypers and
    engine options as attributes, TensorFlow's `clip_gradient_min/max` from
    `clipvalue`) and prints as the class would; `bind` made it, so its
    arguments passed the class's own checks.
    """

    def __init__(self, definition: spec.Definition, *args: Any, **kwargs: Any):
        values = bind(definition, definition.name, args, kwargs)
        clip = values["clipvalue"]
        if clip is None or isinstance(clip, tuple):
            low, high = clip if clip is not None else (None, None)
        else:
            low, high = -clip, clip
        # As `embedding.arguments` gives it back: the (min, max) stored.
        values["clipvalue"] = None if clip is None else (low, high)
        self._definition = definition
        self._values = values
        for argument, value in values.items():
            setattr(self, argument, value)
        self.clip_gradient_min, self.clip_gradient_max = low, high

    def __repr__(self) -> str:
        return call_text(self._definition.name, self._definition, self._values)
