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

import os
from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np

from tf_tpu_embed_opt.checkpoints import formats
from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding.reader import STREAM_BLOCK_BYTES
from tf_tpu_embed_opt.checkpoints.shared.keys import STEP_PATH
from tf_tpu_embed_opt.checkpoints.shared.table_info import PARAMETERS, TableInfo
from tf_tpu_embed_opt.definitions import spec
from tf_tpu_embed_opt.errors import (
    JaxNotInstalled,
    TensorFlowNotInstalled,
    is_jax_missing,
    is_tensorflow_missing,
)

__all__ = [
    "FORMATS",
    "Checkpoint",
    "describe_checkpoint",
    "detect_format",
    "open_checkpoint",
]

# The formats `open_checkpoint` reads, in the order `detect_format` tries them
# (`Checkpoint.wrapping` also takes any table source: format "tables").
FORMATS: Tuple[str, ...] = tuple(formats.READ)


def _is_remote(path: str) -> bool:
    return "://" in path


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
    return f"a file of {size:,} bytes" if size else "an empty file"


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
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(
            "open_checkpoint: argument `path` must be a checkpoint prefix or "
            "directory, or an orbax step directory (a str or os.PathLike); "
            f"received {path!r} of type {type(path).__name__}."
        )
    path = os.fspath(path)
    from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import reader as jax_orbax
    from tf_tpu_embed_opt.checkpoints.keras import orbax_reader as keras_orbax
    from tf_tpu_embed_opt.checkpoints.shared import orbax_items

    if not _is_remote(path):
        if jax_orbax.is_jax_checkpoint(path):
            return "jax-tpu-embedding"
        if os.path.isdir(path) and orbax_items.keras_rs_weights(path):
            return "keras-rs"
        if keras_orbax.is_keras_step(path):
            return "keras"
        if not _tensorflow_checkpoint_files(path):
            raise ValueError(
                f"open_checkpoint: `path` {path!r} is not a checkpoint: "
                f"{_what_is_there(path)}. Looked for "
                f"{formats.described(FORMATS)} (an orbax step is a directory "
                "with embedding_spec/, keras-rs stack weights or a model's "
                "pytree/; a TensorFlow checkpoint is PREFIX.index, or a "
                "directory with a `checkpoint` state file: otherwise pass the "
                "prefix, e.g. 'dir/ckpt-1')."
            )
    try:
        import tensorflow as tf

        from tf_tpu_embed_opt.checkpoints import sparsecore as sparsecore_layout
        from tf_tpu_embed_opt.checkpoints.shared import paths
    except ModuleNotFoundError as error:
        if isinstance(error, TensorFlowNotInstalled) or not is_tensorflow_missing(
            error
        ):
            raise
        raise TensorFlowNotInstalled(
            f"reading the TensorFlow checkpoint {path!r}"
        ) from error
    prefix = paths.checkpoint_prefix(path)
    try:
        names = [name for name, _ in tf.train.list_variables(prefix)]
    except Exception as error:  # noqa: BLE001 - TensorFlow's own, many kinds
        raise ValueError(
            f"open_checkpoint: `path` {path!r} is not a readable TensorFlow "
            f"checkpoint: {paths.first_line(error)}"
        ) from None
    if any(sparsecore_layout.LAYOUTS_KEY in name for name in names):
        return "sparsecore"
    return "tpu-embedding"


def open_checkpoint(
    path: Any,
    *,
    format: Optional[str] = None,
    object_path: Optional[str] = None,
    algorithms: Any = None,
    embedding_spec: Any = None,
    cache_bytes: Optional[int] = None,
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

    Returns:
      A `Checkpoint`.

    Raises:
      TypeError, ValueError: A bad argument, a path that holds no checkpoint,
        or an argument that does not fit the format; the message names it.
      TensorFlowNotInstalled: A TensorFlow checkpoint, without TensorFlow.
      JaxNotInstalled: An orbax step, without the `[jax]` extra.
    """
    format = _checked_arguments(
        "open_checkpoint",
        path,
        format,
        object_path=object_path,
        algorithms=algorithms,
        embedding_spec=embedding_spec,
        cache_bytes=cache_bytes,
    )
    path = os.fspath(path)
    if format in ("jax-tpu-embedding", "keras-rs"):
        from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import reader as jax_orbax

        if format == "keras-rs" and embedding_spec is None:
            raise ValueError(
                f"open_checkpoint: {path!r} is a keras-rs step, which does not "
                "record which table is where: pass `embedding_spec` "
                "(checkpoints.jax_tpu_embedding.keras_rs.embedding_spec("
                "feature_configs, num_devices, sparsecores_per_device, "
                "table_stacking))."
            )
        reader = _orbax(
            lambda step: jax_orbax.JaxCheckpointReader(
                step, embedding_spec, cache_bytes=cache_bytes
            ),
            path,
            format,
        )
    elif format == "keras":
        from tf_tpu_embed_opt.checkpoints.keras import orbax_reader as keras_orbax

        reader = _orbax(keras_orbax.KerasCheckpointReader, path, format)
    elif format == "sparsecore":
        from tf_tpu_embed_opt.checkpoints import sparsecore as sparsecore_layout

        if algorithms is None:
            raise ValueError(
                f"open_checkpoint: {path!r} is a SparseCore (TPUEmbeddingV2) "
                "checkpoint, whose slots do not name the algorithm (Adagrad and "
                "ProximalAdagrad both keep `accumulators`): pass `algorithms` "
                "to tf_tpu_embed_opt.checkpoints.open_checkpoint (one, or a "
                "mapping table -> one)."
            )
        reader = sparsecore_layout.SparseCoreCheckpointReader(
            path, algorithms, object_path=object_path
        )
    else:
        from tf_tpu_embed_opt.checkpoints.tpu_embedding.reader import (
            TPUCheckpointReader,
        )

        reader = TPUCheckpointReader(path, object_path)
    return Checkpoint(reader, format, path)


# The arguments each format takes (`open_checkpoint`, `describe_checkpoint`).
_TAKES = {
    "jax-tpu-embedding": ("embedding_spec", "cache_bytes"),
    "keras-rs": ("embedding_spec", "cache_bytes"),
    "keras": (),
    "sparsecore": ("object_path", "algorithms"),
    "tpu-embedding": ("object_path",),
}


def _checked_arguments(function: str, path: Any, format: Any, **given: Any) -> str:
    """`format` (detected where `None`), once every argument given fits it."""
    if format is None:
        format = detect_format(path)
    elif format not in FORMATS:
        raise ValueError(
            f"{function}: argument `format` must be one of {list(FORMATS)} "
            f"or None; received {format!r}."
        )
    takes = _TAKES[format]
    for name, value in given.items():
        if value is not None and name not in takes:
            raise ValueError(
                f"{function}: argument `{name}` {value!r} does not apply to "
                f"{os.fspath(path)!r}, a {format} checkpoint, which takes "
                f"{', '.join(takes) or 'none of these arguments'}."
            )
    return format


def describe_checkpoint(
    path: Any,
    *,
    format: Optional[str] = None,
    object_path: Optional[str] = None,
    embedding_spec: Any = None,
) -> Dict[str, Any]:
    """What a checkpoint of any format holds, without reading its tensors
    (what `tf-tpu-embed-opt checkpoint inspect` prints).

    Args:
      path: As `open_checkpoint`'s.
      format: One of `FORMATS`; `None` detects it.
      object_path: Of a TensorFlow checkpoint, as `open_checkpoint`'s.
      embedding_spec: Of an orbax step, as `open_checkpoint`'s; a keras-rs
        step without it is described by its stacks alone (which table is
        where is not recorded there).

    Returns:
      A JSON-ready dict with `checkpoint` (its path or prefix), `format` and
      `bytes` (of every tensor described), and for the `TPUEmbedding` layout
      `object_path` and `tables` (one dict per table: `table`, `shape`,
      `dtype`, `slots`, `algorithms` it fits, `bytes`), for a Keras
      `OrbaxCheckpoint` step `step` (see `Checkpoint.step`) and `tables`
      (each also with its `layer` and `row_offset` there), for the stacked
      layouts `layout` and `stacked_tables` (one dict per stack: its name,
      `shape`, `slots`, `algorithms`, `bytes` and, where known, its tables'
      places).

    Raises:
      As `open_checkpoint`.
    """
    format = _checked_arguments(
        "describe_checkpoint",
        path,
        format,
        object_path=object_path,
        embedding_spec=embedding_spec,
    )
    path = os.fspath(path)
    if format == "tpu-embedding":
        from tf_tpu_embed_opt.checkpoints.tpu_embedding.reader import (
            TPUCheckpointReader,
        )

        reader = TPUCheckpointReader(path, object_path)
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
            "format": format,
            "object_path": "/".join(reader.object_path),
            "tables": tables,
            "bytes": sum(t["bytes"] for t in tables),
        }
    if format == "keras":
        reader = open_checkpoint(path, format=format).reader
        tables = reader.describe()
        return {
            "checkpoint": path,
            "format": format,
            "step": reader.step,
            "tables": tables,
            "bytes": sum(t["bytes"] for t in tables),
        }
    if format == "sparsecore":
        from tf_tpu_embed_opt.checkpoints.sparsecore import reader as sparsecore_reader

        layout = "TPUEmbeddingV2"
        stacks = sparsecore_reader.describe_checkpoint(path, object_path=object_path)
    elif format == "keras-rs" and embedding_spec is None:
        from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import (
            keras_rs as keras_rs_orbax,
        )

        layout = "keras-rs"
        stacks = _orbax(keras_rs_orbax.describe_checkpoint, path, format)
    else:
        from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import reader as jax_orbax

        layout = "jax-tpu-embedding"
        stacks = _orbax(jax_orbax.describe_jax_checkpoint, path, format, embedding_spec)
    return {
        "checkpoint": path,
        "format": format,
        "layout": layout,
        "stacked_tables": stacks,
        "bytes": sum(stack["bytes"] for stack in stacks),
    }


def _orbax(describe: Any, path: str, format: str, *arguments: Any) -> Any:
    """`describe(path, *arguments)` of an orbax step; without the `[jax]`
    extra, `JaxNotInstalled`."""
    try:
        return describe(path, *arguments)
    except ModuleNotFoundError as error:
        if not is_jax_missing(error):
            raise
        raise JaxNotInstalled(
            f"reading the {format} step {path!r}", error.name
        ) from error


class Checkpoint:
    """An open checkpoint, of any format (see `open_checkpoint`).

    Attributes:
      format: One of `FORMATS` (`"tables"` for another table source).
      path: The path it was opened from.
      tables: Table name -> `TableInfo` (shape, dtype, slots, keys).
      reader: The format's own reader (`TPUCheckpointReader`,
        `SparseCoreCheckpointReader`, `JaxCheckpointReader`) or table
        source.
      row_reads: Where `read_rows` reads without reading the whole array:
        `"device"` (on the device given, a parameter server reading the
        checkpoint's files itself: the `TPUEmbedding` layout), `"caller"`
        (in this process, only the rows' chunks: orbax steps) or `None`
        (the table state is read whole, then cut: SparseCore's stacks and
        other table sources).
    """

    def __init__(self, reader: Any, format: str, path: str) -> None:
        self.reader = reader
        self.format = format
        self.path = path
        self.tables: Mapping[str, TableInfo] = reader.tables
        self.row_reads = {
            "tpu-embedding": "device",
            "jax-tpu-embedding": "caller",
            "keras-rs": "caller",
            "keras": "caller",
        }.get(format)

    @classmethod
    def wrapping(cls, source: Any) -> "Checkpoint":
        """A table source as a `Checkpoint`: a format's reader, or any object
        with `tables` (name -> `TableInfo`) and `read(name)` (format
        `"tables"`, read whole table by table)."""
        formats = {
            "TPUCheckpointReader": "tpu-embedding",
            "SparseCoreCheckpointReader": "sparsecore",
            "JaxCheckpointReader": "jax-tpu-embedding",
            "KerasCheckpointReader": "keras",
        }
        name = type(source).__name__
        module = type(source).__module__
        if module.startswith("tf_tpu_embed_opt.checkpoints") and name in formats:
            format = formats[name]
        else:
            format = "tables"
        path = getattr(source, "path", None) or getattr(source, "prefix", None)
        return cls(source, format, path if path is not None else repr(source))

    def _info(self, name: str) -> TableInfo:
        if name not in self.tables:
            raise KeyError(
                f"Checkpoint {self.path!r} has no table {name!r}; its tables: "
                f"{sorted(self.tables)}."
            )
        return self.tables[name]

    def _check_key(self, name: str, key: str) -> TableInfo:
        info = self._info(name)
        if key != PARAMETERS and key not in info.slots:
            raise KeyError(
                f"Table {name!r} of {self.path!r} has no {key!r}; it has "
                f"{[PARAMETERS, *info.slots]}."
            )
        return info

    def read(self, name: str) -> Dict[str, np.ndarray]:
        """The state of table `name`: `{"parameters": ..., <slot>: ...}`,
        unstacked, unpadded and unsharded."""
        self._info(name)
        return self.reader.read(name)

    def read_tensor(self, name: str, key: str) -> np.ndarray:
        """One array of one table: `"parameters"` or an engine slot name."""
        self._check_key(name, key)
        read_tensor = getattr(self.reader, "read_tensor", None)
        if read_tensor is not None:
            return read_tensor(name, key)
        return self.reader.read(name)[key]

    def read_rows(
        self, name: str, key: str, rows: Tuple[int, int], device: Any = None
    ) -> Any:
        """Rows `rows` (`start, stop`) of one array of one table; where
        `row_reads` is `"device"`, read on `device` (a tensor there)."""
        info = self._check_key(name, key)
        start, stop = rows
        if not 0 <= start <= stop <= info.shape[0]:
            raise ValueError(
                f"Table {name!r}: rows {rows!r} are outside its {info.shape[0]} rows."
            )
        if self.row_reads is None:
            return self.read_tensor(name, key)[start:stop]
        return self.reader.read_rows(name, key, (start, stop), device)

    def stream(self, name: str, key: str = PARAMETERS) -> Any:
        """One array of one table as a `sparsecore_stacks.RowStream`: blocks
        of rows, for a table larger than memory (one block held at a time
        where the format reads rows; SparseCore's stack is read whole)."""
        from tf_tpu_embed_opt.checkpoints.shared import stacks as sparsecore_stacks

        info = self._check_key(name, key)
        own = getattr(self.reader, "stream", None)
        if self.row_reads == "caller" and own is not None:
            return own(name, key)
        dtype = np.dtype(info.dtype if key == PARAMETERS else info.slot_dtypes[key])
        rows, columns = info.shape
        block = max(1, STREAM_BLOCK_BYTES // max(1, columns * dtype.itemsize))

        def blocks() -> Any:
            for start in range(0, rows, block):
                stop = min(rows, start + block)
                values = np.asarray(self.read_rows(name, key, (start, stop)))
                yield np.arange(start, stop), values

        return sparsecore_stacks.RowStream(info.shape, dtype, blocks)

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
        info = self._check_key(name, key)
        verify_tensor = getattr(self.reader, "verify_tensor", None)
        if verify_tensor is not None:
            verify_tensor(name, key)
            return
        value = self.read_tensor(name, key)
        if tuple(np.shape(value)) != tuple(info.shape):
            raise ValueError(
                f"Table {name!r}: {key!r} reads with shape "
                f"{tuple(np.shape(value))}; expected {tuple(info.shape)}."
            )

    def algorithms(self, name: str) -> Tuple[spec.Definition, ...]:
        """The algorithms the checkpoint allows for table `name`: those whose
        slots it holds (narrowed by a jax-tpu-embedding step's optimizer
        record, or by the record the package writes in the `TPUEmbedding`
        layout; for a SparseCore checkpoint, the one given)."""
        info = self._info(name)
        by_reader = getattr(self.reader, "algorithms", None)
        if isinstance(by_reader, Mapping) and name in by_reader:
            return tuple(by_reader[name])
        return info.algorithms

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
        record: a `jax_layouts.JaxTableLayout` (orbax steps), SparseCore's
        `SparseCoreTableLayout` proto, or the `TableInfo` with the
        `TPUEmbedding` layout's keys."""
        info = self._info(name)
        if self.format in ("tpu-embedding", "tables"):
            return info
        return self.reader.layout(name)

    def read_scalar(self, object_path: str) -> Any:
        """A variable that is no table (e.g. a step counter, `"step"`)."""
        return self.reader.read_scalar(object_path)

    @property
    def step(self) -> Optional[int]:
        """The training step the checkpoint records: of an orbax step its
        directory's number, of a Keras `OrbaxCheckpoint` step its tables'
        step counters (`None` where they differ), of a TensorFlow checkpoint
        its int64 scalar `step` (`STEP_PATH`, where `save_tpu_checkpoint`
        and `write_checkpoint(..., step=)` write it; `read_scalar` reads
        another); `None` where it records none."""
        if self.format == "keras":
            return self.reader.step
        if self.format in ("jax-tpu-embedding", "keras-rs"):
            name = os.path.basename(os.path.normpath(self.path))
            return int(name) if name.isdigit() else None
        if not hasattr(self.reader, "read_scalar"):
            return None
        try:
            return int(self.reader.read_scalar(STEP_PATH))
        except ValueError:
            return None

    def __repr__(self) -> str:
        return (
            f"Checkpoint({self.path!r}, format={self.format!r}, "
            f"tables={sorted(self.tables)})"
        )
