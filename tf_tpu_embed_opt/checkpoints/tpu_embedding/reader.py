"""Embedding tables with their optimizer state in the `TPUEmbedding` checkpoint layout.

`TPUEmbedding` (and `TPUEmbeddingForServing`, which writes and reads the same
object graph on CPU) tracks each table `T` as a child variable `T` of the
embedding object and each slot `s` of `T`'s optimizer as a child variable
`T/s`, so a `tf.train.Checkpoint(embedding=...)` holds the keys
`embedding/T/.ATTRIBUTES/VARIABLE_VALUE` and `embedding/T.Ss/...` ('/' in a
local name is escaped as '.S', '.' as '..'). The slot names are the inputs of
the algorithm's `LoadTPUEmbedding*Parameters` op, i.e. `Slot.name` of its
definition.

`TPUCheckpointReader` reads such a checkpoint one table at a time, as table
states (`{"parameters": array[vocab, dim], <Slot.name>: array, ...}`, the
`protocol.TableReader` every format's reader is); the layout's writer
(`tpu_embedding.writer`, with `check_table_state`) writes them.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import trackable_object_graph_pb2

from tf_tpu_embed_opt.checkpoints import formats
from tf_tpu_embed_opt.checkpoints.protocol import Evidence, TableReader, row_bounds
from tf_tpu_embed_opt.checkpoints.shared import table_info
from tf_tpu_embed_opt.checkpoints.shared.bundles import (
    bytes_present_and_needed,
    open_bundle,
)
from tf_tpu_embed_opt.checkpoints.shared.keys import (
    VALUE_SUFFIX,
    checked_step_path,
    checkpoint_key,
    unescape,
    variable_at,
)
from tf_tpu_embed_opt.checkpoints.shared.table_info import (
    TableInfo,
    algorithms_for_slots,
)
from tf_tpu_embed_opt.definitions import registry, spec

__all__ = [
    "PARAMETERS",
    "TableInfo",
    "TPUCheckpointReader",
    "algorithms_for_slots",
    "checkpoint_key",
    "describe",
    "detect",
    "open_reader",
]

PARAMETERS = table_info.PARAMETERS

_OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"

# Where the package records each table's algorithm (JSON {table: name}) for
# the embedding object at a path: `ALGORITHMS_KEY + "/" + object path`. No
# object of the graph points at it, so TensorFlow's restore never sees it.
ALGORITHMS_KEY = "_TF_TPU_EMBED_OPT_ALGORITHMS"
_SAVE_COUNTER = "save_counter"
# TensorFlow's `tpu_embedding_v3_utils.SPARSECORE_LAYOUTS_CHECKPOINT_KEY`.
_SPARSE_CORE_LAYOUTS = "_sparse_core_table_layouts"
# What TensorFlow's checkpoint reader raises on a damaged file (a short read
# of a truncated data file comes as IndexError).
_READ_ERRORS = (tf.errors.OpError, ValueError, IndexError, RuntimeError)
_ENGINE_SLOT_NAMES = frozenset(s.name for d in registry.DEFINITIONS for s in d.slots)


def _object_graph(reader: Any, path: str, prefix: str) -> Any:
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    try:
        graph.ParseFromString(reader.get_tensor(_OBJECT_GRAPH_KEY))
    except _READ_ERRORS as error:
        if _OBJECT_GRAPH_KEY in reader.get_variable_to_shape_map():
            raise ValueError(_damage_report(reader, path, prefix, error)) from None
        raise ValueError(
            f"Checkpoint {path!r} has no object graph ({_OBJECT_GRAPH_KEY}): it "
            "was not written by tf.train.Checkpoint."
        ) from None
    return graph


def _damage_report(reader: Any, path: str, prefix: str, error: Exception) -> str:
    """What a checkpoint whose object graph cannot be read has lost.

    TensorFlow writes the object graph as the last tensor of the data file, so
    any truncation cuts it; the index still names every tensor. Each one is
    probed by reading its last row (a cut file loses a tensor's end first),
    and the variables that cannot be read are named as the object graph would
    have placed them (`<path>/<table>` and `<path>/<table>/<slot>`).
    """
    shapes = reader.get_variable_to_shape_map()
    dtypes = reader.get_variable_to_dtype_map()
    lost = []
    for key in sorted(shapes):
        if key == _OBJECT_GRAPH_KEY or not key.endswith(VALUE_SUFFIX):
            continue
        shape = shapes[key]
        where = _slice_spec(shape, shape[0] - 1, 1) if shape and shape[0] else ""
        try:
            tf.raw_ops.RestoreV2(
                prefix=prefix,
                tensor_names=[key],
                shape_and_slices=[where],
                dtypes=[dtypes[key]],
            )
        except _READ_ERRORS:
            lost.append(_variable_text(key, shapes))
    present, needed = bytes_present_and_needed(reader, prefix)
    truncated = (
        f" Its data files hold {present} bytes, fewer than the {needed} its "
        "variables alone need: the checkpoint is truncated."
        if present < needed
        else ""
    )
    if lost:
        what = "it cannot read " + ", ".join(lost) + ", nor its object graph"
    else:
        what = (
            "every variable the index names reads, but the object graph, which "
            "TensorFlow writes last and which says where each belongs, does not"
        )
    return (
        f"Checkpoint {path!r} is damaged: {what} ({_OBJECT_GRAPH_KEY}: "
        f"{type(error).__name__}: {str(error).strip()[:200]}).{truncated} "
        "Nothing was loaded; restore the checkpoint from a good copy."
    )


def _variable_text(key: str, keys: Any) -> str:
    """`embedding/T.Ss/.ATTRIBUTES/VARIABLE_VALUE` -> "table 'T', slot 's'"
    (`_as_slot`, its table a variable of the checkpoint's `keys`)."""
    *objects, local = key[: -len(VALUE_SUFFIX)].split("/")
    name = unescape(local)
    parents = tuple(unescape(o) for o in objects)
    where = f" (under {'/'.join(parents)})" if objects else ""
    found = _as_slot(name, lambda table: checkpoint_key(parents, table) in keys)
    if found:
        return f"table {found[0]!r}, slot {found[1]!r}{where}"
    if objects:
        return f"table {name!r}{where}"
    return f"variable {name!r}"


def _variable_key(node: Any) -> Optional[str]:
    for attribute in node.attributes:
        if attribute.name == "VARIABLE_VALUE":
            return attribute.checkpoint_key
    return None


def _as_slot(
    name: str, is_variable: Callable[[str], bool]
) -> Optional[Tuple[str, str]]:
    """`(table, slot)` if the local name `name` is a slot's, else None.

    A slot is tracked as `<table>/<slot>`; table names may hold '/' too, so
    a name is a slot when its last part is an engine slot name and the rest
    is a variable (`is_variable`). (Tables named `T` and `T/<slot name>` are
    ambiguous in TensorFlow's naming itself.)
    """
    table, _, slot = name.rpartition("/")
    if slot in _ENGINE_SLOT_NAMES and is_variable(table):
        return table, slot
    return None


def _tables_under(graph: Any, node_id: int) -> Dict[str, Dict[str, str]]:
    """{table: {"parameters" or slot: checkpoint key}} of one embedding node."""
    children = graph.nodes[node_id].children
    variables = {}
    for child in children:
        key = _variable_key(graph.nodes[child.node_id])
        if key is not None:
            variables[child.local_name] = key
    slots = {}
    for name in variables:
        found = _as_slot(name, variables.__contains__)
        if found:
            slots[name] = found
    tables: Dict[str, Dict[str, str]] = {}
    for name, key in variables.items():
        if name not in slots:
            tables.setdefault(name, {})[PARAMETERS] = key
    for name, (table, slot) in slots.items():
        if table in tables:
            tables[table][slot] = variables[name]
    return tables


def _find_embedding(graph: Any) -> List[Tuple[str, ...]]:
    """Object paths of nodes that hold tables with slots (`T` and `T/s`)."""
    return _paths_where(
        graph,
        lambda node_id: any(
            len(keys) > 1 for keys in _tables_under(graph, node_id).values()
        ),
    )


def _row_sparse_layers(graph: Any) -> List[Tuple[str, ...]]:
    """Object paths of the package's row-sparse layers (`layers.Embedding`:
    its table and step counter), as a checkpoint of a Keras model holds them."""
    return _paths_where(
        graph,
        lambda node_id: (
            {"_embeddings", "_table_step"}
            <= {c.local_name for c in graph.nodes[node_id].children}
        ),
    )


def _paths_where(graph: Any, holds: Callable[[int], bool]) -> List[Tuple[str, ...]]:
    """Object paths of the nodes that `holds`, breadth first, each node once."""
    found = []
    seen = set()
    queue: List[Tuple[int, Tuple[str, ...]]] = [(0, ())]
    while queue:
        node_id, path = queue.pop(0)
        if node_id in seen:
            continue
        seen.add(node_id)
        if holds(node_id):
            found.append(path)
        for child in graph.nodes[node_id].children:
            queue.append((child.node_id, (*path, child.local_name)))
    return found


def _refuse_keras_model(graph: Any, prefix: str) -> None:
    """Refuses a TensorFlow checkpoint of a Keras model whose tables are the
    package's row-sparse layers: their state is the model's, not a
    `TPUEmbedding`'s, and goes through the model."""
    layers = ["/".join(p) for p in _row_sparse_layers(graph)]
    if layers:
        raise ValueError(
            f"Checkpoint {prefix!r}: a TensorFlow checkpoint of a Keras model "
            f"whose tables are tf_tpu_embed_opt.layers.Embedding layers (at "
            f"{layers}), which is not read here: restore it into its model "
            "(tf.train.Checkpoint(model=model).read(path)) and write the "
            "tables with tf_tpu_embed_opt.save_tpu_checkpoint."
        )


class TPUCheckpointReader(TableReader):
    """Reads the tables and slots of a `TPUEmbedding` checkpoint, one table at a time.

    Example:

    ```python
    reader = TPUCheckpointReader("/tmp/ckpt-1")
    for name, info in reader.tables.items():
        state = reader.read(name)  # {"parameters": ..., "accumulators": ...}
    ```

    Args:
      path: A checkpoint prefix (`dir/ckpt-1`) or a directory with a
        `checkpoint` state file.
      object_path: Local names from the checkpoint's root to the embedding
        object, as a '/'-separated string (`"embedding"`,
        `"model/tpu_embedding"`). `None`: the one object in the checkpoint
        holding tables with slots (tables without slots, as with SGD, need
        `object_path`).
      step_path: Where `step` reads the training step, '/'-separated from the
        root (`"global_step"`); `None`: at `"step"`, where the package
        writes it (`None` where no variable is there).

    Attributes:
      tables: Table name -> `TableInfo`.
      algorithms: Table name -> its algorithm (in a tuple, as the other
        readers give the algorithms a checkpoint allows), where the package
        wrote the checkpoint and recorded them; empty otherwise (the slots
        then tell, `TableInfo.algorithms`).

    Raises:
      TypeError: `object_path` or `step_path` is no string.
      ValueError: `path` is not a checkpoint, `object_path` does not lead to
        tables, or no single embedding object is found.
    """

    format = formats.TPU_EMBEDDING.name
    row_reads = "device"

    def __init__(
        self,
        path: str,
        object_path: Optional[str] = None,
        step_path: Optional[str] = None,
    ) -> None:
        self.step_path = checked_step_path(step_path, "TPUCheckpointReader")
        self.prefix, self._reader = open_bundle(path)
        self.path = self.prefix
        graph = _object_graph(self._reader, path, self.prefix)
        if object_path is None:
            candidates = _find_embedding(graph)
            if not candidates:
                _refuse_keras_model(graph, self.prefix)
            if len(candidates) != 1:
                described = [("/".join(c) or "<root>") for c in candidates]
                raise ValueError(
                    f"Checkpoint {self.prefix!r}: "
                    + (
                        "no object holds embedding tables with slots"
                        if not candidates
                        else f"several objects hold embedding tables: {described}"
                    )
                    + "; pass `object_path` (e.g. 'embedding')."
                )
            self.object_path = candidates[0]
        else:
            if not isinstance(object_path, str):
                raise TypeError(
                    "`object_path` must be a '/'-separated string such as "
                    f"'embedding'; received {object_path!r}."
                )
            self.object_path = tuple(p for p in object_path.split("/") if p)
        node_id = 0
        for depth, name in enumerate(self.object_path):
            children = {c.local_name: c.node_id for c in graph.nodes[node_id].children}
            if name not in children:
                raise ValueError(
                    f"Checkpoint {self.prefix!r}: `object_path` "
                    f"{'/'.join(self.object_path)!r} does not exist; "
                    f"{'/'.join(self.object_path[:depth]) or '<root>'} has "
                    f"{sorted(children)}."
                )
            node_id = children[name]
        self._refuse_sparse_core(graph, node_id)
        shapes = self._reader.get_variable_to_shape_map()
        # A table is [rows, dim]: the scalars beside the tables of an object
        # (the root's save counter and step) are none.
        keys = {
            table: table_keys
            for table, table_keys in _tables_under(graph, node_id).items()
            if len(shapes.get(table_keys[PARAMETERS], (0, 0))) == 2
        }
        if not keys:
            raise ValueError(
                f"Checkpoint {self.prefix!r}: object "
                f"{'/'.join(self.object_path)!r} holds no tables."
            )
        dtypes = self._reader.get_variable_to_dtype_map()
        self.tables: Dict[str, TableInfo] = {}
        for table, table_keys in keys.items():
            missing = [k for k in table_keys.values() if k not in shapes]
            if missing:
                raise ValueError(
                    f"Checkpoint {self.prefix!r}: table {table!r} is in the "
                    f"object graph but its values {missing} are not in the "
                    "checkpoint."
                )
            slot_names = tuple(sorted(k for k in table_keys if k != PARAMETERS))
            self.tables[table] = TableInfo(
                name=table,
                shape=tuple(shapes[table_keys[PARAMETERS]]),
                dtype=dtypes[table_keys[PARAMETERS]].as_numpy_dtype.__name__,
                slots=slot_names,
                keys=dict(table_keys),
                slot_shapes={s: tuple(shapes[table_keys[s]]) for s in slot_names},
                slot_dtypes={
                    s: dtypes[table_keys[s]].as_numpy_dtype.__name__ for s in slot_names
                },
            )
        self.algorithms = self._recorded_algorithms(shapes)

    def _recorded_algorithms(self, keys: Any) -> Dict[str, Tuple[spec.Definition]]:
        """Each table's algorithm as the package recorded it when it wrote
        the checkpoint (`ALGORITHMS_KEY`), of the tables whose algorithm it
        knew (null for another: its slots tell); {} for a checkpoint without
        the record (TensorFlow's own). A record that leaves a table out, or
        names an algorithm the table's slots do not fit, is refused."""
        key = f"{ALGORITHMS_KEY}/{'/'.join(self.object_path)}"
        if key not in keys:
            return {}
        try:
            recorded = json.loads(self._reader.get_tensor(key))
            found = {
                table: registry.BY_NAME[recorded[table]]
                for table in self.tables
                if recorded[table] is not None
            }
        except (*_READ_ERRORS, KeyError, TypeError) as error:
            raise ValueError(
                f"Checkpoint {self.prefix!r} is damaged: its record of the "
                f"tables' algorithms ({key}) cannot be read for tables "
                f"{sorted(self.tables)} ({type(error).__name__}: {error})."
            ) from None
        for table, definition in found.items():
            if definition not in self.tables[table].algorithms:
                raise ValueError(
                    f"Checkpoint {self.prefix!r} is damaged: it records "
                    f"{definition.name} for table {table!r}, whose slots "
                    f"{list(self.tables[table].slots)} are not that "
                    "algorithm's."
                )
        return {table: (definition,) for table, definition in found.items()}

    def _refuse_sparse_core(self, graph: Any, node_id: int) -> None:
        # TPUEmbeddingV2 (SparseCore) stacks, pads and shards tables and
        # records how in this string; its variables are not per-table tables.
        for child in graph.nodes[node_id].children:
            if child.local_name != _SPARSE_CORE_LAYOUTS:
                continue
            key = _variable_key(graph.nodes[child.node_id])
            if key is not None and self._reader.get_tensor(key):
                raise ValueError(
                    f"Checkpoint {self.prefix!r}: object "
                    f"{'/'.join(self.object_path)!r} holds SparseCore "
                    f"(TPUEmbeddingV2) stacked and sharded tables "
                    f"({_SPARSE_CORE_LAYOUTS}); unshard them first (see "
                    "tf_tpu_embed_opt.sparsecore_layout)."
                )

    def read(self, name: str) -> Dict[str, np.ndarray]:
        """The table state of table `name`.

        Raises:
          KeyError: No such table.
          ValueError: The data cannot be read (truncated or corrupted file);
            the message names the table and the slot.
        """
        return {slot: self.read_tensor(name, slot) for slot in self._info(name).keys}

    def read_tensor(self, name: str, slot: str) -> np.ndarray:
        """One tensor of table `name`: `"parameters"` or a slot.

        Lets a loader hold one tensor at a time instead of a table and all of
        its slots.

        Raises:
          KeyError: No such table or slot.
          ValueError: The data cannot be read; the message names both.
        """
        info = self._check_key(name, slot)
        try:
            return self._reader.get_tensor(info.keys[slot])
        except _READ_ERRORS as error:
            raise ValueError(
                f"Checkpoint {self.prefix!r}: table {name!r}, "
                f"{'the table' if slot == PARAMETERS else 'slot ' + repr(slot)}"
                f" cannot be read (truncated or corrupted?): "
                f"{type(error).__name__}: {str(error).strip()[:300]}"
            ) from None

    def read_rows(
        self,
        name: str,
        slot: str,
        rows: Tuple[int, int],
        device: Optional[str] = None,
    ) -> tf.Tensor:
        """Rows `rows` (`start, stop`) of one tensor of table `name`, on `device`.

        For a table sharded over parameter servers: with the device of a shard,
        the host of that device (its server) reads the shard's rows from the
        checkpoint's files, which it must reach, and the rows do not pass
        through the calling process. A tensor saved as slices is read from the
        slices holding the rows; one saved whole is read by that host and cut
        to them (TensorFlow's checkpoint reader).

        Args:
          name: The table.
          slot: `"parameters"` or a slot name.
          rows: `(start, stop)`, `0 <= start <= stop <= vocabulary size`.
          device: Where to read (its host CPU); `None`: this process.

        Returns:
          A `tf.Tensor` of shape `(stop - start, dim)` on the host of `device`.

        Raises:
          KeyError: No such table or slot.
          TypeError: `rows` is not two ints.
          ValueError: `rows` out of range, or the data cannot be read; the
            message names the table and the slot.
        """
        info = self._check_key(name, slot)
        shape, dtype = info.shape_of(slot), info.dtype_of(slot)
        start, stop = row_bounds(name, rows)
        if not 0 <= start <= stop <= shape[0]:
            raise ValueError(
                f"Table {name!r}: `rows` must be (start, stop) with 0 <= start <= "
                f"stop <= {shape[0]}; received {rows!r}."
            )
        where = _slice_spec(shape, start, stop - start)
        host = (
            contextlib.nullcontext() if device is None else tf.device(_host_of(device))
        )
        if start == stop:
            # `RestoreV2` refuses an empty slice; there is nothing to read.
            with host:
                return tf.zeros((0, *shape[1:]), tf.as_dtype(dtype))
        try:
            with host:
                (value,) = tf.raw_ops.RestoreV2(
                    prefix=self.prefix,
                    tensor_names=[info.keys[slot]],
                    shape_and_slices=[where],
                    dtypes=[tf.as_dtype(dtype)],
                )
        except _READ_ERRORS as error:
            raise ValueError(
                f"Checkpoint {self.prefix!r}: table {name!r}, "
                f"{'the table' if slot == PARAMETERS else 'slot ' + repr(slot)}"
                f" rows {start}:{stop} cannot be read (truncated or corrupted?): "
                f"{type(error).__name__}: {str(error).strip()[:300]}"
            ) from None
        return value

    def read_scalar(self, object_path: str) -> Any:
        """The value of a scalar variable at `object_path` (e.g. a step counter).

        Raises:
          ValueError: No variable there.
        """
        has, get = self._reader.has_tensor, self._reader.get_tensor
        return variable_at(self.prefix, object_path, has, get)

    def __repr__(self) -> str:
        return (
            f"TPUCheckpointReader({self.prefix!r}, object_path="
            f"{'/'.join(self.object_path)!r}, tables={sorted(self.tables)})"
        )


def detect(evidence: Evidence) -> bool:
    """Format `"tpu-embedding"`: every TensorFlow checkpoint no other format
    claims (tried last; its handler, with `open_reader` and `describe`)."""
    return True


def open_reader(
    path: str, object_path: Optional[str] = None, step_path: Optional[str] = None
) -> TPUCheckpointReader:
    return TPUCheckpointReader(path, object_path, step_path)


def describe(
    path: str, object_path: Optional[str] = None, step_path: Optional[str] = None
) -> Dict[str, Any]:
    reader = TPUCheckpointReader(path, object_path, step_path)
    tables = [
        {
            "table": name,
            "shape": list(info.shape),
            "dtype": info.dtype,
            "slots": list(info.slots),
            "algorithms": [d.name for d in info.algorithms],
            "bytes": info.nbytes,
        }
        for name, info in sorted(reader.tables.items())
    ]
    return {
        "checkpoint": reader.prefix,
        "object_path": "/".join(reader.object_path),
        "step": reader.step,
        "tables": tables,
    }


def _slice_spec(shape: Sequence[int], start: int, rows: int) -> str:
    # `SaveV2`/`RestoreV2`'s `shape_and_slices` entry for rows start:start+rows
    # of a tensor of `shape`: the full shape, then `start,length` per axis
    # (`-`: all of it).
    axes = [f"{start},{rows}"] + ["-"] * (len(shape) - 1)
    return " ".join(str(int(d)) for d in shape) + " " + ":".join(axes)


def _host_of(device: str) -> str:
    # `SaveV2` runs on a CPU: the host of the shard's device, as TensorFlow's
    # own saver places it (`saveable_object_util.set_cpu0`).
    return (
        tf.DeviceSpec.from_string(device)
        .replace(device_type="CPU", device_index=0)
        .to_string()
    )
