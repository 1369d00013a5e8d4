"""The checks every argument of a definition uses: real numbers, bools, the
intervals they must lie in, and binding arguments to a signature.

Re-exported by `spec`, where the definitions' modules read them. Imports
neither TensorFlow nor Keras.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any, Dict, Optional, Tuple

__all__ = [
    "Bounds",
    "NON_NEGATIVE",
    "NON_POSITIVE",
    "NON_ZERO",
    "POSITIVE",
    "UNIT_INTERVAL",
    "UNIT_INTERVAL_OPEN",
    "bind_arguments",
    "check_bool",
    "check_real",
    "is_bool",
    "is_real",
]


def is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def is_bool(value: Any) -> bool:
    # numpy's bool (`numpy.bool_`) is not a subclass of bool; accept it by its
    # type so this module needs no numpy import.
    kind = type(value)
    return isinstance(value, bool) or (
        kind.__module__ == "numpy" and kind.__name__ in ("bool", "bool_")
    )


def check_real(
    owner: str, name: str, value: Any, bounds: Optional["Bounds"] = None
) -> None:
    """Raises unless `value` is a finite real number inside `bounds`.

    Args:
      owner: The class or function that received the argument (for messages).
      name: The argument's name.
      value: The value received.
      bounds: Optional allowed interval.

    Raises:
      TypeError: `value` is not a real number (a `bool` is refused).
      ValueError: `value` is NaN or infinite, or outside `bounds`.
    """
    if not is_real(value):
        raise TypeError(
            f"{owner}: argument `{name}` must be a real number"
            f"{' ' + bounds.describe() if bounds else ''}; "
            f"received {value!r} of type {type(value).__name__}."
        )
    if not math.isfinite(value):
        raise ValueError(
            f"{owner}: argument `{name}` must be finite"
            f"{' and ' + bounds.describe() if bounds else ''}; received {value!r}."
        )
    if bounds is not None and not bounds.contains(value):
        raise ValueError(
            f"{owner}: argument `{name}` must be {bounds.describe()}; "
            f"received {value!r}."
        )


def check_bool(owner: str, name: str, value: Any) -> None:
    """Raises `TypeError` unless `value` is a `bool`."""
    if not is_bool(value):
        raise TypeError(
            f"{owner}: argument `{name}` must be True or False; "
            f"received {value!r} of type {type(value).__name__}, not a bool."
        )


def bind_arguments(
    owner: str, signature: Any, instance: Any, args: Tuple[Any, ...], kwargs: Any
) -> Dict[str, Any]:
    """Every argument of a generated `__init__` by name, defaults applied.

    Raises:
      TypeError: The call does not fit the signature; the message names `owner`.
    """
    try:
        bound = signature.bind(instance, *args, **kwargs)
    except TypeError as error:
        raise TypeError(f"{owner}: {error}") from None
    bound.apply_defaults()
    values = dict(bound.arguments)
    del values["self"]
    return values


@dataclasses.dataclass(frozen=True)
class Bounds:
    """An interval of allowed values; `None` means unbounded on that side."""

    lower: Optional[float] = None
    upper: Optional[float] = None
    lower_open: bool = False
    upper_open: bool = False
    excluded: Tuple[float, ...] = ()

    def contains(self, value: float) -> bool:
        if value in self.excluded:
            return False
        if self.lower is not None:
            if value < self.lower or (self.lower_open and value == self.lower):
                return False
        if self.upper is not None:
            if value > self.upper or (self.upper_open and value == self.upper):
                return False
        return True

    def describe(self) -> str:
        interval = self._describe_interval()
        if not self.excluded:
            return interval
        return f"{interval} but {', '.join(f'{x:g}' for x in self.excluded)}"

    def _describe_interval(self) -> str:
        if self.lower is not None and self.upper is not None:
            left = "(" if self.lower_open else "["
            right = ")" if self.upper_open else "]"
            return f"in {left}{self.lower:g}, {self.upper:g}{right}"
        if self.lower is not None:
            return f"{'>' if self.lower_open else '>='} {self.lower:g}"
        if self.upper is not None:
            return f"{'<' if self.upper_open else '<='} {self.upper:g}"
        return "any real number"


POSITIVE = Bounds(lower=0.0, lower_open=True)
NON_NEGATIVE = Bounds(lower=0.0)
NON_POSITIVE = Bounds(upper=0.0)
NON_ZERO = Bounds(excluded=(0.0,))
UNIT_INTERVAL_OPEN = Bounds(lower=0.0, upper=1.0, upper_open=True)
UNIT_INTERVAL = Bounds(lower=0.0, upper=1.0)
