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
    engine_named,
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
    is_real,
)

__all__ = [
    "ROUNDING_KEY",
    "Bounds",
    "Hyper",
    "KerasArg",
    "KerasFace",
    "Remap",
    "INHERITED",
    "Slot",
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
]

# The engines (`engine_faces.Engine`, one registry): those of TensorFlow, and
# jax-tpu-embedding's.
TENSORFLOW_ENGINES: Tuple[Engine, ...] = tuple(e for e in ENGINES if e.tensorflow)
JAX_ENGINE = JAX_TPU_EMBEDDING


class _Inherited:
    """What a `KerasArg` leaves to its hyperparameter."""

    def __repr__(self) -> str:
        return "INHERITED"


INHERITED: Any = _Inherited()


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
class KerasArg:
    """An argument of an algorithm's Keras class.

    An argument that is an engine hyperparameter (`hyper`) inherits from it
    whatever it does not say itself: its name, default, kind, doc and bounds
    (`KerasArg(hyper="beta")` is the hyperparameter `beta` on the Keras face);
    its definition fills them in (`Definition.keras_arguments`).

    Attributes:
      name: The Keras argument name (e.g. `nesterov`, `lazy`).
      default: Its default on the Keras face (Keras's own where Keras has the
        algorithm).
      kind: `"float"` or `"bool"`.
      doc: One-line description.
      bounds: Allowed interval for a float (where the Keras face's domain is
        wider than the TensorFlow engines', the values another engine or
        Keras accepts and computes; a conversion to the embedding face then
        refuses the rest with TensorFlow's reason).
      hyper: The engine hyperparameter with the same meaning, whose value is
        copied by the conversions; `None` for a Keras-only argument.
      engine: For a Keras-only argument, the value with which the Keras math is
        the engine's (e.g. Adagrad `epsilon=0.0`). A conversion to the
        embedding face refuses any other value.
      keyword: Taken through `**kwargs`, so that the explicit signature stays
        exactly Keras's (TPU-only options such as `lazy`).
      keras_error: Keras's own message for a value outside `bounds`, where
        Keras checks the argument (`{value}` is replaced by the value): the
        Keras-named classes refuse what Keras refuses with Keras's words, so
        that code matching Keras's errors keeps working.
      engine_lacks: For a Keras-only argument, why a value other than
        `engine` has no engine equivalent (the conversions' refusal says it).
      negligible: For a Keras-only argument, f(value, arguments) -> whether
        that value differs from `engine` by a documented, provably negligible
        amount with these Keras arguments (Adagrad's epsilon far below the
        initial accumulator): the conversions then take it as `engine`.
      in_learning_rate: A value other than `engine` is carried by the
        conversions' learning rate (Adam's `bias_correction`: the
        definition's `KerasFace.learning_rate_factor`, evaluated at the Keras
        optimizer's step), not refused.
    """

    name: str = INHERITED
    default: Any = INHERITED
    kind: str = INHERITED
    doc: str = INHERITED
    bounds: Optional[Bounds] = INHERITED
    hyper: Optional[str] = None
    engine: Any = None
    keyword: bool = False
    keras_error: Optional[str] = None
    engine_lacks: str = "the engine has no such option"
    negligible: Optional[Callable[[Any, Mapping[str, Any]], bool]] = None
    in_learning_rate: bool = False

    def check(self, owner: str, value: Any) -> None:
        if self.kind == "bool":
            check_bool(owner, self.name, value)
            return
        if (
            self.keras_error is not None
            and is_real(value)
            and not (self.bounds is None or self.bounds.contains(value))
        ):
            raise ValueError(self.keras_error.format(value=value))
        check_real(owner, self.name, value, self.bounds)

    @classmethod
    def mirroring(cls, hyper: Hyper, bounds: Optional[Bounds] = None) -> "KerasArg":
        """The Keras argument equal to an engine hyperparameter (`bounds`, where
        given, the Keras face's wider domain)."""
        return cls(hyper=hyper.name, bounds=INHERITED if bounds is None else bounds)

    def inheriting(self, hypers: Mapping[str, "Hyper"], owner: str) -> "KerasArg":
        """This argument with what it does not say taken from its `hyper`.

        Raises:
          ValueError: It names no hyperparameter of `hypers` yet leaves a
            field to inherit.
        """
        unsaid = [
            f.name
            for f in dataclasses.fields(self)
            if getattr(self, f.name) is INHERITED
        ]
        if self.hyper is None and unsaid == ["bounds"]:
            return dataclasses.replace(self, bounds=None)  # Keras-only: none
        if not unsaid:
            return self
        hyper = hypers.get(self.hyper) if self.hyper is not None else None
        if hyper is None:
            raise ValueError(
                f"Definition {owner}: Keras argument {self.name!r} leaves "
                f"{unsaid} to inherit, but names no hyperparameter of it "
                f"(hyper={self.hyper!r}; it has {sorted(hypers)})."
            )
        inherited = {
            "name": hyper.name,
            "default": hyper.default,
            "kind": hyper.kind,
            "doc": hyper.doc,
            "bounds": hyper.bounds,
        }
        return dataclasses.replace(self, **{name: inherited[name] for name in unsaid})


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
    """

    name: str
    initial: Any
    doc: str
    keras_name: Optional[str] = None
    when: Optional[Callable[[Mapping[str, Any]], bool]] = None
    keras_initial: Optional[str] = None

    @property
    def keras_variable_name(self) -> str:
        return self.keras_name or self.name

    def initial_value(self, hypers: Mapping[str, Any]) -> float:
        if isinstance(self.initial, str):
            return hypers[self.initial]
        return self.initial


@dataclasses.dataclass(frozen=True)
class KerasFace:
    """How an algorithm appears as a Keras 3 optimizer.

    Attributes:
      name: Class name in `tf_tpu_embed_opt.optimizers` (Keras's name where
        Keras has the algorithm: `Ftrl`, `RMSprop`).
      learning_rate: Default learning rate on the Keras face.
      arguments: The algorithm's Keras arguments, in signature order; those with
        `keyword=True` come through `**kwargs`. `None`: the engine's
        hyperparameters, same names and defaults (no Keras class to follow).
      extra_slots: Keras-only slots; their `when` says when they exist.
      stock: Name of the `keras.optimizers` class with the same signature and,
        on dense gradients, the same math; `None` if Keras has none.
      variants: Keras bool arguments that switch to another engine algorithm
        (by definition name) when True: RMSprop's `centered`.
      learning_rate_factor: Optional f(xp, step, arguments, lr) giving the
        learning rate of step `step` (1-based) from `lr`; Keras Adam's bias
        correction.
      zero_gradient_steps: Whether, with the given Keras arguments, the step
        with a zero gradient changes the weights or a slot the next steps read
        (momentum, moving averages, FTRL's weights recomputed from `linear`).
        Keras then changes every row on a sparse gradient, the engine only
        the looked-up rows; the class takes `lazy` to choose (see `lazy`).
        `None`: never (Adagrad); the class takes no `lazy`.
      lazy_hyper: The engine hyperparameter that `lazy` sets, if the engine
        has the choice too (Adam's `lazy_adam`).
      zero_gradient_keeps_weights: Whether, with the given Keras arguments,
        the zero-gradient step leaves the weights exactly as they are (only
        slots change: RMSprop without momentum, Adadelta). With `lazy=False`
        a sparse gradient then steps every row's slots but writes only the
        looked-up rows of the weights, as Keras does. `None`: never.
      check: Optional cross-argument validation of the Keras arguments,
        called with the class name and the arguments by name.
      remap: Keras arguments under which the conversions give another
        engine algorithm (`Remap`), or `None`.
    """

    name: str
    learning_rate: float
    arguments: Optional[Tuple[KerasArg, ...]] = None
    extra_slots: Tuple["Slot", ...] = ()
    stock: Optional[str] = None
    variants: Mapping[str, str] = dataclasses.field(default_factory=dict)
    learning_rate_factor: Optional[Callable[..., Any]] = None
    zero_gradient_steps: Optional[Callable[[Mapping[str, Any]], bool]] = None
    lazy_hyper: Optional[str] = None
    zero_gradient_keeps_weights: Optional[Callable[[Mapping[str, Any]], bool]] = None
    check: Optional[Callable[[str, Mapping[str, Any]], None]] = None
    remap: Optional[Remap] = None

    @property
    def lazy(self) -> Optional[KerasArg]:
        """The `lazy` argument, derived from `zero_gradient_steps` and `stock`.

        One rule for every class whose zero-gradient step can change a row;
        `None` for the others (they update only looked-up rows either way). A
        class named like Keras's (`stock`) defaults to Keras's result
        (`lazy=False`: every row steps on a sparse gradient, as with the
        equivalent dense gradient); an engine-only class to the engine's
        (`lazy=True`: only looked-up rows and their slots change).
        """
        if self.zero_gradient_steps is None:
            return None
        return KerasArg(
            "lazy",
            self.stock is None,
            "bool",
            "With a sparse gradient, update only the looked-up rows and their "
            "slots (the TPU engine's rule); False: every row steps, as with the "
            "equivalent dense gradient (Keras's rule).",
            hyper=self.lazy_hyper,
            engine=None if self.lazy_hyper else True,
            keyword=True,
        )


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
      proto_oneof: Name of the algorithm's member of the
        `OptimizationParameters.parameters` oneof (e.g. `rms_prop`); `None`
        for an algorithm the TensorFlow engines do not have (LaProp, F2A:
        jax-tpu-embedding only), which has no class on the embedding face.
      op_name: The algorithm's part of the TPU op names: `LoadTPUEmbedding`
        + op_name + `Parameters` (e.g. `RMSProp`); `None` without a proto.
      op_module_name: The same in snake case, as in `tpu_ops`
        (`load_tpu_embedding_rms_prop_parameters`); `None` without a proto.
      learning_rate_default: Default learning rate on the embedding face.
      hypers: The algorithm's own hyperparameters.
      slots: Its slot variables, in the order of the load/retrieve ops.
      rule: The per-row update rule, over engine hyperparameters and the Keras
        face's Keras-only arguments (call `update`, which fills the latter).
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
      tensorflow_checks: The hyperparameters TensorFlow's own class validates,
        in its order; the embedding class checks them first, before the
        arguments TensorFlow accepts (so that it refuses in TensorFlow's order).
      check: Optional cross-argument validation, called with the class name and
        every constructor argument after the `tensorflow_checks` (TensorFlow
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
    """

    name: str
    proto_oneof: Optional[str]
    op_name: Optional[str]
    op_module_name: Optional[str]
    learning_rate_default: float
    hypers: Tuple[Hyper, ...]
    slots: Tuple[Slot, ...]
    rule: UpdateRule
    summary: str
    math: str
    sources: str
    tensorflow_class: Optional[str] = None
    signature: Optional[Tuple[str, ...]] = None
    zero_gradient_is_noop: bool = True
    reference_kernel: Optional[str] = None
    tensorflow_checks: Tuple[str, ...] = ()
    check: Optional[Callable[[str, Mapping[str, Any]], None]] = None
    keras: Optional[KerasFace] = None
    step_hypers: Optional[Callable[..., Mapping[str, Any]]] = None
    jax: Optional[JaxFace] = None
    sparsecore: Optional[SparseCoreOptimizer] = None
    demo_learning_rate: Optional[float] = None
    linear_in_gradient: bool = False

    def __post_init__(self):
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
            if self.sparsecore.definition != self.name or sorted(listed) != sorted(
                self.hyper
            ):
                raise ValueError(
                    f"Definition {self.name}: its SparseCore record "
                    f"({self.sparsecore.definition}) does not list each "
                    f"hyperparameter of {sorted(self.hyper)} exactly once: "
                    f"{sorted(listed)}."
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

    @property
    def tensorflow_engines(self) -> bool:
        """Whether the TensorFlow engines (and the embedding face) have it."""
        return self.proto_oneof is not None

    def hypers_at(self, xp: Any, step: Any, hypers: Mapping[str, Any]) -> Any:
        """`hypers` with the values `step_hypers` gives at step `step` (1-based)."""
        if self.step_hypers is None:
            return hypers
        return {**hypers, **self.step_hypers(xp, step, hypers)}

    @property
    def parameter_names(self) -> Tuple[str, ...]:
        if self.signature is not None:
            return self.signature
        if not self.tensorflow_engines:
            return ("learning_rate", *(h.name for h in self.hypers))
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
        """One application of the rule; Keras-only arguments default to the engine."""
        return self.rule(xp, w, dict(slots), g, lr, self.rule_hypers(hypers))

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
