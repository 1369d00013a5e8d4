"""jax-tpu-embedding's orbax checkpoints: its tables and slots, unstacked and unsharded.

A jax-tpu-embedding training job (its flax examples, `lib/flax/nnx/
checkpoint_utils.py` at HEAD) saves an orbax checkpoint step directory with
an `embedding_spec` item: the `EmbeddingSpecProto`
(`jax_tpu_embedding/sparsecore/lib/proto/embedding_spec.proto`, as text) that
says, per stacked table, its padded sizes, the number of SparseCores it is
sharded over and, per table, `row_offset_in_shard` and `shard_rotation`. Its
model item holds each stack as jax-tpu-embedding's `EmbeddingVariables`: a
`table` and a `slot` mapping (`{"momentum": ..., "velocity": ...}`), each of
shape `[stack_vocab_size, stack_embedding_dim]`, in the stacked, mod-sharded,
rotated layout.

That layout is the one TensorFlow's SparseCore checkpoints use
(`sparsecore_stacks`): this module turns the proto's records into the same
layout records and reads a table's rows where `sparsecore_stacks.stacked_rows`
says, one index computation for both. `tests/test_jax_orbax.py` pins it against
jax-tpu-embedding's own `stack_and_shard_tables` and
`unshard_and_unstack_tables`.

Arrays are read one at a time (orbax restores only the leaf asked for), so a
checkpoint far larger than one table is never held whole; a table larger
than memory is read by row ranges (`read_rows`) or streamed shard by shard
(`stream`). Reading needs orbax (the `jax` extra), not TensorFlow.
"""

from __future__ import annotations

import collections
import dataclasses
import os
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

from tf_tpu_embed_opt import lazy
from tf_tpu_embed_opt.checkpoints import formats
from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import spec_proto as jax_spec_proto
from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding.description import describe_stacks
from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding.layouts import (
    JaxTableLayout,
    layouts,
)
from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding.spec_proto import (
    EMBEDDING_SPEC_ITEM,
    algorithms_for_jax_slots,
    algorithms_for_table,
    engine_slot_names,
    is_jax_checkpoint,
    jax_slot_names,
    optimizer_records,
    read_embedding_spec,
)
from tf_tpu_embed_opt.checkpoints.protocol import (
    STREAM_BLOCK_BYTES,
    Evidence,
    TableReader,
    row_bounds,
)
from tf_tpu_embed_opt.checkpoints.shared import orbax_arrays, orbax_items, paths
from tf_tpu_embed_opt.checkpoints.shared import stacks as sparsecore_stacks
from tf_tpu_embed_opt.checkpoints.shared.paths import checked_int
from tf_tpu_embed_opt.checkpoints.shared.table_info import PARAMETERS, TableInfo
from tf_tpu_embed_opt.definitions import spec

__all__ = [
    "EMBEDDING_SPEC_ITEM",
    "JaxCheckpointReader",
    "JaxTable",
    "JaxTableLayout",
    "algorithms_for_jax_slots",
    "describe",
    "describe_jax_checkpoint",
    "describe_stacks",
    "detect",
    "is_jax_checkpoint",
    "jax_slot_names",
    "layouts",
    "machine_memory_bytes",
    "open_reader",
    "read_embedding_spec",
    "read_jax_tables",
]


@dataclasses.dataclass(frozen=True)
class JaxTable:
    """One table of a jax-tpu-embedding checkpoint, unstacked and unsharded.

    Attributes:
      name: The table's name (`TableSpec.name`).
      layout: Where it lived in its stack.
      table: `[vocab_size, embedding_dim]` float array.
      slots: Each slot, by jax-tpu-embedding's slot name, the table's shape.
      algorithms: The definitions whose jax-tpu-embedding slots are exactly
        these and that the table's optimizer record, if any, allows (the
        checkpoint holds no hyperparameters that this package reads).
    """

    name: str
    layout: JaxTableLayout
    table: np.ndarray
    slots: Mapping[str, np.ndarray]
    algorithms: Tuple[spec.Definition, ...]


class JaxCheckpointReader(TableReader):
    """A jax-tpu-embedding checkpoint step as a table source.

    What `load_into_keras` reads (as from `TPUCheckpointReader`): `tables`,
    each table's `TableInfo` with the TensorFlow engines' slot names (Adam's
    `momentum` is `momenta` there), checked against the layout when the
    reader is made, without reading an array; `read_tensor` unstacks and
    unshards one array. The slot names map through the definitions
    (`JaxFace.slots`); a `RuleOptimizerSpec`'s are the engines' already.

    Args:
      step_dir: The orbax step directory (it holds `embedding_spec/`).
      embedding_spec: The layout, for a checkpoint that records none: a
        keras-rs `DistributedEmbedding`'s, from
        `keras_rs_orbax.embedding_spec` (its stacks' weights,
        `var:<stack>:table...`, are found in any item).
      cache_bytes: How many bytes of stacked arrays to keep between reads.
        Each table of a stack has rows in every chunk of the stack's arrays
        (mod-sharding), so the stacked arrays that fit are read whole once
        and the tables of the stack cut from them; a larger one is read by
        each table's rows (only the chunks holding them). `None`: the
        largest stack's table and slots (what restoring that stack through
        orbax holds), but at most a quarter of this machine's memory, so
        that a stack larger than memory is read by rows or streamed
        (`stream`); less bounds the memory, at the cost of reading chunks
        again (0: every read by rows).

    Raises:
      ValueError: A missing stack, a stored shape the layout contradicts, or
        slots that fit no algorithm, naming the table and the slot.
    """

    format = formats.JAX_TPU_EMBEDDING.name
    row_reads = "caller"

    def __init__(
        self,
        step_dir: str,
        embedding_spec: Any = None,
        *,
        cache_bytes: Optional[int] = None,
    ) -> None:
        cache_bytes = checked_int(
            cache_bytes, "cache_bytes", "JaxCheckpointReader", 0, or_none=True
        )
        self.path = step_dir
        self._given_spec = embedding_spec is not None
        if embedding_spec is None:
            proto = read_embedding_spec(step_dir)
        else:
            proto = jax_spec_proto.checked(embedding_spec, "open_checkpoint")
        self.embedding_spec = proto
        self._layouts = {t.table_name: t for t in layouts(proto)}
        self._records = optimizer_records(proto)
        stacks = sorted({t.stacked_table_name for t in self._layouts.values()})
        self._where = orbax_items.stacks_in_items(step_dir, stacks)
        missing = sorted(set(stacks) - set(self._where))
        if missing:
            raise ValueError(
                f"{step_dir!r}: the embedding spec names stacks {missing}, whose "
                "variables (`<stack>/table` and `<stack>/slot/<name>`, or "
                "keras-rs's `var:<stack>:table` and `var:<stack>:table:slot:"
                "<name>`) are in none of the checkpoint's items"
                + (
                    " (the spec given: are the feature configs and the "
                    "`table_stacking` the job's?)."
                    if self._given_spec
                    else "."
                )
            )
        self.tables: Dict[str, TableInfo] = {}
        self.algorithms: Dict[str, Tuple[spec.Definition, ...]] = {}
        self._paths: Dict[str, Dict[str, Tuple[Any, ...]]] = {}
        self._jax_slot_names: Dict[str, Dict[str, str]] = {}
        for name, layout in self._layouts.items():
            self._describe(name, layout)
        if cache_bytes is None:
            cache_bytes = max(
                (
                    sum(self._nbytes(s, p) for p in (s.table, *s.slots.values()))
                    for s in self._where.values()
                ),
                default=0,
            )
            cache_bytes = min(cache_bytes, machine_memory_bytes() // 4)
        self._cache_bytes = int(cache_bytes)
        self._cache: "collections.OrderedDict[Any, np.ndarray]" = (
            collections.OrderedDict()
        )
        self._arrays: Dict[Tuple[str, Tuple[Any, ...]], Any] = {}

    def _describe(self, name: str, layout: JaxTableLayout) -> None:
        stack = self._where[layout.stacked_table_name]
        jax_slots = sorted(stack.slots)
        where = f"Table {name!r} (stack {layout.stacked_table_name!r})"
        algorithms = algorithms_for_table(jax_slots, self._records.get(name), where)
        renames = {engine_slot_names(d, jax_slots) for d in algorithms}
        if len(renames) != 1:
            raise ValueError(
                f"{where}: slots {jax_slots} fit "
                f"{[d.name for d in algorithms]}, which name them differently."
            )
        engine_names = dict(next(iter(renames)))
        stacked_shape = sparsecore_stacks.stacked_shape(layout)
        paths = {PARAMETERS: stack.table}
        paths.update({engine_names[s]: stack.slots[s] for s in jax_slots})
        slot_of = {engine_names[s]: s for s in jax_slots}
        dtypes = {}
        for key, path in paths.items():
            stored = stack.metadata(path)
            what = "table" if key == PARAMETERS else slot_of[key]
            if tuple(stored.shape) != stacked_shape:
                raise ValueError(
                    f"Table {name!r}, {what}: stored with shape "
                    f"{tuple(stored.shape)}; stack {layout.stacked_table_name!r} "
                    f"needs {stacked_shape} (stack_vocab_size x "
                    "stack_embedding_dim)"
                    + (
                        " in the spec given: is its topology the job's?"
                        if self._given_spec
                        else "."
                    )
                )
            dtypes[key] = np.dtype(stored.dtype).name
        slots = tuple(sorted(k for k in paths if k != PARAMETERS))
        self.tables[name] = TableInfo(
            name=name,
            shape=tuple(layout.unsharded_shape),
            dtype=dtypes[PARAMETERS],
            slots=slots,
            keys={k: "/".join(map(str, p)) for k, p in paths.items()},
            slot_shapes={k: tuple(layout.unsharded_shape) for k in slots},
            slot_dtypes={k: dtypes[k] for k in slots},
        )
        self.algorithms[name] = algorithms
        self._paths[name] = paths
        self._jax_slot_names[name] = slot_of

    def layout(self, name: str) -> JaxTableLayout:
        self._info(name)
        return self._layouts[name]

    def jax_slot_name(self, name: str, key: str) -> str:
        """jax-tpu-embedding's name of a table's slot (by engine name).

        Raises:
          KeyError: No table `name`, or `key` is none of its slots
            (`"parameters"` is the table itself, which has no slot name).
        """
        info = self._check_key(name, key)
        if key == PARAMETERS:
            raise KeyError(
                f"Table {name!r} of {self.path!r}: {PARAMETERS!r} is the table "
                f"itself, not a slot; its slots are {list(info.slots)}."
            )
        return self._jax_slot_names[name][key]

    def read_tensor(self, name: str, key: str) -> np.ndarray:
        """One array of one table (`"parameters"` or an engine slot name),
        unstacked and unsharded; only the table's rows are read."""
        return self.read_rows(name, key, (0, self._check_key(name, key).shape[0]))

    def read_rows(
        self, name: str, key: str, rows: Tuple[int, int], device: Any = None
    ) -> np.ndarray:
        """Rows `rows` (`start, stop`) of one array of one table, unsharded.

        Only the chunks of the stacked array that hold those rows are read,
        in one TensorStore read (`orbax_arrays`), straight into the table's
        row order. A table larger than memory is read range by range
        (`load_into_keras` does so for a table sharded over parameter
        servers, shard by shard); from a checkpoint a TPU job wrote, whose
        arrays orbax chunks by device shard, a range reads about its own
        bytes.

        Args:
          name: The table.
          key: `"parameters"` or an engine slot name.
          rows: `(start, stop)`, `0 <= start <= stop <= vocabulary size`.
          device: Ignored (the rows are NumPy arrays of this process), for the
            table-source contract of `load_into_keras`.

        Raises:
          KeyError: No such table or key.
          TypeError: `rows` is not two ints.
          ValueError: `rows` out of range, or the array cannot be read (a
            damaged checkpoint), naming the table and the slot.
        """
        del device
        self._check_key(name, key)
        layout = self._layouts[name]
        vocabulary, columns = layout.unsharded_shape
        start, stop = row_bounds(name, rows)
        if not 0 <= start <= stop <= vocabulary:
            raise ValueError(
                f"Table {name!r}: rows {rows!r} are not within (0, {vocabulary})."
            )
        stack = self._where[layout.stacked_table_name]
        with self._naming_errors(name, key, stack):
            stacked = self._stacked(stack, self._paths[name][key])
            rows = sparsecore_stacks.stacked_rows(layout, start, stop)
            if isinstance(stacked, np.ndarray):
                return stacked[rows, :columns]
            return stacked.take(rows, columns)

    def _naming_errors(self, name: str, key: str, stack: orbax_items.Stack) -> Any:
        """A failed read becomes a ValueError naming the table and the slot."""
        what = "table" if key == PARAMETERS else self._jax_slot_names[name][key]
        return paths.errors_named(
            f"Table {name!r}, {what}: cannot be read from {stack.directory!r}",
            orbax_items.PARTIAL_STEP,
        )

    def verify_tensor(self, name: str, key: str) -> None:
        """Reads one array of one table as `read_tensor` does, without
        cutting or keeping the table (what `load_into_keras(...,
        verify=True)` reads first): a stack's arrays that fit `cache_bytes`
        whole into the cache, where `read_tensor` then cuts the table from;
        a larger one shard by shard (`stream`).

        Raises:
          KeyError: No such table or key.
          ValueError: As `read_rows`.
        """
        self._check_key(name, key)
        stack = self._where[self._layouts[name].stacked_table_name]
        with self._naming_errors(name, key, stack):
            stacked = self._stacked(stack, self._paths[name][key])
        if not isinstance(stacked, np.ndarray):
            for _ in self.stream(name, key).blocks():
                pass

    def stream(
        self, name: str, key: str, *, block_bytes: int = STREAM_BLOCK_BYTES
    ) -> sparsecore_stacks.RowStream:
        """One array of one table as a `RowStream`, read shard by shard: each
        block is rows of one SparseCore shard, contiguous in the stacked
        array, of about `block_bytes`. Only one block is held at a time
        (unless the stack fits `cache_bytes`, when it is cut from the cached
        arrays), so a table larger than memory is written
        (`write_jax_checkpoint`) by streaming.

        Raises:
          KeyError: No such table or key.
          ValueError: As `read_rows`, when a block is read.
        """
        self._check_key(name, key)
        checked_int(block_bytes, "block_bytes", "JaxCheckpointReader.stream", 1)
        layout = self._layouts[name]
        columns = layout.unsharded_shape[1]
        dtype = np.dtype(self.tables[name].dtype_of(key))
        stack = self._where[layout.stacked_table_name]
        path = self._paths[name][key]
        # At least one row, however narrow the budget.
        block_rows = max(1, int(block_bytes) // (columns * dtype.itemsize))

        def blocks() -> Any:
            for rows, first in sparsecore_stacks.shard_blocks(layout, block_rows):
                with self._naming_errors(name, key, stack):
                    stacked = self._stacked(stack, path)
                    stop = first + len(rows)
                    if isinstance(stacked, np.ndarray):
                        values = stacked[first:stop, :columns]
                    else:
                        values = stacked.rows(first, stop, columns)
                yield rows, values

        return sparsecore_stacks.RowStream(layout.unsharded_shape, dtype, blocks)

    def streams(
        self, name: str, *, block_bytes: int = STREAM_BLOCK_BYTES
    ) -> Dict[str, sparsecore_stacks.RowStream]:
        """The table state as `RowStream`s (see `stream`), by engine name."""
        self._info(name)
        return {
            key: self.stream(name, key, block_bytes=block_bytes)
            for key in self._paths[name]
        }

    def _stacked(self, stack: orbax_items.Stack, path: Tuple[Any, ...]) -> Any:
        """A stacked array: whole from the cache (read whole into it, with the
        other arrays of its stack, if they fit `cache_bytes`), else its
        `StoredArray`, read by rows."""
        key = (stack.directory, path)
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        if self._nbytes(stack, path) > self._cache_bytes:
            return self._stored(stack, path)
        # The stack's table and slots are read together (each table of the
        # stack reads them all), concurrently, as far as they fit.
        wanted = [path]
        room = self._cache_bytes - self._nbytes(stack, path)
        for other in (stack.table, *stack.slots.values()):
            size = self._nbytes(stack, other)
            if other != path and (stack.directory, other) not in self._cache:
                if size <= room:
                    wanted.append(other)
                    room -= size
        need = sum(self._nbytes(stack, p) for p in wanted)
        while (
            self._cache
            and need + sum(a.nbytes for a in self._cache.values()) > self._cache_bytes
        ):
            self._cache.popitem(last=False)
        pending = [(p, self._stored(stack, p).read()) for p in wanted]
        for other, result in pending:
            self._cache[(stack.directory, other)] = result()
        self._cache.move_to_end(key)
        return self._cache[key]

    @staticmethod
    def _nbytes(stack: orbax_items.Stack, path: Tuple[Any, ...]) -> int:
        metadata = stack.metadata(path)
        return int(np.prod(metadata.shape)) * np.dtype(metadata.dtype).itemsize

    def _stored(self, stack: orbax_items.Stack, path: Tuple[Any, ...]) -> Any:
        key = (stack.directory, path)
        if key not in self._arrays:
            self._arrays[key] = orbax_arrays.StoredArray(
                stack.directory,
                path,
                stack.use_zarr3,
                lambda: orbax_items.restore_leaf(stack, path),
            )
        return self._arrays[key]

    def read(self, name: str) -> Dict[str, np.ndarray]:
        """The table state: `"parameters"` and each slot, by engine name."""
        self._info(name)
        return {key: self.read_tensor(name, key) for key in self._paths[name]}

    def read_scalar(self, object_path: str) -> Any:
        raise ValueError(
            f"{self.path!r} is a jax-tpu-embedding checkpoint, whose step is "
            f"not a variable {object_path!r}; pass `step` instead of "
            "`step_path`."
        )

    @property
    def step(self) -> Optional[int]:
        """The step directory's number (`None` for another name)."""
        return paths.orbax_step(self.path)


def machine_memory_bytes() -> int:
    """This machine's memory, or no bound where the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # pragma: no cover - not POSIX
        return 1 << 62


def read_jax_tables(
    step_dir: str,
    tables: Optional[Sequence[str]] = None,
    *,
    embedding_spec: Any = None,
) -> Dict[str, JaxTable]:
    """Every table of a jax-tpu-embedding checkpoint step, with its slots.

    Args:
      step_dir: The orbax step directory (it holds `embedding_spec/`).
      tables: Only these tables (by name); all by default.
      embedding_spec: As for `JaxCheckpointReader` (keras-rs checkpoints).

    Returns:
      `{table name: JaxTable}` (slots by jax-tpu-embedding's names), in the
      spec's order.

    Raises:
      ValueError: As `JaxCheckpointReader`; an unknown table asked for.
    """
    reader = JaxCheckpointReader(step_dir, embedding_spec)
    known = list(reader.tables)
    if tables is not None:
        unknown = sorted(set(tables) - set(known))
        if unknown:
            raise ValueError(
                f"read_jax_tables: argument `tables` names {unknown}, which "
                f"the checkpoint does not hold; it holds {known}."
            )
    result: Dict[str, JaxTable] = {}
    for name in known:
        if tables is not None and name not in tables:
            continue
        state = reader.read(name)
        result[name] = JaxTable(
            name=name,
            layout=reader.layout(name),
            table=state.pop(PARAMETERS),
            slots={reader.jax_slot_name(name, k): v for k, v in state.items()},
            algorithms=reader.algorithms[name],
        )
    return result


def detect(evidence: Evidence) -> bool:
    """Format `"jax-tpu-embedding"`: an orbax step with its spec (its
    handler, with `open_reader` and `describe`)."""
    return is_jax_checkpoint(evidence.path)


def open_reader(
    path: str, embedding_spec: Any = None, cache_bytes: Optional[int] = None
) -> JaxCheckpointReader:
    return JaxCheckpointReader(path, embedding_spec, cache_bytes=cache_bytes)


def describe(path: str, embedding_spec: Any = None) -> Dict[str, Any]:
    return {
        "layout": formats.JAX_TPU_EMBEDDING.layout,
        "step": paths.orbax_step(path),
        "stacked_tables": describe_stacks(path, embedding_spec),
    }


describe_jax_checkpoint = lazy.deprecated(
    describe_stacks,
    f"{__name__}.describe_jax_checkpoint",
    "tf_tpu_embed_opt.checkpoints.describe_checkpoint(step_dir)",
)
