"""Keras 3 optimizers that share the embedding optimizers' definitions.

One class per algorithm, generated from its definition. Where Keras has the
algorithm (`SGD`, `Adagrad`, `Adam`, `Ftrl`, `RMSprop`, `Adadelta`) the class
has Keras's name, signature and defaults and matches Keras on dense gradients;
TPU-engine behaviour is opt-in through keyword arguments, and
`tf_tpu_embed_opt.to_keras` sets them so that the optimizer computes what the
TPU embedding engine computes.

On a sparse gradient (`tf.IndexedSlices`, e.g. from `keras.layers.Embedding`)
duplicate ids are summed first. Then, with `lazy=True`, only the looked-up rows
of the variable and of its slots are read, updated and written (the TPU
engine's rule); with `lazy=False` every row steps, as with the equivalent dense
gradient (Keras's rule). Every class whose step with a zero gradient is not a
no-op takes `lazy`: the classes named like Keras's (`SGD`, `Adam`, `Ftrl`,
`RMSprop`, `Adadelta`) default to Keras's `lazy=False`, the engine-only ones
(`Momentum`, `AdagradMomentum`, `ProximalAdagrad`, `ProximalYogi`) to the
engine's `lazy=True`; `Adagrad` steps only looked-up rows either way. Where the
arguments make the zero-gradient step a no-op (e.g. `SGD` without momentum)
both rules give the same result and the row-sparse update runs. Under XLA
(`jit_compile=True`, TPU) the de-duplication keeps static shapes; elsewhere it
keeps one entry per distinct id.

Inside a `tf.function` that is not compiled, the update of a whole variable
(dense gradient, `lazy=False`) with at least `XLA_MIN_ELEMENTS` elements is
compiled with XLA where this TensorFlow can compile for the variable's device,
so that it writes the variable and slots in place.

The classes run on every Keras backend. The row-sparse, XLA and sharded paths
above are the TensorFlow backend's (`tensorflow_twin`); on JAX and PyTorch the
same rule runs with `keras.ops` on the whole variable, and a twin whose
`lazy=True` changes the result warns that it cannot know the looked-up rows
there (`backend`).

TPU-engine keyword arguments accepted by every class (all default to off):

- `clip_weight_min`, `clip_weight_max`: clamp the updated weights.
- `clip_gradient_min`, `clip_gradient_max`: clamp the (summed) gradient
  element-wise before the update; either bound may be set alone.
- `weight_decay_factor`: decoupled weight decay `w ← w − λ·w` of the updated
  rows before the update (all elements for a dense gradient);
  `multiply_weight_decay_factor_by_learning_rate=True` uses `λ·η`.
- `rounding`: `"keras"` (Keras's operations in Keras's order, terms of the
  hyperparameters such as 1 − β₁ in Python floats: bit-identical to
  `keras.optimizers` on dense gradients) or `"jax-tpu-embedding"` (that
  engine's lowering's operations in its order, every hyperparameter a
  float32 operand; `to_keras` of a jax-tpu-embedding spec sets it).
"""

from __future__ import annotations

import inspect
import math
from typing import Any, Dict, List, Mapping, Optional

import keras
import numpy as np
from keras import ops

from tf_tpu_embed_opt.definitions import configured, registry, spec
from tf_tpu_embed_opt.optimizers import backend, twin_docs
from tf_tpu_embed_opt.optimizers.twin_docs import KERAS_BASE

# With one class per Keras name of `registry.ALL` (`twin_classes()`), added
# where the classes are made, below.
__all__ = [
    "TwinOptimizer",
    "class_for",
    "rate_repr",
    "twin_classes",
    "twin_class_of_stock",
    "twin_of_stock",
]


# The engine options every twin takes (keywords), with their defaults.
ENGINE_OPTIONS = configured.ENGINE_OPTIONS


def _check_learning_rate(owner: str, value: Any) -> None:
    """Keras's accepted learning rates, with a finite value >= 0.

    Keras accepts a `float` (not an `int`), a schedule or a callable; it
    refuses the others with a `ValueError`, which is kept here.
    """
    if isinstance(value, keras.optimizers.schedules.LearningRateSchedule) or (
        callable(value)
    ):
        return
    allowed = (
        "a float >= 0 (as in Keras, not an int), a "
        "keras.optimizers.schedules.LearningRateSchedule or a callable "
        "returning the learning rate"
    )
    if not isinstance(value, float):
        hint = f"; write {float(value)!r}" if type(value) is int and value >= 0 else ""
        raise ValueError(
            f"{owner}: argument `learning_rate` must be {allowed}; received "
            f"{value!r} of type {type(value).__name__}{hint}."
        )
    if not math.isfinite(value) or value < 0:
        raise ValueError(
            f"{owner}: argument `learning_rate` must be {allowed}; received {value!r}."
        )


def _check_new_learning_rate(owner: str, value: Any) -> None:
    """The setter's check: Keras's setter takes any number or tensor.

    Only a value that is a finite number >= 0 passes (callbacks hand over
    NumPy scalars); a symbolic tensor is left to Keras.
    """
    if isinstance(value, keras.optimizers.schedules.LearningRateSchedule) or (
        callable(value)
    ):
        return
    try:
        number = float(value)
    except (TypeError, ValueError):
        return
    if not math.isfinite(number) or number < 0:
        raise ValueError(
            f"{owner}: the new `learning_rate` must be a finite number >= 0; "
            f"received {value!r}."
        )


class TwinOptimizer(backend.TwinBase, keras.optimizers.Optimizer):
    """Base of the generated Keras classes: one engine definition, Keras hooks.

    Subclasses are generated; each has `_definition` (its algorithm) and
    `_signature`. Use the concrete classes, e.g. `tf_tpu_embed_opt.optimizers.
    Adagrad`.
    """

    _definition: spec.Definition
    _signature: inspect.Signature

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        owner = type(self).__name__
        if getattr(type(self), "_definition", None) is None:
            concrete = ", ".join(sorted(_CLASSES_BY_KERAS_NAME))
            raise TypeError(
                f"{owner} is the base of this package's Keras optimizers and "
                "has no update rule; use a concrete class of "
                f"tf_tpu_embed_opt.optimizers: {concrete}."
            )
        values = spec.bind_arguments(owner, self._signature, self, args, kwargs)
        extra = dict(values.pop("kwargs", {}))
        base = {name: values.pop(name) for name, _ in KERAS_BASE}
        learning_rate = values.pop("learning_rate")
        keras_face = self._definition.keras
        if keras_face.learning_rate_check is not None:
            learning_rate = keras_face.learning_rate_check(owner, learning_rate)
        else:
            _check_learning_rate(owner, learning_rate)
        name_given = base["name"] != self._signature.parameters["name"].default

        arguments: Dict[str, Any] = {}
        for argument in self._definition.keras_arguments:
            if argument.keyword:
                value = extra.pop(argument.name, argument.default)
            else:
                value = values.pop(argument.name)
            arguments[argument.name] = value
        options = {}
        if keras_face.engine_options:
            options = {
                name: extra.pop(name, default)
                for name, default in ENGINE_OPTIONS.items()
            }
        rule = configured.ConfiguredRule.checked(
            owner, self._definition, arguments, options
        )
        super().__init__(learning_rate=learning_rate, **base, **extra)
        # The definition with these arguments: every row step reads it.
        self._rule = rule
        self._arguments = rule.arguments
        self._options = rule.options
        self._name_given = name_given
        self._active = rule.active
        self._hypers = rule.hypers

    @property
    def rule(self) -> configured.ConfiguredRule:
        """The algorithm this optimizer runs, with its Keras arguments and
        engine options (`tf_tpu_embed_opt.definitions.configured.ConfiguredRule`,
        read-only): what the conversions, checkpoints and `describe` read."""
        return self._rule

    @property
    def _rows_only(self) -> bool:
        """Whether a sparse gradient updates only the looked-up rows."""
        return self._rule.rows_only

    @property
    def _lazy_differs(self) -> bool:
        """Whether `lazy=True` changes the result."""
        return self._rule.lazy_differs

    # Set by a row-sparse table that this optimizer steps (a weak reference
    # to its `layers.Embedding`), whose step counter it then reports.
    _table_step_of: Any = None

    @property
    def iterations(self) -> Any:
        """Keras's step counter. The optimizer of a row-sparse table
        (`tf_tpu_embed_opt.layers.Embedding`) reports the table's, an integer
        tensor: the steps applied to the table (`layer.table_step`)."""
        layer = self._table_step_of() if self._table_step_of is not None else None
        if layer is not None:
            return layer.table_step
        return super().iterations

    @property
    def learning_rate(self) -> Any:
        return super().learning_rate

    @learning_rate.setter
    def learning_rate(self, learning_rate: Any) -> None:
        _check_new_learning_rate(type(self).__name__, learning_rate)
        keras.optimizers.Optimizer.learning_rate.fset(self, learning_rate)

    def _slots(self) -> List[spec.Slot]:
        return self._rule.slots()

    @property
    def _accumulators(self) -> List[Any]:
        """The `accumulator` slot of each variable, where the algorithm keeps
        one, under the attribute Keras's Adagrad and Ftrl keep it."""
        for slot in self._slots():
            if slot.keras_variable_name == "accumulator":
                return self._slot_variables[slot.name]
        raise AttributeError(f"{type(self).__name__} keeps no accumulator.")

    def build(self, var_list: List[Any]) -> None:
        if self.built:
            return
        for variable in var_list:
            # A row-sparse layer's table is judged by its layer.
            if not getattr(variable, "overwrite_with_gradient", False):
                self._definition.check_table_dtype(
                    type(self).__name__,
                    _path(variable),
                    keras.backend.standardize_dtype(variable.dtype),
                )
        super().build(var_list)
        slots = self._slots()
        self._slot_variables: Dict[str, List[Any]] = {s.name: [] for s in slots}
        self._factor_variables: List[Any] = []
        factor = self._rule.factor if self._rule.exports_factor else None
        # In Keras's order (its classes save their variables by position);
        # where the class exports a factor, variable by variable, its slots
        # then its factor (the order `.keras` files saved before its class
        # was generated hold them in).
        groups = self._rule.slot_groups() if factor is None else [[*slots, factor]]
        order = [
            (item, variable)
            for group in groups
            for variable in var_list
            for item in group
        ]
        for item, variable in order:
            # Keras overwrites variables marked `overwrite_with_gradient` (a
            # row-sparse `layers.Embedding`'s table and slots, float8
            # scales) with their "gradient" and never steps them: no slots.
            if getattr(variable, "overwrite_with_gradient", False):
                made = None
            elif item is factor:
                made = self.add_variable(
                    shape=(),
                    initializer="ones",
                    dtype=variable.dtype,
                    name=f"{_prefix(variable)}_{factor.name}",
                )
            elif item.per_row or self._step_dtype(variable) != _dtype(variable):
                made = self._state_variable(item, variable)
            else:
                made = self.add_variable_from_reference(
                    variable,
                    name=item.keras_variable_name,
                    initializer=backend.constant_initializer(self._slot_initial(item)),
                )
            if item is factor:
                self._factor_variables.append(made)
            else:
                self._slot_variables[item.name].append(made)

    def _step_dtype(self, variable: Any) -> str:
        """The dtype `variable` steps in and its slots are kept in
        (`Definition.step_dtype`: float32 for a 16-bit table where the
        algorithm keeps float32 state)."""
        return self._definition.step_dtype(_dtype(variable))

    def _state_variable(self, slot: spec.Slot, variable: Any) -> Any:
        """A slot's variable of the step's dtype (`_step_dtype`): the
        variable's shape or, for a slot of one value per row, `[rows, 1]`.

        Raises:
          ValueError: A slot of one value per row, and `variable` has no
            rows (not 2-D) or is sharded.
        """
        shape = tuple(variable.shape)
        if slot.per_row and (len(shape) != 2 or self._sharded(variable)):
            what = "sharded" if len(shape) == 2 else f"of shape {shape}"
            raise ValueError(
                f"{type(self).__name__} keeps one value per row of a 2-D "
                f"variable (a table; its `{slot.keras_variable_name}` is "
                f"[rows, 1]); received variable {_prefix(variable)!r}, {what}. "
                "Give it the tables only: a keras.optimizers.MultiOptimizer "
                "(tf_tpu_embed_opt.keras_optimizer) with another optimizer for "
                "the dense layers."
            )
        return self.add_variable(
            shape=(shape[0], 1) if slot.per_row else shape,
            initializer=backend.constant_initializer(self._slot_initial(slot)),
            dtype=self._step_dtype(variable),
            name=f"{_prefix(variable)}_{slot.keras_variable_name}",
        )

    def _keep_factor(self, variable: Any, new_slots: Mapping[str, Any]) -> None:
        """Keeps the factor of the step just taken, if the class exports it."""
        if self._rule.exports_factor:
            index = self._get_variable_index(variable)
            self.assign(
                self._factor_variables[index], new_slots[self._rule.factor.name]
            )

    def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
        """Applies one engine step of the definition's rule to `variable`."""
        lr, hypers = self._step_arguments(
            learning_rate, self.iterations, _dtype(variable)
        )
        index = self._get_variable_index(variable)
        slots = {
            name: self._slot_for(variables[index], variable)
            for name, variables in self._slot_variables.items()
        }
        self._apply_rule(gradient, variable, lr, slots, hypers)

    def _step_arguments(self, learning_rate: Any, iterations: Any, dtype: Any) -> Any:
        """The learning rate and hyperparameters of the step after `iterations`
        steps of a table of `dtype`, in the dtype it steps in (`_step_dtype`;
        a 16-bit table's step may take other hyperparameters:
        `NarrowTables.hypers`): step-dependent terms (Adam's bias
        correction, LaProp's and F2A's) are taken at step `iterations + 1`."""
        table_dtype = keras.backend.standardize_dtype(dtype)
        dtype = self._definition.step_dtype(table_dtype)
        lr = ops.cast(learning_rate, dtype)
        hypers = self._hypers_in(dtype)
        if dtype != table_dtype:
            hypers = {**hypers, **self._definition.narrow_tables.hypers}
        if not self._reads_step:
            return lr, hypers
        return self._at_step(self._XP, ops.cast(iterations + 1, dtype), lr, hypers)

    def _hypers_in(self, dtype: Any) -> Dict[str, Any]:
        """The rule's hyperparameters, rounded as `rounding` says for
        variables of `dtype`."""
        return self._rule.hypers_in(keras.backend.standardize_dtype(dtype))

    @property
    def _reads_step(self) -> bool:
        """Whether the learning rate or a hyperparameter changes with the step."""
        return self._rule.reads_step

    def _at_step(self, xp: Any, step: Any, lr: Any, hypers: Any) -> Any:
        """The learning rate and hyperparameters of (1-based) `step`."""
        return self._rule.at_step(xp, step, lr, hypers)

    def rows_step(
        self,
        rows: Any,
        slot_rows: Mapping[str, Any],
        gradient_rows: Any,
        learning_rate: Any,
        iterations: Any,
    ) -> Any:
        """One engine step of gathered rows: the rule on values, no variable.

        For the row-sparse `tf_tpu_embed_opt.layers.Embedding`, which applies
        its table's optimizer inside the backward pass.

        Args:
          rows: The looked-up rows of the table, each once.
          slot_rows: The same rows of each slot, by slot name.
          gradient_rows: Their gradients, duplicate ids already summed.
          learning_rate: The learning rate of this step (`learning_rate`).
          iterations: Steps taken before this one.

        Returns:
          The new rows and the new slot rows.
        """
        lr, hypers = self._step_arguments(learning_rate, iterations, rows.dtype)
        return self._tpu_step(self._XP, rows, slot_rows, gradient_rows, lr, hypers)

    def _tpu_step(
        self,
        xp: Any,
        rows: Any,
        slot_rows: Mapping[str, Any],
        gradient_rows: Any,
        lr: Any,
        hypers: Mapping[str, Any],
    ) -> Any:
        """The configured rule on rows of a table (`rules.tpu_step`) in the
        dtype the table steps in (`_step_dtype`): `(new rows in the table's
        dtype, new slot rows)`. A 16-bit table whose algorithm keeps float32
        state steps in float32 from its rows' values, and only the new rows
        round back, to nearest."""
        stored = keras.backend.standardize_dtype(rows.dtype)
        dtype = self._definition.step_dtype(stored)
        new_rows, new_slots = self._rule.step(
            xp,
            ops.cast(rows, dtype),
            slot_rows,
            ops.cast(gradient_rows, dtype),
            lr,
            hypers,
        )
        return ops.cast(new_rows, stored), new_slots

    def _slot_initial(self, slot: spec.Slot) -> Any:
        return self._rule.slot_initial(slot)

    def slot_table(self) -> List[Any]:
        """(rule name, Keras variable name, initial value) of each slot this
        twin keeps, in its order."""
        return self._rule.slot_table()

    @classmethod
    def from_config(cls, config: Dict[str, Any], custom_objects: Any = None) -> Any:
        """Builds the optimizer from a config, as Keras does.

        Keys that `config` lacks take the constructor's defaults (hand-written
        and older configs rely on it); an unknown key is refused by Keras's
        "Argument(s) not recognized".
        """
        if isinstance(config, Mapping):
            config = dict(config)  # Keras's from_config writes into it.
        return super().from_config(config, custom_objects=custom_objects)

    def get_config(self) -> Dict[str, Any]:
        # A learning rate following another optimizer's steps (a conversion's
        # `KerasStepLearningRate`) says whether this one may be saved with it.
        check = getattr(self._learning_rate, "check_saved_by", None)
        if check is not None:
            check(self)
        config = super().get_config()
        config.update(self._arguments)
        config.update(self._options)
        return config

    def __repr__(self) -> str:
        """The class name and the arguments that differ from the defaults."""
        keras_face = self._definition.keras
        defaults = {
            "learning_rate": keras_face.learning_rate,
            **{a.name: a.default for a in self._definition.keras_arguments},
            **{n: self._signature.parameters[n].default for n, _ in KERAS_BASE},
            **ENGINE_OPTIONS,
        }
        current = {
            **self._arguments,
            **{name: getattr(self, name) for name, _ in KERAS_BASE},
            **self._options,
        }
        if not self._name_given:
            del current["name"]
        shown = [f"learning_rate={rate_repr(self._learning_rate)}"]
        if shown[0] == f"learning_rate={defaults['learning_rate']!r}":
            shown = []
        for name, value in current.items():
            if value != defaults[name] or type(value) is not type(defaults[name]):
                shown.append(f"{name}={value!r}")
        return f"{type(self).__name__}({', '.join(shown)})"


def _dtype(variable: Any) -> str:
    """A variable's dtype by Keras's standardized name."""
    return keras.backend.standardize_dtype(variable.dtype)


def _path(variable: Any) -> str:
    """A variable's Keras path (a TensorFlow variable's name)."""
    return str(getattr(variable, "path", None) or variable.name)


def _prefix(variable: Any) -> str:
    """A variable's path as Keras prefixes its optimizer variables' names."""
    return _path(variable).replace("/", "_").replace(":", "_")


def rate_repr(rate: Any) -> str:
    """A learning rate as a repr shows it: a schedule by its config.

    A schedule without `get_config` (Keras asks for it only to save, and its
    base class raises `NotImplementedError`) shows its own `repr` where its
    class defines one, else its class name.
    """
    if isinstance(rate, keras.optimizers.schedules.LearningRateSchedule):
        try:
            config = rate.get_config()
        except NotImplementedError:
            if type(rate).__repr__ is not object.__repr__:
                return repr(rate)
            return f"<{type(rate).__qualname__} schedule>"
        arguments = ", ".join(f"{k}={v!r}" for k, v in config.items())
        return f"{type(rate).__name__}({arguments})"
    if isinstance(rate, keras.Variable):
        # Kept in float32; the shortest decimal with that value is what was
        # written (0.05, not 0.05000000074505806).
        return repr(float(str(np.float32(rate.numpy()))))
    return repr(rate)


def _argument(name: str, doc: str) -> property:
    """A Keras argument of the class, read-only (as Keras's optimizers keep
    theirs: `optimizer.epsilon`)."""
    return property(lambda self: self._arguments[name], doc=doc)


def _factors(factor: spec.VariableFactor) -> property:
    def factors(self: TwinOptimizer) -> List[Any]:
        return list(getattr(self, "_factor_variables", []))

    factors.__doc__ = (
        f"With `{factor.export}=True`, once built, one scalar variable per "
        f"model variable holding the {factor.name.replace('_', ' ')} of its latest "
        "step (1.0 before any step); otherwise an empty list. A copy."
    )
    return property(factors)


def _make_class(definition: spec.Definition) -> type:
    signature = twin_docs.signature(definition)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        TwinOptimizer.__init__(self, *args, **kwargs)

    __init__.__signature__ = signature
    name = definition.keras.name
    members = {
        argument.name: _argument(argument.name, argument.doc)
        for argument in definition.keras_arguments
        if not hasattr(keras.optimizers.Optimizer, argument.name)
    }
    if definition.factor is not None and definition.factor.export is not None:
        members[f"{definition.factor.name}s"] = _factors(definition.factor)
    cls = type(
        name,
        (TwinOptimizer,),
        {
            **members,
            "__init__": __init__,
            "__doc__": twin_docs.docstring(definition),
            "__module__": "tf_tpu_embed_opt.optimizers",
            "__qualname__": name,
            "_definition": definition,
            "_signature": signature,
        },
    )
    return keras.saving.register_keras_serializable(package="tf_tpu_embed_opt")(cls)


_CLASSES = {d.name: _make_class(d) for d in registry.ALL if d.keras is not None}
_CLASSES_BY_KERAS_NAME = {cls.__name__: cls for cls in _CLASSES.values()}

# Each class under its Keras name (`tf_tpu_embed_opt.optimizers.Ftrl`).
globals().update({cls.__name__: cls for cls in _CLASSES.values()})
__all__ += [cls.__name__ for cls in _CLASSES.values()]


def twin_classes() -> Dict[str, type]:
    """Every generated class by its Keras name, in the registry's order."""
    return {cls.__name__: cls for cls in _CLASSES.values()}


def twin_class_of_stock(optimizer: Any) -> Optional[type]:
    """The twin class that mirrors the stock `keras.optimizers` class of
    `optimizer` (`SGD`, `Adagrad`, `Adam`, `Ftrl`, `RMSprop`, `Adadelta`);
    None for any other value. Reads no config."""
    for definition in registry.DEFINITIONS:
        stock = definition.keras.stock if definition.keras else None
        if stock and type(optimizer) is getattr(keras.optimizers, stock):
            return _CLASSES[definition.name]
    return None


def twin_of_stock(optimizer: Any) -> Optional[TwinOptimizer]:
    """The twin of a stock `keras.optimizers` instance, with its config.

    The same arguments and the same math, duplicate ids summed first; None
    when `optimizer` is not an instance of one of Keras's classes that a twin
    mirrors (`twin_class_of_stock`).
    """
    cls = twin_class_of_stock(optimizer)
    return None if cls is None else cls.from_config(optimizer.get_config())


def class_for(definition: spec.Definition) -> Optional[type]:
    """The Keras class generated from `definition` (None for a variant)."""
    return _CLASSES.get(definition.name)


def unscaled(optimizer: Any) -> Any:
    """`optimizer` without Keras's loss scaling: the inner optimizer of a
    `keras.optimizers.LossScaleOptimizer` (which `model.compile` wraps around
    the model's under `mixed_float16`), which keeps every state of the
    variables; anything else as it is."""
    scaling = getattr(keras.optimizers, "LossScaleOptimizer", None)
    while scaling is not None and isinstance(optimizer, scaling):
        optimizer = optimizer.inner_optimizer
    return optimizer
