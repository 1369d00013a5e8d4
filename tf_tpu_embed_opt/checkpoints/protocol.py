"""What every checkpoint format implements: a reader, a handler and a writer.

As orbax has one `Checkpointer` over a handler per type, the package has one
front door (`reader.open_checkpoint`, `writer.write_checkpoint`) over a
handler per format, each registered once in `formats`:

- `TableReader`: the base of every format's reader. A format gives `tables`
  (name -> `TableInfo`) and `read(name)`; what it does better than the
  defaults derived from those (rows read without the rest, a stream, the
  algorithms its records name, where a table lives, the step) it overrides.
- `FormatHandler`: the module that detects a format (`detect`), opens a path
  in it (`open_reader`) and says what it holds (`describe`).
- `FormatWriter`: the module that writes a format (`write`).

`tests/test_checkpoint_protocol.py` checks that every registered format
implements them.
"""

from __future__ import annotations

import os
from typing import (
    Any,
    Dict,
    Iterable,
    Iterator,
    Mapping,
    Optional,
    Protocol,
    Tuple,
    Union,
    runtime_checkable,
)

import numpy as np

from tf_tpu_embed_opt.checkpoints.shared.keys import recorded_step
from tf_tpu_embed_opt.checkpoints.shared.table_info import PARAMETERS, TableInfo
from tf_tpu_embed_opt.definitions import spec

__all__ = [
    "STREAM_BLOCK_BYTES",
    "Evidence",
    "FormatHandler",
    "FormatWriter",
    "TableReader",
    "Tables",
    "UnknownTable",
    "checked_key",
    "is_pair",
    "pairs_of",
    "row_bounds",
    "table_info",
]

# The bytes of one block of rows a stream holds at a time.
STREAM_BLOCK_BYTES = 64 << 20


def row_bounds(name: str, rows: Any, count: Optional[int] = None) -> Tuple[int, int]:
    """`rows` of table `name` as `(start, stop)` ints, within its `count` rows
    where given.

    Raises:
      TypeError: `rows` is not two ints (a float is not cut to one).
      ValueError: Not `0 <= start <= stop <= count`.
    """
    try:
        start, stop = rows
    except (TypeError, ValueError):
        start = stop = None
    for bound in (start, stop):
        if isinstance(bound, bool) or not isinstance(bound, (int, np.integer)):
            raise TypeError(
                f"Table {name!r}: `rows` must be (start, stop), two ints; "
                f"received {rows!r}."
            )
    if count is not None and not 0 <= start <= stop <= count:
        raise ValueError(f"Table {name!r}: rows {rows!r} are outside its {count} rows.")
    return int(start), int(stop)


class UnknownTable(KeyError, ValueError):
    """A table name a checkpoint does not hold: a `KeyError`, as the tables
    are a mapping by name, and a `ValueError`, which SparseCore's reader
    raised for it, so that code catching either still does (numpy's
    `AxisError` is likewise an `IndexError` and a `ValueError`)."""

    def __str__(self) -> str:
        # The message as written, not quoted as a missing key's repr.
        return str(self.args[0]) if self.args else ""


def table_info(tables: Mapping[str, TableInfo], name: str, path: str) -> TableInfo:
    """`tables[name]` of the checkpoint at `path`.

    Raises:
      TypeError: `name` is not a str.
      UnknownTable: It holds no table `name`; the message names its tables.
    """
    if not isinstance(name, str):
        raise TypeError(
            f"A table of checkpoint {path!r} is named by a str; received "
            f"{name!r} of type {type(name).__name__} (its tables: "
            f"{sorted(tables)})."
        )
    if name not in tables:
        raise UnknownTable(
            f"Checkpoint {path!r} has no table {name!r}; its tables: {sorted(tables)}."
        )
    return tables[name]


def checked_key(
    tables: Mapping[str, TableInfo], name: str, key: str, path: str
) -> TableInfo:
    """`table_info`, where table `name` has the array `key` (`"parameters"`
    or one of its slots).

    Raises:
      UnknownTable: No table `name`.
      KeyError: The table has no `key`; the message names what it has.
    """
    info = table_info(tables, name, path)
    if key != PARAMETERS and key not in info.slots:
        raise KeyError(
            f"Table {name!r} of {path!r} has no {key!r}; it has "
            f"{[PARAMETERS, *info.slots]}."
        )
    return info


class TableReader:
    """The base of every format's reader (and of any table source wrapped).

    A subclass sets `path`, `tables` and, where its records name the
    algorithms, `algorithms`, and implements `read`; the other calls have
    defaults derived from those, which a format overrides where it knows
    better. Each call refuses a table the reader does not hold
    (`UnknownTable`) and an array the table does not have (`KeyError`), in
    the same words for every format (`_info`, `_check_key`).

    Attributes:
      format: The format's name (`formats.FORMATS`), `"tables"` for another
        table source.
      path: The path it reads.
      tables: Table name -> `TableInfo`.
      algorithms: Table name -> the algorithms its records name (empty:
        the slots say).
      row_reads: Where `read_rows` reads without the whole array:
        `"device"` (on the device given), `"caller"` (in this process, only
        the rows' chunks) or `None` (the array is read whole, then cut).
      step_path: Of a TensorFlow checkpoint: where `step` reads the step
        (`None`: at `STEP_PATH`, `None` where no variable is there).
    """

    format = "tables"
    row_reads: Optional[str] = None
    path: str
    tables: Mapping[str, TableInfo]
    algorithms: Mapping[str, Tuple[spec.Definition, ...]] = {}
    step_path: Optional[str] = None

    def _info(self, name: str) -> TableInfo:
        return table_info(self.tables, name, self.path)

    def _check_key(self, name: str, key: str) -> TableInfo:
        return checked_key(self.tables, name, key, self.path)

    def read(self, name: str) -> Dict[str, np.ndarray]:
        """The state of table `name`: `{"parameters": ..., <slot>: ...}`."""
        raise NotImplementedError

    def read_tensor(self, name: str, key: str) -> np.ndarray:
        """One array of table `name`: `"parameters"` or a slot."""
        self._check_key(name, key)
        return self.read(name)[key]

    def read_rows(
        self, name: str, key: str, rows: Tuple[int, int], device: Any = None
    ) -> Any:
        """Rows `rows` (`start, stop`) of one array of table `name`."""
        info = self._check_key(name, key)
        start, stop = row_bounds(name, rows, info.shape[0])
        return self.read_tensor(name, key)[start:stop]

    def stream(self, name: str, key: str = PARAMETERS) -> Any:
        """One array of table `name` as a `RowStream` of blocks of rows (of
        the array read once, where `row_reads` is `None`)."""
        from tf_tpu_embed_opt.checkpoints.shared.stacks import RowStream

        info = self._check_key(name, key)
        shape, dtype = info.shape_of(key), np.dtype(info.dtype_of(key))
        rows, columns = shape
        block = max(1, STREAM_BLOCK_BYTES // max(1, columns * dtype.itemsize))

        def blocks() -> Any:
            whole = self.read_tensor(name, key) if self.row_reads is None else None
            for start in range(0, rows, block):
                stop = min(rows, start + block)
                if whole is not None:
                    values = np.asarray(whole[start:stop])
                else:
                    values = np.asarray(self.read_rows(name, key, (start, stop)))
                yield np.arange(start, stop), values

        return RowStream(shape, dtype, blocks)

    def verify_tensor(self, name: str, key: str) -> None:
        """Reads one array and checks its shape.

        Raises:
          ValueError: It does not read, or reads with another shape.
        """
        expected = self._check_key(name, key).shape_of(key)
        value = self.read_tensor(name, key)
        if tuple(np.shape(value)) != expected:
            raise ValueError(
                f"Table {name!r}: {key!r} reads with shape "
                f"{tuple(np.shape(value))}; expected {expected}."
            )

    def algorithms_of(self, name: str) -> Tuple[spec.Definition, ...]:
        """The algorithms the checkpoint allows for table `name`."""
        info = self._info(name)
        if name in self.algorithms:
            return tuple(self.algorithms[name])
        return info.algorithms

    def layout(self, name: str) -> Any:
        """Where table `name` lives, in the format's own record (by default
        its `TableInfo`, with the keys of its arrays)."""
        return self._info(name)

    def read_scalar(self, object_path: str) -> Any:
        """A variable that is no table (e.g. a step counter).

        Raises:
          ValueError: No variable there.
        """
        raise ValueError(f"{self.path!r} holds no variable at {object_path!r}.")

    @property
    def step(self) -> Optional[int]:
        """The training step it records at `step_path` (at `STEP_PATH`, or
        `None` where no variable is there, when `step_path` is `None`).

        Raises:
          ValueError: No variable at `step_path`, or the variable there is no
            integer >= 0.
        """
        return recorded_step(self.read_scalar, self.path, self.step_path)


class Evidence:
    """What detection looks at: the path, and (read once, when a format asks)
    the variable names of the TensorFlow checkpoint there.

    Args:
      path: The path given.
      variable_names: Called once, when first asked: the checkpoint's
        variable names (it refuses a path that holds no TensorFlow
        checkpoint, and needs TensorFlow).
    """

    def __init__(self, path: str, variable_names: Any) -> None:
        self.path = path
        self.remote = "://" in path
        self._variable_names = variable_names
        self._names: Optional[Tuple[str, ...]] = None

    @property
    def variable_names(self) -> Tuple[str, ...]:
        if self._names is None:
            self._names = tuple(self._variable_names(self.path))
        return self._names

    def is_directory(self) -> bool:
        return not self.remote and os.path.isdir(self.path)


@runtime_checkable
class FormatHandler(Protocol):
    """The module of a format that detects, opens and describes it."""

    def detect(self, evidence: Evidence) -> bool:
        """Whether the checkpoint at `evidence.path` is in this format (the
        orbax formats from their files; the TensorFlow ones from
        `evidence.variable_names`)."""

    def open_reader(self, path: str, **arguments: Any) -> TableReader:
        """The checkpoint at `path` open, with the format's arguments
        (`Format.takes`; those not given are `None`)."""

    def describe(self, path: str, **arguments: Any) -> Dict[str, Any]:
        """What `describe_checkpoint` says of it, without reading tensors."""


# What every writer takes as its tables: `(name, state)` pairs (a generator
# holds one table at a time) or a mapping name -> state.
Tables = Union[Iterable[Tuple[str, Mapping[str, Any]]], Mapping[str, Mapping[str, Any]]]


def is_pair(item: Any) -> bool:
    """Whether `item` is a `(name, state)` pair as every writer unpacks one:
    a tuple, or a list of two."""
    return isinstance(item, (tuple, list)) and len(item) == 2


def pairs_of(tables: Tables, argument: str = "tables") -> Iterator[Tuple[Any, Any]]:
    """The `(name, state)` pairs of `tables` (pairs, or a mapping name ->
    state), each checked to be a pair as it comes (`is_pair`).

    Raises:
      TypeError: An item is no pair; the message shows it and names
        `argument`.
    """
    for item in tables.items() if isinstance(tables, Mapping) else tables:
        if not is_pair(item):
            raise TypeError(
                f"`{argument}` must give (table name, state) pairs; received an "
                f"item {item!r:.80}."
            )
        yield item


@runtime_checkable
class FormatWriter(Protocol):
    """The module of a format that writes it (the arguments it takes and
    needs are its `formats.Format`'s, checked before it is imported)."""

    def write(self, path: str, tables: Any, **arguments: Any) -> str:
        """Writes `tables` (`(name, state)` pairs, or a mapping) at `path`;
        returns what was written."""
