"""The parts of an algorithm's definition that are its own: its
hyperparameters (`Hyper`), its slots (`Slot`), and how it steps tables of a
16-bit float dtype (`NarrowTables`) or scales a variable's step by one factor
(`VariableFactor`). `spec.Definition` is made of them; `spec` exports them
too. This module imports neither TensorFlow nor Keras.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional, Tuple

from tf_tpu_embed_opt.definitions.keras_face import INHERITED
from tf_tpu_embed_opt.definitions.values import Bounds, check_bool, check_real

__all__ = ["Hyper", "NARROW_FLOATS", "NarrowTables", "Slot", "VariableFactor"]


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
        that carries the value, or `None` if the proto has no such field.
        `INHERITED` (the default): the hyperparameter's own name where the
        TensorFlow engines run the algorithm, except for a slot's initial
        value (held by the tables, not the proto); `None` elsewhere. Its
        `Definition` fills it in.
      proto_negated: The proto field holds the negation of a bool (Adam's
        `lazy_adam` is written as `use_non_lazy_adam`).
    """

    name: str
    default: Any
    kind: str
    doc: str
    bounds: Optional[Bounds] = None
    proto_field: Optional[str] = INHERITED
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
      keras_name: Name of the slot's variables on the Keras face (Keras's own
        name where Keras has the algorithm, e.g. `accumulator`).
      when: The condition on the Keras arguments under which the Keras twin
        keeps the slot (e.g. Adam's Keras-only `velocity_hat` with
        `amsgrad=True`); `None`: always. An engine slot may be left out only
        where the rule then does not read it (RMSProp's `mom` with
        momentum 0); the twin drops its new value.
      keras_initial: A Keras argument of the twin that sets the slot's
        initial value there (jax-tpu-embedding lets FTRL's linear slot start
        elsewhere than 0, which the TensorFlow engines cannot); `None`:
        `initial` on both faces.
      per_row: One value per row of the table (`[rows, 1]`: a row-wise
        optimizer's state, 1/dim of the table) instead of the table's shape.
    """

    name: str
    initial: Any
    doc: str
    keras_name: Optional[str] = None
    when: Optional[Callable[[Mapping[str, Any]], bool]] = None
    keras_initial: Optional[str] = None
    per_row: bool = False

    @property
    def keras_variable_name(self) -> str:
        return self.keras_name or self.name

    def initial_value(self, hypers: Mapping[str, Any]) -> float:
        if isinstance(self.initial, str):
            return hypers[self.initial]
        return self.initial


# The 16-bit float dtypes a table may have (Keras's and NumPy's names): an
# algorithm whose state needs float32 steps them in float32
# (`Definition.narrow_tables`), and the engines' float32 checkpoints take them
# widened, exactly.
NARROW_FLOATS = ("float16", "bfloat16")


@dataclasses.dataclass(frozen=True)
class NarrowTables:
    """How an algorithm whose reference keeps float32 state steps a table of
    a 16-bit float dtype (`NARROW_FLOATS`): in float32, from the table's
    values (which float32 holds exactly), with its slots float32, rounding
    only the new weights to the table's dtype, to nearest. In the table's
    own dtype its state would underflow or stop growing.

    Attributes:
      reference: Whose step this is, and what it measured (documentation).
      hypers: Hyperparameters such a table's step takes in place of the
        configured ones, where the reference computes otherwise on it.
    """

    reference: str
    hypers: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class VariableFactor:
    """One factor per model variable that scales the step of all its rows.

    Adaptive clipping (arXiv:2302.09178): the factor is the largest `s <= 1` that keeps
    every element's step within its threshold, a minimum over the whole
    variable. The definition's `rule` then gives, instead of the new rows,
    the largest factor each element allows and what `finish` needs:
    `rule(xp, w, slots, g, lr, hypers) -> (bound, carry)`. The variable's
    factor is `min(1, min of bound over every row the step touches)` (its
    looked-up rows, across all its shards; a row without gradient bounds
    nothing), and `finish(xp, carry, factor, hypers) -> (w, slots)` writes the
    step. No engine that steps each row on its own computes it: the engines,
    their conversions and the row-sparse layer refuse such an algorithm with
    `why_not_per_row`.

    Attributes:
      finish: The second half of the step, given the variable's factor.
      name: What the factor is called (`clipping_factor`): a Keras variable
        that keeps the latest one is `<variable>_<name>`, and the Keras class
        lists them as `<name>s`.
      export: The Keras bool argument that keeps each variable's latest factor
        in a variable (`export_clipping_factors`), or `None`.
      why_not_per_row: Why an engine that sees one row at a time cannot
        compute it (the refusals say it).
    """

    finish: Callable[..., Tuple[Any, Mapping[str, Any]]]
    name: str
    export: Optional[str]
    why_not_per_row: str
