"""jax-tpu-embedding's `EmbeddingSpecProto`, as its newest code writes it.

A jax-tpu-embedding checkpoint step holds its `EmbeddingSpecProto` as text
(`embedding_spec/proto.pbtxt`). Text format is read by field name, so a
checkpoint written by a newer jax-tpu-embedding than the installed one does
not parse with the installed message: since 0.1.0 it added a table's
`combiner` and `optimizer` (an `OptimizerSpecProto`) and a stack's
`activation_mem_bytes_limit`. This module builds the message as it is at
jax-tpu-embedding's HEAD (`jax_tpu_embedding/sparsecore/lib/proto/
embedding_spec.proto`), a superset of 0.1.0's with the same field numbers, in
a pool of its own: it reads what every release writes, its text and bytes
are jax-tpu-embedding's, and it needs neither jax-tpu-embedding nor
TensorFlow.

`RECORD_TYPES` is jax-tpu-embedding's table of `OptimizerType` -> spec class
(`embedding_proto_utils._OPTIMIZER_TYPE_TO_CLASS`), derived from the
definitions (`JaxFace.record`); any other spec is written as `CUSTOM`
(LaProp, custom specs), which that module's `proto_to_optimizer_spec` reads
back as SGD. `definitions_for_record` says
which algorithms a record allows, and never takes CUSTOM for SGD;
`algorithms_for_table`, which a table's slots and record allow together.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from tf_tpu_embed_opt.definitions import registry, spec

__all__ = [
    "EMBEDDING_SPEC_ITEM",
    "RECORD_TYPES",
    "EmbeddingSpecProto",
    "algorithms_for_jax_slots",
    "algorithms_for_table",
    "checked",
    "definitions_for_record",
    "engine_slot_names",
    "is_jax_checkpoint",
    "jax_slot_names",
    "optimizer_records",
    "parse",
    "read_embedding_spec",
    "record_type",
]

# The item jax-tpu-embedding saves its EmbeddingSpecProto under.
EMBEDDING_SPEC_ITEM = "embedding_spec"
_SPEC_FILE = "proto.pbtxt"


PACKAGE = "third_party.py.jax_tpu_embedding.sparsecore_lib_proto"

# OptimizerSpecProto.OptimizerType, jax-tpu-embedding's enum in its order
# (the values are the field's numbers).
_ENUM = (
    "OPTIMIZER_TYPE_UNSPECIFIED",
    "SGD",
    "ADAGRAD",
    "ADAM",
    "FTRL",
    "F2A",
    "ADAGRAD_MOMENTUM",
    "CUSTOM",
)

# OptimizerType -> jax-tpu-embedding's spec class, from the definitions.
RECORD_TYPES: Mapping[str, str] = {
    d.jax.record: d.jax.spec_class
    for d in registry.ALL
    if d.jax is not None and d.jax.record is not None
}
if set(RECORD_TYPES) != set(_ENUM[1:-1]):  # pragma: no cover - a definition's error
    raise ValueError(
        f"The definitions' jax-tpu-embedding records {sorted(RECORD_TYPES)} are "
        f"not its named optimizer types {sorted(_ENUM[1:-1])}."
    )

_INT64, _STRING, _FLOAT, _BOOL, _MESSAGE, _ENUM_TYPE = 3, 9, 2, 8, 11, 14

# message -> (field, number, type, repeated, message or enum type, oneof).
_MESSAGES: Mapping[str, Tuple[Tuple[Any, ...], ...]] = {
    "FeatureSpecProto": (
        ("feature_name", 1, _STRING, False, None, None),
        ("input_shape", 2, _INT64, True, None, None),
        ("output_shape", 3, _INT64, True, None, None),
        ("row_offset", 4, _INT64, False, None, None),
        ("col_offset", 5, _INT64, False, None, None),
        ("col_shift", 6, _INT64, False, None, None),
    ),
    "OptimizerSpecProto": (
        ("type", 1, _ENUM_TYPE, False, "OptimizerSpecProto.OptimizerType", None),
        ("learning_rate", 2, _FLOAT, False, None, 0),
        ("learning_rate_tag", 3, _STRING, False, None, 0),
        (
            "float_params",
            4,
            _MESSAGE,
            True,
            "OptimizerSpecProto.FloatParamsEntry",
            None,
        ),
        ("bool_params", 5, _MESSAGE, True, "OptimizerSpecProto.BoolParamsEntry", None),
    ),
    "TableSpecProto": (
        ("table_name", 1, _STRING, False, None, None),
        ("vocab_size", 2, _INT64, False, None, None),
        ("embedding_dim", 3, _INT64, False, None, None),
        ("max_ids_per_partition", 5, _INT64, False, None, None),
        ("max_unique_ids_per_partition", 6, _INT64, False, None, None),
        ("padded_vocab_size", 7, _INT64, False, None, None),
        ("padded_embedding_dim", 8, _INT64, False, None, None),
        ("row_offset_in_shard", 9, _INT64, False, None, None),
        ("shard_rotation", 10, _INT64, False, None, None),
        ("feature_specs", 11, _MESSAGE, True, "FeatureSpecProto", None),
        ("combiner", 12, _STRING, False, None, None),
        ("optimizer", 13, _MESSAGE, False, "OptimizerSpecProto", None),
    ),
    "StackedTableSpecProto": (
        ("stack_name", 1, _STRING, False, None, None),
        ("stack_vocab_size", 2, _INT64, False, None, None),
        ("stack_embedding_dim", 3, _INT64, False, None, None),
        ("total_sample_count", 6, _INT64, False, None, None),
        ("max_ids_per_partition", 7, _INT64, False, None, None),
        ("max_unique_ids_per_partition", 8, _INT64, False, None, None),
        ("num_sparsecores", 9, _INT64, False, None, None),
        ("table_specs", 10, _MESSAGE, True, "TableSpecProto", None),
        # proto3 `optional`: a synthetic oneof of its own.
        ("activation_mem_bytes_limit", 11, _INT64, False, None, "optional"),
    ),
    "EmbeddingSpecProto": (
        ("stacked_table_specs", 1, _MESSAGE, True, "StackedTableSpecProto", None),
    ),
}


def _file_descriptor() -> Any:
    from google.protobuf import descriptor_pb2

    file = descriptor_pb2.FileDescriptorProto(
        name="tf_tpu_embed_opt/jax_tpu_embedding_embedding_spec.proto",
        package=PACKAGE,
        syntax="proto3",
    )
    label = descriptor_pb2.FieldDescriptorProto
    for name, fields in _MESSAGES.items():
        message = file.message_type.add(name=name)
        for field, number, kind, repeated, type_name, oneof in fields:
            entry = message.field.add(
                name=field,
                number=number,
                type=kind,
                label=label.LABEL_REPEATED if repeated else label.LABEL_OPTIONAL,
            )
            if type_name is not None:
                entry.type_name = f".{PACKAGE}.{type_name}"
            if oneof == "optional":
                entry.proto3_optional = True
                entry.oneof_index = len(message.oneof_decl)
                message.oneof_decl.add(name=f"_{field}")
            elif oneof is not None:
                if not message.oneof_decl:
                    message.oneof_decl.add(name="learning_rate_spec")
                entry.oneof_index = oneof
        if name == "OptimizerSpecProto":
            enum = message.enum_type.add(name="OptimizerType")
            for number, value in enumerate(_ENUM):
                enum.value.add(name=value, number=number)
            for entry_name, value_type in (
                ("FloatParamsEntry", _FLOAT),
                ("BoolParamsEntry", _BOOL),
            ):
                nested = message.nested_type.add(name=entry_name)
                nested.options.map_entry = True
                nested.field.add(
                    name="key", number=1, type=_STRING, label=label.LABEL_OPTIONAL
                )
                nested.field.add(
                    name="value", number=2, type=value_type, label=label.LABEL_OPTIONAL
                )
    return file


@functools.lru_cache(maxsize=None)
def _classes() -> Mapping[str, type]:
    from google.protobuf import descriptor_pool, message_factory

    pool = descriptor_pool.DescriptorPool()
    pool.Add(_file_descriptor())
    return {
        name: message_factory.GetMessageClass(
            pool.FindMessageTypeByName(f"{PACKAGE}.{name}")
        )
        for name in _MESSAGES
    }


def EmbeddingSpecProto(**fields: Any) -> Any:  # noqa: N802 - a message class's name
    """A new `EmbeddingSpecProto` message (jax-tpu-embedding's, at HEAD)."""
    return _classes()["EmbeddingSpecProto"](**fields)


def checked(embedding_spec: Any, where: str) -> Any:
    """`embedding_spec` (jax-tpu-embedding's message, or this module's) as
    this module's `EmbeddingSpecProto`.

    Raises:
      TypeError: It is no `EmbeddingSpecProto`; the message names `where`.
    """
    descriptor = getattr(embedding_spec, "DESCRIPTOR", None)
    if getattr(descriptor, "name", None) != "EmbeddingSpecProto":
        raise TypeError(
            f"{where}: argument `embedding_spec` must be an EmbeddingSpecProto "
            "(jax-tpu-embedding's `create_proto_from_feature_specs`, "
            "`embedding_spec_for`, `retarget_embedding_spec` or keras-rs's "
            f"`embedding_spec`); received {type(embedding_spec).__name__}."
        )
    proto = EmbeddingSpecProto()
    proto.ParseFromString(embedding_spec.SerializeToString())
    return proto


def message_class(name: str) -> type:
    """The class of one message of the file (`"TableSpecProto"`, ...)."""
    return _classes()[name]


def parse(text: str) -> Any:
    """An `EmbeddingSpecProto` from its text format.

    Raises:
      google.protobuf.text_format.ParseError: The text is not one.
    """
    from google.protobuf import text_format

    return text_format.Parse(text, EmbeddingSpecProto())


def definitions_for_record(record: Any) -> Optional[Tuple[spec.Definition, ...]]:
    """The algorithms a table's `OptimizerSpecProto` allows, or `None`.

    `None` when the table has no record or it is `OPTIMIZER_TYPE_UNSPECIFIED`
    (jax-tpu-embedding 0.1.0 writes none): the slots alone decide. A named
    type allows the algorithms whose jax-tpu-embedding spec it names; CUSTOM
    allows every algorithm that has no such type (LaProp, and what a custom
    spec runs), never SGD.
    """
    kind = record_type(record)
    if kind in (None, "OPTIMIZER_TYPE_UNSPECIFIED"):
        return None
    if kind == "CUSTOM":
        return tuple(d for d in registry.ALL if d.jax is None or d.jax.record is None)
    return tuple(d for d in registry.ALL if d.jax is not None and d.jax.record == kind)


def record_type(record: Any) -> Optional[str]:
    """The `OptimizerType` a table's record names (`None`: no record)."""
    if record is None:
        return None
    return type(record).OptimizerType.Name(record.type)


def optimizer_records(proto: Any) -> Dict[str, Any]:
    """Table name -> its `OptimizerSpecProto`, for the tables that have one
    (jax-tpu-embedding writes them since after 0.1.0)."""
    return {
        table.table_name: table.optimizer
        for stack in proto.stacked_table_specs
        for table in stack.table_specs
        if table.HasField("optimizer")
    }


def algorithms_for_table(
    jax_slots: Sequence[str], record: Any, where: str
) -> Tuple[spec.Definition, ...]:
    """The algorithms a table's slots fit and its optimizer record allows.

    Raises:
      ValueError: None does, naming the slots and the record's type (a record
        of CUSTOM, e.g. LaProp's, is never read as SGD).
    """
    algorithms = algorithms_for_jax_slots(jax_slots)
    if not algorithms:
        raise ValueError(
            f"{where}: slots {jax_slots} fit no algorithm of "
            "jax-tpu-embedding or of this package."
        )
    allowed = definitions_for_record(record)
    if allowed is None:
        return algorithms
    kept = tuple(d for d in algorithms if d in allowed)
    if not kept:
        raise ValueError(
            f"{where}: its optimizer record says {record_type(record)} "
            f"({', '.join(d.name for d in allowed)}), but its slots "
            f"{jax_slots} fit {[d.name for d in algorithms]}."
        )
    return kept


def algorithms_for_jax_slots(names: Sequence[str]) -> Tuple[spec.Definition, ...]:
    """The definitions whose jax-tpu-embedding slots are exactly `names`:
    a built-in spec's slot names, or the engine's slot names of a
    `RuleOptimizerSpec` (which names its slots as TensorFlow's engines do)."""
    wanted = set(names)
    return tuple(d for d in registry.ALL if set(jax_slot_names(d).values()) == wanted)


def jax_slot_names(definition: spec.Definition) -> Dict[str, str]:
    """Engine slot name -> jax-tpu-embedding's, for one algorithm
    (`Definition.jax_slots`)."""
    return dict(definition.jax_slots)


def engine_slot_names(
    definition: spec.Definition, jax_slots: Sequence[str]
) -> Tuple[Tuple[str, str], ...]:
    """(jax-tpu-embedding slot name, engine slot name) of each slot."""
    engine = {theirs: ours for ours, theirs in jax_slot_names(definition).items()}
    return tuple((s, engine[s]) for s in jax_slots)


def is_jax_checkpoint(path: str) -> bool:
    """Whether `path` is an orbax step directory with an embedding spec."""
    return os.path.isfile(os.path.join(path, EMBEDDING_SPEC_ITEM, _SPEC_FILE))


def read_embedding_spec(step_dir: str) -> Any:
    """The `EmbeddingSpecProto` of a step directory.

    Raises:
      ValueError: The directory has none, or it does not parse.
    """
    from google.protobuf import text_format

    path = os.path.join(step_dir, EMBEDDING_SPEC_ITEM, _SPEC_FILE)
    if not os.path.isfile(path):
        raise ValueError(
            f"{step_dir!r} is not a jax-tpu-embedding checkpoint step: it has "
            f"no {EMBEDDING_SPEC_ITEM}/{_SPEC_FILE} (the EmbeddingSpecProto "
            "jax-tpu-embedding saves with its tables)."
        )
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    try:
        return parse(text)
    except text_format.ParseError as error:
        raise ValueError(f"{path}: not an EmbeddingSpecProto: {error}") from None
