"""SparseCore table layouts: how `TPUEmbeddingV2` stacks, pads and shards tables.

The `SparseCoreTableLayouts` proto a `TPUEmbeddingV2` checkpoint holds says
where each table lives in its stacked variable. This module parses and checks
layouts, computes the layouts a TPU job will use (`stack_layouts`, on CPU),
and moves one table between its unsharded rows and the stacked, padded,
sharded form (`unshard_table`, `shard_tables`). The reader
(`checkpoints.sparsecore.reader`) and the writer (`checkpoints.sparsecore.writer`)
of SparseCore checkpoints build on it; `tf_tpu_embed_opt.sparsecore_layout` is
the public module. The facts, with their sources in TensorFlow, are in
docs/tpu_semantics.md, section "SparseCore checkpoint layout".
"""

import inspect
from typing import (
    Any,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    Sequence,
    Tuple,
    Union,
)

import numpy as np

from tf_tpu_embed_opt.checkpoints.shared import keys as checkpoint_keys
from tf_tpu_embed_opt.checkpoints.shared.paths import checked_int

# The name under which TPUEmbeddingV2 tracks its layouts proto
# (tpu_embedding_v3_utils.SPARSECORE_LAYOUTS_CHECKPOINT_KEY).
LAYOUTS_KEY = "_sparse_core_table_layouts"
# The key of the table itself in a table's state (TPUEmbeddingV2's
# `_PARAMETER_NAME`, the name TensorFlow's `variables` dicts use).
PARAMETERS = "parameters"

_OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
_VALUE_SUFFIX = checkpoint_keys.VALUE_SUFFIX

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
        if isinstance(data, str) or not isinstance(data, Iterable):
            raise TypeError(
                "The SparseCore layouts must be a SparseCoreTableLayouts proto, "
                "its bytes or SparseCoreTableLayout messages (e.g. "
                "`stack_layouts(...)` or `read_layouts(path)`); received "
                f"{data!r} of type {type(data).__name__}."
            )
        layouts = list(data)
        for layout in layouts:
            if not isinstance(layout, pb2.SparseCoreTableLayout):
                raise TypeError(
                    "Expected SparseCoreTableLayout messages; received "
                    f"{layout!r} of type {type(layout).__name__}."
                )
    group_layouts(layouts)
    return layouts


def check_layout(layout: Layout) -> None:
    """Refuses a layout whose fields contradict each other, naming the field.

    Reads only the fields a layout record shares with TensorFlow's
    `SparseCoreTableLayout`, so that jax-tpu-embedding's layouts
    (`jax_orbax.JaxTableLayout`) are checked alike.
    """
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
        check_layout(layout)
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


def stacked_shape(layout: Layout) -> Tuple[int, int]:
    """The shape of the stacked variable that holds the layout's table."""
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
    check_layout(layout)
    stacked = np.asarray(stacked)
    expected = stacked_shape(layout)
    if tuple(stacked.shape) != expected:
        raise ValueError(
            f"Stacked table {layout.stacked_table_name!r} (holding table "
            f"{layout.table_name!r}) has shape {tuple(stacked.shape)}; its "
            f"SparseCore layout needs {expected}."
        )
    rows, columns = layout.unsharded_shape
    return stacked[stacked_rows(layout, 0, rows), :columns]


def stacked_rows(layout: Layout, start: int, stop: int) -> np.ndarray:
    """The rows of the stacked variable that hold the table's rows
    `[start, stop)`, in order (`stacked_index` of those rows)."""
    return stacked_index(layout, np.arange(start, stop, dtype=np.int64))


def stacked_index(layout: Layout, rows: np.ndarray) -> np.ndarray:
    """The rows of the stacked variable that hold the table's rows `rows`:
    row `r` is in SparseCore shard `(r mod n + rotation) mod n` (`n`
    SparseCores), at `sparse_core_shard_row_offset + r // n` of that shard.
    The one index computation of the layout: unsharding, sharding, reading
    row ranges and streaming by shard (`shard_blocks`) all use it."""
    n = layout.num_sparse_cores
    rows = np.asarray(rows, dtype=np.int64)
    shard = (rows % n + layout.sparse_core_shard_rotation) % n
    return (
        shard * layout.total_rows_per_sparse_core_shard
        + layout.sparse_core_shard_row_offset
        + rows // n
    )


def shard_blocks(layout: Layout, block_rows: int) -> Iterator[Tuple[np.ndarray, int]]:
    """The table's rows shard by shard, in blocks of at most `block_rows`
    rows that are contiguous in the stacked variable.

    Yields:
      `(rows, first)`: table rows (a stride of `num_sparse_cores` within one
      SparseCore shard), held by the stacked rows
      `[first, first + len(rows))`. Every table row comes exactly once.
    """
    checked_int(block_rows, "block_rows", "shard_blocks", 1)
    n = layout.num_sparse_cores
    vocabulary = layout.unsharded_shape[0]
    for residue in range(min(n, vocabulary)):
        count = (vocabulary - residue + n - 1) // n
        for begin in range(0, count, block_rows):
            rows = residue + n * np.arange(
                begin, min(count, begin + block_rows), dtype=np.int64
            )
            yield rows, int(stacked_index(layout, rows[:1])[0])


class RowStream:
    """One array of a table (the table or a slot) given as blocks of rows,
    for tables larger than memory: `place_table` and `write_jax_checkpoint`
    take it where they take an array, and hold one block at a time.

    Args:
      shape: The table's unsharded shape, `(rows, columns)`.
      dtype: The values' dtype.
      blocks: Called with no argument, an iterator of `(rows, values)`:
        table rows (an integer array) and their values (`len(rows)` x
        `columns`); together every row once, in any order (e.g. a
        `JaxCheckpointReader.stream`, shard by shard).
    """

    def __init__(
        self,
        shape: Tuple[int, int],
        dtype: Any,
        blocks: Callable[[], Iterable[Tuple[np.ndarray, np.ndarray]]],
    ) -> None:
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        self._blocks = blocks

    def blocks(self) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
        return iter(self._blocks())

    def __repr__(self) -> str:
        return f"RowStream(shape={self.shape}, dtype={self.dtype.name})"


def _pad(stacked: np.ndarray, layout: Layout, pad_value: float) -> None:
    """Sets the table's padding in a stacked array: its padding columns, and
    in each shard the rows of its part after the last row it holds (written
    once, so that a stack in a memory-mapped file is not written twice)."""
    n = layout.num_sparse_cores
    rows, columns = layout.unsharded_shape
    shard_rows = layout.total_rows_per_sparse_core_shard
    offset = layout.sparse_core_shard_row_offset
    size = layout.unsharded_padded_shape[0] // n
    shards = stacked.reshape(n, shard_rows, -1)
    shards[:, offset : offset + size, columns:] = pad_value
    # Each shard's last row of the table, or none (fewer rows than shards).
    ends = {shard: offset for shard in range(n)}
    for last in stacked_index(layout, np.arange(max(0, rows - n), rows)):
        ends[int(last) // shard_rows] = int(last) % shard_rows + 1
    for shard, end in ends.items():
        shards[shard, end : offset + size, :columns] = pad_value


# Rows an array table is placed by at a time (bounds the index arrays).
_PLACE_BLOCK_ROWS = 1 << 20


def shard_tables(
    tables: Mapping[str, np.ndarray],
    layouts: Sequence[Layout],
    *,
    dtype: Any = np.float32,
    pad_value: float = 0.0,
) -> np.ndarray:
    """The stacked, padded, sharded variable of one stack of tables.

    The inverse of `unshard_table` for every table of the stack. A table's
    padding rows and columns hold `pad_value`: zeros, as TensorFlow's own
    unsharded -> sharded conversion writes them, or NaN, as
    jax-tpu-embedding's `stack_and_shard_tables` does; rows of the stack that
    no table owns are zeros (both).

    Args:
      tables: Every table of the stack by name, each of its
        `unsharded_shape`.
      layouts: The layouts of one stacked table.
      dtype: The dtype of the result.
      pad_value: The value of each table's padding.

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
    stacked = np.zeros(stacked_shape(members[0]), dtype=dtype)
    for layout in members:
        if layout.table_name not in tables:
            raise ValueError(
                f"shard_tables: table {layout.table_name!r} of stacked table "
                f"{stacked_name!r} is missing."
            )
        place_table(stacked, tables[layout.table_name], layout, pad_value=pad_value)
    return stacked


def place_table(
    stacked: np.ndarray, table: Any, layout: Layout, *, pad_value: float = 0.0
) -> None:
    """Writes one table into its rows of a stacked array, in place.

    The table's rows go where `stacked_index` says; the rest of the table's
    part of each shard (its padding rows and columns) is set to `pad_value`.
    Other rows are not touched, so a stack can be assembled table by table
    (into a memory-mapped array, say).

    Args:
      stacked: The stacked array.
      table: An array of the layout's `unsharded_shape`, or a `RowStream`
        (placed block by block; every row must come exactly once).
      layout: The table's layout.
      pad_value: The value of the table's padding.

    Raises:
      ValueError: `table` is not of the layout's `unsharded_shape`, a
        `RowStream` gives a row twice, misses one or gives a block of the
        wrong shape, or `stacked` is not of its stacked shape.
    """
    rows, columns = layout.unsharded_shape
    if not isinstance(table, RowStream):
        table = np.asarray(table)
    if tuple(table.shape) != (rows, columns):
        raise ValueError(
            f"Table {layout.table_name!r} has shape {tuple(table.shape)}; its "
            f"layout says ({rows}, {columns})."
        )
    if tuple(stacked.shape) != stacked_shape(layout):
        raise ValueError(
            f"Stacked table {layout.stacked_table_name!r} has shape "
            f"{tuple(stacked.shape)}; its layout needs {stacked_shape(layout)}."
        )
    _pad(stacked, layout, pad_value)
    if not isinstance(table, RowStream):
        for start in range(0, rows, _PLACE_BLOCK_ROWS):
            stop = min(rows, start + _PLACE_BLOCK_ROWS)
            stacked[stacked_rows(layout, start, stop), :columns] = table[start:stop]
        return
    seen = np.zeros(rows, dtype=bool)
    for block_rows, values in table.blocks():
        block_rows = np.asarray(block_rows, dtype=np.int64)
        values = np.asarray(values)
        if block_rows.ndim != 1 or values.shape != (len(block_rows), columns):
            raise ValueError(
                f"Table {layout.table_name!r}: a block of {block_rows.shape} rows "
                f"holds values of shape {values.shape}; each block must be "
                f"(rows, {columns})."
            )
        if values.dtype != table.dtype:
            raise ValueError(
                f"Table {layout.table_name!r}: a block holds {values.dtype} "
                f"values; the stream says {table.dtype}."
            )
        if len(block_rows) and (block_rows.min() < 0 or block_rows.max() >= rows):
            raise ValueError(
                f"Table {layout.table_name!r}: a block gives rows outside [0, {rows})."
            )
        unique, counts = np.unique(block_rows, return_counts=True)
        repeated = np.concatenate([unique[counts > 1], block_rows[seen[block_rows]]])
        if len(repeated):
            raise ValueError(
                f"Table {layout.table_name!r}: row {int(repeated.min())} comes "
                "more than once in its blocks."
            )
        seen[block_rows] = True
        stacked[stacked_index(layout, block_rows), :columns] = values
    if not seen.all():
        raise ValueError(
            f"Table {layout.table_name!r}: the blocks miss {int((~seen).sum())} "
            f"of its {rows} rows (the first: {int(np.argmin(seen))})."
        )
