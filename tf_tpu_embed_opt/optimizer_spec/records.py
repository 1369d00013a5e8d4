"""The `OptimizerSpec` message and its writer and reader (`to_spec`, `from_spec`).

Public through `tf_tpu_embed_opt.optimizer_spec`, whose docstring says what
the proto is for.
"""

from __future__ import annotations

import json
import math
import numbers
from typing import Any, Callable, Dict, Optional, Union

import keras
from google.protobuf import descriptor_pool, message_factory, text_format
from google.protobuf import message as protobuf_message
from tensorflow.core.protobuf.tpu import optimization_parameters_pb2  # noqa: F401

from tf_tpu_embed_opt import errors
from tf_tpu_embed_opt.definitions import registry
from tf_tpu_embed_opt.embedding import parameters as embedding
from tf_tpu_embed_opt.embedding import proto
from tf_tpu_embed_opt.optimizer_spec.descriptor import SERIALIZED_FILE_DESCRIPTOR
from tf_tpu_embed_opt.optimizers import twins as optimizers

__all__ = [
    "SPEC_VERSION",
    "OptimizerSpec",
    "Face",
    "to_spec",
    "from_spec",
]

SPEC_VERSION = 1

# Where users find the message class (`help()`, pydoc, repr).
_PUBLIC_MODULE = "tf_tpu_embed_opt.optimizer_spec"

_POOL = descriptor_pool.Default()
try:
    _FILE = _POOL.FindFileByName("tf_tpu_embed_opt/optimizer_spec.proto")
except KeyError:
    _FILE = _POOL.AddSerializedFile(SERIALIZED_FILE_DESCRIPTOR)


def _message_class(name: str, doc: str) -> type:
    """The message class of `tf_tpu_embed_opt.<name>`, named as Python code.

    The message factory leaves `__module__` unset and a placeholder docstring,
    which breaks `help()` and pydoc; the class gets the module that defines it
    here, its name and `doc`.
    """
    cls = message_factory.GetMessageClass(
        _POOL.FindMessageTypeByName(f"tf_tpu_embed_opt.{name}")
    )
    cls.__module__ = _PUBLIC_MODULE
    cls.__qualname__ = name
    cls.__doc__ = doc
    return cls


OptimizerSpec = _message_class(
    "OptimizerSpec",
    """Any optimizer of this package, recorded losslessly (a protobuf message).

    Written by `to_spec` and read by `from_spec`; defined in
    `protos/tf_tpu_embed_opt/optimizer_spec.proto`.

    Fields:
      spec_version: Format version (`SPEC_VERSION` = 1); readers refuse newer
        versions.
      face: `Face.EMBEDDING` (`tf_tpu_embed_opt.embedding`) or `Face.KERAS`
        (`tf_tpu_embed_opt.optimizers`).
      algorithm: The class name on that face, e.g. "Adagrad", "RMSProp".
      learning_rate: `constant`, `dynamic_tag` (a callable embedding learning
        rate) or `keras_schedule_json`.
      arguments: Every other constructor argument (Keras: every `get_config`
        entry); a spec of the current version that lacks one is refused.
      optimization_parameters: The `tensorflow.tpu.OptimizationParameters` the
        TPU engine receives, when it can run the optimizer; refused when it
        disagrees with the arguments.

    Example:
      >>> spec = to_spec(embedding.Adam(0.01, beta_1=0.7))
      >>> from_spec(spec.SerializeToString()).beta_1
      0.7
    """,
)
Argument = _message_class(
    "Argument",
    "One constructor argument of an `OptimizerSpec`: its name and value.",
)
_FACE = _POOL.FindEnumTypeByName("tf_tpu_embed_opt.Face")


class Face:
    """Values of the `Face` enum."""

    FACE_UNSPECIFIED = _FACE.values_by_name["FACE_UNSPECIFIED"].number
    EMBEDDING = _FACE.values_by_name["EMBEDDING"].number
    KERAS = _FACE.values_by_name["KERAS"].number


def _keras_classes() -> Dict[str, type]:
    return {d.keras.name: optimizers.class_for(d) for d in registry.ALL if d.keras}


def _not_a_twin(opt: Any) -> str:
    """Names `opt`, a Keras optimizer no spec records, by its full path (a
    stock `keras.optimizers.Adam` is not the twin of that name) and says what
    to record instead, where something is exact."""
    where = errors.type_path(opt)
    if optimizers.unscaled(opt) is not opt:
        return (
            f"{where}, which scales the loss and steps its inner_optimizer: "
            "record the inner_optimizer (the loss scale is not the table's math)"
        )
    twin = optimizers.twin_class_of_stock(opt)
    if twin is not None:
        return (
            f"{where}, Keras's own class (from_spec gives this package's): record "
            f"its twin, tf_tpu_embed_opt.optimizers.{twin.__name__}.from_config("
            "opt.get_config()), the same arguments and the same math, duplicate "
            "ids summed first"
        )
    return where


def _set_value(argument: Any, name: str, value: Any) -> None:
    argument.name = name
    if value is None:
        argument.none.SetInParent()
    elif isinstance(value, bool) or type(value).__name__ in ("bool", "bool_"):
        argument.flag = bool(value)
    elif isinstance(value, numbers.Integral):
        argument.integer = int(value)
    elif isinstance(value, numbers.Real):
        argument.number = float(value)
    elif isinstance(value, str):
        argument.text = value
    elif isinstance(value, tuple) and len(value) == 2:
        argument.range.SetInParent()
        if value[0] is not None:
            argument.range.lower = float(value[0])
        if value[1] is not None:
            argument.range.upper = float(value[1])
    else:
        raise ValueError(
            f"to_spec: argument `{name}` has the value {value!r} of type "
            f"{type(value).__name__}, which an OptimizerSpec cannot record."
        )


def _get_value(argument: Any) -> Any:
    kind = argument.WhichOneof("value")
    if kind is None:
        raise ValueError(f"from_spec: argument `{argument.name}` has no value.")
    if kind == "none":
        return None
    if kind == "range":
        r = argument.range
        return (
            r.lower if r.HasField("lower") else None,
            r.upper if r.HasField("upper") else None,
        )
    return getattr(argument, kind)


def to_spec(opt: Any, *, learning_rate_tag: Optional[int] = None) -> Any:
    """Records `opt` in an `OptimizerSpec` message.

    Args:
      opt: An optimizer of `tf_tpu_embed_opt.embedding` (or TensorFlow's own
        embedding classes) or of `tf_tpu_embed_opt.optimizers`.
      learning_rate_tag: For an embedding optimizer with a callable learning
        rate, its dynamic tag (see `to_proto`). For a Keras optimizer whose
        engine equivalent needs a callable learning rate (Adam's bias
        correction, schedules), the tag written in `optimization_parameters`
        (default 0).

    Returns:
      A `tf_tpu_embed_opt.OptimizerSpec` message.

    Raises:
      TypeError: Not an optimizer of this package (for Keras's own class of
        a twin's name, the message gives the twin to record).
      ValueError: A setting that cannot be recorded (a callable
        `slot_variable_creation_fn`, a Keras learning rate that is a plain
        callable, a callable embedding learning rate without a tag).
    """
    spec = OptimizerSpec(spec_version=SPEC_VERSION)
    if learning_rate_tag is not None:
        learning_rate_tag = proto.checked_learning_rate_tag(
            learning_rate_tag, "to_spec"
        )
    if isinstance(opt, keras.optimizers.Optimizer):
        _keras_to_spec(spec, opt, learning_rate_tag)
        return spec
    opt = proto.as_embedding_optimizer(opt, "opt", "to_spec")
    definition = embedding.definition_of(opt)
    spec.face = Face.EMBEDDING
    spec.algorithm = definition.name
    spec.optimization_parameters.CopyFrom(
        proto.proto_of(opt, learning_rate_tag, "to_spec")
    )
    if callable(opt.learning_rate):
        spec.learning_rate.dynamic_tag = learning_rate_tag
    else:
        spec.learning_rate.constant = float(opt.learning_rate)
    for name, value in embedding.arguments(opt).items():
        if name == "learning_rate":
            continue
        if name == "slot_variable_creation_fn" and value is not None:
            raise ValueError(
                "to_spec: `slot_variable_creation_fn` is a callable, which an "
                "OptimizerSpec cannot record; record the optimizer without it."
            )
        _set_value(spec.arguments.add(), name, value)
    return spec


def _keras_to_spec(spec: Any, opt: Any, learning_rate_tag: Optional[int]) -> None:
    name = type(opt).__name__
    if _keras_classes().get(name) is not type(opt):
        raise TypeError(
            "to_spec: a Keras optimizer must be one of tf_tpu_embed_opt.optimizers "
            f"({', '.join(_keras_classes())}); received {_not_a_twin(opt)}."
        )
    spec.face = Face.KERAS
    spec.algorithm = name
    rate = opt._learning_rate
    if not isinstance(
        rate, (keras.optimizers.schedules.LearningRateSchedule, keras.Variable)
    ) and callable(rate):
        raise ValueError(
            f"to_spec: the learning rate of {name} is the callable {rate!r}; an "
            "OptimizerSpec records a number or a keras.optimizers.schedules "
            "schedule."
        )
    config = opt.get_config()
    rate = config.pop("learning_rate")
    if isinstance(rate, dict):
        spec.learning_rate.keras_schedule_json = json.dumps(rate, sort_keys=True)
    else:
        spec.learning_rate.constant = float(rate)
    for key, value in config.items():
        _set_value(spec.arguments.add(), key, value)
    from tf_tpu_embed_opt.conversions import faces as convert

    try:
        engine = convert.to_embedding(opt)
    except (TypeError, ValueError) as error:  # no engine runs these settings
        engine, why = None, str(error)
    dynamic = engine is not None and callable(engine.learning_rate)
    if learning_rate_tag is not None and not dynamic:
        if engine is not None:
            rate = engine.learning_rate
            why = f"its engine learning rate is the constant {rate!r}."
        raise ValueError(
            "to_spec: `learning_rate_tag` applies only to a Keras optimizer "
            "whose engine counterpart has a callable learning rate (bias "
            f"correction, a schedule); {name}: {why} Received "
            f"learning_rate_tag={learning_rate_tag!r}."
        )
    if engine is None:
        return
    tag = None
    if dynamic:
        tag = 0 if learning_rate_tag is None else learning_rate_tag
    spec.optimization_parameters.CopyFrom(proto.proto_of(engine, tag, "to_spec"))


def _parse(spec: Union[Any, bytes, str]) -> Any:
    if isinstance(spec, OptimizerSpec):
        return spec
    message = OptimizerSpec()
    if isinstance(spec, (bytes, bytearray)):
        try:
            message.ParseFromString(bytes(spec))
        except protobuf_message.DecodeError as error:
            raise ValueError(
                f"from_spec: the bytes are not an OptimizerSpec: {error}"
            ) from None
        return message
    if isinstance(spec, str):
        try:
            text_format.Parse(spec, message)
        except text_format.ParseError as error:
            raise ValueError(
                f"from_spec: the text is not an OptimizerSpec in protobuf text "
                f"format: {error}"
            ) from None
        return message
    raise TypeError(
        "from_spec: argument `spec` must be an OptimizerSpec message, its "
        "serialized bytes or its text format; received "
        f"{spec!r} of type {type(spec).__name__}."
    )


def from_spec(
    spec: Union[Any, bytes, str],
    *,
    learning_rate: Optional[Callable[[], float]] = None,
) -> Any:
    """The optimizer an `OptimizerSpec` records; the inverse of `to_spec`.

    Args:
      spec: An `OptimizerSpec`, its serialized bytes, or its text format.
      learning_rate: For an embedding optimizer recorded with a dynamic tag,
        the callable learning rate.

    Returns:
      The optimizer, equal to the one recorded (embedding face) or with the
      same `get_config()` (Keras face).

    Raises:
      TypeError: `spec` is of another type.
      ValueError: Malformed, empty, from a newer version, unknown face or
        algorithm, lacking an argument `to_spec` writes (a damaged or
        truncated spec), invalid values, or `optimization_parameters` that
        disagree with the arguments.
    """
    message = _parse(spec)
    if message.ByteSize() == 0:
        raise ValueError(
            "from_spec: the spec is empty (no field is set); expected an "
            "OptimizerSpec written by tf_tpu_embed_opt.to_spec."
        )
    if message.spec_version > SPEC_VERSION:
        raise ValueError(
            f"from_spec: spec_version {message.spec_version} was written by a "
            f"newer tf_tpu_embed_opt; this version reads up to {SPEC_VERSION}."
        )
    if message.spec_version < 1:
        raise ValueError("from_spec: `spec_version` is missing (0).")
    arguments: Dict[str, Any] = {}
    for argument in message.arguments:
        if argument.name in arguments:
            raise ValueError(
                f"from_spec: argument `{argument.name}` appears more than once."
            )
        arguments[argument.name] = _get_value(argument)
    for name, value in arguments.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(
                f"from_spec: argument `{name}` is {value!r}; values must be finite."
            )
    source = message.learning_rate.WhichOneof("source")
    if message.face == Face.EMBEDDING:
        return _embedding_from_spec(message, arguments, source, learning_rate)
    if message.face == Face.KERAS:
        if learning_rate is not None:
            raise ValueError(
                "from_spec: `learning_rate` applies only to embedding optimizers "
                "with a dynamic tag."
            )
        return _keras_from_spec(message, arguments, source)
    raise ValueError(
        f"from_spec: `face` is {message.face}; expected EMBEDDING or KERAS."
    )


def _embedding_from_spec(message, arguments, source, learning_rate):
    definition = registry.BY_NAME.get(message.algorithm)
    if definition is None:
        raise ValueError(
            f"from_spec: unknown embedding algorithm {message.algorithm!r}; "
            f"known: {', '.join(registry.BY_NAME)}."
        )
    if source == "constant":
        if learning_rate is not None:
            raise ValueError(
                "from_spec: the spec has a constant learning rate; "
                "`learning_rate` must not be passed."
            )
        arguments["learning_rate"] = message.learning_rate.constant
    elif source == "dynamic_tag":
        if learning_rate is None:
            raise ValueError(
                "from_spec: the spec has a dynamic learning rate (tag "
                f"{message.learning_rate.dynamic_tag}); pass the callable as "
                "`learning_rate=`."
            )
        if not callable(learning_rate):
            # As from_proto: the value given is the wrong kind, not missing.
            raise TypeError(
                "from_spec: the spec has a dynamic learning rate, so "
                "`learning_rate` must be a callable taking no arguments; "
                f"received {learning_rate!r}."
            )
        arguments["learning_rate"] = learning_rate
    else:
        raise ValueError(
            "from_spec: an embedding spec needs `learning_rate.constant` or "
            "`learning_rate.dynamic_tag`."
        )
    unknown = set(arguments) - set(definition.parameter_names)
    if unknown:
        raise ValueError(
            f"from_spec: {definition.name} has no argument(s) {sorted(unknown)}."
        )
    _check_complete(message, definition.parameter_names, arguments)
    try:
        opt = embedding.class_for(definition)(**arguments)
    except (TypeError, ValueError) as error:
        raise ValueError(f"from_spec: invalid values: {error}") from None
    if message.HasField("optimization_parameters"):
        tag = message.learning_rate.dynamic_tag if source == "dynamic_tag" else None
        if (
            proto.to_proto(opt, learning_rate_tag=tag)
            != message.optimization_parameters
        ):
            raise ValueError(
                "from_spec: `optimization_parameters` disagree with the arguments; "
                "the spec is inconsistent."
            )
    return opt


def _keras_from_spec(message, arguments, source):
    cls = _keras_classes().get(message.algorithm)
    if cls is None:
        raise ValueError(
            f"from_spec: unknown Keras algorithm {message.algorithm!r}; known: "
            f"{', '.join(_keras_classes())}."
        )
    if source == "constant":
        arguments["learning_rate"] = message.learning_rate.constant
    elif source == "keras_schedule_json":
        try:
            arguments["learning_rate"] = keras.optimizers.schedules.deserialize(
                json.loads(message.learning_rate.keras_schedule_json)
            )
        except (ValueError, TypeError, KeyError) as error:
            raise ValueError(
                f"from_spec: `learning_rate.keras_schedule_json` is not a Keras "
                f"schedule: {error}"
            ) from None
    else:
        raise ValueError(
            "from_spec: a Keras spec needs `learning_rate.constant` or "
            "`learning_rate.keras_schedule_json`."
        )
    _check_complete(message, cls().get_config(), arguments)
    try:
        opt = cls.from_config(arguments)
    except (TypeError, ValueError) as error:
        raise ValueError(f"from_spec: invalid values: {error}") from None
    if message.HasField("optimization_parameters"):
        _check_keras_parameters(message, opt)
    return opt


def _check_complete(message: Any, names: Any, arguments: Dict[str, Any]) -> None:
    """Refuses a spec of this version that lacks an argument `to_spec` writes.

    `to_spec` records every argument, so for its own version a missing one means
    the spec was damaged (e.g. cut at a field boundary, which protobuf parses
    without complaint); filling it with the default would change the optimizer
    silently. A future version may default arguments that this one did not have.
    """
    if message.spec_version != SPEC_VERSION:
        return
    missing = [
        name for name in names if name not in arguments and name != "learning_rate"
    ]
    if missing:
        listed = ", ".join(f"`{name}`" for name in missing)
        raise ValueError(
            f"from_spec: the {message.algorithm} spec (version {SPEC_VERSION}) "
            f"lacks argument(s) {listed}; to_spec writes every argument, so the "
            "spec is damaged or truncated."
        )


def _check_keras_parameters(message: Any, opt: Any) -> None:
    """Refuses `optimization_parameters` that are not what `opt` converts to."""
    from tf_tpu_embed_opt.conversions import faces as convert

    name = type(opt).__name__
    try:
        engine = convert.to_embedding(opt)
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"from_spec: the spec records optimization_parameters, but the TPU "
            f"engine cannot run this {name} ({error}); the spec is inconsistent."
        ) from None
    tag = None
    if callable(engine.learning_rate):
        tag = message.optimization_parameters.learning_rate.dynamic.tag
    if proto.to_proto(engine, learning_rate_tag=tag) != message.optimization_parameters:
        raise ValueError(
            "from_spec: `optimization_parameters` disagree with the arguments of "
            f"the {name}; the spec is inconsistent."
        )
