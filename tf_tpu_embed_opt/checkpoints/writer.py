"""One way to write every checkpoint format the package writes: `write_checkpoint`.

The formats are `open_checkpoint`'s (`checkpoints.reader.FORMATS`) but for
keras-rs's, which is a jax-tpu-embedding step in keras-rs's naming (write it
with `format="jax-tpu-embedding", naming="keras-rs"`):

- `"tpu-embedding"`: TensorFlow's `TPUEmbedding` layout
  (`tpu_embedding.writer`), what `TPUEmbedding` and `TPUEmbeddingForServing`
  restore;
- `"sparsecore"`: the checkpoint `TPUEmbeddingV2` saves, in given layouts
  (`sparsecore.writer`);
- `"jax-tpu-embedding"`: an orbax step of a jax-tpu-embedding job (or a
  keras-rs one) of any topology (`jax_tpu_embedding.writer`).

Each is a `protocol.FormatWriter` registered in `formats`, whose record says
the arguments it takes and needs: they are checked here, before the writer
(and TensorFlow or orbax) is imported.

Every format takes the tables the same way: `(name, state)` pairs or a
mapping name -> state, a state being `{"parameters": array, <engine slot>:
array, ...}` (what `Checkpoint.read` gives; `RowStream`s from
`Checkpoint.streams` for the orbax format, for tables larger than memory),
of float32, the engines' dtype (`shared.table_info.engine_state` widens a
float16 or bfloat16 state exactly; another dtype is refused by name).
Every write is complete or leaves nothing at `path`. An argument that does
not apply to the format is refused by name.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional, Sequence, Tuple

from tf_tpu_embed_opt.checkpoints import formats
from tf_tpu_embed_opt.checkpoints.protocol import Tables, is_pair

__all__ = ["WRITE_FORMATS", "write_checkpoint"]

WRITE_FORMATS: Tuple[str, ...] = formats.WRITE_NAMES


def write_checkpoint(
    path: str,
    tables: Tables,
    *,
    format: str = "tpu-embedding",
    algorithms: Optional[Mapping[str, Any]] = None,
    step: Optional[int] = None,
    object_path: Optional[str] = None,
    step_path: Optional[str] = None,
    layouts: Any = None,
    embedding_spec: Any = None,
    item: Optional[str] = None,
    variables_path: Optional[Sequence[str]] = None,
    naming: Optional[str] = None,
    pad_value: Optional[float] = None,
    items_from: Optional[str] = None,
    spill_bytes: Optional[int] = None,
) -> str:
    """Writes table states (with their optimizer slots) as a checkpoint.

    Args:
      path: `"tpu-embedding"`, `"sparsecore"`: the checkpoint prefix to write
        (an existing checkpoint there is replaced). `"jax-tpu-embedding"`:
        the orbax root directory; the step goes to `path/<step>`.
      tables: `(name, state)` pairs (a generator holds one table at a time)
        or a mapping name -> state.
      format: One of `WRITE_FORMATS`.
      algorithms: `{table: algorithm}` (a name, a `Definition` or an
        optimizer of either face). Optional for `"tpu-embedding"` (then
        checked against each state's slots; `None` for a table whose
        algorithm is not known); `"sparsecore"` also takes one algorithm for
        every table.
      step: The training step: stored at `step_path` (`"tpu-embedding"`,
        optional), or the orbax step's number (`"jax-tpu-embedding"`).
      object_path: Of the TensorFlow formats: where the embedding object sits
        (default `"embedding"`).
      step_path: Of `"tpu-embedding"`: where `step` is stored (default
        `"step"`).
      layouts: Of `"sparsecore"`: the target `SparseCoreTableLayouts`, e.g.
        `sparsecore_layout.stack_layouts(feature_config, optimizer,
        num_replicas=...)`, or those of a checkpoint the job wrote
        (`sparsecore_layout.read_layouts`).
      embedding_spec: Of `"jax-tpu-embedding"`: the target layout (from
        `checkpoints.jax_tpu_embedding.specs.embedding_spec_for`,
        `retarget_embedding_spec` there, or a job's proto).
      item: Of `"jax-tpu-embedding"`: the orbax item holding the variables
        (default: where `items_from` holds its stacks, else `"model"`).
      variables_path: Of `"jax-tpu-embedding"`: where the stacks sit in it.
      naming: Of `"jax-tpu-embedding"`: `"jax-tpu-embedding"` or
        `"keras-rs"` (keras-rs's weight names).
      pad_value: Of `"jax-tpu-embedding"`: the padding's value (NaN).
      items_from: Of `"jax-tpu-embedding"`: a step whose other items come
        along.
      spill_bytes: Of `"jax-tpu-embedding"`: the stacks held in memory
        together, beyond which they spill to memory-mapped files.

    Returns:
      What was written: the prefix, or the orbax step directory.

    Raises:
      TypeError, ValueError: An unknown format, an argument that does not
        apply to it or that it needs and lacks (named), `tables` that are not
        `(name, state)` pairs or a state that is no mapping (named as they
        come), or what the format's writer refuses (a missing or extra table
        or slot, a wrong shape or dtype); nothing is written then.
    """
    written = formats.written_named(format, "write_checkpoint")
    given = {
        "algorithms": algorithms,
        "step": step,
        "object_path": object_path,
        "step_path": step_path,
        "layouts": layouts,
        "embedding_spec": embedding_spec,
        "item": item,
        "variables_path": variables_path,
        "naming": naming,
        "pad_value": pad_value,
        "items_from": items_from,
        "spill_bytes": spill_bytes,
    }
    for name, value in given.items():
        if value is not None and name not in written.write_takes:
            raise ValueError(
                f"write_checkpoint: argument `{name}` does not apply to format "
                f"{written.name!r}, which takes {', '.join(written.write_takes)}."
            )
    for name in written.write_needs:
        if given[name] is None:
            raise ValueError(
                f"write_checkpoint: format {written.name!r} needs argument `{name}`."
            )
    pairs = _checked_pairs(
        tables.items() if isinstance(tables, Mapping) else tables, written
    )
    tables = dict(pairs) if isinstance(tables, Mapping) else pairs
    chosen = {k: v for k, v in given.items() if v is not None}
    try:
        writing = written.writing()
    except ModuleNotFoundError as error:
        written.raise_missing(error, f"write_checkpoint(format={written.name!r})")
    return writing.write(path, tables, **chosen)


def _checked_pairs(pairs: Any, format: formats.Format) -> Any:
    """`pairs`, each checked to be a `(name, state)` pair as it comes (the
    first before anything is written) and, where `format` is written from
    one process holding the tables whole, its state held so: a table spread
    over several JAX processes is refused by name (only the
    jax-tpu-embedding writer writes from every process)."""
    if isinstance(pairs, (str, bytes)) or not isinstance(pairs, Iterable):
        raise TypeError(
            "write_checkpoint: argument `tables` must be (name, state) pairs or "
            f"a mapping name -> state; received {type(pairs).__name__}."
        )
    pairs = iter(pairs)
    first = next(pairs, None)
    if first is None:
        return iter(())
    _check_pair(first, format)

    def checked() -> Any:
        yield first
        for pair in pairs:
            _check_pair(pair, format)
            yield pair

    return checked()


def _check_pair(pair: Any, format: formats.Format) -> None:
    from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding.processes import is_spread

    if not (is_pair(pair) and isinstance(pair[0], str)):
        raise TypeError(
            "write_checkpoint: argument `tables` must give (name, state) pairs, "
            "a state being {'parameters': array, <slot>: array, ...}; received "
            f"an item {pair!r:.80}."
        )
    name, state = pair
    if not name:
        # No engine names a table so (TPUEmbedding names an unnamed one
        # "table_<i>"), so no job could restore it.
        raise ValueError(
            "write_checkpoint: argument `tables` gives a table named ''; a "
            "table's name must not be empty."
        )
    if not isinstance(state, Mapping):
        raise TypeError(
            f"write_checkpoint: table {name!r}: its state must be a mapping "
            "{'parameters': array, <slot>: array, ...}; received "
            f"{type(state).__name__}."
        )
    if format.holds_whole and any(is_spread(value) for value in state.values()):
        raise ValueError(
            f"write_checkpoint: table {name!r} is spread over several JAX "
            f"processes; format {format.name!r} is written from one process "
            "holding the tables whole. Write format='jax-tpu-embedding' "
            "(every process writes its rows), or save the job's step with "
            "keras.callbacks.OrbaxCheckpoint and convert that step in one "
            "process (`tf-tpu-embed-opt checkpoint convert STEP DST`)."
        )
