"""Building blocks of an optimizer definition.

Every algorithm of the package is declared once, as a `Definition` made of
`Hyper` parameters and `Slot` variables plus an update rule. The embedding
classes, the proto reader and writer, and the documentation tables are derived
from these declarations. This module imports neither TensorFlow nor Keras.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any, Callable, Mapping, Optional, Tuple

__all__ = [
    "Bounds",
    "Hyper",
    "Slot",
    "Definition",
    "COMMON_ARGUMENTS",
    "check_real",
    "check_bool",
]


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _is_bool(value: Any) -> bool:
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
    if not _is_real(value):
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
    if not _is_bool(value):
        raise TypeError(
            f"{owner}: argument `{name}` must be True or False; "
            f"received {value!r} of type {type(value).__name__}."
        )


@dataclasses.dataclass(frozen=True)
class Bounds:
    """An interval of allowed values; `None` means unbounded on that side."""

    lower: Optional[float] = None
    upper: Optional[float] = None
    lower_open: bool = False
    upper_open: bool = False

    def contains(self, value: float) -> bool:
        if self.lower is not None:
            if value < self.lower or (self.lower_open and value == self.lower):
                return False
        if self.upper is not None:
            if value > self.upper or (self.upper_open and value == self.upper):
                return False
        return True

    def describe(self) -> str:
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
UNIT_INTERVAL_OPEN = Bounds(lower=0.0, upper=1.0, upper_open=True)
UNIT_INTERVAL = Bounds(lower=0.0, upper=1.0)


@dataclasses.dataclass(frozen=True)
class Hyper:
    """One hyperparameter of an algorithm.

    Attributes:
      name: Argument and attribute name on the embedding face (TensorFlow's
        spelling, e.g. `beta_1`, `l1_regularization_strength`).
      default: Default value on the embedding face.
      kind: `"float"` or `"bool"`.
      doc: One-line description for docstrings and help texts.
      bounds: Allowed interval for a float.
      proto_field: Field of the algorithm's `OptimizationParameters` sub-message
        that carries the value, or `None` if the proto has no such field (slot
        initial values live in the tables, not in the proto).
      proto_negated: The proto field holds the negation of a bool (Adam's
        `lazy_adam` is written as `use_non_lazy_adam`).
    """

    name: str
    default: Any
    kind: str
    doc: str
    bounds: Optional[Bounds] = None
    proto_field: Optional[str] = None
    proto_negated: bool = False

    def check(self, owner: str, value: Any) -> None:
        if self.kind == "bool":
            check_bool(owner, self.name, value)
        else:
            check_real(owner, self.name, value, self.bounds)

    @property
    def annotation(self) -> Any:
        return bool if self.kind == "bool" else float


@dataclasses.dataclass(frozen=True)
class Slot:
    """One slot variable of an algorithm.

    Attributes:
      name: The slot's name on the TPU: the input name of the algorithm's
        `LoadTPUEmbedding*Parameters` op (e.g. `accumulators`, `ms`).
      initial: The slot's initial value: a number, or the name of the
        hyperparameter that holds it (e.g. `initial_accumulator_value`).
      doc: What the slot holds.
    """

    name: str
    initial: Any
    doc: str

    def initial_value(self, hypers: Mapping[str, Any]) -> float:
        if isinstance(self.initial, str):
            return hypers[self.initial]
        return self.initial


# The arguments every embedding optimizer shares, in TensorFlow's order. Their
# validation lives with the embedding face; definitions only place them in the
# signature.
COMMON_ARGUMENTS: Tuple[str, ...] = (
    "use_gradient_accumulation",
    "clip_weight_min",
    "clip_weight_max",
    "weight_decay_factor",
    "multiply_weight_decay_factor_by_learning_rate",
    "slot_variable_creation_fn",
    "clipvalue",
    "low_dimensional_packing_status",
)


# An update rule maps (xp, w, slots, g, lr, hypers) to (w, slots) for one step
# of the TPU engine's per-row optimizer, after gradient clipping and weight
# decay and before weight clipping. `xp` is a small array namespace (see
# `tf_tpu_embed_opt.rules`), `slots` a dict keyed by slot name, `hypers` a dict
# of Python values keyed by hyperparameter name, and `lr` a scalar.
UpdateRule = Callable[..., Tuple[Any, Mapping[str, Any]]]


@dataclasses.dataclass(frozen=True)
class Definition:
    """Everything the package knows about one algorithm.

    Attributes:
      name: Class name on the embedding face (e.g. `Adagrad`, `RMSProp`).
      proto_oneof: Name of the algorithm's member of the
        `OptimizationParameters.parameters` oneof (e.g. `rms_prop`).
      op_name: The algorithm's part of the TPU op names: `LoadTPUEmbedding`
        + op_name + `Parameters` (e.g. `RMSProp`).
      op_module_name: The same in snake case, as in `tpu_ops`
        (`load_tpu_embedding_rms_prop_parameters`).
      learning_rate_default: Default learning rate on the embedding face.
      hypers: The algorithm's own hyperparameters.
      slots: Its slot variables, in the order of the load/retrieve ops.
      update: The per-row update rule.
      summary: One line for tables and help.
      math: The update rule in plain text, for docstrings.
      sources: Where the rule comes from (see docs/tpu_semantics.md).
      tensorflow_class: Name of TensorFlow's own class in
        `tf.tpu.experimental.embedding` that the embedding class extends, or
        `None` when TensorFlow has none.
      signature: Constructor parameter names in order, when they are not
        `learning_rate`, the hypers, then `COMMON_ARGUMENTS`.
      zero_gradient_is_noop: Whether a zero row gradient leaves the row and its
        slots unchanged (with default hyperparameters); low-dimensional packing
        applies zero-gradient updates to untouched rows, so it is refused for
        algorithms TensorFlow does not expose when this is False.
      reference_kernel: TensorFlow's CPU training op the TPU proto names as the
        reference implementation, if any.
      check: Optional cross-argument validation, called with the class name and
        every constructor argument after each one passed its own check.
    """

    name: str
    proto_oneof: str
    op_name: str
    op_module_name: str
    learning_rate_default: float
    hypers: Tuple[Hyper, ...]
    slots: Tuple[Slot, ...]
    update: UpdateRule
    summary: str
    math: str
    sources: str
    tensorflow_class: Optional[str] = None
    signature: Optional[Tuple[str, ...]] = None
    zero_gradient_is_noop: bool = True
    reference_kernel: Optional[str] = None
    check: Optional[Callable[[str, Mapping[str, Any]], None]] = None

    def __post_init__(self):
        names = self.parameter_names
        expected = {"learning_rate", *(h.name for h in self.hypers)}
        expected |= set(COMMON_ARGUMENTS)
        if not self.slots:
            expected.discard("slot_variable_creation_fn")
        if set(names) != expected or len(names) != len(expected):
            raise ValueError(
                f"Definition {self.name}: signature {names} does not list "
                f"exactly {sorted(expected)}."
            )
        for slot in self.slots:
            if isinstance(slot.initial, str) and slot.initial not in self.hyper:
                raise ValueError(
                    f"Definition {self.name}: slot {slot.name} starts at "
                    f"unknown hyperparameter {slot.initial!r}."
                )

    @property
    def parameter_names(self) -> Tuple[str, ...]:
        if self.signature is not None:
            return self.signature
        common = COMMON_ARGUMENTS
        if not self.slots:
            common = tuple(c for c in common if c != "slot_variable_creation_fn")
        return ("learning_rate", *(h.name for h in self.hypers), *common)

    @property
    def hyper(self) -> Mapping[str, Hyper]:
        return {h.name: h for h in self.hypers}

    @property
    def defaults(self) -> Mapping[str, Any]:
        return {h.name: h.default for h in self.hypers}

    @property
    def load_op(self) -> str:
        return f"LoadTPUEmbedding{self.op_name}Parameters"

    @property
    def retrieve_op(self) -> str:
        return f"RetrieveTPUEmbedding{self.op_name}Parameters"
