"""One way to open every checkpoint the package reads: `open_checkpoint`.

The format of a path is decided here and nowhere else (`detect_format`),
from its files where they tell (no TensorFlow is imported for an orbax step,
a missing path or a file that is no checkpoint):

- `"jax-tpu-embedding"`: an orbax step directory with the
  `EmbeddingSpecProto` jax-tpu-embedding saves beside its tables (and the
  steps this package writes, keras-rs's included);
- `"keras-rs"`: an orbax step of keras-rs's JAX `DistributedEmbedding`, whose
  layout is not recorded there (give `embedding_spec`, e.g.
  `keras_rs_orbax.embedding_spec(feature_configs, ...)`);
- `"keras"`: a step of `keras.callbacks.OrbaxCheckpoint` (of one process or
  many), whose tables are those of the package's row-sparse layers, found
  from the model config saved with it;
- `"sparsecore"`: a TensorFlow checkpoint holding `TPUEmbeddingV2` layouts
  (its slots do not name the algorithm: give `algorithms`);
- `"tpu-embedding"`: any other TensorFlow checkpoint, read in
  `TPUEmbedding`'s layout (the package's own `save_tpu_checkpoint` writes
  this one).

Every format answers through one `Checkpoint`: `tables` (name -> `TableInfo`),
`read(name)` (`{"parameters": array, <slot>: array, ...}`), `read_tensor`,
`read_rows`, `stream` / `streams` (row blocks, for tables larger than memory),
`verify`, `algorithm` / `algorithms`, `layout`, `read_scalar` and `step`.
`load_into_keras` and the command line's `checkpoint inspect|convert` open
their sources here.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np

from tf_tpu_embed_opt.checkpoints import formats
from tf_tpu_embed_opt.checkpoints.protocol import (
    Evidence,
    TableReader,
    checked_key,
    row_bounds,
    table_info,
)
from tf_tpu_embed_opt.checkpoints.shared.keys import checked_step_path
from tf_tpu_embed_opt.checkpoints.shared.table_info import PARAMETERS, TableInfo
from tf_tpu_embed_opt.definitions import spec

__all__ = [
    "FORMATS",
    "Checkpoint",
    "describe_checkpoint",
    "detect_format",
    "open_checkpoint",
]

# The formats `open_checkpoint` reads, in the order `detect_format` tries them
# (`Checkpoint.wrapping` also takes any table source: format "tables").
FORMATS: Tuple[str, ...] = formats.READ_NAMES


def _tensorflow_checkpoint_files(path: str) -> bool:
    """Whether `path` looks like a TensorFlow checkpoint: a prefix with its
    `.index` file, or a directory with a `checkpoint` state file."""
    if os.path.isdir(path):
        return os.path.isfile(os.path.join(path, "checkpoint"))
    return os.path.isfile(path + ".index")


def _what_is_there(path: str) -> str:
    if not os.path.exists(path):
        return "nothing is there"
    if os.path.isdir(path):
        entries = sorted(os.listdir(path))
        if not entries:
            return "an empty directory"
        # An orbax root: its steps are directories named by their number.
        steps = sorted(
            int(entry)
            for entry in entries
            if entry.isdigit()
            and os.path.isfile(os.path.join(path, entry, "_CHECKPOINT_METADATA"))
        )
        if steps:
            shown = ", ".join(map(str, steps[-5:]))
            latest = os.path.join(path, str(steps[-1]))
            return (
                f"an orbax root directory whose steps are {shown}: pass a "
                f"step's directory, e.g. {latest!r}"
            )
        shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
        return f"a directory holding {shown}"
    size = os.path.getsize(path)
    keras_file = _keras_file(path)
    if keras_file:
        return (
            f"{keras_file}, which is not read here: load it into its model "
            "(keras.saving.load_model, or model.load_weights) and write the "
            "tables with tf_tpu_embed_opt.save_tpu_checkpoint, or save the "
            "model's steps with keras.callbacks.OrbaxCheckpoint, which "
            "open_checkpoint and the command line read"
        )
    return f"a file of {size:,} bytes" if size else "an empty file"


def _keras_file(path: str) -> str:
    """What Keras file `path` is (`.keras`, `.weights.h5`), told from its
    first bytes; "" for any other."""
    try:
        with open(path, "rb") as file:
            start = file.read(8)
    except OSError:  # unreadable: said as any other file
        return ""
    if start == b"\x89HDF\r\n\x1a\n":
        return "an HDF5 file (as Keras's model.save_weights writes)"
    if start[:4] == b"PK\x03\x04":
        import zipfile

        try:
            with zipfile.ZipFile(path) as archive:
                names = set(archive.namelist())
        except zipfile.BadZipFile:
            return ""
        if "config.json" in names and "model.weights.h5" in names:
            return "a Keras model file (.keras)"
    return ""


def _variable_names(path: str, subject: str) -> Any:
    """The variable names of the TensorFlow checkpoint at `path` (what the
    TensorFlow formats are told apart by); refused, naming `path` as
    `subject` says, where none is there."""
    if "://" not in path and not _tensorflow_checkpoint_files(path):
        raise ValueError(
            f"{subject} {path!r} is not a checkpoint: "
            f"{_what_is_there(path)}. Looked for "
            f"{formats.described(formats.FORMATS)} (an orbax step is a directory "
            "with embedding_spec/, keras-rs stack weights or a model's "
            "pytree/; a TensorFlow checkpoint is PREFIX.index, or a "
            "directory with a `checkpoint` state file: otherwise pass the "
            "prefix, e.g. 'dir/ckpt-1')."
        )
    try:
        import tensorflow as tf

        from tf_tpu_embed_opt.checkpoints.shared import paths
    except ModuleNotFoundError as error:
        _raise_missing(error, formats.TPU_EMBEDDING, path)
    prefix = paths.checkpoint_prefix(path)
    try:
        return [name for name, _ in tf.train.list_variables(prefix)]
    except Exception as error:  # noqa: BLE001 - TensorFlow's own, many kinds
        raise ValueError(
            f"{subject} {path!r} is not a readable TensorFlow "
            f"checkpoint: {paths.first_line(error)}"
        ) from None


def detect_format(path: Any) -> str:
    """The format of the checkpoint at `path` (one of `FORMATS`).

    An orbax step, a missing path and anything that is no checkpoint are told
    apart from their files, without TensorFlow; a TensorFlow checkpoint is
    then opened (with TensorFlow) to tell SparseCore's layout from
    `TPUEmbedding`'s. A remote path (`gs://...`) is taken for a TensorFlow
    checkpoint.

    Raises:
      TypeError: `path` is not a path.
      ValueError: No checkpoint of these formats is there; the message says
        what is there and which formats were looked for.
      TensorFlowNotInstalled: A TensorFlow checkpoint, without TensorFlow.
    """
    return format_of(path, "detect_format: argument `path`").name


def format_of(path: Any, subject: str) -> formats.Format:
    """The format of the checkpoint at `path`, as `detect_format` finds it;
    its refusals name `path` as `subject` (e.g. "open_checkpoint: argument
    `path`", or the command line's "`SRC`")."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(
            f"{subject} must be a checkpoint prefix or "
            "directory, or an orbax step directory (a str or os.PathLike); "
            f"received {path!r} of type {type(path).__name__}."
        )
    path = os.fspath(path)
    evidence = Evidence(path, functools.partial(_variable_names, subject=subject))
    for format in formats.FORMATS:
        if format.orbax and evidence.remote:
            continue
        if not format.orbax:
            evidence.variable_names  # noqa: B018 - refuses what is no checkpoint
        if _handler(format, path).detect(evidence):
            return format
    raise AssertionError("the TPUEmbedding layout takes every TensorFlow checkpoint")


def _raise_missing(error: ModuleNotFoundError, format: formats.Format, path: str):
    """`error` as what the user lacks for `format` (`Format.raise_missing`)."""
    what = (
        f"reading the {format.name} step {path!r}"
        if format.orbax
        else f"reading the TensorFlow checkpoint {path!r}"
    )
    format.raise_missing(error, what)


def _handler(format: formats.Format, path: str) -> Any:
    try:
        return format.handling()
    except ModuleNotFoundError as error:
        _raise_missing(error, format, path)


def _handled(format: formats.Format, path: str, call: str, **arguments: Any) -> Any:
    """`call` of `format`'s handler on `path`, what it lacks said by name."""
    handler = _handler(format, path)
    try:
        return getattr(handler, call)(path, **arguments)
    except ModuleNotFoundError as error:
        _raise_missing(error, format, path)


def open_checkpoint(
    path: Any,
    *,
    format: Optional[str] = None,
    object_path: Optional[str] = None,
    algorithms: Any = None,
    embedding_spec: Any = None,
    cache_bytes: Optional[int] = None,
    step_path: Optional[str] = None,
) -> "Checkpoint":
    """Opens the checkpoint at `path`, whatever its format.

    Args:
      path: A checkpoint prefix or directory, or an orbax step directory.
      format: One of `FORMATS`; `None` detects it (`detect_format`).
      object_path: Of a TensorFlow checkpoint: the embedding object's path
        (found when `None`; see `TPUCheckpointReader`).
      algorithms: Of a SparseCore checkpoint, whose slots do not name the
        algorithm: one algorithm (a definition, an embedding optimizer or a
        name) or a mapping table -> one. Elsewhere the slots (and a
        jax-tpu-embedding step's optimizer records) say it; `None`.
      embedding_spec: Of a keras-rs step (required) or a jax-tpu-embedding
        one (optional, to read it as another job laid it out): the
        `EmbeddingSpecProto` of its layout.
      cache_bytes: Of an orbax step: see `JaxCheckpointReader`.
      step_path: Of a TensorFlow checkpoint: where `Checkpoint.step` reads
        the training step, '/'-separated from the root (`"global_step"`);
        `None`: at `"step"`, where the package writes it. (An orbax step's
        step is its directory's number.)

    Returns:
      A `Checkpoint`.

    Raises:
      TypeError, ValueError: A bad argument, a path that holds no checkpoint,
        or an argument that does not fit the format; the message names it.
      TensorFlowNotInstalled: A TensorFlow checkpoint, without TensorFlow.
      JaxNotInstalled: An orbax step, without the `[jax]` extra.
    """
    format, arguments = _checked_arguments(
        "open_checkpoint",
        path,
        format,
        object_path=object_path,
        algorithms=algorithms,
        embedding_spec=embedding_spec,
        cache_bytes=cache_bytes,
        step_path=checked_step_path(step_path, "open_checkpoint"),
    )
    path = os.fspath(path)
    return Checkpoint(_handled(format, path, "open_reader", **arguments), path)


def _checked_arguments(
    function: str, path: Any, format: Any, **given: Any
) -> Tuple[formats.Format, Dict[str, Any]]:
    """`format` (detected where `None`), once every argument given fits it,
    and the arguments it takes."""
    if format is None:
        format = format_of(path, f"{function}: argument `path`")
    else:
        format = formats.format_named(format, function)
    for name, value in given.items():
        if value is not None and name not in format.takes:
            raise ValueError(
                f"{function}: argument `{name}` {value!r} does not apply to "
                f"{os.fspath(path)!r}, a {format.name} checkpoint, which takes "
                f"{', '.join(format.takes) or 'none of these arguments'}."
            )
    return format, {name: given[name] for name in format.takes if name in given}


def describe_checkpoint(
    path: Any,
    *,
    format: Optional[str] = None,
    object_path: Optional[str] = None,
    embedding_spec: Any = None,
    step_path: Optional[str] = None,
) -> Dict[str, Any]:
    """What a checkpoint of any format holds, without reading its tables
    (of its tensors only a TensorFlow checkpoint's step, a scalar): what
    `tf-tpu-embed-opt checkpoint inspect` prints.

    Args:
      path: As `open_checkpoint`'s.
      format: One of `FORMATS`; `None` detects it.
      object_path: Of a TensorFlow checkpoint, as `open_checkpoint`'s.
      embedding_spec: Of an orbax step, as `open_checkpoint`'s; a keras-rs
        step without it is described by its stacks alone (which table is
        where is not recorded there).
      step_path: Of a TensorFlow checkpoint, as `open_checkpoint`'s.

    Returns:
      A JSON-ready dict with `checkpoint` (its path or prefix), `format`,
      `step` (what `Checkpoint.step` reads: `None` where it records none),
      `step_path` where one is given, and `bytes` (of every tensor
      described), and for the `TPUEmbedding`
      layout `object_path` and `tables` (one dict per table: `table`,
      `shape`, `dtype`, `slots`, `algorithms` it fits, `bytes`), for a Keras
      `OrbaxCheckpoint` step `tables`
      (each also with its `layer` and `row_offset` there), for the stacked
      layouts `layout` and `stacked_tables` (one dict per stack: its name,
      `shape`, `slots`, `algorithms`, `bytes` and, where known, its tables'
      places).

    Raises:
      TypeError: As `open_checkpoint`'s.
      ValueError: As `open_checkpoint`'s.
      TensorFlowNotInstalled: A TensorFlow checkpoint, without TensorFlow.
      JaxNotInstalled: An orbax step, without the `[jax]` extra.
    """
    format, arguments = _checked_arguments(
        "describe_checkpoint",
        path,
        format,
        object_path=object_path,
        embedding_spec=embedding_spec,
        step_path=checked_step_path(step_path, "describe_checkpoint"),
    )
    path = os.fspath(path)
    described = dict(_handled(format, path, "describe", **arguments))
    parts = described.get("tables", described.get("stacked_tables", []))
    return {
        "checkpoint": described.pop("checkpoint", path),
        "format": format.name,
        **described,
        **({} if step_path is None else {"step_path": step_path}),
        "bytes": sum(part["bytes"] for part in parts),
    }


class _Source(TableReader):
    """Another table source (an object with `tables` and `read(name)`) read
    through the protocol; what else it has (`read_tensor`, `read_scalar`,
    `algorithms`) it answers itself."""

    def __init__(self, source: Any) -> None:
        tables = getattr(source, "tables", None)
        if (
            not isinstance(tables, Mapping)
            or not all(isinstance(info, TableInfo) for info in tables.values())
            or not callable(getattr(source, "read", None))
        ):
            raise TypeError(
                "Checkpoint.wrapping: argument `source` must be a table source: "
                "`tables` (table name -> checkpoints.TableInfo) and `read(name)`; "
                f"received {source!r:.80} of type {type(source).__name__}."
            )
        self.source = source
        self.tables = tables
        path = getattr(source, "path", None) or getattr(source, "prefix", None)
        self.path = path if path is not None else repr(source)
        if isinstance(getattr(source, "algorithms", None), Mapping):
            self.algorithms = source.algorithms

    def read(self, name: str) -> Dict[str, np.ndarray]:
        return self.source.read(name)

    def read_tensor(self, name: str, key: str) -> np.ndarray:
        if hasattr(self.source, "read_tensor"):
            return self.source.read_tensor(name, key)
        return super().read_tensor(name, key)

    def read_scalar(self, object_path: str) -> Any:
        if hasattr(self.source, "read_scalar"):
            return self.source.read_scalar(object_path)
        return super().read_scalar(object_path)


class Checkpoint:
    """An open checkpoint, of any format (see `open_checkpoint`): its reader
    (a `protocol.TableReader`), with every table and key checked by name.

    Attributes:
      format: One of `FORMATS` (`"tables"` for another table source).
      path: The path it was opened from.
      tables: Table name -> `TableInfo` (shape, dtype, slots, keys).
      reader: The format's own reader (`TPUCheckpointReader`,
        `SparseCoreCheckpointReader`, `JaxCheckpointReader`,
        `KerasCheckpointReader`) or the table source, read through the
        protocol.
      row_reads: Where `read_rows` reads without reading the whole array:
        `"device"` (on the device given, a parameter server reading the
        checkpoint's files itself: the `TPUEmbedding` layout), `"caller"`
        (in this process, only the rows' chunks: orbax steps) or `None`
        (the table state is read whole, then cut: SparseCore's stacks and
        other table sources).
    """

    def __init__(self, reader: TableReader, path: str) -> None:
        self.reader = reader
        self.format = reader.format
        self.path = path
        self.tables: Mapping[str, TableInfo] = reader.tables
        self.row_reads = reader.row_reads

    @classmethod
    def wrapping(cls, source: Any) -> "Checkpoint":
        """A table source as a `Checkpoint`: a format's reader, or any object
        with `tables` (name -> `TableInfo`) and `read(name)` (format
        `"tables"`, read whole table by table)."""
        if not isinstance(source, TableReader):
            source = _Source(source)
        return cls(source, source.path)

    def _info(self, name: str) -> TableInfo:
        return table_info(self.tables, name, self.path)

    def _check_key(self, name: str, key: str) -> TableInfo:
        return checked_key(self.tables, name, key, self.path)

    def read(self, name: str) -> Dict[str, np.ndarray]:
        """The state of table `name`: `{"parameters": ..., <slot>: ...}`,
        unstacked, unpadded and unsharded."""
        self._info(name)
        return self.reader.read(name)

    def read_tensor(self, name: str, key: str) -> np.ndarray:
        """One array of one table: `"parameters"` or an engine slot name."""
        self._check_key(name, key)
        return self.reader.read_tensor(name, key)

    def read_rows(
        self, name: str, key: str, rows: Tuple[int, int], device: Any = None
    ) -> Any:
        """Rows `rows` (`start, stop`) of one array of one table; where
        `row_reads` is `"device"`, read on `device` (a tensor there).

        Raises:
          KeyError: No such table or array.
          TypeError: `rows` is not two ints.
          ValueError: `rows` outside the table's, or a failed read.
        """
        info = self._check_key(name, key)
        start, stop = row_bounds(name, rows, info.shape[0])
        return self.reader.read_rows(name, key, (start, stop), device)

    def stream(self, name: str, key: str = PARAMETERS) -> Any:
        """One array of one table as a `shared.stacks.RowStream`: blocks
        of rows, for a table larger than memory (one block held at a time
        where the format reads rows; SparseCore's stack is read whole)."""
        self._check_key(name, key)
        return self.reader.stream(name, key)

    def streams(self, name: str) -> Dict[str, Any]:
        """The table state as `RowStream`s (see `stream`), by engine name."""
        info = self._info(name)
        return {key: self.stream(name, key) for key in (PARAMETERS, *info.slots)}

    def verify(self, name: str, key: str) -> None:
        """Reads one array of one table and checks its shape, so that a
        damaged file is found before anything is changed.

        Raises:
          ValueError: The array does not read, or reads with another shape.
        """
        self._check_key(name, key)
        self.reader.verify_tensor(name, key)

    def algorithms(self, name: str) -> Tuple[spec.Definition, ...]:
        """The algorithms the checkpoint allows for table `name`: those whose
        slots it holds (narrowed by a jax-tpu-embedding step's optimizer
        record, or by the record the package writes in the `TPUEmbedding`
        layout; for a SparseCore checkpoint, the one given)."""
        self._info(name)
        return self.reader.algorithms_of(name)

    def algorithm(self, name: str) -> spec.Definition:
        """The one algorithm of table `name`.

        Raises:
          ValueError: The checkpoint allows several (Adagrad and
            ProximalAdagrad keep the same slots) or none; the message names
            them.
        """
        found = self.algorithms(name)
        if len(found) != 1:
            raise ValueError(
                f"Table {name!r} of {self.path!r}: its slots "
                f"{list(self._info(name).slots)} fit "
                + (
                    f"{[d.name for d in found]}: the checkpoint does not say which."
                    if found
                    else "no algorithm of the package."
                )
            )
        return found[0]

    def layout(self, name: str) -> Any:
        """Where table `name` lives in the checkpoint, in the format's own
        record: a `jax_tpu_embedding.layouts.JaxTableLayout` (orbax steps),
        SparseCore's `SparseCoreTableLayout` proto, or the `TableInfo` with
        the `TPUEmbedding` layout's keys."""
        self._info(name)
        return self.reader.layout(name)

    def read_scalar(self, object_path: str) -> Any:
        """A variable that is no table (e.g. a step counter, `"step"`).

        Raises:
          TypeError: `object_path` is not a string.
          ValueError: No variable there.
        """
        if not isinstance(object_path, str):
            raise TypeError(
                "read_scalar: argument `object_path` must be a '/'-separated "
                f"string such as 'step'; received {object_path!r}."
            )
        return self.reader.read_scalar(object_path)

    @property
    def step(self) -> Optional[int]:
        """The training step the checkpoint records: of an orbax step its
        directory's number, of a Keras `OrbaxCheckpoint` step its tables'
        step counters (`None` where they differ), of a TensorFlow checkpoint
        its integer scalar at `open_checkpoint`'s `step_path` (by default
        `step`, where `save_tpu_checkpoint` and `write_checkpoint(...,
        step=)` write it); `None` where it records none.

        Raises:
          ValueError: No variable at the `step_path` given, or the variable
            read is no integer >= 0.
        """
        return self.reader.step

    def __repr__(self) -> str:
        return (
            f"Checkpoint({self.path!r}, format={self.format!r}, "
            f"tables={sorted(self.tables)})"
        )
