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

TPU-engine keyword arguments accepted by every class (all default to off):

- `clip_weight_min`, `clip_weight_max`: clamp the updated weights.
- `clip_gradient_min`, `clip_gradient_max`: clamp the (summed) gradient
  element-wise before the update; either bound may be set alone.
- `weight_decay_factor`: decoupled weight decay `w ← w − λ·w` of the updated
  rows before the update (all elements for a dense gradient);
  `multiply_weight_decay_factor_by_learning_rate=True` uses `λ·η`.
"""

from __future__ import annotations

import functools
import inspect
import math
from typing import Any, Callable, Dict, List, Mapping, Optional

import keras
import numpy as np
import tensorflow as tf

from tf_tpu_embed_opt.definitions import registry, rules, spec
from tf_tpu_embed_opt.optimizers.clippy_adagrad import ClippyAdagrad
from tf_tpu_embed_opt.optimizers.sharded import ShardedOptimizerMixin
from tf_tpu_embed_opt.optimizers.sparse import (
    deduplicate,
    in_xla_context,
    update_distinct,
)

__all__ = [
    "SGD",
    "Adagrad",
    "AdagradMomentum",
    "Adam",
    "Ftrl",
    "Momentum",
    "RMSprop",
    "Adadelta",
    "ProximalAdagrad",
    "ProximalYogi",
    "ClippyAdagrad",
    "TwinOptimizer",
    "deduplicate",
]


def _power(base: Any, exponent: Any) -> Any:
    # Ftrl's default (a^0.5) and AdagradMomentum's (a^-0.5): a square root is
    # correctly rounded and several times cheaper than pow's exp(p·log a),
    # notably under XLA:CPU (TF's ApplyFtrl kernel does the same).
    if type(exponent) in (int, float) and abs(exponent) == 0.5:
        root = tf.sqrt(base)
        return root if exponent > 0 else 1 / root
    # A Python base with a tensor exponent takes the exponent's dtype.
    if not tf.is_tensor(base) and tf.is_tensor(exponent):
        base = tf.constant(base, dtype=exponent.dtype)
    return tf.pow(base, exponent)


TENSORFLOW = rules.ArrayNamespace(
    sqrt=tf.sqrt,
    square=tf.square,
    abs=tf.abs,
    sign=tf.sign,
    maximum=tf.maximum,
    minimum=tf.minimum,
    where=tf.where,
    power=_power,
)

# TPU-engine options every twin takes through **kwargs, with their defaults.
ENGINE_OPTIONS: Dict[str, Any] = {
    "clip_weight_min": None,
    "clip_weight_max": None,
    "clip_gradient_min": None,
    "clip_gradient_max": None,
    "weight_decay_factor": None,
    "multiply_weight_decay_factor_by_learning_rate": False,
}

# Whole-variable updates inside a tf.function (dense gradients, non-lazy Adam)
# of variables with at least this many elements are compiled with XLA, once
# per variable and trace (~0.1 s each). Measured on 2 CPU cores, float32 Adam
# and Adagrad: at 16,384 elements compiling is 1.1x slower than TensorFlow ops;
# from 131,072 elements on it is 1.7-9x faster.
XLA_MIN_ELEMENTS = 1 << 16

# Keras's base-optimizer arguments, in the order of its optimizers' signatures.
_KERAS_BASE = (
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


def _summed_slices(gradient: tf.IndexedSlices) -> tf.IndexedSlices:
    static_shape = in_xla_context()
    ids, rows = deduplicate(gradient.indices, gradient.values, static_shape)
    if static_shape:
        # Padding entries repeat the first row; zero them so that norms and
        # the later summation count each distinct row once.
        keep = tf.logical_or(tf.range(tf.shape(ids)[0]) == 0, ids != tf.reduce_min(ids))
        rows = tf.where(
            tf.reshape(keep, [-1] + [1] * (len(rows.shape) - 1)),
            rows,
            tf.zeros_like(rows),
        )
    return tf.IndexedSlices(rows, ids, gradient.dense_shape)


def _tensor(variable: Any) -> Any:
    return variable.value if isinstance(variable, keras.Variable) else variable


def _device_type(variable: Any) -> str:
    return tf.DeviceSpec.from_string(_tensor(variable).device).device_type or "CPU"


@functools.lru_cache(maxsize=None)
def _xla_compiles_on(device_type: str) -> bool:
    """Whether XLA can compile for `device_type` in this process.

    Not every TensorFlow build can: `tensorflow-tpu` without `libtpu` has no
    XLA backend for the host ("could not find registered transfer manager").
    """
    with tf.init_scope(), tf.device(f"/device:{device_type}:0"):
        try:
            tf.function(tf.identity, jit_compile=True)(tf.constant(0.0))
        except tf.errors.OpError:
            return False
    return True


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


def _constant(value: float) -> Callable[..., tf.Tensor]:
    """An initializer filling with `value` converted straight to the dtype.

    `keras.initializers.Constant` converts a Python float to float32 first, so
    a float64 slot would start from the rounded value.
    """

    def initializer(shape: Any, dtype: Any = None) -> tf.Tensor:
        return tf.fill(shape, tf.constant(value, dtype=dtype or "float32"))

    return initializer


def _check_engine_options(owner: str, options: Mapping[str, Any]) -> None:
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


class TwinOptimizer(ShardedOptimizerMixin, keras.optimizers.Optimizer):
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
        base_defaults = dict(_KERAS_BASE)
        base = {name: values.pop(name) for name in base_defaults}
        learning_rate = values.pop("learning_rate")
        _check_learning_rate(owner, learning_rate)
        name_given = base["name"] is not None

        arguments: Dict[str, Any] = {}
        for argument in self._definition.keras_arguments:
            if argument.keyword:
                value = extra.pop(argument.name, argument.default)
            else:
                value = values.pop(argument.name)
            argument.check(owner, value)
            arguments[argument.name] = value
        options = {
            name: extra.pop(name, default) for name, default in ENGINE_OPTIONS.items()
        }
        _check_engine_options(owner, options)
        super().__init__(learning_rate=learning_rate, **base, **extra)
        self._arguments = arguments
        self._options = options
        self._name_given = name_given
        self._active = self._definition
        for flag, variant in self._definition.keras.variants.items():
            if arguments[flag]:
                self._active = registry.BY_NAME[variant]
        self._hypers = self._rule_hypers()

    def _rule_hypers(self) -> Dict[str, Any]:
        hypers = {h.name: h.default for h in self._active.hypers}
        for argument in self._definition.keras_arguments:
            key = argument.hyper if argument.hyper is not None else argument.name
            hypers[key] = self._arguments[argument.name]
        return self._active.rule_hypers(hypers)

    @property
    def _rows_only(self) -> bool:
        """Whether a sparse gradient updates only the looked-up rows.

        True with `lazy=True`, for classes without `lazy`, and where these
        arguments make the zero-gradient step a no-op (the same result).
        """
        steps = self._definition.keras.zero_gradient_steps
        return steps is None or self._arguments["lazy"] or not steps(self._arguments)

    @property
    def learning_rate(self) -> Any:
        return super().learning_rate

    @learning_rate.setter
    def learning_rate(self, learning_rate: Any) -> None:
        _check_new_learning_rate(type(self).__name__, learning_rate)
        keras.optimizers.Optimizer.learning_rate.fset(self, learning_rate)

    def _slots(self) -> List[spec.Slot]:
        return [
            slot
            for slot in (*self._active.slots, *self._definition.keras.extra_slots)
            if slot.when is None or slot.when(self._arguments)
        ]

    def build(self, var_list: List[Any]) -> None:
        if self.built:
            return
        super().build(var_list)
        self._slot_variables: Dict[str, List[Any]] = {}
        for slot in self._slots():
            initial = slot.initial_value(self._hypers)
            self._slot_variables[slot.name] = [
                self.add_variable_from_reference(
                    variable,
                    name=slot.keras_variable_name,
                    initializer=_constant(initial),
                )
                for variable in var_list
            ]

    def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
        """Applies one engine step of the definition's rule to `variable`."""
        dtype = variable.dtype
        lr = tf.cast(learning_rate, dtype)
        factor = self._definition.keras.learning_rate_factor
        if factor is not None:
            step = tf.cast(self.iterations + 1, dtype)
            scale = factor(TENSORFLOW, step, self._arguments)
            if scale is not None:
                lr = lr * scale
        index = self._get_variable_index(variable)
        slots = {
            name: self._slot_for(variables[index], variable)
            for name, variables in self._slot_variables.items()
        }
        if isinstance(gradient, tf.IndexedSlices) and self._rows_only:

            def rows_update(ids: tf.Tensor, rows: tf.Tensor) -> None:
                current = {
                    name: tf.gather(_tensor(s), ids) for name, s in slots.items()
                }
                new_rows, new_slots = rules.tpu_step(
                    self._active,
                    TENSORFLOW,
                    tf.gather(_tensor(variable), ids),
                    current,
                    rows,
                    lr,
                    self._hypers,
                    **self._options,
                )
                # Slots the twin does not keep (`Slot.when`) are not written.
                for name, slot in slots.items():
                    self.assign(slot, tf.IndexedSlices(new_slots[name], ids))
                self.assign(variable, tf.IndexedSlices(new_rows, ids))

            values = tf.cast(gradient.values, dtype)
            if in_xla_context():
                update_distinct(gradient.indices, values, rows_update)
            else:
                rows_update(*deduplicate(gradient.indices, values, False))
            return
        rows = None
        if isinstance(gradient, tf.IndexedSlices):
            keeps = self._definition.keras.zero_gradient_keeps_weights
            if keeps is not None and keeps(self._arguments):
                # Every row's slots step, but only the looked-up rows of the
                # weights can change: write those (as Keras does).
                rows = gradient.indices
            gradient = tf.convert_to_tensor(gradient)

        def dense_update(gradient: tf.Tensor, lr: tf.Tensor) -> None:
            new_value, new_slots = rules.tpu_step(
                self._active,
                TENSORFLOW,
                tf.convert_to_tensor(_tensor(variable)),
                {name: tf.convert_to_tensor(_tensor(s)) for name, s in slots.items()},
                gradient,
                lr,
                self._hypers,
                **self._options,
            )
            for name, slot in slots.items():
                self.assign(slot, new_slots[name])
            if rows is None:
                self.assign(variable, new_value)
            else:
                self.assign(
                    variable, tf.IndexedSlices(tf.gather(new_value, rows), rows)
                )

        if (
            tf.inside_function()
            and not in_xla_context()
            and _tensor(variable).shape.num_elements() >= XLA_MIN_ELEMENTS
            and _xla_compiles_on(_device_type(variable))
        ):
            # The rule is a chain of element-wise ops over the whole variable.
            # As TensorFlow ops each allocates a new variable-sized tensor
            # (1.3-1.8x the time of Keras's in-place updates, issue #4);
            # compiled, it is one loop that writes the variables in place.
            dense_update = tf.function(dense_update, jit_compile=True, autograph=False)
        dense_update(tf.cast(gradient, dtype), lr)

    def _clip_gradients(self, grads: List[Any]) -> List[Any]:
        # Keras clips the values of a sparse gradient one duplicate at a time;
        # clip the summed rows instead, so that sparse equals dense.
        if self.clipnorm or self.global_clipnorm or self.clipvalue:
            grads = [
                _summed_slices(g) if isinstance(g, tf.IndexedSlices) else g
                for g in grads
            ]
        return super()._clip_gradients(grads)

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
            **dict(_KERAS_BASE),
            **ENGINE_OPTIONS,
        }
        current = {
            **self._arguments,
            **{name: getattr(self, name) for name, _ in _KERAS_BASE},
            **self._options,
        }
        if not self._name_given:
            del current["name"]
        shown = [f"learning_rate={_rate_repr(self._learning_rate)}"]
        if shown[0] == f"learning_rate={defaults['learning_rate']!r}":
            shown = []
        for name, value in current.items():
            if value != defaults[name] or type(value) is not type(defaults[name]):
                shown.append(f"{name}={value!r}")
        return f"{type(self).__name__}({', '.join(shown)})"


def _rate_repr(rate: Any) -> str:
    if isinstance(rate, keras.optimizers.schedules.LearningRateSchedule):
        arguments = ", ".join(f"{k}={v!r}" for k, v in rate.get_config().items())
        return f"{type(rate).__name__}({arguments})"
    if isinstance(rate, keras.Variable):
        # Kept in float32; the shortest decimal with that value is what was
        # written (0.05, not 0.05000000074505806).
        return repr(float(str(np.float32(rate.numpy()))))
    return repr(rate)


def _signature(definition: spec.Definition) -> inspect.Signature:
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
    for name, default in _KERAS_BASE:
        parameters.append(inspect.Parameter(name, positional, default=default))
    parameters.append(inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD))
    return inspect.Signature(parameters)


def _docstring(definition: spec.Definition) -> str:
    keras_face = definition.keras
    lines = [
        f"Keras 3 twin of the TPU engine's `{definition.proto_oneof}` optimizer.",
        "",
    ]
    if keras_face.stock:
        lines += [
            f"Same signature and defaults as `keras.optimizers.{keras_face.stock}`, "
            "and the same result on dense gradients.",
            "",
        ]
    lines += [
        "Engine update per row (g summed over duplicate ids):",
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
    lines += [
        "  clip_weight_min, clip_weight_max, clip_gradient_min, clip_gradient_max,",
        "    weight_decay_factor, multiply_weight_decay_factor_by_learning_rate",
        "    (keywords): TPU-engine options; see the module docstring.",
        "  weight_decay, clipnorm, clipvalue, global_clipnorm, use_ema, ema_momentum,",
        "    ema_overwrite_frequency, loss_scale_factor, gradient_accumulation_steps,",
        "    name: as in every Keras optimizer.",
    ]
    return "\n".join(lines)


def _make_class(definition: spec.Definition) -> type:
    signature = _signature(definition)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        TwinOptimizer.__init__(self, *args, **kwargs)

    __init__.__signature__ = signature
    name = definition.keras.name
    cls = type(
        name,
        (TwinOptimizer,),
        {
            "__init__": __init__,
            "__doc__": _docstring(definition),
            "__module__": "tf_tpu_embed_opt.optimizers",
            "__qualname__": name,
            "_definition": definition,
            "_signature": signature,
        },
    )
    return keras.saving.register_keras_serializable(package="tf_tpu_embed_opt")(cls)


_CLASSES = {d.name: _make_class(d) for d in registry.DEFINITIONS if d.keras is not None}
_CLASSES_BY_KERAS_NAME = {
    **{cls.__name__: cls for cls in _CLASSES.values()},
    "ClippyAdagrad": ClippyAdagrad,
}

SGD = _CLASSES["SGD"]
Adagrad = _CLASSES["Adagrad"]
AdagradMomentum = _CLASSES["AdagradMomentum"]
Adam = _CLASSES["Adam"]
Ftrl = _CLASSES["FTRL"]
Momentum = _CLASSES["Momentum"]
RMSprop = _CLASSES["RMSProp"]
Adadelta = _CLASSES["Adadelta"]
ProximalAdagrad = _CLASSES["ProximalAdagrad"]
ProximalYogi = _CLASSES["ProximalYogi"]


def class_for(definition: spec.Definition) -> Optional[type]:
    """The Keras class generated from `definition` (None for a variant)."""
    return _CLASSES.get(definition.name)
