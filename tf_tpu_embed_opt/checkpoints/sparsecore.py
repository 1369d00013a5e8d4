"""SparseCore checkpoints: unshard `TPUEmbeddingV2` state into tables, and back.

`TPUEmbeddingV2` (TensorFlow's SparseCore embedding) stacks tables that share
the embedding width and the optimizer into one variable per stack, pads their
rows and columns, deals the rows round-robin over the SparseCores (rotated per
table) and saves, next to the stacked variables and their slot variables, the
`SparseCoreTableLayouts` proto that says where each table lives. TensorFlow
converts unsharded -> sharded and sharded -> resharded on restore, but not
sharded -> unsharded. This module does both directions on the host, one
stacked table at a time:

- `read_tables(path, optimizer)` yields `(table_name, state)` for every table
  of a `TPUEmbeddingV2` checkpoint, `state` being
  `{"parameters": array[vocab, dim], <slot>: array[vocab, dim], ...}` with
  the slots named as the algorithm's engine slots (`Slot.name`, e.g. Adam's
  `momenta` and `velocities`).
- `write_checkpoint(path, layouts, states, optimizer)` writes such states in
  the stacked, padded, sharded form `TPUEmbeddingV2` itself saves (object
  graph, keys, per-device slices and the layouts proto), which a
  `TPUEmbeddingV2` restores directly when its layouts are the same and
  through TensorFlow's `EmbeddingReshardCallback` when they differ (in
  TensorFlow 2.20 only when both stack the same tables together), and which
  `TPUEmbeddingForServing` restores on CPU.
- `stack_layouts(feature_config, optimizer, num_replicas=...)` computes the
  layouts a TPU job's `TPUEmbeddingV2` will use, on CPU.
- `describe_checkpoint(path)` says what a checkpoint holds without reading
  its tensors.

The layout facts, with their sources in TensorFlow, are in
docs/tpu_semantics.md, section "SparseCore checkpoint layout".
"""

import glob
import inspect
import os
import shutil
import tempfile
from typing import (
    Any,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Union,
)

import numpy as np

from tf_tpu_embed_opt.checkpoints import keys as checkpoint_keys
from tf_tpu_embed_opt.definitions import registry, spec

__all__ = [
    "LAYOUTS_KEY",
    "PARAMETERS",
    "SparseCoreCheckpointReader",
    "checkpoint_key",
    "describe_checkpoint",
    "group_layouts",
    "parse_layouts",
    "read_layouts",
    "read_tables",
    "shard_tables",
    "stack_layouts",
    "unshard_table",
    "write_checkpoint",
]

# The name under which TPUEmbeddingV2 tracks its layouts proto
# (tpu_embedding_v3_utils.SPARSECORE_LAYOUTS_CHECKPOINT_KEY).
LAYOUTS_KEY = "_sparse_core_table_layouts"
# The key of the table itself in a table's state (TPUEmbeddingV2's
# `_PARAMETER_NAME`, the name TensorFlow's `variables` dicts use).
PARAMETERS = "parameters"

_OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
_VALUE_SUFFIX = checkpoint_keys.VALUE_SUFFIX

OptimizerLike = Any
Layout = Any  # tensorflow.tpu.SparseCoreTableLayout


def _layout_pb2():
    try:
        from tensorflow.core.tpu.kernels import sparse_core_layout_pb2
    except ImportError as error:  # pragma: no cover - depends on the TF build
        raise ImportError(
            "tf_tpu_embed_opt.sparsecore_layout needs TensorFlow's "
            "tensorflow.core.tpu.kernels.sparse_core_layout_pb2, which this "
            "TensorFlow does not ship."
        ) from error
    return sparse_core_layout_pb2


def checkpoint_key(object_path: str, stacked_table: str, slot: str = PARAMETERS) -> str:
    """The checkpoint key of a stacked table's parameters or one of its slots.

    `TPUEmbeddingV2` creates the stacked table as the dependency
    `<stacked_table>` and each slot as `<stacked_table>/<slot>` of the
    embedding object; `object_path` is the path of local names from the
    checkpoint's root to that object, e.g. `"embedding"` for
    `tf.train.Checkpoint(embedding=mid_level_api)`.
    """
    local = stacked_table if slot == PARAMETERS else f"{stacked_table}/{slot}"
    return checkpoint_keys.checkpoint_key(object_path.split("/"), local)


def _layouts_key(object_path: str) -> str:
    return checkpoint_keys.checkpoint_key(object_path.split("/"), LAYOUTS_KEY)


# --------------------------------------------------------------------------
# Layouts


def parse_layouts(data: Union[bytes, Any]) -> List[Layout]:
    """The table layouts of a serialized `SparseCoreTableLayouts`, validated.

    Args:
      data: The serialized proto (what `TPUEmbeddingV2` stores under
        `_sparse_core_table_layouts`), a `SparseCoreTableLayouts` message or
        an iterable of `SparseCoreTableLayout` messages.

    Raises:
      ValueError: The bytes do not parse, or a layout is inconsistent (see
        `group_layouts`); the message names the table.
    """
    pb2 = _layout_pb2()
    if isinstance(data, (bytes, bytearray)):
        message = pb2.SparseCoreTableLayouts()
        try:
            message.ParseFromString(bytes(data))
        except Exception as error:  # protobuf raises DecodeError or RuntimeError
            raise ValueError(
                "The SparseCore layouts are not a serialized "
                f"SparseCoreTableLayouts proto ({len(data)} bytes): {error}"
            ) from None
        layouts = list(message.tables)
    elif isinstance(data, pb2.SparseCoreTableLayouts):
        layouts = list(data.tables)
    else:
        layouts = list(data)
        for layout in layouts:
            if not isinstance(layout, pb2.SparseCoreTableLayout):
                raise TypeError(
                    "Expected SparseCoreTableLayout messages; received "
                    f"{layout!r} of type {type(layout).__name__}."
                )
    group_layouts(layouts)
    return layouts


def _check_layout(layout: Layout) -> None:
    name = layout.table_name
    where = f"SparseCore layout of table {name!r}"
    if not name:
        raise ValueError(f"A SparseCore layout has no table_name: {layout}")
    if not layout.stacked_table_name:
        raise ValueError(f"{where}: stacked_table_name is empty.")
    n = layout.num_sparse_cores
    if n < 1:
        raise ValueError(f"{where}: num_sparse_cores must be >= 1; received {n}.")
    partitions = layout.num_partitions
    if partitions < 1 or n % partitions:
        raise ValueError(
            f"{where}: num_partitions must be >= 1 and divide num_sparse_cores "
            f"({n}); received {partitions}."
        )
    shape, padded = list(layout.unsharded_shape), list(layout.unsharded_padded_shape)
    if len(shape) != 2 or min(shape) < 1:
        raise ValueError(
            f"{where}: unsharded_shape must be [rows >= 1, columns >= 1]; "
            f"received {shape}."
        )
    if len(padded) != 2 or padded[0] < shape[0] or padded[1] < shape[1]:
        raise ValueError(
            f"{where}: unsharded_padded_shape must be two sizes at least "
            f"unsharded_shape {shape}; received {padded}."
        )
    if padded[0] % n:
        raise ValueError(
            f"{where}: padded rows {padded[0]} are not a multiple of "
            f"num_sparse_cores {n}."
        )
    offset, rotation = (
        layout.sparse_core_shard_row_offset,
        layout.sparse_core_shard_rotation,
    )
    if offset < 0 or rotation < 0:
        raise ValueError(
            f"{where}: sparse_core_shard_row_offset ({offset}) and "
            f"sparse_core_shard_rotation ({rotation}) must be >= 0."
        )
    if offset + padded[0] // n > layout.total_rows_per_sparse_core_shard:
        raise ValueError(
            f"{where}: its rows [{offset}, {offset + padded[0] // n}) in each "
            "SparseCore shard exceed total_rows_per_sparse_core_shard "
            f"{layout.total_rows_per_sparse_core_shard}."
        )


def group_layouts(layouts: Iterable[Layout]) -> Dict[str, List[Layout]]:
    """The layouts by stacked table, each stack ordered by row offset.

    Stacks come in the order of their names, as `TPUEmbeddingV2` builds them.

    Raises:
      ValueError: A table appears twice, a layout is inconsistent in itself,
        the tables of a stack disagree on the shard geometry or the padded
        width, or their rows overlap; the message names the tables.
    """
    stacks: Dict[str, List[Layout]] = {}
    seen = set()
    for layout in layouts:
        _check_layout(layout)
        if layout.table_name in seen:
            raise ValueError(f"Table {layout.table_name!r} has two SparseCore layouts.")
        seen.add(layout.table_name)
        stacks.setdefault(layout.stacked_table_name, []).append(layout)
    grouped = {}
    for stacked in sorted(stacks):
        members = sorted(stacks[stacked], key=lambda t: t.sparse_core_shard_row_offset)
        first = members[0]
        geometry = _geometry(first)
        end = 0
        for layout in members:
            if _geometry(layout) != geometry:
                raise ValueError(
                    f"Tables {first.table_name!r} and {layout.table_name!r} of "
                    f"stacked table {stacked!r} disagree on (num_sparse_cores, "
                    "num_partitions, total_rows_per_sparse_core_shard, padded "
                    f"columns): {geometry} vs {_geometry(layout)}."
                )
            if layout.sparse_core_shard_row_offset < end:
                raise ValueError(
                    f"Table {layout.table_name!r} of stacked table {stacked!r} "
                    f"starts at row {layout.sparse_core_shard_row_offset} of each "
                    f"SparseCore shard, inside the previous table's rows (up to "
                    f"{end})."
                )
            end = (
                layout.sparse_core_shard_row_offset
                + layout.unsharded_padded_shape[0] // layout.num_sparse_cores
            )
        grouped[stacked] = members
    return grouped


def _geometry(layout: Layout) -> Tuple[int, int, int, int]:
    return (
        layout.num_sparse_cores,
        layout.num_partitions,
        layout.total_rows_per_sparse_core_shard,
        layout.unsharded_padded_shape[1],
    )


def _stacked_shape(layout: Layout) -> Tuple[int, int]:
    return (
        layout.num_sparse_cores * layout.total_rows_per_sparse_core_shard,
        layout.unsharded_padded_shape[1],
    )


def stack_layouts(
    feature_config: Any,
    optimizer: Any = None,
    *,
    num_replicas: int,
    sparse_cores_per_chip: int = 4,
    sparse_core_embedding_config: Any = None,
) -> List[Layout]:
    """The layouts `TPUEmbeddingV2` computes for a feature config, on CPU.

    Runs TensorFlow's own stacking (`_stack_tables_with_same_table_dim_and_
    optimizer`, with the C++ `SparseCoreLayoutStacker`) on copies of the
    configs, as `TPUEmbeddingV2.__init__` does, so a checkpoint for a TPU job
    can be written without the TPU. The user's configs are not changed.

    Args:
      feature_config: The nested `FeatureConfig`s the TPU job passes to
        `TPUEmbeddingV2`; every feature needs its `output_shape` (the stacker
        sizes buffers from it).
      optimizer: The job's global embedding optimizer (tables without their
        own take it).
      num_replicas: `strategy.num_replicas_in_sync` of the TPU job (the
        layouts' `num_partitions`).
      sparse_cores_per_chip: SparseCores per chip
        (`tpu_hardware_feature.num_embedding_devices_per_chip`; TensorFlow's
        fallback is 4).
      sparse_core_embedding_config: The job's `SparseCoreEmbeddingConfig`, if
        any (e.g. `disable_table_stacking=True`).

    Returns:
      One layout per table, in table-name order.

    Raises:
      ValueError: A count is not a positive integer, a feature has no fully
        defined `output_shape`, or TensorFlow refuses the configs.
      NotImplementedError: This TensorFlow's stacking function is missing or
        takes other arguments.
    """
    import tensorflow as tf
    from tensorflow.python.tpu import tpu_embedding_base, tpu_embedding_v3
    from tensorflow.python.util import nest

    for name, value in (
        ("num_replicas", num_replicas),
        ("sparse_cores_per_chip", sparse_cores_per_chip),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(
                f"stack_layouts: `{name}` must be a positive int; received {value!r}."
            )
    for feature in nest.flatten(feature_config):
        shape = getattr(feature, "output_shape", None)
        if shape is None or not shape.is_fully_defined() or not shape.rank:
            raise ValueError(
                f"stack_layouts: feature {getattr(feature, 'name', feature)!r} needs "
                f"a fully defined `output_shape` (the batch shape TPUEmbeddingV2 "
                f"sizes its buffers with); received {shape}."
            )
    stack = getattr(
        tpu_embedding_v3, "_stack_tables_with_same_table_dim_and_optimizer", None
    )
    expected = [
        "table_config",
        "flat_features",
        "num_partitions",
        "num_sc_per_partition",
        "sparse_core_embedding_config",
    ]
    if stack is None or list(inspect.signature(stack).parameters) != expected:
        raise NotImplementedError(
            "stack_layouts needs TPUEmbeddingV2's stacking function "
            "(_stack_tables_with_same_table_dim_and_optimizer) with the arguments "
            f"{expected}; this TensorFlow ({tf.__version__}) has another one."
        )
    # TPUEmbeddingV2 stacks clones (tables get their padded sizes written into
    # them) after TPUEmbeddingBase has given tables the global optimizer.
    base = tpu_embedding_base.TPUEmbeddingBase(
        tpu_embedding_v3._clone_feature_config(feature_config), optimizer
    )
    stacking = stack(
        base._table_config,
        nest.flatten_with_joined_string_paths(base._feature_config),
        num_replicas,
        sparse_cores_per_chip,
        sparse_core_embedding_config,
    )
    return [stacking.table_to_layout[name] for name in sorted(stacking.table_to_layout)]


# --------------------------------------------------------------------------
# The arithmetic of the layout


def unshard_table(stacked: np.ndarray, layout: Layout) -> np.ndarray:
    """One table, unpadded, out of its stacked and sharded variable.

    The stacked variable is `num_sparse_cores` equal shards of rows; the
    table holds rows `[offset, offset + padded_rows / num_sparse_cores)` of
    every shard, its row `r` in shard `(r + rotation) % num_sparse_cores` at
    position `offset + r // num_sparse_cores`; padding is cut off.

    Args:
      stacked: The whole stacked variable (array or tensor), of shape
        `[num_sparse_cores * total_rows_per_sparse_core_shard, padded_columns]`.
      layout: The table's `SparseCoreTableLayout`.

    Returns:
      A new C-contiguous array of `layout.unsharded_shape`.

    Raises:
      ValueError: `stacked` does not have the stacked shape the layout implies.
    """
    _check_layout(layout)
    stacked = np.asarray(stacked)
    expected = _stacked_shape(layout)
    if tuple(stacked.shape) != expected:
        raise ValueError(
            f"Stacked table {layout.stacked_table_name!r} (holding table "
            f"{layout.table_name!r}) has shape {tuple(stacked.shape)}; its "
            f"SparseCore layout needs {expected}."
        )
    n = layout.num_sparse_cores
    size = layout.unsharded_padded_shape[0] // n
    offset = layout.sparse_core_shard_row_offset
    rows, columns = layout.unsharded_shape
    shards = stacked.reshape(n, layout.total_rows_per_sparse_core_shard, -1)
    rotation = layout.sparse_core_shard_rotation
    # Row j·n + k of the table is row offset + j of shard (k + rotation) mod n:
    # one strided copy per shard, straight into the table's memory.
    table = np.empty((size, n, columns), dtype=stacked.dtype)
    for k in range(n):
        table[:, k, :] = shards[(k + rotation) % n, offset : offset + size, :columns]
    table = table.reshape(size * n, columns)
    return np.ascontiguousarray(table[:rows])


def shard_tables(
    tables: Mapping[str, np.ndarray],
    layouts: Sequence[Layout],
    *,
    dtype: Any = np.float32,
) -> np.ndarray:
    """The stacked, padded, sharded variable of one stack of tables.

    The inverse of `unshard_table` for every table of the stack; padding rows
    and columns are zeros, as TensorFlow's own unsharded -> sharded
    conversion writes them.

    Args:
      tables: Every table of the stack by name, each of its
        `unsharded_shape`.
      layouts: The layouts of one stacked table.
      dtype: The dtype of the result.

    Raises:
      ValueError: The layouts are not one consistent stack, or a table is
        missing, unknown or of the wrong shape (the message names it).
    """
    grouped = group_layouts(layouts)
    if len(grouped) != 1:
        raise ValueError(
            f"shard_tables: `layouts` must describe one stacked table; received "
            f"the stacked tables {sorted(grouped)}."
        )
    ((stacked_name, members),) = grouped.items()
    names = [layout.table_name for layout in members]
    unknown = sorted(set(tables) - set(names))
    if unknown:
        raise ValueError(
            f"shard_tables: tables {unknown} are not in stacked table "
            f"{stacked_name!r} (its tables: {names})."
        )
    first = members[0]
    n = first.num_sparse_cores
    stacked = np.zeros(_stacked_shape(first), dtype=dtype)
    shards = stacked.reshape(n, first.total_rows_per_sparse_core_shard, -1)
    for layout in members:
        if layout.table_name not in tables:
            raise ValueError(
                f"shard_tables: table {layout.table_name!r} of stacked table "
                f"{stacked_name!r} is missing."
            )
        value = np.asarray(tables[layout.table_name])
        rows, columns = layout.unsharded_shape
        if value.shape != (rows, columns):
            raise ValueError(
                f"shard_tables: table {layout.table_name!r} has shape "
                f"{value.shape}; its SparseCore layout says ({rows}, {columns})."
            )
        offset = layout.sparse_core_shard_row_offset
        rotation = layout.sparse_core_shard_rotation
        # Rows k, k + n, k + 2n, ... go to shard (k + rotation) mod n from row
        # `offset` on; the rest of the table's part of the shard stays zero.
        for k in range(min(n, rows)):
            part = value[k::n]
            shard = shards[(k + rotation) % n]
            shard[offset : offset + len(part), :columns] = part
    return stacked


# --------------------------------------------------------------------------
# Algorithms


def _definition(optimizer: OptimizerLike, what: str) -> spec.Definition:
    if isinstance(optimizer, spec.Definition):
        return optimizer
    if isinstance(optimizer, str):
        if optimizer in registry.BY_NAME:
            return registry.BY_NAME[optimizer]
        raise ValueError(
            f"{what}: unknown algorithm {optimizer!r}; allowed: "
            f"{sorted(registry.BY_NAME)}."
        )
    from tf_tpu_embed_opt.embedding import parameters as embedding

    try:
        return embedding.definition_of(optimizer)
    except TypeError as error:
        raise TypeError(f"{what}: {error}") from None


def _definitions_by_table(
    optimizer: Union[OptimizerLike, Mapping[str, OptimizerLike]],
    stacks: Mapping[str, List[Layout]],
) -> Dict[str, spec.Definition]:
    """Each stacked table's algorithm, from one optimizer or one per table."""
    tables = {layout.table_name for members in stacks.values() for layout in members}
    if isinstance(optimizer, Mapping):
        unknown = sorted(set(optimizer) - tables)
        if unknown:
            raise ValueError(
                f"`optimizer` names tables {unknown} that the SparseCore layouts "
                f"do not have (tables: {sorted(tables)})."
            )
        missing = sorted(tables - set(optimizer))
        if missing:
            raise ValueError(
                f"`optimizer` has no optimizer for tables {missing}; give one "
                "per table or a single optimizer for all."
            )
        by_table = {
            name: _definition(value, f"`optimizer` of table {name!r}")
            for name, value in optimizer.items()
        }
    else:
        definition = _definition(optimizer, "`optimizer`")
        by_table = {name: definition for name in tables}
    result = {}
    for stacked, members in stacks.items():
        found = {id(d): d for d in (by_table[t.table_name] for t in members)}
        if len(found) != 1:
            raise ValueError(
                f"Tables {[t.table_name for t in members]} share stacked table "
                f"{stacked!r}, so TPUEmbeddingV2 gave them one optimizer; "
                f"`optimizer` gives them {sorted(d.name for d in found.values())}."
            )
        result[stacked] = next(iter(found.values()))
    return result


def _slot_names(definition: spec.Definition) -> List[str]:
    return [slot.name for slot in definition.slots]


# --------------------------------------------------------------------------
# Reading


class _Reader:
    """TensorFlow's checkpoint reader, with its errors as ValueError naming the
    path and the key, and a check that the data files are not truncated."""

    def __init__(self, path: Any):
        import tensorflow as tf

        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(
                f"`path` must be a checkpoint path (str); received {path!r} of "
                f"type {type(path).__name__}."
            )
        self.path = os.fspath(path)
        prefix = self.path
        if os.path.isdir(prefix):
            prefix = tf.train.latest_checkpoint(prefix) or prefix
        try:
            self._reader = tf.train.load_checkpoint(prefix)
            self.shapes = self._reader.get_variable_to_shape_map()
            self.dtypes = self._reader.get_variable_to_dtype_map()
        except Exception as error:  # TensorFlow raises its own error classes
            raise ValueError(
                f"{self.path!r} is not a readable TensorFlow checkpoint: "
                f"{_first_line(error)}"
            ) from None
        # The data files hold every tensor's bytes uncompressed: smaller files
        # mean a truncated checkpoint, found before anything is converted.
        unsized = (tf.string, tf.variant, tf.resource)
        needed = sum(
            int(np.prod(shape, dtype=np.int64)) * self.dtypes[key].size
            for key, shape in self.shapes.items()
            if self.dtypes[key] not in unsized
        )
        data = glob.glob(glob.escape(prefix) + ".data-*")
        present = sum(os.path.getsize(name) for name in data)
        if present < needed:
            raise ValueError(
                f"The checkpoint {self.path!r} is truncated: its data files hold "
                f"{present} bytes, its tensors need at least {needed}."
            )

    def get(self, key: str) -> Any:
        try:
            return self._reader.get_tensor(key)
        except Exception as error:  # TensorFlow raises its own error classes
            raise ValueError(
                f"Cannot read {key!r} from the checkpoint {self.path!r} (corrupted "
                f"or truncated?): {_first_line(error)}"
            ) from None


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"


def _find_object_path(keys: Iterable[str], object_path: Optional[str]) -> str:
    suffix = f"/{LAYOUTS_KEY}{_VALUE_SUFFIX}"
    found = sorted(key[: -len(suffix)] for key in keys if key.endswith(suffix))
    if object_path is not None:
        wanted = _layouts_key(object_path)[: -len(suffix)]
        if wanted not in found:
            raise ValueError(
                f"The checkpoint has no SparseCore layouts under object path "
                f"{object_path!r} (found them under {found})."
            )
        return object_path
    if not found:
        raise ValueError(
            "The checkpoint has no SparseCore layouts (no key ending in "
            f"{suffix!r}): it was not written by TPUEmbeddingV2."
        )
    if len(found) > 1:
        raise ValueError(
            f"The checkpoint holds several SparseCore embeddings ({found}); "
            "pass `object_path` to choose one."
        )
    # Keys hold escaped local names; undo the escaping for the caller.
    return "/".join(checkpoint_keys.unescape(part) for part in found[0].split("/"))


def read_layouts(
    path: str, *, object_path: Optional[str] = None
) -> Tuple[str, List[Layout]]:
    """The object path and the table layouts stored in a SparseCore checkpoint.

    Args:
      path: The checkpoint prefix (or a directory with a `checkpoint` file).
      object_path: The path of the embedding object from the checkpoint's
        root (e.g. `"embedding"`); needed only when the checkpoint holds more
        than one SparseCore embedding.

    Raises:
      ValueError: Not a readable checkpoint, no layouts in it, or corrupted
        layouts.
    """
    reader = _Reader(path)
    object_path = _find_object_path(reader.shapes, object_path)
    return object_path, parse_layouts(reader.get(_layouts_key(object_path)))


def read_tables(
    path: str,
    optimizer: Union[OptimizerLike, Mapping[str, OptimizerLike]],
    *,
    object_path: Optional[str] = None,
) -> Iterator[Tuple[str, Dict[str, np.ndarray]]]:
    """Unshards a `TPUEmbeddingV2` checkpoint into per-table states.

    Every check (layouts, keys, slots, shapes, dtypes) runs before the first
    table is yielded; then one stacked table with its slots is read at a time.

    Args:
      path: The checkpoint prefix.
      optimizer: The tables' embedding optimizer (an instance of
        `tf_tpu_embed_opt.embedding` or `tf.tpu.experimental.embedding`, an
        algorithm definition or its name such as `"Adam"`), or a mapping from
        every table name to one. The checkpoint must hold exactly its slots.
      object_path: See `read_layouts`.

    Yields:
      `(table_name, {"parameters": array, <engine slot name>: array, ...})`,
      stacked tables in name order, their tables in row-offset order.

    Raises:
      ValueError: The checkpoint is unreadable, has no or corrupted layouts, a
        variable of a stacked table is missing or has another shape or dtype
        than the layouts imply, it holds slots of another algorithm, or
        `optimizer` does not fit the tables; the message names the table
        and the slot.
    """
    reader, object_path, plan = _read_plan(path, optimizer, object_path)
    return _unshard_stacks(reader, object_path, plan)


def _read_plan(
    path: str,
    optimizer: Union[OptimizerLike, Mapping[str, OptimizerLike]],
    object_path: Optional[str],
) -> Tuple[Any, str, List[Tuple[str, List[Layout], List[str]]]]:
    """Checks a checkpoint against its layouts and `optimizer` (see `read_tables`).

    Returns:
      The reader, the object path and, per stacked table, its name, its
      member layouts and its slot names.
    """
    reader = _Reader(path)
    shapes, dtypes = reader.shapes, reader.dtypes
    object_path = _find_object_path(shapes, object_path)
    stacks = group_layouts(parse_layouts(reader.get(_layouts_key(object_path))))
    definitions = _definitions_by_table(optimizer, stacks)
    plan = []
    for stacked, members in stacks.items():
        slots = _slot_names(definitions[stacked])
        names = [layout.table_name for layout in members]
        expected_shape = list(_stacked_shape(members[0]))
        for slot in [PARAMETERS] + slots:
            key = checkpoint_key(object_path, stacked, slot)
            what = (
                f"stacked table {stacked!r} (tables {names})"
                if slot == PARAMETERS
                else f"slot {slot!r} of stacked table {stacked!r} (tables {names})"
            )
            if key not in shapes:
                raise ValueError(
                    f"The checkpoint has no {what} for {definitions[stacked].name}: "
                    f"key {key!r} is missing."
                )
            if list(shapes[key]) != expected_shape:
                raise ValueError(
                    f"The {what} has shape {list(shapes[key])} in the checkpoint; "
                    f"its SparseCore layouts need {expected_shape}."
                )
            if dtypes[key].name != "float32":
                raise ValueError(
                    f"The {what} has dtype {dtypes[key].name} in the checkpoint; "
                    "TPUEmbeddingV2 stores float32."
                )
        present = _slots_in_checkpoint(shapes, object_path, stacked)
        extra = sorted(present - set(slots))
        if extra:
            raise ValueError(
                f"Stacked table {stacked!r} (tables {names}) has slots {extra} "
                f"in the checkpoint, which {definitions[stacked].name} does not "
                f"have (its slots: {slots}): the optimizer does not match."
            )
        plan.append((stacked, members, slots))
    return reader, object_path, plan


class SparseCoreCheckpointReader:
    """A `TPUEmbeddingV2` checkpoint as a table source of `checkpoints`.

    `tf_tpu_embed_opt.load_into_keras` (and anything else that takes a table
    source: an object with `tables` and `read(name)`) reads SparseCore
    checkpoints through it, so that a table trained on SparseCore continues on
    CPU/GPU with its optimizer state::

        source = sparsecore_layout.SparseCoreCheckpointReader(path, optimizer)
        teo.load_into_keras(source, model, keras_optimizer)

    Every check of `read_tables` runs when it is made. `read(name)` unshards
    the table's stacked variable and slots; the last stack read is kept, so
    reading the tables of one stack in turn reads it once, and no more than one
    stack is held.

    Args:
      path: The checkpoint prefix (or a directory: its latest checkpoint).
      optimizer: As in `read_tables`.
      object_path: As in `read_tables`.

    Attributes:
      tables: Table name -> `checkpoints.TableInfo` (unpadded shape, float32,
        the optimizer's engine slots; `keys` are those of the stacked
        variables the table lives in).
    """

    def __init__(
        self,
        path: str,
        optimizer: Union[OptimizerLike, Mapping[str, OptimizerLike]],
        *,
        object_path: Optional[str] = None,
    ) -> None:
        from tf_tpu_embed_opt.checkpoints import tpu_layout as checkpoints

        self._reader, self._object_path, plan = _read_plan(path, optimizer, object_path)
        self.prefix = self._reader.path
        self._stacks: Dict[str, Tuple[str, Layout, List[str]]] = {}
        tables = {}
        for stacked, members, slots in plan:
            keys = {
                slot: checkpoint_key(self._object_path, stacked, slot)
                for slot in [PARAMETERS] + slots
            }
            for layout in members:
                shape = tuple(int(n) for n in layout.unsharded_shape)
                self._stacks[layout.table_name] = (stacked, layout, slots)
                tables[layout.table_name] = checkpoints.TableInfo(
                    name=layout.table_name,
                    shape=shape,
                    dtype="float32",
                    slots=tuple(sorted(slots)),
                    keys=keys,
                    slot_shapes={slot: shape for slot in slots},
                    slot_dtypes={slot: "float32" for slot in slots},
                )
        self.tables = tables
        self._cached: Tuple[Optional[str], Dict[str, np.ndarray]] = (None, {})

    def read(self, name: str) -> Dict[str, np.ndarray]:
        """The state of table `name`: `{"parameters": ..., <slot>: ...}`."""
        if name not in self._stacks:
            raise ValueError(
                f"Checkpoint {self.prefix!r} has no table {name!r}; its tables: "
                f"{sorted(self.tables)}."
            )
        stacked, layout, slots = self._stacks[name]
        if self._cached[0] != stacked:
            self._cached = (None, {})  # free the last stack before the next
            values = {
                slot: self._reader.get(checkpoint_key(self._object_path, stacked, slot))
                for slot in [PARAMETERS] + slots
            }
            self._cached = (stacked, values)
        return {
            slot: unshard_table(value, layout)
            for slot, value in self._cached[1].items()
        }

    def read_scalar(self, object_path: str) -> Any:
        """The value of a variable at `object_path` (e.g. a step counter).

        Raises:
          ValueError: No variable there.
        """
        parts = object_path.split("/")
        key = checkpoint_keys.checkpoint_key(parts[:-1], parts[-1])
        if key not in self._reader.shapes:
            raise ValueError(
                f"Checkpoint {self.prefix!r} has no variable at {object_path!r} "
                f"(key {key!r})."
            )
        return self._reader.get(key)

    def __repr__(self) -> str:
        return (
            f"SparseCoreCheckpointReader({self.prefix!r}, tables={sorted(self.tables)})"
        )


def _slots_in_checkpoint(shapes: Iterable[str], object_path: str, stacked: str) -> set:
    head = checkpoint_key(object_path, stacked, "\0").split("\0")[0]
    return {
        checkpoint_keys.unescape(key[len(head) : -len(_VALUE_SUFFIX)])
        for key in shapes
        if key.startswith(head)
        and key.endswith(_VALUE_SUFFIX)
        and "/" not in key[len(head) : -len(_VALUE_SUFFIX)]
    }


def describe_checkpoint(
    path: str, *, object_path: Optional[str] = None
) -> List[Dict[str, Any]]:
    """What a SparseCore checkpoint holds, per stacked table, without reading it.

    Only the layouts proto is read; shapes, slots and sizes come from the
    checkpoint's index.

    Args:
      path: The checkpoint prefix.
      object_path: See `read_layouts`.

    Returns:
      One dict per stacked table, in name order: `stacked_table`, `shape` (of
      the stacked variable in the checkpoint, `None` if it is missing),
      `tables` (name -> unpadded `[rows, columns]`, in row-offset order),
      `slots` (the slot variables present, sorted), `algorithms` (the names
      of the algorithms whose engine slots are exactly those) and `bytes` (of
      the stacked variable and its slots).

    Raises:
      ValueError: As `read_layouts`.
    """
    reader = _Reader(path)
    object_path = _find_object_path(reader.shapes, object_path)
    stacks = group_layouts(parse_layouts(reader.get(_layouts_key(object_path))))
    result = []
    for stacked, members in stacks.items():
        slots = sorted(_slots_in_checkpoint(reader.shapes, object_path, stacked))
        keys = [checkpoint_key(object_path, stacked, s) for s in [PARAMETERS] + slots]
        present = [key for key in keys if key in reader.shapes]
        result.append(
            {
                "stacked_table": stacked,
                "shape": (
                    list(reader.shapes[keys[0]]) if keys[0] in reader.shapes else None
                ),
                "tables": {t.table_name: list(t.unsharded_shape) for t in members},
                "slots": slots,
                "algorithms": [
                    d.name
                    for d in registry.DEFINITIONS
                    if sorted(_slot_names(d)) == slots
                ],
                "bytes": sum(
                    int(np.prod(reader.shapes[key], dtype=np.int64))
                    * reader.dtypes[key].size
                    for key in present
                ),
            }
        )
    return result


def _unshard_stacks(
    reader: Any, object_path: str, plan: List[Tuple[str, List[Layout], List[str]]]
) -> Iterator[Tuple[str, Dict[str, np.ndarray]]]:
    for stacked, members, slots in plan:
        values = {
            slot: reader.get(checkpoint_key(object_path, stacked, slot))
            for slot in [PARAMETERS] + slots
        }
        for layout in members:
            yield (
                layout.table_name,
                {slot: unshard_table(value, layout) for slot, value in values.items()},
            )
        del values


# --------------------------------------------------------------------------
# Writing


def _object_graph(
    object_path: str, stacks: Mapping[str, List[str]], workdir: str
) -> bytes:
    """The object graph `TPUEmbeddingV2` saves, made by TensorFlow itself.

    A skeleton with the same dependencies (one tiny variable per stacked
    table and slot, tracked under `<stacked>` and `<stacked>/<slot>` as
    `TPUEmbeddingV2._create_variables` does, and the layouts under
    `_sparse_core_table_layouts`) is written with `tf.train.Checkpoint`; the
    graph does not depend on the variables' shapes.
    """
    import tensorflow as tf
    from tensorflow.python.trackable import autotrackable

    parts = object_path.split("/")
    embedding = autotrackable.AutoTrackable()
    expected = {_OBJECT_GRAPH_KEY, _layouts_key(object_path)}
    for stacked, slots in stacks.items():
        for slot in [PARAMETERS] + slots:
            local = stacked if slot == PARAMETERS else f"{stacked}/{slot}"
            embedding._track_trackable(tf.Variable(0.0, name=local), name=local)
            expected.add(checkpoint_key(object_path, stacked, slot))
    embedding._track_trackable(
        tf.Variable(b"", dtype=tf.string, name=LAYOUTS_KEY), name=LAYOUTS_KEY
    )
    node = embedding
    for part in reversed(parts[1:]):
        parent = autotrackable.AutoTrackable()
        parent._track_trackable(node, name=part)
        node = parent
    skeleton = os.path.join(workdir, "object-graph")
    tf.train.Checkpoint(**{parts[0]: node}).write(skeleton)
    reader = tf.train.load_checkpoint(skeleton)
    written = set(reader.get_variable_to_shape_map())
    if written != expected:  # a bug in this module, never the user's input
        raise RuntimeError(
            f"Checkpoint keys differ from TensorFlow's: {sorted(written ^ expected)}"
        )
    graph = reader.get_tensor(_OBJECT_GRAPH_KEY)
    for name in os.listdir(workdir):
        if name.startswith("object-graph"):
            os.remove(os.path.join(workdir, name))
    return graph


def _save(prefix: str, names: List[str], slices: List[str], tensors: List[Any]) -> None:
    import tensorflow as tf

    tf.raw_ops.SaveV2(
        prefix=prefix,
        tensor_names=names,
        shape_and_slices=slices,
        tensors=[_to_tensor(value) for value in tensors],
    )


def _to_tensor(value: Any) -> Any:
    import tensorflow as tf

    # `tf.constant` copies a large float array several times slower than
    # memcpy; DLPack hands TensorFlow the array's memory (it keeps the array
    # alive). Strings and any array DLPack refuses take the copy.
    if isinstance(value, np.ndarray) and value.dtype == np.float32:
        try:
            return tf.experimental.dlpack.from_dlpack(value.__dlpack__())
        except Exception:  # noqa: BLE001 - any refusal means "copy instead"
            pass
    return tf.constant(value)


def _device_slices(
    stacked: np.ndarray, layout: Layout
) -> Iterator[Tuple[str, np.ndarray]]:
    # TPUEmbeddingShardedSaveable: one slice per device (partition), rows
    # split evenly, under the full shape of the stacked variable.
    rows, columns = stacked.shape
    per_device = rows // layout.num_partitions
    for device in range(layout.num_partitions):
        start = device * per_device
        spec_ = f"{rows} {columns} {start},{per_device}:0,{columns}"
        yield spec_, stacked[start : start + per_device]


def write_checkpoint(
    path: str,
    layouts: Any,
    states: Union[
        Mapping[str, Mapping[str, np.ndarray]],
        Callable[[str], Mapping[str, np.ndarray]],
    ],
    optimizer: Union[OptimizerLike, Mapping[str, OptimizerLike]],
    *,
    object_path: str = "embedding",
) -> str:
    """Writes per-table states as the checkpoint `TPUEmbeddingV2` saves.

    The result has `TPUEmbeddingV2`'s object graph under `object_path`, one
    stacked variable per stacked table and one per slot (saved as one slice
    per device, like `TPUEmbeddingShardedSaveable`), and the layouts proto.
    A `TPUEmbeddingV2` built with the same layouts restores it as is; with
    other layouts TensorFlow's `TpuEmbeddingV3CheckpointAdapter` reshards it
    on restore (TensorFlow 2.20's only between layouts that stack the same
    tables together: write with the job's layouts there);
    `TPUEmbeddingForServing` restores its tables on CPU.

    One stacked table is in memory at a time. The checkpoint is written under
    a temporary name next to `path` and appears (its `.index` file last) only
    when complete; on any error nothing is left behind.

    Args:
      path: The checkpoint prefix to write (`<path>.index`,
        `<path>.data-*`). An existing checkpoint there is replaced.
      layouts: The target layouts: a `SparseCoreTableLayouts` message, its
        bytes or an iterable of `SparseCoreTableLayout` (e.g.
        `TPUEmbeddingV2.embedding_layouts.values()`).
      states: Per table `{"parameters": array, <engine slot name>: array, ...}`,
        as a mapping from table name, a function of the table name (called
        once per table, when its stacked table is written) or an iterable of
        `(table name, state)` pairs in any order (e.g. what `read_tables`
        yields; tables arriving before their stack is due wait in memory).
      optimizer: As in `read_tables`: its slots are the ones written.
      object_path: The path of the embedding object from the checkpoint's root
        (`"embedding"` for `tf.train.Checkpoint(embedding=mid_level_api)`).

    Returns:
      `path`.

    Raises:
      ValueError: Bad layouts; a table of the layouts missing from `states` or
        a table in `states` the layouts do not have; a missing or extra slot;
        an array of the wrong shape or not float32. The message names the
        table and the slot; nothing is written.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(
            f"`path` must be a checkpoint prefix (str); received {path!r} of type "
            f"{type(path).__name__}."
        )
    path = os.fspath(path)
    if not isinstance(object_path, str) or not all(object_path.split("/")):
        raise ValueError(
            "`object_path` must be local names joined by '/', e.g. 'embedding' or "
            f"'model/embedding'; received {object_path!r}."
        )
    parsed = parse_layouts(layouts)
    stacks = group_layouts(parsed)
    definitions = _definitions_by_table(optimizer, stacks)
    tables = [layout.table_name for layout in parsed]
    if isinstance(states, Mapping):
        unknown = sorted(set(states) - set(tables))
        if unknown:
            raise ValueError(
                f"`states` has tables {unknown} that the SparseCore layouts do "
                f"not have (tables: {sorted(tables)})."
            )
        missing = sorted(set(tables) - set(states))
        if missing:
            raise ValueError(f"`states` has no state for tables {missing}.")
        get_state = states.__getitem__
    elif callable(states):
        get_state = states
    elif isinstance(states, Iterable) and not isinstance(states, (str, bytes)):
        get_state = _PairSource(states, tables)
    else:
        raise TypeError(
            "`states` must be a mapping from table name to state, a function of "
            "the table name or an iterable of (table name, state) pairs; "
            f"received {type(states).__name__}."
        )
    # In the caller's order, as TPUEmbeddingV2 saves its `embedding_layouts`.
    layouts_bytes = (
        _layout_pb2().SparseCoreTableLayouts(tables=parsed).SerializeToString()
    )
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix=".sparsecore-tmp-", dir=directory)
    try:
        parts = []
        for stacked, members in stacks.items():
            slots = _slot_names(definitions[stacked])
            member_states = {
                layout.table_name: _checked_state(
                    get_state(layout.table_name), layout, slots, definitions[stacked]
                )
                for layout in members
            }
            # One bundle per variable: only one stacked array exists at a time.
            for slot in [PARAMETERS] + slots:
                value = shard_tables(
                    {name: state[slot] for name, state in member_states.items()},
                    members,
                )
                key = checkpoint_key(object_path, stacked, slot)
                pieces = list(_device_slices(value, members[0]))
                part = os.path.join(workdir, f"part-{len(parts):05d}")
                _save(
                    part,
                    [key] * len(pieces),
                    [spec_ for spec_, _ in pieces],
                    [piece for _, piece in pieces],
                )
                parts.append(part)
                del value, pieces
            del member_states
        if isinstance(get_state, _PairSource):
            get_state.check_exhausted()
        graph = _object_graph(
            object_path,
            {stacked: _slot_names(definitions[stacked]) for stacked in stacks},
            workdir,
        )
        part = os.path.join(workdir, f"part-{len(parts):05d}")
        _save(
            part,
            [_OBJECT_GRAPH_KEY, _layouts_key(object_path)],
            ["", ""],
            [np.array(graph, dtype=object), np.array(layouts_bytes, dtype=object)],
        )
        parts.append(part)
        _publish(parts, path, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return path


class _PairSource:
    """States from an iterable of `(table, state)` pairs, e.g. another reader.

    Pairs are pulled as the stacks need them; tables that arrive before their
    stack is written wait in memory.
    """

    def __init__(self, pairs: Iterable[Tuple[str, Any]], tables: Sequence[str]):
        self._pairs = iter(pairs)
        self._tables = set(tables)
        self._waiting: Dict[str, Any] = {}
        self._seen: set = set()

    def _pull(self) -> bool:
        try:
            item = next(self._pairs)
        except StopIteration:
            return False
        if not (isinstance(item, tuple) and len(item) == 2):
            raise TypeError(
                "`states` must yield (table name, state) pairs; received "
                f"{type(item).__name__}."
            )
        name, state = item
        if name not in self._tables:
            raise ValueError(
                f"`states` has table {name!r}, which the SparseCore layouts do not "
                f"have (tables: {sorted(self._tables)})."
            )
        if name in self._seen:
            raise ValueError(f"`states` has table {name!r} twice.")
        self._seen.add(name)
        self._waiting[name] = state
        return True

    def __call__(self, name: str) -> Any:
        while name not in self._waiting:
            if not self._pull():
                raise ValueError(f"`states` has no state for table {name!r}.")
        return self._waiting.pop(name)

    def check_exhausted(self) -> None:
        # Every table has been taken, so `_pull` raises for any further pair
        # (a repeat or an unknown table) before anything is published.
        self._pull()


def _checked_state(
    state: Any, layout: Layout, slots: List[str], definition: spec.Definition
) -> Dict[str, np.ndarray]:
    table = layout.table_name
    if not isinstance(state, Mapping):
        raise TypeError(
            f"The state of table {table!r} must be a mapping of 'parameters' and "
            f"slot names to arrays; received {type(state).__name__}."
        )
    wanted = [PARAMETERS] + slots
    extra = sorted(set(state) - set(wanted))
    if extra:
        raise ValueError(
            f"The state of table {table!r} has {extra}, which {definition.name} "
            f"does not have (it needs {wanted})."
        )
    result = {}
    for slot in wanted:
        if slot not in state:
            raise ValueError(
                f"The state of table {table!r} has no {slot!r}; "
                f"{definition.name} needs {wanted}."
            )
        value = np.asarray(state[slot])
        if value.dtype != np.float32:
            raise ValueError(
                f"{slot!r} of table {table!r} has dtype {value.dtype}; "
                "TPUEmbeddingV2 stores float32 (convert it explicitly)."
            )
        if value.shape != tuple(layout.unsharded_shape):
            raise ValueError(
                f"{slot!r} of table {table!r} has shape {value.shape}; its "
                f"SparseCore layout says {tuple(layout.unsharded_shape)}."
            )
        result[slot] = value
    return result


def _publish(parts: List[str], path: str, workdir: str) -> None:
    """Merges the parts and moves the checkpoint into place, index last."""
    import tensorflow as tf

    merged = os.path.join(workdir, "merged")
    tf.raw_ops.MergeV2Checkpoints(
        checkpoint_prefixes=parts, destination_prefix=merged, delete_old_dirs=False
    )
    # An older checkpoint at `path` stops being discoverable before its data
    # files are replaced, so no reader ever pairs an old index with new data.
    if os.path.exists(path + ".index"):
        os.remove(path + ".index")
    stale = os.path.basename(path) + ".data-"
    for name in os.listdir(os.path.dirname(os.path.abspath(path))):
        if name.startswith(stale):
            os.remove(os.path.join(os.path.dirname(os.path.abspath(path)), name))
    for name in sorted(os.listdir(workdir)):
        if name.startswith("merged.data-"):
            os.replace(os.path.join(workdir, name), path + name[len("merged") :])
    os.replace(merged + ".index", path + ".index")
