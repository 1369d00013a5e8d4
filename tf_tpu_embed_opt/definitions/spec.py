"""Building blocks of an optimizer definition.

Every algorithm of the package is declared once, as a `Definition` made of
`Hyper` parameters and `Slot` variables plus an update rule. The embedding
classes, the proto reader and writer, and the documentation tables are derived
from these declarations. This module imports neither TensorFlow nor Keras.
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from tf_tpu_embed_opt.definitions.engine_faces import (
    ENGINES,
    JAX_TPU_EMBEDDING,
    TPU_EMBEDDING,
    TPU_EMBEDDING_V2,
    Engine,
    JaxFace,
    Remap,
    SparseCoreOptimizer,
    TensorFlowFace,
    engine_named,
)
from tf_tpu_embed_opt.definitions.keras_face import INHERITED, KerasArg, KerasFace
from tf_tpu_embed_opt.definitions.parts import (
    NARROW_FLOATS,
    Hyper,
    NarrowTables,
    Slot,
    VariableFactor,
)
from tf_tpu_embed_opt.definitions.values import (
    NON_NEGATIVE,
    NON_POSITIVE,
    NON_ZERO,
    POSITIVE,
    UNIT_INTERVAL,
    UNIT_INTERVAL_OPEN,
    Bounds,
    bind_arguments,
    check_bool,
    check_real,
)

__all__ = [
    "ROUNDING_KEY",
    "NARROW_FLOATS",
    "NarrowTables",
    "Bounds",
    "Hyper",
    "KerasArg",
    "KerasFace",
    "Remap",
    "INHERITED",
    "Slot",
    "VariableFactor",
    "Definition",
    "COMMON_ARGUMENTS",
    "COMMON_DEFAULTS",
    "check_real",
    "check_bool",
    "bind_arguments",
    "NON_NEGATIVE",
    "NON_POSITIVE",
    "NON_ZERO",
    "POSITIVE",
    "UNIT_INTERVAL",
    "UNIT_INTERVAL_OPEN",
    "ENGINES",
    "Engine",
    "TENSORFLOW_ENGINES",
    "JAX_ENGINE",
    "TPU_EMBEDDING",
    "TPU_EMBEDDING_V2",
    "engine_named",
    "JaxFace",
    "SparseCoreOptimizer",
    "TensorFlowFace",
]

# The engines (`engine_faces.Engine`, one registry): those of TensorFlow, and
# jax-tpu-embedding's.
TENSORFLOW_ENGINES: Tuple[Engine, ...] = tuple(e for e in ENGINES if e.tensorflow)
JAX_ENGINE = JAX_TPU_EMBEDDING


# The arguments every embedding optimizer shares, in TensorFlow's order, with
# TensorFlow's defaults (tests/test_embedding.py compares the signatures). The
# embedding classes and the command line's help take them from here; their
# validation lives with the embedding face.
COMMON_DEFAULTS: Mapping[str, Any] = types.MappingProxyType(
    {
        "use_gradient_accumulation": True,
        "clip_weight_min": None,
        "clip_weight_max": None,
        "weight_decay_factor": None,
        "multiply_weight_decay_factor_by_learning_rate": None,
        "slot_variable_creation_fn": None,
        "clipvalue": None,
        "low_dimensional_packing_status": False,
    }
)

# What each of those arguments means, once: the embedding classes' docstrings
# and `describe`'s help read it (the command line spells None as `none`).
COMMON_DOCS: Mapping[str, str] = types.MappingProxyType(
    {
        "use_gradient_accumulation": (
            "Sum a row's gradients over the batch before applying them "
            "(needed for clipping and exact results)."
        ),
        "clip_weight_min": "Lower bound for the updated weights; None for no bound.",
        "clip_weight_max": "Upper bound for the updated weights; None for no bound.",
        "weight_decay_factor": (
            "Decoupled weight decay of the looked-up rows; None for no decay."
        ),
        "multiply_weight_decay_factor_by_learning_rate": (
            "Multiply the weight decay by the current learning rate."
        ),
        "slot_variable_creation_fn": (
            "None, or a callable (table, slot_names, initializers) or (table, "
            "slot_names) returning the slot variables by name."
        ),
        "clipvalue": (
            "Gradient clipping: c >= 0 clips to [-c, c], (min, max) to "
            "[min, max] with None for a side without bound; None for no "
            "clipping."
        ),
        "low_dimensional_packing_status": "Pack tables of dimension 1, 2 or 4.",
    }
)
COMMON_ARGUMENTS: Tuple[str, ...] = tuple(COMMON_DEFAULTS)


# An update rule maps (xp, w, slots, g, lr, hypers) to (w, slots) for one step
# of the TPU engine's per-row optimizer, after gradient clipping and weight
# decay and before weight clipping. `xp` is a small array namespace (see
# `tf_tpu_embed_opt.definitions.rules`), `slots` a dict keyed by slot name,
# `hypers` a dict of Python values keyed by hyperparameter name, and `lr` a
# scalar.
UpdateRule = Callable[..., Tuple[Any, Mapping[str, Any]]]

# The key of `hypers` under which a rule finds how to round where Keras's
# order and jax-tpu-embedding's differ (FTRL): JAX_ENGINE, or absent for
# Keras's (see `rules.ROUNDINGS`).
ROUNDING_KEY = "rounding"


@dataclasses.dataclass(frozen=True)
class Definition:
    """Everything the package knows about one algorithm.

    Attributes:
      name: Class name on the embedding face (e.g. `Adagrad`, `RMSProp`).
      learning_rate_default: Default learning rate on the embedding face.
      hypers: The algorithm's own hyperparameters.
      slots: Its slot variables, in the order of the load/retrieve ops.
      rule: The per-row update rule, over engine hyperparameters and the Keras
        face's Keras-only arguments (call `update`, which fills the latter).
      summary: One line for tables and help.
      math: The update rule in plain text, for docstrings.
      sources: Where the rule comes from (see docs/tpu_semantics.md).
      tensorflow: The algorithm on TensorFlow's engines (`TensorFlowFace`:
        its `OptimizationParameters` member, load/retrieve ops, TensorFlow's
        own class and checks, reference kernel, the embedding class's
        signature); `None` for an algorithm they do not have (LaProp, F2A:
        jax-tpu-embedding only), which has no class on the embedding face.
        `proto_oneof`, `op_name`, `tensorflow_class`, ... read it.
      zero_gradient_is_noop: Whether a zero row gradient leaves the row and its
        slots unchanged (with default hyperparameters); low-dimensional packing
        applies zero-gradient updates to untouched rows, so it is refused for
        algorithms TensorFlow does not expose when this is False.
      check: Optional cross-argument validation, called with the class name and
        every constructor argument after `TensorFlowFace.checks` (TensorFlow
        runs Adam's the same way).
      keras: The algorithm's Keras face; `None` when another definition's
        Keras class serves it through a variant (CenteredRMSProp).
      step_hypers: Optional f(xp, step, hypers) -> the values of some rule
        hyperparameters at step `step` (1-based count of applications, a
        scalar of `xp`), merged over `hypers` before the rule runs: schedules
        that the engine derives from the step (LaProp's decay, F2A's global
        step, Adam's epsilon after bias correction).
      jax: The algorithm in jax-tpu-embedding; `None` where it has none.
      linear_in_gradient: Whether applying a row's gradient contributions one
        at a time equals one step with their sum (plain SGD): an engine
        without gradient accumulation then computes the same.
      sparsecore: What `TPUEmbeddingV2` (SparseCore through TensorFlow) hands
        its op, where it runs the algorithm; `None`: it refuses it.
      demo_learning_rate: The learning rate with which `tf-tpu-embed-opt
        demo` trains its tables (close to the best held-out loss on the
        demo's data in three epochs); `None`: `learning_rate_default`.
      factor: One factor per model variable that scales every row's step
        (`VariableFactor`); `None` for the per-row rules.
      state_of: The engine algorithm whose slots this one keeps, by name,
        where it has none of its own on an engine: a checkpoint carries its
        state as that algorithm's (an adaptive clipping of Adagrad keeps
        Adagrad's accumulator).
      narrow_tables: How it steps a float16 or bfloat16 table, where its
        reference keeps its state and steps in float32 whatever the table's
        dtype (`NarrowTables`, `step_dtype`); `None`: it steps a table in
        the table's dtype, as Keras's optimizers do.
    """

    name: str
    learning_rate_default: float
    hypers: Tuple[Hyper, ...]
    slots: Tuple[Slot, ...]
    rule: UpdateRule
    summary: str
    math: str
    sources: str
    tensorflow: Optional[TensorFlowFace] = None
    zero_gradient_is_noop: bool = True
    check: Optional[Callable[[str, Mapping[str, Any]], None]] = None
    keras: Optional[KerasFace] = None
    step_hypers: Optional[Callable[..., Mapping[str, Any]]] = None
    jax: Optional[JaxFace] = None
    sparsecore: Optional[SparseCoreOptimizer] = None
    demo_learning_rate: Optional[float] = None
    linear_in_gradient: bool = False
    factor: Optional[VariableFactor] = None
    state_of: Optional[str] = None
    narrow_tables: Optional[NarrowTables] = None

    def __post_init__(self):
        self._fill_in_implied()
        names = self.parameter_names
        expected = {"learning_rate", *(h.name for h in self.hypers)}
        if self.tensorflow_engines:
            expected |= set(COMMON_ARGUMENTS)
        if not self.slots:
            expected.discard("slot_variable_creation_fn")
        if set(names) != expected or len(names) != len(expected):
            raise ValueError(
                f"Definition {self.name}: signature {names} does not list "
                f"exactly {sorted(expected)}."
            )
        unknown = set(self.tensorflow_checks) - set(self.hyper)
        if unknown:
            raise ValueError(
                f"Definition {self.name}: tensorflow_checks names unknown "
                f"hyperparameters {sorted(unknown)}."
            )
        known = set(self.hyper) | {a.name for a in self.keras_arguments}
        for slot in self.slots:
            if isinstance(slot.initial, str) and slot.initial not in self.hyper:
                raise ValueError(
                    f"Definition {self.name}: slot {slot.name} starts at "
                    f"unknown hyperparameter {slot.initial!r}."
                )
            if slot.keras_initial is not None and slot.keras_initial not in known:
                raise ValueError(
                    f"Definition {self.name}: slot {slot.name} starts at "
                    f"unknown Keras argument {slot.keras_initial!r}."
                )
        if self.sparsecore is not None:
            listed = [
                *self.sparsecore.attributes,
                *self.sparsecore.slot_hypers,
                *self.sparsecore.dropped,
            ]
            if self.sparsecore.definition != self.name:
                raise ValueError(
                    f"Definition {self.name}: its SparseCore record is "
                    f"{self.sparsecore.definition}'s."
                )
            if sorted(listed) != sorted(self.hyper):
                raise ValueError(
                    f"Definition {self.name}: its SparseCore record "
                    f"({self.sparsecore.definition}) does not list each "
                    f"hyperparameter of {sorted(self.hyper)} exactly once: "
                    f"{sorted(listed)}."
                )
        if self.engine_refusal is not None:
            faults = [
                fault
                for fault, present in (
                    ("a TensorFlow face (a proto)", self.tensorflow_engines),
                    ("a jax-tpu-embedding face", self.jax is not None),
                    ("no Keras face", self.keras is None),
                    (
                        "engine options on its Keras face",
                        self.keras is not None and self.keras.engine_options,
                    ),
                )
                if present
            ]
            if faults:
                raise ValueError(
                    f"Definition {self.name}: a step scaled per variable or "
                    "state per row runs on no engine and takes no engine "
                    f"options, but it has {', '.join(faults)}."
                )
        if self.jax is not None:
            unknown = (set(self.jax.fields) | set(self.jax.implied)) - known
            unknown |= set(self.jax.slots) - {s.name for s in self.slots}
            unknown |= set(self.jax.reasons) - set(self.jax.implied)
            if unknown:
                raise ValueError(
                    f"Definition {self.name}: its jax-tpu-embedding face names "
                    f"unknown arguments or slots {sorted(unknown)}."
                )

    def _fill_in_implied(self) -> None:
        """What a definition leaves implied, filled in: each hyperparameter's
        proto field (its own name on the TensorFlow engines, except a slot's
        initial value), the Keras face's default learning rate (the embedding
        face's), jax-tpu-embedding's spec fields (each Keras argument the
        spec does not imply, by its own name unless `JaxFace.fields` gives
        another) and what SparseCore's record leaves out
        (`SparseCoreOptimizer.completed`)."""
        starts = {s.initial for s in self.slots if isinstance(s.initial, str)}
        hypers = []
        for hyper in self.hypers:
            if hyper.proto_field is INHERITED:
                own = self.tensorflow is not None and hyper.name not in starts
                hyper = dataclasses.replace(
                    hyper, proto_field=hyper.name if own else None
                )
            hypers.append(hyper)
        object.__setattr__(self, "hypers", tuple(hypers))
        if self.sparsecore is not None:
            names = tuple(h.name for h in self.hypers)
            sparsecore = self.sparsecore.completed(self.name, names, starts)
            object.__setattr__(self, "sparsecore", sparsecore)
        if self.keras is not None and self.keras.learning_rate is INHERITED:
            keras = dataclasses.replace(
                self.keras, learning_rate=self.learning_rate_default
            )
            object.__setattr__(self, "keras", keras)
        if self.jax is not None:
            implied, named = self.jax.implied, self.jax.fields
            if not isinstance(named, Mapping):
                raise TypeError(
                    f"Definition {self.name}: JaxFace.fields must map an "
                    "argument to the spec's field of another name; received "
                    f"{named!r}."
                )
            fields = {}
            for argument in self.keras_arguments:
                name = argument.hyper or argument.name
                if argument.name != "lazy" and not {name, argument.name} & {*implied}:
                    fields[name] = named.get(name, name)
            unknown = set(named) - set(fields)
            if unknown:
                raise ValueError(
                    f"Definition {self.name}: its jax-tpu-embedding face names "
                    f"fields of no Keras argument, or of implied ones: "
                    f"{sorted(unknown)}."
                )
            object.__setattr__(
                self, "jax", dataclasses.replace(self.jax, fields=fields)
            )

    def __repr__(self) -> str:
        # The dataclass's repr spells every field, a page for Adam; a table's
        # algorithm (`open_checkpoint(...).algorithm(name)`,
        # `load_into_keras`'s result) is shown by its name and summary.
        return f"<Definition {self.name!r}: {self.summary}>"

    @property
    def jax_slots(self) -> Dict[str, str]:
        """Each slot's name in jax-tpu-embedding, in the definition's order
        (the spec's): `JaxFace.slots` where it differs, else the slot's own
        (as a `RuleOptimizerSpec`, for an algorithm without a spec of
        jax-tpu-embedding's, names them)."""
        renamed = self.jax.slots if self.jax is not None else {}
        return {s.name: renamed.get(s.name, s.name) for s in self.slots}

    @property
    def tensorflow_engines(self) -> bool:
        """Whether the TensorFlow engines (and the embedding face) have it."""
        return self.tensorflow is not None

    @property
    def engine_refusal(self) -> Optional[str]:
        """Why no engine can run it, or `None`: a step scaled per variable
        (`factor`), or state of one value per row (a slot `per_row`), which
        no engine's slots hold."""
        if self.factor is not None:
            return self.factor.why_not_per_row
        if any(slot.per_row for slot in self.slots):
            return (
                "its state is one value per row ([rows, 1]), which no engine "
                "holds: TensorFlow's engines have no such algorithm, and "
                "jax-tpu-embedding's custom optimizers keep every slot the "
                "shape of the table and step rows padded to a multiple of 8 "
                "(a stack's to its widest), so a row's mean would not be over "
                "the table's own width"
            )
        return None

    def step_dtype(self, dtype: str) -> str:
        """The dtype a table of `dtype` (Keras's standardized name) steps in
        and keeps its slots in: float32 for a float16 or bfloat16 one where
        `narrow_tables` says so; its own otherwise."""
        if self.narrow_tables is not None and dtype in NARROW_FLOATS:
            return "float32"
        return dtype

    def check_table_dtype(self, owner: str, table: str, dtype: str) -> None:
        """Refuses a table of `dtype` (Keras's standardized name) that the
        algorithm cannot step: a float8 one where it keeps float32 state
        (`narrow_tables`), whose reference has no such table.

        Raises:
          ValueError: It does, naming `owner`, `table` and the dtype.
        """
        if self.narrow_tables is None or not dtype.startswith("float8"):
            return
        raise ValueError(
            f"{owner}: table {table!r} is {dtype}; {self.name} steps tables "
            "of float32 or wider, and float16 or bfloat16 ones in float32 with "
            "float32 state. Give the table one of those dtypes."
        )

    # What `tensorflow` says, read where the TensorFlow engines are asked
    # (`None`, or no checks, for an algorithm they do not have).
    @property
    def proto_oneof(self) -> Optional[str]:
        return self.tensorflow.oneof if self.tensorflow else None

    @property
    def op_name(self) -> Optional[str]:
        return self.tensorflow.op_name if self.tensorflow else None

    @property
    def op_module_name(self) -> Optional[str]:
        return self.tensorflow.op_module_name if self.tensorflow else None

    @property
    def tensorflow_class(self) -> Optional[str]:
        return self.tensorflow.tensorflow_class if self.tensorflow else None

    @property
    def tensorflow_checks(self) -> Tuple[str, ...]:
        return self.tensorflow.checks if self.tensorflow else ()

    @property
    def reference_kernel(self) -> Optional[str]:
        return self.tensorflow.reference_kernel if self.tensorflow else None

    def hypers_at(self, xp: Any, step: Any, hypers: Mapping[str, Any]) -> Any:
        """`hypers` with the values `step_hypers` gives at step `step` (1-based)."""
        if self.step_hypers is None:
            return hypers
        return {**hypers, **self.step_hypers(xp, step, hypers)}

    @property
    def parameter_names(self) -> Tuple[str, ...]:
        """The embedding class's constructor parameters, in TensorFlow's order:
        `learning_rate`, the hyperparameters, the shared arguments (with the
        `late` hyperparameters before `low_dimensional_packing_status`)."""
        if not self.tensorflow_engines:
            return ("learning_rate", *(h.name for h in self.hypers))
        common = COMMON_ARGUMENTS
        if not self.slots:
            common = tuple(c for c in common if c != "slot_variable_creation_fn")
        *shared, packing = common
        late = self.tensorflow.late
        first = tuple(h.name for h in self.hypers if h.name not in late)
        return ("learning_rate", *first, *shared, *late, packing)

    @property
    def hyper(self) -> Mapping[str, Hyper]:
        return {h.name: h for h in self.hypers}

    @property
    def defaults(self) -> Mapping[str, Any]:
        return {h.name: h.default for h in self.hypers}

    def rule_hypers(self, values: Mapping[str, Any]) -> Dict[str, Any]:
        """`values` plus the Keras-only arguments it lacks, at engine values.

        The update rule reads Keras-only arguments too (e.g. Adagrad's
        `epsilon`); on the embedding face they take the values that reproduce
        the engine.
        """
        hypers = dict(values)
        if self.keras is not None:
            for argument in self.keras_arguments:
                if argument.hyper is None:
                    hypers.setdefault(argument.name, argument.engine)
        return hypers

    def update(
        self,
        xp: Any,
        w: Any,
        slots: Mapping[str, Any],
        g: Any,
        lr: Any,
        hypers: Mapping[str, Any],
    ) -> Tuple[Any, Mapping[str, Any]]:
        """One application of the rule; Keras-only arguments default to the engine.

        With a `factor`, the step of these rows as the whole variable: the
        factor is the minimum over them, and the new slots hold it under the
        factor's name too.
        """
        if self.factor is None:
            return self.rule(xp, w, dict(slots), g, lr, self.rule_hypers(hypers))
        bound, carry = self.bound(xp, w, slots, g, lr, hypers)
        return self.scaled(xp, carry, bound, hypers)

    def bound(
        self,
        xp: Any,
        w: Any,
        slots: Mapping[str, Any],
        g: Any,
        lr: Any,
        hypers: Mapping[str, Any],
    ) -> Tuple[Any, Any]:
        """With a `factor`: the largest factor these rows allow (a scalar; 1
        or more where none moves) and what `scaled` needs."""
        bound, carry = self.rule(xp, w, dict(slots), g, lr, self.rule_hypers(hypers))
        return xp.min(bound), carry

    def scaled(
        self, xp: Any, carry: Any, bound: Any, hypers: Mapping[str, Any]
    ) -> Tuple[Any, Mapping[str, Any]]:
        """With a `factor`: the step scaled by `min(1, bound)`, where `bound`
        is the minimum of `bound` over every part of the variable; the new
        slots hold the factor under its name too."""
        factor = xp.minimum(1.0, bound)
        w, slots = self.factor.finish(xp, carry, factor, self.rule_hypers(hypers))
        return w, {**slots, self.factor.name: factor}

    @property
    def keras_arguments(self) -> Tuple[KerasArg, ...]:
        """The Keras face's algorithm arguments, in signature order."""
        if self.keras is None:
            return ()
        given = self.keras.arguments
        if given is None:
            given = tuple(KerasArg(hyper=h.name) for h in self.hypers)
        lazy = self.keras.lazy
        given = given if lazy is None else (*given, lazy)
        hypers = self.hyper
        return tuple(argument.inheriting(hypers, self.name) for argument in given)

    @property
    def load_op(self) -> str:
        return f"LoadTPUEmbedding{self.op_name}Parameters"

    @property
    def retrieve_op(self) -> str:
        return f"RetrieveTPUEmbedding{self.op_name}Parameters"
