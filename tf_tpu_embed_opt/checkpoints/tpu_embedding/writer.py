"""Writing table states in the `TPUEmbedding` checkpoint layout.

`write_tpu_checkpoint` writes each table (and its slots) as its own data
shard, tables sharded over parameter servers shard by shard on their servers,
and makes the checkpoint discoverable (its `.index` file) only once every table
is written; `check_table_state` checks each table state it is given. The
layout and the table-state contract are described in
`tf_tpu_embed_opt.checkpoints.tpu_embedding.reader`.
"""

from __future__ import annotations

import json
from typing import (
    Any,
    Dict,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
)

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import trackable_object_graph_pb2
from tensorflow.python.distribute import sharded_variable

from tf_tpu_embed_opt import lazy
from tf_tpu_embed_opt.checkpoints.protocol import Tables, pairs_of
from tf_tpu_embed_opt.checkpoints.shared import paths
from tf_tpu_embed_opt.checkpoints.shared.algorithms import definition_of
from tf_tpu_embed_opt.checkpoints.shared.bundles import Staging
from tf_tpu_embed_opt.checkpoints.shared.keys import STEP_PATH, checkpoint_key
from tf_tpu_embed_opt.checkpoints.shared.table_info import algorithms_for_slots
from tf_tpu_embed_opt.checkpoints.tpu_embedding.reader import (
    _OBJECT_GRAPH_KEY,
    _SAVE_COUNTER,
    ALGORITHMS_KEY,
    PARAMETERS,
    _host_of,
    _slice_spec,
)
from tf_tpu_embed_opt.definitions import registry, spec

__all__ = ["check_table_state", "write", "write_tpu_checkpoint"]


def check_table_state(
    table: str,
    state: Mapping[str, Any],
    definition: Optional[spec.Definition] = None,
    shape: Optional[Tuple[int, ...]] = None,
) -> None:
    """Raises unless `state` is a complete table state (of `definition`).

    Args:
      table: The table's name, for messages.
      state: The table state (see the module docstring).
      definition: If given, the slots must be exactly its slots; else they
        must be those of some algorithm (`algorithms_for_slots`).
      shape: If given, the table's required shape.

    Raises:
      TypeError: `state` is not a mapping of arrays, or `definition` no
        `Definition`.
      ValueError: Missing or extra slots, or shapes / dtypes that differ; the
        message names the table and the slot.
    """
    if definition is not None and not isinstance(definition, spec.Definition):
        raise TypeError(
            "check_table_state: argument `definition` must be a Definition "
            "(e.g. tf_tpu_embed_opt.definitions.registry.BY_NAME['Adam']); "
            f"received {definition!r}."
        )
    if not isinstance(state, Mapping):
        raise TypeError(
            f"Table {table!r}: the table state must be a dict of arrays keyed "
            f"by 'parameters' and slot names; received {type(state).__name__}."
        )
    if PARAMETERS not in state:
        raise ValueError(
            f"Table {table!r}: the table state lacks {PARAMETERS!r}; it has "
            f"{sorted(state)}."
        )
    found = set(state) - {PARAMETERS}
    if definition is not None:
        expected = {s.name for s in definition.slots}
        if found != expected:
            fits = ", ".join(d.name for d in algorithms_for_slots(found)) or "none"
            raise ValueError(
                f"Table {table!r}: slots {sorted(found)} are not those of "
                f"{definition.name} ({sorted(expected)}); missing "
                f"{sorted(expected - found)}, extra {sorted(found - expected)}. "
                f"Algorithms with these slots: {fits}."
            )
    elif not algorithms_for_slots(found):
        # Read back, its slots would be no table's (a misspelled or Keras
        # slot name, `accumulator`, is none of the engine's).
        known = "; ".join(
            f"{d.name} {[s.name for s in d.slots]}"
            for d in registry.DEFINITIONS
            if d.slots
        )
        raise ValueError(
            f"Table {table!r}: slots {sorted(found)} are no "
            f"algorithm's; each algorithm's slots are named as the engine names "
            f"them: {known}."
        )
    table_shape, table_dtype = _shape_and_dtype(state[PARAMETERS])
    if shape is not None and table_shape != tuple(shape):
        raise ValueError(
            f"Table {table!r}: 'parameters' has shape {table_shape}; "
            f"expected {tuple(shape)}."
        )
    if len(table_shape) != 2:
        raise ValueError(
            f"Table {table!r}: 'parameters' must have rank 2 (vocabulary, dim); "
            f"received shape {table_shape}."
        )
    if not _floating(table_dtype):
        raise ValueError(
            f"Table {table!r}: 'parameters' has dtype {table_dtype}; a table "
            "and its slots must be of a floating dtype."
        )
    for name, value in state.items():
        value_shape, value_dtype = _shape_and_dtype(value)
        if value_shape != table_shape:
            raise ValueError(
                f"Table {table!r}: slot {name!r} has shape {value_shape}; the "
                f"table has {table_shape}."
            )
        if value_dtype != table_dtype:
            raise ValueError(
                f"Table {table!r}: slot {name!r} has dtype {value_dtype}; "
                f"expected the table's floating dtype {table_dtype}."
            )


def _floating(dtype: np.dtype) -> bool:
    """Whether TensorFlow takes `dtype` for a float: NumPy's, and bfloat16
    (ml_dtypes', which NumPy does not count among its floats)."""
    try:
        return tf.as_dtype(dtype).is_floating
    except TypeError:
        return False


def _shape_and_dtype(value: Any) -> Tuple[Tuple[int, ...], np.dtype]:
    # From the attributes, so that a tf.Tensor is not copied into NumPy.
    if isinstance(value, np.ndarray) or not hasattr(value, "dtype"):
        value = np.asarray(value)
        return tuple(value.shape), value.dtype
    dtype = getattr(value.dtype, "as_numpy_dtype", value.dtype)
    return tuple(int(d) for d in value.shape), np.dtype(dtype)


def _graph_for(
    object_path: Tuple[str, ...],
    local_names: Sequence[str],
    step_path: Optional[Tuple[str, ...]],
) -> bytes:
    """The object graph of the root, the embedding object and its variables."""
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.nodes.add()

    def child(parent: int, name: str) -> int:
        for reference in graph.nodes[parent].children:
            if reference.local_name == name:
                return reference.node_id
        graph.nodes.add()
        node_id = len(graph.nodes) - 1
        graph.nodes[parent].children.add(node_id=node_id, local_name=name)
        return node_id

    def variable(path: Tuple[str, ...]) -> None:
        parent = 0
        for name in path[:-1]:
            parent = child(parent, name)
        node = graph.nodes[child(parent, path[-1])]
        node.attributes.add(
            name="VARIABLE_VALUE",
            full_name=path[-1],
            checkpoint_key=checkpoint_key(path[:-1], path[-1]),
        )

    for name in local_names:
        variable((*object_path, name))
    # As `tf.train.Checkpoint.save` writes it; a `tf.train.Checkpoint` that
    # restores creates its `save_counter` and expects a value for it.
    variable((_SAVE_COUNTER,))
    if step_path:
        variable(step_path)
    for node in graph.nodes:
        node.has_checkpoint_values.value = True
    return graph.SerializeToString()


# The step is stored as an int64 scalar, as Keras's and TensorFlow's counters.
_LARGEST_STEP = int(np.iinfo(np.int64).max)


def _write_tpu_checkpoint(
    prefix: str,
    tables: Tables,
    *,
    object_path: str = "embedding",
    algorithms: Optional[Mapping[str, spec.Definition]] = None,
    step: Optional[int] = None,
    step_path: str = STEP_PATH,
    _argument: str = "prefix",
) -> str:
    """Writes table states in the `TPUEmbedding` checkpoint layout.

    The result restores into a `TPUEmbedding` / `TPUEmbeddingForServing` with
    the same tables and optimizers through
    `tf.train.Checkpoint(**{object_path: embedding}).restore(prefix)`.
    Each table is written as soon as it is produced (its own data shard), so
    `tables` may be a generator holding one table at a time. The checkpoint's
    `.index` file, which makes it discoverable, is moved into place last: an
    interrupted write leaves no checkpoint at `prefix` (only a temporary
    directory next to it, removed on a Python exception).

    A `ShardedVariable` in a table state is written shard by shard, each
    shard as a slice of the key by the host of the shard's device (its
    parameter server), which must reach `prefix`'s directory; its rows do not
    pass through the calling process.

    Args:
      prefix: The checkpoint prefix to write (`dir/ckpt`); an existing
        checkpoint with that prefix is replaced.
      tables: `(table name, table state)` pairs (see the module docstring),
        or a mapping table name -> table state.
      object_path: Local names from the root to the embedding object,
        '/'-separated.
      algorithms: Optional algorithm of each table; its slots must be exactly
        those of the table state, and every table must be listed (`None`
        for one whose algorithm is not known: its slots tell what they
        can). The checkpoint records them (`TPUCheckpointReader.algorithms`),
        where TensorFlow's restore does not look.
      step: Optional training step to store as an int64 scalar variable.
      step_path: Where to store `step`, '/'-separated from the root.
      _argument: What the caller calls `prefix`, in errors
        (`write_checkpoint`'s `path`).

    Returns:
      `prefix`.

    Raises:
      ValueError: A table state is incomplete or does not match its algorithm,
        a table name repeats or is missing from `algorithms`; nothing is
        written.
    """
    prefix = paths.writable_prefix(prefix, _argument)
    for name, value in (("object_path", object_path), ("step_path", step_path)):
        if not isinstance(value, str):
            raise TypeError(
                f"`{name}` must be a '/'-separated string; received {value!r}."
            )
    path = tuple(p for p in object_path.split("/") if p)
    if not path:
        raise ValueError(
            f"`object_path` must name an object; received {object_path!r}."
        )
    steps = tuple(p for p in step_path.split("/") if p) if step is not None else None
    if steps == ():
        raise ValueError(
            f"`step_path` must name where `step` goes, e.g. 'step'; received "
            f"{step_path!r} (the step would not be written)."
        )
    if step is not None and (
        isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0
    ):
        raise ValueError(f"`step` must be an integer >= 0; received {step!r}.")
    if step is not None and step > _LARGEST_STEP:
        raise ValueError(
            f"`step` must be an integer >= 0; received {step!r}, more than the "
            f"int64 step variable holds (at most {_LARGEST_STEP})."
        )
    with Staging(prefix, _argument) as staging:
        names = _save_tables(tables, algorithms, path, staging)
        if not names:
            raise ValueError("`tables` is empty; a checkpoint needs at least one.")
        graph_names = [_OBJECT_GRAPH_KEY, checkpoint_key((), _SAVE_COUNTER)]
        graph_values = [
            tf.constant(_graph_for(path, names, steps)),
            tf.constant(1, tf.int64),
        ]
        if steps:
            graph_names.append(checkpoint_key(steps[:-1], steps[-1]))
            graph_values.append(tf.constant(int(step), tf.int64))
        if algorithms is not None:
            # What the slots cannot tell (Adagrad and ProximalAdagrad keep the
            # same ones), for `open_checkpoint(...).algorithm(table)`.
            graph_names.append(f"{ALGORITHMS_KEY}/{'/'.join(path)}")
            recorded = {t: None if d is None else d.name for t, d in algorithms.items()}
            graph_values.append(tf.constant(json.dumps(recorded, sort_keys=True)))
        staging.save(graph_names, [""] * len(graph_names), graph_values)
        staging.publish()
    return prefix


def _save_tables(
    tables: Any,
    algorithms: Optional[Mapping[str, Any]],
    path: Tuple[str, ...],
    staging: Staging,
) -> List[str]:
    """Saves each table and its slots as bundles in `staging`, one table at a
    time; returns their names relative to the embedding object, in order."""
    names: List[str] = []
    seen = set()
    for table, state in pairs_of(tables):
        if table in seen:
            raise ValueError(f"Table {table!r} is given twice.")
        seen.add(table)
        definition = None
        if algorithms is not None:
            if table not in algorithms:
                raise ValueError(
                    f"Table {table!r} has no entry in `algorithms` "
                    f"(which lists {sorted(algorithms)})."
                )
            definition = algorithms[table]
        check_table_state(table, state, definition)
        _check_float32(table, state)
        # The table first, then its slots, as TensorFlow creates them.
        local = [table] + [f"{table}/{s}" for s in state if s != PARAMETERS]
        arrays = [state[PARAMETERS]] + [state[s] for s in state if s != PARAMETERS]
        for device, keys, slices, tensors in _save_groups(
            [checkpoint_key(path, n) for n in local], arrays
        ):
            staging.save(keys, slices, tensors, device)
        names.extend(local)
    if algorithms is not None and set(algorithms) - seen:
        raise ValueError(
            f"Tables {sorted(set(algorithms) - seen)} are in `algorithms` "
            "but were not given."
        )
    return names


def _check_float32(table: str, state: Mapping[str, Any]) -> None:
    """Refuses a table state of another dtype than float32, which
    `TPUEmbedding` and `TPUEmbeddingForServing` create their tables and
    slots in: their restore fails on it ("expected dtype float does not
    equal original dtype half")."""
    dtype = _shape_and_dtype(state[PARAMETERS])[1]
    if dtype != np.float32:
        raise ValueError(
            f"Table {table!r}: 'parameters' and its slots have dtype {dtype}; "
            "TPUEmbedding stores float32 (convert it explicitly)."
        )


def _row_shards(value: Any) -> Optional[List[Any]]:
    """The shards of a `ShardedVariable` (row ranges, in order), else None."""
    if isinstance(value, sharded_variable.ShardedVariableMixin):
        return list(value.variables)
    return None


def _save_groups(
    keys: Sequence[str], values: Sequence[Any]
) -> Iterator[Tuple[Optional[str], List[str], List[str], List[Any]]]:
    """`(device, keys, shape_and_slices, tensors)` for each `SaveV2` of a table.

    Whole values are saved together, by the calling process. A row-sharded
    value is saved as one slice per shard, by the shard's own device, with
    the other values' shards on that device: its rows never pass through the
    calling process (as TensorFlow's own saver does for sharded variables).
    Restoring the key without a slice reads the assembled whole tensor.
    """
    whole: Tuple[List[str], List[Any]] = ([], [])
    by_device: Dict[str, Tuple[List[str], List[str], List[Any]]] = {}
    for key, value in zip(keys, values):
        parts = _row_shards(value)
        if parts is None:
            whole[0].append(key)
            whole[1].append(value)
            continue
        shape = [int(d) for d in value.shape]
        start = 0
        for part in parts:
            rows = int(part.shape[0])
            group = by_device.setdefault(_host_of(part.device), ([], [], []))
            group[0].append(key)
            group[1].append(_slice_spec(shape, start, rows))
            group[2].append(part)
            start += rows
    if whole[0]:
        yield None, whole[0], [""] * len(whole[0]), whole[1]
    for device, (names, slices, tensors) in by_device.items():
        yield device, names, slices, tensors


def write(prefix: str, tables: Any, **arguments: Any) -> str:
    """`write_checkpoint(prefix, tables, format="tpu-embedding", ...)`:
    `algorithms` may name each table's algorithm in any form
    `shared.algorithms.definition_of` takes, or `None` (not known)."""
    if arguments.get("algorithms") is not None:
        if not isinstance(arguments["algorithms"], Mapping):
            raise TypeError(
                "write_checkpoint: format 'tpu-embedding' takes `algorithms` as "
                "a mapping {table: algorithm}; received "
                f"{arguments['algorithms']!r}."
            )
        arguments["algorithms"] = {
            name: None
            if value is None
            else definition_of(value, f"`algorithms[{name!r}]`")
            for name, value in arguments["algorithms"].items()
        }
    # The front door calls the prefix `path`: its refusals say so.
    return _write_tpu_checkpoint(prefix, tables, _argument="path", **arguments)


write_tpu_checkpoint = lazy.deprecated(
    _write_tpu_checkpoint,
    "tf_tpu_embed_opt.write_tpu_checkpoint",
    "tf_tpu_embed_opt.checkpoints.write_checkpoint(prefix, tables)",
)
