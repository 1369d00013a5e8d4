"""`OptimizationParameters` for embedding optimizers, and back."""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional

import numpy as np
from google.protobuf import message as protobuf_message
from tensorflow.core.protobuf.tpu import optimization_parameters_pb2

from tf_tpu_embed_opt import errors
from tf_tpu_embed_opt.definitions import registry
from tf_tpu_embed_opt.definitions.rules import shortest_float
from tf_tpu_embed_opt.embedding import parameters as embedding

__all__ = ["to_proto", "from_proto", "as_embedding_optimizer", "shortest_float"]

OptimizationParameters = optimization_parameters_pb2.OptimizationParameters
_Status = optimization_parameters_pb2.GradientAccumulationStatus
_Packing = optimization_parameters_pb2.LowDimensionalPackingStatus
# The largest `DynamicLearningRate.tag` (an int32 field).
_INT32_MAX = 2**31 - 1


def as_embedding_optimizer(
    opt: Any, argument: str = "opt", owner: Optional[str] = None
) -> Any:
    """`opt` as this package's class; TensorFlow's own instances are rebuilt.

    TensorFlow's `SGD`, `Adagrad`, `AdagradMomentum`, `Adam` and `FTRL` cannot
    write their proto under protobuf >= 7.34; rebuilding them as this package's
    subclass (same arguments, validated) lets them be written everywhere.

    Args:
      opt: The optimizer.
      argument: Its argument name, or a phrase naming it ("the optimizer of
        table 't'"), for the error.
      owner: The public function that received it (`to_proto`), which starts
        the error as in the package's other errors.

    Raises:
      TypeError: `opt` is not an embedding optimizer this package implements.
    """
    if isinstance(opt, embedding.EmbeddingOptimizer):
        return opt
    try:
        definition = embedding.definition_of(opt)
    except TypeError:
        ours = ", ".join(d.name for d in registry.DEFINITIONS)
        tensorflows = ", ".join(
            d.tensorflow_class for d in registry.DEFINITIONS if d.tensorflow_class
        )
        # An argument's name, or a phrase ("the optimizer of table 't'").
        what = f"argument `{argument}`" if argument.isidentifier() else argument
        start = f"{owner}: {what}" if owner else what[0].upper() + what[1:]
        raise TypeError(
            f"{start} must be an embedding optimizer: one of the "
            f"{len(registry.DEFINITIONS)} classes of tf_tpu_embed_opt.embedding "
            f"({ours}) or TensorFlow's own tf.tpu.experimental.embedding "
            f"{tensorflows}; received {opt!r} of type {errors.type_path(opt)}"
            f"{errors.keras_optimizer_note(opt)}."
        ) from None
    return embedding.class_for(definition)(**embedding.arguments(opt))


def to_proto(
    opt: Any, *, learning_rate_tag: Optional[int] = None
) -> OptimizationParameters:
    """The `OptimizationParameters` the TPU engine receives for `opt`.

    The fields are those `TableConfig._set_table_descriptor` writes for a table
    with this optimizer: the learning rate, low-dimensional packing, then the
    optimizer's own fields.

    Args:
      opt: An optimizer of `tf_tpu_embed_opt.embedding`, or one of TensorFlow's
        `tf.tpu.experimental.embedding` parameter classes.
      learning_rate_tag: For a callable (dynamic) learning rate, its tag: the
        index `TPUEmbedding` gives it among the distinct callables of all tables
        (0 to 2**31 - 1, the proto's int32). Must be None for a constant
        learning rate.

    Returns:
      A new `tensorflow.tpu.OptimizationParameters`.

    Raises:
      TypeError: `opt` is not a supported optimizer, or the tag is not an int.
      ValueError: A callable learning rate without a tag, a tag with a constant
        learning rate, or a tag outside the int32 range of non-negative values.
    """
    return proto_of(as_embedding_optimizer(opt, "opt", "to_proto"), learning_rate_tag)


def checked_learning_rate_tag(tag: Any, caller: str) -> int:
    """`tag` as the `int` a `DynamicLearningRate.tag` (int32) holds.

    Raises:
      TypeError: `tag` is not an int (a bool is not).
      ValueError: `tag` is negative or above 2**31 - 1.
    """
    if isinstance(tag, bool) or not isinstance(tag, (int, np.integer)):
        raise TypeError(
            f"{caller}: argument `learning_rate_tag` must be a non-negative int; "
            f"received {tag!r}."
        )
    if not 0 <= tag <= _INT32_MAX:
        raise ValueError(
            f"{caller}: argument `learning_rate_tag` must be a non-negative int "
            f"of at most {_INT32_MAX} (the proto's int32); received {tag!r}."
        )
    return int(tag)


def proto_of(
    opt: Any, learning_rate_tag: Optional[int], caller: str = "to_proto"
) -> OptimizationParameters:
    """`to_proto` of an embedding optimizer already checked, for `caller`."""
    parameters = OptimizationParameters()
    if callable(opt.learning_rate):
        if learning_rate_tag is None:
            raise ValueError(
                f"{caller}: the optimizer has a callable (dynamic) learning rate "
                f"{opt.learning_rate!r}; pass `learning_rate_tag`, the index "
                "TPUEmbedding assigns it (0 for the first distinct callable)."
            )
        tag = checked_learning_rate_tag(learning_rate_tag, caller)
        parameters.learning_rate.dynamic.tag = tag
    else:
        if learning_rate_tag is not None:
            raise ValueError(
                f"{caller}: `learning_rate_tag` applies only to a callable "
                f"learning rate; this optimizer's is the constant "
                f"{opt.learning_rate!r}. Received "
                f"learning_rate_tag={learning_rate_tag!r}."
            )
        parameters.learning_rate.constant = opt.learning_rate
    opt._set_optimization_parameters(parameters)
    return parameters


def _refuse_extras(parameters: OptimizationParameters) -> None:
    if parameters.HasField("simulated_quantization"):
        raise ValueError(
            "from_proto: `simulated_quantization` is a table setting, not an "
            "optimizer setting; build the optimizer from a copy without it and "
            "pass tf.tpu.experimental.embedding.QuantizationConfig to "
            "TableConfig(quantization_config=...)."
        )
    if parameters.HasField("hot_id_replication_configuration"):
        raise ValueError(
            "from_proto: `hot_id_replication_configuration` is set; no embedding "
            "optimizer class can carry it, so it would be dropped."
        )


def from_proto(
    params: Any,
    *,
    learning_rate: Optional[Callable[[], float]] = None,
    **arguments: Any,
) -> Any:
    """The embedding optimizer that writes `params`; the inverse of `to_proto`.

    Float fields are float32 in the proto; each comes back as the shortest
    decimal with the same float32 value, so `to_proto(from_proto(p))` equals
    `p` and `from_proto(to_proto(opt)) == opt` whenever `opt`'s floats are such
    decimals (0.001, 1e-07, 0.9, ...).

    The proto has no field for slot initial values (e.g.
    `initial_accumulator_value`) nor for `slot_variable_creation_fn`; those take
    the class defaults unless given as keyword arguments. A dynamic learning
    rate is recorded only as a tag; pass the callable as `learning_rate`.

    Args:
      params: A `tensorflow.tpu.OptimizationParameters` or its serialized bytes.
      learning_rate: The callable for a dynamic learning rate. Required when
        `params` has `learning_rate.dynamic`, refused otherwise.
      **arguments: Constructor arguments the proto cannot hold.

    Returns:
      An instance of the matching `tf_tpu_embed_opt.embedding` class.

    Raises:
      TypeError: `params` is neither the message nor bytes.
      ValueError: No algorithm is set, the algorithm is not implemented here,
        the learning rate is missing, a field has no class equivalent, or the
        values are invalid for the class.
    """
    params = _message(params)
    oneof = params.WhichOneof("parameters")
    if oneof is None:
        raise ValueError(
            "from_proto: `params` has no optimization algorithm set (the "
            "`parameters` oneof is empty)."
        )
    definition = registry.BY_PROTO_ONEOF.get(oneof)
    if definition is None:
        raise ValueError(
            f"from_proto: algorithm `{oneof}` is not implemented by "
            "tf_tpu_embed_opt; supported: "
            f"{', '.join(registry.BY_PROTO_ONEOF)}."
        )
    _refuse_extras(params)
    cls = embedding.class_for(definition)
    unknown = set(arguments) - {
        h.name for h in definition.hypers if h.proto_field is None
    }
    if definition.slots:
        unknown.discard("slot_variable_creation_fn")
    if unknown:
        raise TypeError(
            f"from_proto: {definition.name} reads {sorted(unknown)} from the "
            "proto; only arguments the proto cannot hold may be passed."
        )
    values = {
        **arguments,
        "learning_rate": _learning_rate(params, learning_rate),
        **_shared_fields(params),
    }
    sub_message = getattr(params, oneof)
    for hyper in definition.hypers:
        if hyper.proto_field is None:
            continue
        value = getattr(sub_message, hyper.proto_field)
        if hyper.kind == "bool":
            values[hyper.name] = (not value) if hyper.proto_negated else bool(value)
        else:
            values[hyper.name] = shortest_float(value)
    try:
        return cls(**values)
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"from_proto: the proto's values are invalid: {error}"
        ) from None


def _message(params: Any) -> Any:
    """`params` as an `OptimizationParameters` message (parsed from bytes)."""
    if isinstance(params, (bytes, bytearray)):
        message = OptimizationParameters()
        try:
            message.ParseFromString(bytes(params))
        except protobuf_message.DecodeError as error:
            raise ValueError(
                f"from_proto: `params` bytes are not an OptimizationParameters "
                f"message: {error}"
            ) from None
        return message
    if not isinstance(params, OptimizationParameters):
        raise TypeError(
            "from_proto: argument `params` must be a "
            "tensorflow.tpu.OptimizationParameters or its serialized bytes; "
            f"received {params!r} of type {type(params).__name__}."
        )
    return params


def _learning_rate(params: Any, learning_rate: Any) -> Any:
    """The class's `learning_rate`: the proto's constant, or the callable
    given for a dynamic (or unset) one."""
    rate = params.learning_rate.WhichOneof("learning_rate")
    if rate == "constant":
        if learning_rate is not None:
            raise ValueError(
                "from_proto: `params` has the constant learning rate "
                f"{shortest_float(params.learning_rate.constant)}; "
                "`learning_rate` must not be passed."
            )
        return shortest_float(params.learning_rate.constant)
    if rate == "dynamic":
        if learning_rate is None:
            raise ValueError(
                "from_proto: `params` has a dynamic learning rate (tag "
                f"{params.learning_rate.dynamic.tag}); pass the callable as "
                "`learning_rate=`."
            )
        if not callable(learning_rate):
            raise TypeError(
                "from_proto: `params` has a dynamic learning rate, so "
                "`learning_rate` must be a callable taking no arguments; "
                f"received {learning_rate!r}."
            )
        return learning_rate
    if learning_rate is None:
        raise ValueError(
            "from_proto: `params.learning_rate` is not set; pass "
            "`learning_rate=` (a callable) or set it in the proto."
        )
    return learning_rate


def _shared_fields(params: Any) -> Dict[str, Any]:
    """The class arguments of the fields every algorithm shares: gradient
    accumulation, weight and gradient clipping, weight decay, packing."""
    values: Dict[str, Any] = {
        "use_gradient_accumulation": (
            params.gradient_accumulation_status != _Status.DISABLED
        )
    }
    for name, field in (("clip_weight_min", "lower"), ("clip_weight_max", "upper")):
        has = params.HasField("clipping_limits") and params.clipping_limits.HasField(
            field
        )
        values[name] = (
            shortest_float(getattr(params.clipping_limits, field).value)
            if has
            else None
        )
    if params.HasField("gradient_clipping_limits"):
        limits = params.gradient_clipping_limits
        values["clipvalue"] = tuple(
            shortest_float(getattr(limits, f).value) if limits.HasField(f) else None
            for f in ("lower", "upper")
        )
        if values["clipvalue"] == (None, None):
            values["clipvalue"] = None
    if params.weight_decay_factor:
        values["weight_decay_factor"] = shortest_float(params.weight_decay_factor)
        if params.multiply_weight_decay_factor_by_learning_rate:
            values["multiply_weight_decay_factor_by_learning_rate"] = True
    elif params.multiply_weight_decay_factor_by_learning_rate:
        raise ValueError(
            "from_proto: `multiply_weight_decay_factor_by_learning_rate` is set "
            "but `weight_decay_factor` is 0; the flag has no meaning without a "
            "decay factor."
        )
    values["low_dimensional_packing_status"] = (
        params.low_dimensional_packing_status == _Packing.ENABLED
    )
    return values
