"""TPUEmbedding optimizer parameter classes, derived from the definitions.

`SGD`, `Adagrad`, `AdagradMomentum`, `Adam` and `FTRL` extend TensorFlow's own
classes in `tf.tpu.experimental.embedding` (same constructor, defaults and
attributes, so `TPUEmbedding`, `TPUEmbeddingV2`, `TableConfig` and
`TPUEmbeddingForServing` accept them), validate every argument with a clear
error, and write their `OptimizationParameters` correctly under protobuf 6 and
7. `Momentum`, `RMSProp`, `CenteredRMSProp`, `Adadelta`, `ProximalAdagrad` and
`ProximalYogi` expose TPU engine optimizers that TensorFlow has load/retrieve
ops for but no Python class.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, List

from tensorflow.core.protobuf.tpu import optimization_parameters_pb2
from tensorflow.python.ops import init_ops_v2
from tensorflow.python.tpu import tpu_embedding_v2_utils
from tensorflow.python.tpu.ops import tpu_ops

from tf_tpu_embed_opt import errors
from tf_tpu_embed_opt.definitions import arguments as checks
from tf_tpu_embed_opt.definitions import registry, spec

# With one class per algorithm of the TensorFlow engines (`registry.
# DEFINITIONS`), added where the classes are made, below.
__all__ = [
    "EmbeddingOptimizer",
    "arguments",
    "class_for",
    "definition_of",
    "embedding_classes",
]

_TFOptimizer = tpu_embedding_v2_utils._Optimizer
_ENABLED = optimization_parameters_pb2.GradientAccumulationStatus.ENABLED
_DISABLED = optimization_parameters_pb2.GradientAccumulationStatus.DISABLED
_PACKING_ENABLED = optimization_parameters_pb2.LowDimensionalPackingStatus.ENABLED
# TensorFlow writes `False` into this enum field, i.e. 0.
_PACKING_UNSPECIFIED = (
    optimization_parameters_pb2.LowDimensionalPackingStatus.UNSPECIFIED
)


class EmbeddingOptimizer:
    """Behaviour shared by every embedding class of this package.

    The concrete classes are generated from the algorithm definitions; each also
    derives from TensorFlow's `_Optimizer` (through TensorFlow's own class where
    one exists).
    """

    _definition: spec.Definition
    _signature: inspect.Signature

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        owner = type(self).__name__
        definition = getattr(type(self), "_definition", None)
        if definition is None:
            raise TypeError(
                f"{owner} is the base of this package's embedding optimizers "
                "and has no algorithm; use a class of tf_tpu_embed_opt.embedding: "
                f"{', '.join(d.name for d in registry.DEFINITIONS)}."
            )
        values = spec.bind_arguments(owner, self._signature, self, args, kwargs)
        checks.validate(definition, owner, values)
        if definition.tensorflow_class is not None:
            # TensorFlow's constructor sets the attributes in its own order, so
            # `__dict__` (which TensorFlow hashes and compares) is identical to
            # that of TensorFlow's class for the same arguments.
            tf_class = _tensorflow_class(definition)
            tf_class.__init__(self, **values)
            return
        _TFOptimizer.__init__(
            self,
            values["learning_rate"],
            values["use_gradient_accumulation"],
            values["clip_weight_min"],
            values["clip_weight_max"],
            values["weight_decay_factor"],
            values["multiply_weight_decay_factor_by_learning_rate"],
            values["clipvalue"],
            values.get("slot_variable_creation_fn"),
            values["low_dimensional_packing_status"],
        )
        for hyper in definition.hypers:
            setattr(self, hyper.name, values[hyper.name])

    def _slot_names(self) -> List[str]:
        return [slot.name for slot in self._definition.slots]

    def _slot_initializers(self) -> List[init_ops_v2.Initializer]:
        hypers = _hyper_values(self)
        return [
            init_ops_v2.Constant(slot.initial_value(hypers), support_partition=True)
            for slot in self._definition.slots
        ]

    def _create_slots(self, table, variable_creator, *args, **kwargs):
        fn = getattr(self, "slot_variable_creation_fn", None)
        if fn is not None and not checks.takes(fn, 3):
            # TensorFlow 2.3's documented form: (table, slot_names).
            return fn(table, self._slot_names())
        return _TFOptimizer._create_slots(
            self, table, variable_creator, *args, **kwargs
        )

    def _set_optimization_parameters(
        self, parameters: optimization_parameters_pb2.OptimizationParameters
    ) -> None:
        """Writes everything but the learning rate into `parameters`."""
        parameters.gradient_accumulation_status = (
            _ENABLED if self.use_gradient_accumulation else _DISABLED
        )
        if self.clip_weight_min is not None:
            parameters.clipping_limits.lower.value = self.clip_weight_min
        if self.clip_weight_max is not None:
            parameters.clipping_limits.upper.value = self.clip_weight_max
        if self.clip_gradient_min is not None:
            parameters.gradient_clipping_limits.lower.value = self.clip_gradient_min
        if self.clip_gradient_max is not None:
            parameters.gradient_clipping_limits.upper.value = self.clip_gradient_max
        if self.weight_decay_factor:
            parameters.weight_decay_factor = self.weight_decay_factor
            if self.multiply_weight_decay_factor_by_learning_rate:
                parameters.multiply_weight_decay_factor_by_learning_rate = True
        parameters.low_dimensional_packing_status = (
            _PACKING_ENABLED
            if self.low_dimensional_packing_status
            else _PACKING_UNSPECIFIED
        )
        message = getattr(parameters, self._definition.proto_oneof)
        message.SetInParent()
        for hyper in self._definition.hypers:
            if hyper.proto_field is None:
                continue
            value = getattr(self, hyper.name)
            if hyper.kind == "bool":
                value = bool(value) != hyper.proto_negated
            setattr(message, hyper.proto_field, value)

    def _load(self) -> Callable[..., Any]:
        return getattr(
            tpu_ops, f"load_tpu_embedding_{self._definition.op_module_name}_parameters"
        )

    def _retrieve(self) -> Callable[..., Any]:
        return getattr(
            tpu_ops,
            f"retrieve_tpu_embedding_{self._definition.op_module_name}_parameters",
        )

    def __eq__(self, other: Any) -> bool:
        # TensorFlow compares `__dict__` items of instances of the same class.
        # Here an instance of TensorFlow's own class with the same attributes is
        # equal too, in both directions, as their hashes already are.
        definition = self._definition
        if definition.tensorflow_class:
            same_kind = type(other) is _tensorflow_class(definition) or (
                getattr(type(other), "_definition", None) is definition
            )
        else:
            same_kind = getattr(type(other), "_definition", None) is definition
        return same_kind and list(self.__dict__.items()) == list(other.__dict__.items())

    __hash__ = _TFOptimizer.__hash__

    def __repr__(self) -> str:
        return checks.call_text(type(self).__name__, self._definition, arguments(self))


def _tensorflow_class(definition: spec.Definition) -> type:
    return getattr(tpu_embedding_v2_utils, definition.tensorflow_class)


def _hyper_values(opt: Any) -> Dict[str, Any]:
    return {h.name: getattr(opt, h.name) for h in definition_of(opt).hypers}


def definition_of(opt: Any) -> spec.Definition:
    """The definition behind an embedding optimizer (ours or TensorFlow's).

    Raises:
      TypeError: `opt` is not an embedding optimizer this package implements.
    """
    # The Keras twins carry a `_definition` too, and are no embedding optimizer.
    definition = getattr(type(opt), "_definition", None)
    if definition is not None and isinstance(opt, EmbeddingOptimizer):
        return definition
    for candidate in registry.DEFINITIONS:
        if candidate.tensorflow_class and type(opt) is _tensorflow_class(candidate):
            return candidate
    raise TypeError(
        "Expected an embedding optimizer of tf_tpu_embed_opt.embedding or "
        "tf.tpu.experimental.embedding (SGD, Adagrad, AdagradMomentum, Adam, "
        f"FTRL); received {opt!r} of type {errors.type_path(opt)}."
    )


def arguments(opt: Any) -> Dict[str, Any]:
    """The constructor arguments that rebuild `opt`, in signature order.

    Works for this package's classes and TensorFlow's own parameter classes. A
    scalar `clipvalue=c` comes back as the tuple `(-c, c)` TensorFlow stores.
    """
    definition = definition_of(opt)
    values: Dict[str, Any] = {}
    for name in definition.parameter_names:
        if name == "clipvalue":
            low, high = opt.clip_gradient_min, opt.clip_gradient_max
            values[name] = None if low is None and high is None else (low, high)
        else:
            values[name] = getattr(opt, name)
    return values


def _docstring(definition: spec.Definition) -> str:
    lines = [
        f"{definition.summary}",
        "",
        "TPU embedding parameters for the engine's "
        f"`{definition.proto_oneof}` optimizer.",
        "",
        "Update per looked-up row, with g the row's summed gradient and η the",
        "learning rate (after gradient clipping and weight decay, before weight",
        "clipping; see docs/tpu_semantics.md §1.9):",
        "",
        f"    {definition.math}",
        "",
        f"Source: {definition.sources}",
        "",
    ]
    if definition.tensorflow_class:
        lines += [
            "Extends `tf.tpu.experimental.embedding."
            f"{definition.tensorflow_class}` with the same constructor; every",
            "argument is validated and the proto is written correctly under",
            "protobuf 6 and 7.",
            "",
        ]
    else:
        lines += [
            "TensorFlow has load/retrieve ops for this optimizer "
            f"(`{definition.load_op}`) but no Python class.",
            "",
        ]
    lines.append("Args:")
    for name in definition.parameter_names:  # in the signature's order
        if name == "learning_rate":
            text = (
                "A non-negative float, or a callable taking no arguments for "
                "a dynamic learning rate."
            )
        elif name in definition.hyper:
            hyper = definition.hyper[name]
            text = f"{hyper.doc} Default {hyper.default!r}."
        else:
            text = spec.COMMON_DOCS[name]
        lines.append(f"  {name}: {text}")
    lines += [
        "",
        "Slots (names of the load/retrieve op inputs):",
    ]
    if not definition.slots:
        lines.append("  none")
    for slot in definition.slots:
        start = slot.initial if isinstance(slot.initial, str) else repr(slot.initial)
        lines.append(f"  {slot.name}: {slot.doc} Starts at {start}.")
    return "\n".join(lines)


def _make_class(definition: spec.Definition) -> type:
    base = (
        _tensorflow_class(definition) if definition.tensorflow_class else _TFOptimizer
    )
    signature = checks.signature(definition)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        EmbeddingOptimizer.__init__(self, *args, **kwargs)

    __init__.__signature__ = signature
    __init__.__doc__ = f"Creates {definition.name} embedding optimizer parameters."
    namespace = {
        "__init__": __init__,
        "__doc__": _docstring(definition),
        "__module__": "tf_tpu_embed_opt.embedding",
        "__qualname__": definition.name,
        "_definition": definition,
        "_signature": signature,
    }
    return type(definition.name, (EmbeddingOptimizer, base), namespace)


_CLASSES = {d.name: _make_class(d) for d in registry.DEFINITIONS}

# Each class under its name (`tf_tpu_embed_opt.embedding.FTRL`).
globals().update(_CLASSES)
__all__ += list(_CLASSES)


def embedding_classes() -> Dict[str, type]:
    """Every generated class by its name, in the registry's order."""
    return dict(_CLASSES)


def class_for(definition: spec.Definition) -> type:
    """The embedding class generated from `definition`."""
    return _CLASSES[definition.name]
