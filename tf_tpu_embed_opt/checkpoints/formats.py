"""The checkpoint formats: one registry, from which everything else derives.

Each `Format` names a format once: its name, what it is in words, the
arguments `open_checkpoint` and `describe_checkpoint` take for it, the module
that handles it (its `FormatHandler`: detection, opening, describing) and,
where the package writes it, the module of its writer (a `FormatWriter`).
`FORMATS` is every format `open_checkpoint` reads, in the order detection
tries them; `WRITTEN` those `write_checkpoint` writes. `open_checkpoint`,
`detect_format`, `describe_checkpoint`, `write_checkpoint`, the command
line's help and every refusal that lists formats ask this module; nothing
else compares a format's name. Nothing is imported until a format's handler
or writer is asked for, so that `--help` stays fast.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Dict, Iterable, Optional, Tuple

__all__ = [
    "FORMATS",
    "Format",
    "JAX_TPU_EMBEDDING",
    "KERAS",
    "KERAS_RS",
    "READ",
    "READ_NAMES",
    "SPARSECORE",
    "TPU_EMBEDDING",
    "WRITE",
    "WRITE_NAMES",
    "WRITTEN",
    "described",
    "format_named",
    "found",
    "holds_engine_state",
    "with_layout",
    "written_named",
]

_HOME = "tf_tpu_embed_opt.checkpoints."


@dataclasses.dataclass(frozen=True)
class Format:
    """One checkpoint format.

    Attributes:
      name: Its name, as `format=` takes it.
      words: What it is, in words (errors and help say it).
      takes: The arguments `open_checkpoint` and `describe_checkpoint` take
        for it (beyond `path` and `format`).
      handler: The module that detects, opens and describes it (relative to
        `tf_tpu_embed_opt.checkpoints`; a `protocol.FormatHandler`).
      writer: The module that writes it (a `protocol.FormatWriter`), or
        `None`: read only.
      orbax: Whether it is an orbax step (read with the `[jax]` extra, and
        detected from its files without TensorFlow); otherwise a TensorFlow
        checkpoint.
      write_takes: The arguments `write_checkpoint` takes for it (beyond
        `path` and `tables`).
      write_needs: Those of them it cannot do without.
      holds_whole: Whether its writer writes from one process holding each
        table whole (a table spread over JAX processes is refused before
        anything is written).
      layout: Of a stacked format: the `layout` its description names
        (`describe_checkpoint`); `None`: described table by table.
      engine: Whether it holds an engine's state, so that an algorithm no
        engine runs (a row-wise optimizer's state) is refused by name before
        a load; Keras's own format holds any twin's state.
    """

    name: str
    words: str
    takes: Tuple[str, ...]
    handler: str
    writer: Optional[str] = None
    orbax: bool = False
    write_takes: Tuple[str, ...] = ()
    write_needs: Tuple[str, ...] = ()
    holds_whole: bool = True
    layout: Optional[str] = None
    engine: bool = True

    def handling(self) -> Any:
        """The handler module (imported now)."""
        return importlib.import_module(_HOME + self.handler)

    def writing(self) -> Any:
        """The writer module (imported now)."""
        return importlib.import_module(_HOME + str(self.writer))

    def raise_missing(self, error: ModuleNotFoundError, what: str) -> None:
        """Raises `error` (an import failed while `what`, e.g. "reading the
        step 'x'") as what the user lacks for this format: the `[jax]` extra
        (`JaxNotInstalled`) for an orbax step, TensorFlow
        (`TensorFlowNotInstalled`) for a TensorFlow checkpoint; else `error`
        itself."""
        from tf_tpu_embed_opt import errors

        if self.orbax and errors.is_jax_missing(error):
            raise errors.JaxNotInstalled(what, error.name) from error
        if (
            not self.orbax
            and errors.is_tensorflow_missing(error)
            and not isinstance(error, errors.TensorFlowNotInstalled)
        ):
            raise errors.TensorFlowNotInstalled(what) from error
        raise error

    def __str__(self) -> str:
        return self.name


_JAX_TAKES = ("embedding_spec", "cache_bytes")

JAX_TPU_EMBEDDING = Format(
    "jax-tpu-embedding",
    "a jax-tpu-embedding orbax step",
    _JAX_TAKES,
    "jax_tpu_embedding.reader",
    writer="jax_tpu_embedding.writer",
    orbax=True,
    write_takes=(
        "algorithms",
        "step",
        "embedding_spec",
        "item",
        "variables_path",
        "naming",
        "pad_value",
        "items_from",
        "spill_bytes",
    ),
    write_needs=("algorithms", "step", "embedding_spec"),
    # Every process of a JAX job writes its own rows.
    holds_whole=False,
    layout="jax-tpu-embedding",
)
KERAS_RS = Format(
    "keras-rs",
    "a keras-rs DistributedEmbedding orbax step (JAX)",
    _JAX_TAKES,
    "jax_tpu_embedding.keras_rs",
    orbax=True,
    layout="keras-rs",
)
KERAS = Format(
    "keras",
    "a Keras OrbaxCheckpoint step of a model with the package's row-sparse layers",
    (),
    "keras.orbax_reader",
    orbax=True,
    engine=False,
)
SPARSECORE = Format(
    "sparsecore",
    "a TensorFlow checkpoint in the TPUEmbeddingV2 (SparseCore) layout",
    ("object_path", "algorithms", "step_path"),
    "sparsecore.reader",
    writer="sparsecore.writer",
    write_takes=("algorithms", "object_path", "layouts"),
    write_needs=("algorithms", "layouts"),
    layout="TPUEmbeddingV2",
)
TPU_EMBEDDING = Format(
    "tpu-embedding",
    "a TensorFlow checkpoint in the TPUEmbedding layout",
    ("object_path", "step_path"),
    "tpu_embedding.reader",
    writer="tpu_embedding.writer",
    write_takes=("algorithms", "step", "object_path", "step_path"),
)

# Detection tries them in this order: the orbax steps from their files, then
# a TensorFlow checkpoint's variables (SparseCore's layouts, else TPUEmbedding).
FORMATS: Tuple[Format, ...] = (
    JAX_TPU_EMBEDDING,
    KERAS_RS,
    KERAS,
    SPARSECORE,
    TPU_EMBEDDING,
)
WRITTEN: Tuple[Format, ...] = (TPU_EMBEDDING, SPARSECORE, JAX_TPU_EMBEDDING)

# The names, for `format=` arguments and the command line's choices; `READ`
# also says each in words.
READ_NAMES: Tuple[str, ...] = tuple(f.name for f in FORMATS)
WRITE_NAMES: Tuple[str, ...] = tuple(f.name for f in WRITTEN)
READ: Dict[str, str] = {f.name: f.words for f in FORMATS}
WRITE = WRITE_NAMES


def format_named(name: Any, function: str) -> Format:
    """The format called `name` (a `Format` passes through).

    Raises:
      ValueError: No format is called that; the message names `function`'s
        argument `format` and the formats there are.
    """
    if isinstance(name, Format):
        return name
    for format in FORMATS:
        if format.name == name:
            return format
    raise ValueError(
        f"{function}: argument `format` must be one of {list(READ_NAMES)} or "
        f"None; received {name!r}."
    )


def found(name: Any) -> Optional[Format]:
    """The format called `name`, or `None` (another table source's
    `"tables"`)."""
    return next((f for f in FORMATS if f.name == name), None)


def holds_engine_state(name: Any) -> bool:
    """Whether the format called `name` is an engine's (`Format.engine`);
    another table source's (`"tables"`) is not."""
    format = found(name)
    return format is not None and format.engine


def with_layout(layout: Any) -> Optional[Format]:
    """The stacked format whose description names `layout`, or `None`."""
    return next((f for f in FORMATS if layout and f.layout == layout), None)


def written_named(name: Any, function: str) -> Format:
    """The written format called `name`.

    Raises:
      ValueError: The package writes no format called that (keras-rs's steps
        are jax-tpu-embedding's in keras-rs's naming: the message says so).
    """
    for format in WRITTEN:
        if format.name == name or format is name:
            return format
    raise ValueError(
        f"{function}: argument `format` must be one of {list(WRITE_NAMES)}; "
        f"received {name!r} (keras-rs steps: format='jax-tpu-embedding', "
        "naming='keras-rs')."
    )


def described(formats: Iterable[Any]) -> str:
    """The formats (or their names) in words, as one list: "A, B or C"."""
    words = [format_named(f, "described").words for f in formats]
    if len(words) < 2:
        return "".join(words)
    return f"{', '.join(words[:-1])} or {words[-1]}"
