"""An algorithm with its arguments and engine options: what one row step computes.

The Keras twin of an algorithm is its definition plus the values of its Keras
arguments (`lazy`, Adagrad's `epsilon`, RMSprop's `centered`, ...) and of the
engine options every twin takes (`clip_weight_min/max`, asymmetric gradient
clipping, row-wise weight decay, `rounding`). `ConfiguredRule` holds those
values, checked, and derives from them everything a row step needs: the
algorithm that runs (a Keras flag may switch to a variant), its
hyperparameters, its slots and their initial values, what changes with the
step, and the step itself.

The Keras twins hold one (`optimizers.twins`), and jax-tpu-embedding's custom
spec builds one from a twin's class name and arguments
(`engines.jax_custom`), so the engine runs the twin's rule without importing
the Keras face. No TensorFlow, no Keras.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
import types
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from tf_tpu_embed_opt.definitions import registry, rules, spec
from tf_tpu_embed_opt.definitions.values import is_bool

__all__ = [
    "ENGINE_OPTIONS",
    "ConfiguredRule",
    "check_engine_options",
    "keras_classes",
]

# The engine options every twin takes (keywords), with their defaults: the
# TPU engine's weight and gradient clipping and row-wise weight decay, and how
# hyperparameters are rounded (Keras's order, or jax-tpu-embedding's).
ENGINE_OPTIONS: Mapping[str, Any] = types.MappingProxyType(
    {
        "clip_weight_min": None,
        "clip_weight_max": None,
        "clip_gradient_min": None,
        "clip_gradient_max": None,
        "weight_decay_factor": None,
        "multiply_weight_decay_factor_by_learning_rate": False,
        "rounding": "keras",
    }
)


def check_engine_options(owner: str, options: Mapping[str, Any]) -> None:
    """Raises unless `options` (every engine option, by name) are valid.

    Raises:
      TypeError: A value of the wrong type; the message names `owner`.
      ValueError: A value out of range, or a lower bound above its upper one.
    """
    for name in (
        "clip_weight_min",
        "clip_weight_max",
        "clip_gradient_min",
        "clip_gradient_max",
    ):
        if options[name] is not None:
            spec.check_real(owner, name, options[name])
    for low, high in (
        ("clip_weight_min", "clip_weight_max"),
        ("clip_gradient_min", "clip_gradient_max"),
    ):
        if (
            options[low] is not None
            and options[high] is not None
            and options[low] > options[high]
        ):
            raise ValueError(
                f"{owner}: `{low}` must be <= `{high}`; received "
                f"{low}={options[low]!r}, {high}={options[high]!r}."
            )
    if options["weight_decay_factor"] is not None:
        spec.check_real(
            owner,
            "weight_decay_factor",
            options["weight_decay_factor"],
            spec.NON_NEGATIVE,
        )
    spec.check_bool(
        owner,
        "multiply_weight_decay_factor_by_learning_rate",
        options["multiply_weight_decay_factor_by_learning_rate"],
    )
    if options["rounding"] not in rules.ROUNDINGS:
        allowed = " or ".join(repr(r) for r in rules.ROUNDINGS)
        raise ValueError(
            f"{owner}: argument `rounding` must be {allowed}; received "
            f"{options['rounding']!r}."
        )


def _plain(value: Any) -> Any:
    """A NumPy scalar as the Python value it equals (configs stay JSON)."""
    if type(value).__module__ != "numpy":
        return value
    if is_bool(value):
        return bool(value)
    return int(value) if isinstance(value, numbers.Integral) else float(value)


def keras_classes() -> Dict[str, spec.Definition]:
    """Every algorithm with a Keras class, by the class's name, in order."""
    return {d.keras.name: d for d in registry.ALL if d.keras is not None}


@dataclasses.dataclass(frozen=True)
class ConfiguredRule:
    """One algorithm's row step with given Keras arguments and engine options.

    Build it with `checked`; treat its dicts as read-only. Attributes:
      definition: The algorithm of the Keras class.
      arguments: Every Keras argument of the class by name.
      options: Every engine option the class takes by name
        (`ENGINE_OPTIONS`; none where `KerasFace.engine_options` is False).
    """

    definition: spec.Definition
    arguments: Dict[str, Any]
    options: Dict[str, Any]

    @classmethod
    def checked(
        cls,
        owner: str,
        definition: spec.Definition,
        arguments: Mapping[str, Any],
        options: Mapping[str, Any],
    ) -> "ConfiguredRule":
        """The rule of `definition` with `arguments` and `options`, each
        checked (the message names `owner`); missing ones take the Keras
        class's defaults.

        Raises:
          TypeError, ValueError: An argument or option the class refuses, or
            one it does not have.
        """
        known = {a.name: a for a in definition.keras_arguments}
        takes = ENGINE_OPTIONS if definition.keras.engine_options else {}
        unknown = sorted((set(arguments) - set(known)) | (set(options) - set(takes)))
        if unknown:
            also = f" and the engine options {', '.join(takes)}" if takes else ""
            raise TypeError(
                f"{owner}: {definition.keras.name} has no argument(s) "
                f"{', '.join(unknown)}; it takes {', '.join(known)}{also}."
            )
        values = {name: arguments.get(name, a.default) for name, a in known.items()}
        for name, argument in known.items():
            argument.check(owner, values[name])
            values[name] = _plain(values[name])
        if definition.keras.check is not None:
            definition.keras.check(owner, values)
        every_option = {**takes, **options}
        if takes:
            check_engine_options(owner, every_option)
        return cls(definition, values, every_option)

    @functools.cached_property
    def active(self) -> spec.Definition:
        """The algorithm that runs: a Keras flag may switch to a variant
        (RMSprop's `centered=True` runs CenteredRMSProp)."""
        for flag, variant in self.definition.keras.variants.items():
            if self.arguments[flag]:
                return registry.BY_NAME[variant]
        return self.definition

    @functools.cached_property
    def hypers(self) -> Dict[str, Any]:
        """The rule's hyperparameters as Python values."""
        hypers = {h.name: h.default for h in self.active.hypers}
        for argument in self.definition.keras_arguments:
            key = argument.hyper if argument.hyper is not None else argument.name
            hypers[key] = self.arguments[argument.name]
        return self.active.rule_hypers(hypers)

    @property
    def step_options(self) -> Dict[str, Any]:
        """The engine options `rules.tpu_step` takes (all but `rounding`)."""
        every_option = {**ENGINE_OPTIONS, **self.options}
        return {k: v for k, v in every_option.items() if k != "rounding"}

    @property
    def math(self) -> str:
        """What one step does to a row, in plain text: the algorithm's update
        within the gradient clipping, weight decay and weight clipping the
        options set (`rules.step_math`), then each Keras-only argument that
        changes it from the engine's (`KerasArg.engine`) with its doc (SGD's
        `momentum=0.9: Keras momentum: m ← μ·m − η·g; ...`)."""
        math = rules.step_math(self.active.math, self.step_options)
        return math + "".join(
            f";  with {argument.name}={self.arguments[argument.name]!r}: "
            f"{argument.doc.removesuffix('.')}"
            for argument in self.keras_only_changes
        )

    @property
    def keras_only_changes(self) -> List[spec.KerasArg]:
        """The Keras-only arguments whose values change the row's update from
        the engine's: neither `lazy` (which rows step, not how) nor a slot's
        initial value (where it starts)."""
        starts = {slot.keras_initial for slot in self.definition.slots}
        return [
            argument
            for argument in self.definition.keras_arguments
            if argument.hyper is None
            and argument.engine is not None
            and argument.name != "lazy"
            and argument.name not in starts
            and self.arguments[argument.name] != argument.engine
        ]

    @property
    def rows_only(self) -> bool:
        """Whether a sparse gradient updates only the looked-up rows.

        True with `lazy=True`, for classes without `lazy`, and where these
        arguments make the zero-gradient step a no-op (the same result).
        """
        steps = self.definition.keras.zero_gradient_steps
        return steps is None or self.arguments["lazy"] or not steps(self.arguments)

    @property
    def lazy_differs(self) -> bool:
        """Whether `lazy=True` changes the result: the zero-gradient step of
        these arguments is not a no-op."""
        steps = self.definition.keras.zero_gradient_steps
        return steps is not None and self.arguments["lazy"] and steps(self.arguments)

    def slots(self) -> List[spec.Slot]:
        """The slots these arguments keep, in the rule's order."""
        return [
            slot
            for slot in (*self.active.slots, *self.definition.keras.extra_slots)
            if slot.when is None or slot.when(self.arguments)
        ]

    def slot_groups(self) -> List[List[spec.Slot]]:
        """The slots in the order Keras's class builds them: group after
        group, each group's slots variable by variable
        (`KerasFace.slots_by_variable`)."""
        slots = self.slots()
        if not self.definition.keras.slots_by_variable:
            return [[slot] for slot in slots]
        extra = self.definition.keras.extra_slots
        own = [slot for slot in slots if slot not in extra]
        return [own, *([slot] for slot in slots if slot in extra)]

    def step_refusal(self, table: str, dtype: str) -> Optional[str]:
        """Why `table` (its owner and name, in words), of `dtype` (Keras's
        standardized name), cannot step in that dtype as configured, or None:
        a decay rate (a hyperparameter below an open upper bound, such as
        beta_2 in [0, 1)) that the dtype rounds to that bound. Adam's default
        beta_2 = 0.999 is 1.0 in bfloat16, its bias correction then 0, and
        no row ever moves. (A table stepped in float32, `narrow_tables`,
        steps; so does one whose epsilon rounds to 0, as Keras leaves it.)"""
        if (
            dtype not in spec.NARROW_FLOATS
            or self.definition.step_dtype(dtype) != dtype
        ):
            return None
        rounded = rules.engine_rounded(self.hypers, dtype)
        for hyper in self.active.hypers:
            value = self.hypers[hyper.name]
            if hyper.bounds is None or not hyper.bounds.upper_open or is_bool(value):
                continue
            held = float(rounded[hyper.name])
            if not hyper.bounds.contains(held):
                return (
                    f"{table} is {dtype}, which holds "
                    f"{hyper.name}={value!r} as {held!r}; {self.active.name} "
                    f"needs {hyper.name} {hyper.bounds.describe()}, so the "
                    "table would not step as configured. Give the table "
                    f"float32, or a {hyper.name} that {dtype} holds (it loads "
                    "and serves as it is)."
                )
        return None

    def slot_initial(self, slot: spec.Slot) -> Any:
        """The initial value of `slot`."""
        if slot.keras_initial is not None:
            return self.arguments[slot.keras_initial]
        return slot.initial_value(self.hypers)

    def slot_table(self) -> List[Tuple[str, str, Any]]:
        """(rule name, Keras variable name, initial value) of each slot."""
        return [
            (slot.name, slot.keras_variable_name, self.slot_initial(slot))
            for slot in self.slots()
        ]

    @property
    def reads_step(self) -> bool:
        """Whether the learning rate or a hyperparameter changes with the step."""
        return (
            self.definition.keras.learning_rate_factor is not None
            or self.active.step_hypers is not None
        )

    def step_hyper_names(self) -> Tuple[str, ...]:
        """The hyperparameters the algorithm computes from the step."""
        if self.active.step_hypers is None:
            return ()
        hypers = rules.engine_rounded(self.hypers, "float32")
        values = self.active.step_hypers(rules.NUMPY, np.float32(1), hypers)
        return tuple(sorted(values))

    def at_step(self, xp: Any, step: Any, lr: Any, hypers: Any) -> Any:
        """The learning rate and hyperparameters of (1-based) `step`, in
        namespace `xp` (Keras Adam's bias correction, LaProp's and F2A's
        schedules)."""
        hypers = self.active.hypers_at(xp, step, hypers)
        factor = self.definition.keras.learning_rate_factor
        if factor is not None:
            lr = factor(xp, step, self.arguments, lr)
        return lr, hypers

    def hypers_in(self, dtype: str) -> Dict[str, Any]:
        """The hyperparameters, rounded as `rounding` says for values of
        `dtype` (a standardized dtype name: `"float32"`, `"bfloat16"`)."""
        if self.options.get("rounding", "keras") == "keras":
            return self.hypers
        return rules.engine_rounded(self.hypers, dtype)

    @property
    def factor(self) -> Any:
        """The step's factor per variable (`spec.VariableFactor`), or None."""
        return self.active.factor

    @property
    def exports_factor(self) -> bool:
        """Whether the class keeps each variable's latest factor."""
        factor = self.active.factor
        return factor is not None and bool(self.arguments.get(factor.export))

    def step(
        self,
        xp: Any,
        rows: Any,
        slot_rows: Mapping[str, Any],
        gradient_rows: Any,
        lr: Any,
        hypers: Mapping[str, Any],
    ) -> Any:
        """One engine step of rows (gradient clipping, weight decay, the
        rule, weight clipping): `(new rows, new slot rows)`."""
        return rules.tpu_step(
            self.active,
            xp,
            rows,
            dict(slot_rows),
            gradient_rows,
            lr,
            hypers,
            **self.step_options,
        )
