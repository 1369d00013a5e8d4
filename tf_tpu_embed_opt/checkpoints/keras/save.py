"""Keras tables and their optimizer state, written in the `TPUEmbedding` layout.

`save_tpu_checkpoint` reads the tables and slots of a Keras model (found as
`checkpoints.keras.tables` finds them, the row-sparse layers' own included)
and writes them with `checkpoints.write_checkpoint(..., format="tpu-embedding")`,
to warm-start a TPU job; `load_into_keras` (`checkpoints.keras.state`) is its
way back.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional, Tuple

import keras

from tf_tpu_embed_opt import checkpoints
from tf_tpu_embed_opt.checkpoints.keras.tables import KerasTable, keras_tables
from tf_tpu_embed_opt.checkpoints.shared import paths
from tf_tpu_embed_opt.checkpoints.shared.keys import STEP_PATH
from tf_tpu_embed_opt.checkpoints.shared.table_info import engine_float32

__all__ = ["save_tpu_checkpoint"]


def _saved_value(variable: Any) -> Any:
    # A sharded variable goes to the writer as its `ShardedVariable`, which
    # the writer saves shard by shard on the shards' servers, and a JAX array
    # spread over processes as it is, which the writer refuses by name; any
    # other as a tensor read from it.
    import tensorflow as tf

    from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding.processes import is_spread
    from tf_tpu_embed_opt.optimizers import sharded

    value = variable.value if isinstance(variable, keras.Variable) else variable
    if sharded.shards_of(value) is not None:
        return value
    held = getattr(variable, "value", variable)  # a stacked table's rows too
    if is_spread(held):
        return held
    return tf.convert_to_tensor(variable)


def _tensor_states(tables: List[KerasTable]) -> Iterator[Tuple[str, Dict[str, Any]]]:
    # As `keras_table_states`, but as tensors read from the variables: no
    # NumPy copy of each table and slot on the way to the writer.
    import tensorflow as tf

    for table in tables:
        parameters = engine_float32(_saved_value(table.variable))
        state = {checkpoints.PARAMETERS: parameters}
        for slot, variable in table.slots.items():
            state[slot] = (
                engine_float32(_saved_value(variable))
                if variable is not None
                else tf.zeros(parameters.shape, parameters.dtype)
            )
        yield table.name, state
        del state, parameters


def save_tpu_checkpoint(
    prefix: str,
    variables: Any,
    optimizer: Any,
    *,
    names: Any = None,
    object_path: str = "embedding",
    step: Optional[int] = None,
    step_path: str = STEP_PATH,
) -> str:
    """Writes Keras tables and their optimizer state in the `TPUEmbedding` layout.

    `TPUEmbeddingForServing` and `TPUEmbedding` with the same tables and
    engine optimizers (whose tables are float32: a float16 or bfloat16 table
    and its slots are written as float32, which holds each of their values
    exactly, and which `load_into_keras` takes back into such a table; a
    float64 one is refused, it would round) restore the result with
    `tf.train.Checkpoint(**{object_path: embedding}).restore(prefix)`; call
    `.expect_partial()` on the returned status (after
    `assert_existing_objects_matched()` if you want that check), since the
    checkpoint also holds the step at `step_path`, which the embedding's object
    graph has no place for (TensorFlow would otherwise warn about an
    unrestored value). Tables are read and written one at a time; the
    checkpoint is discoverable only once complete (see
    `checkpoints.write_checkpoint`).

    A table sharded over parameter servers (see `tf_tpu_embed_opt.sharded`)
    and its slots are written by the servers that hold them, each shard as a
    slice of the table's key (as TensorFlow's own saver writes sharded
    variables): none of their rows pass through the calling process, and
    `prefix` must be on a file system that every such server reaches. The
    calling process writes the object graph and the step, and an engine slot
    the optimizer does not keep (written as zeros) as one tensor.

    Args:
      prefix: The checkpoint prefix to write.
      variables: As for `load_into_keras`.
      optimizer: As for `load_into_keras`.
      names: The tables to write: of a model as `variables`, required; of
        a mapping, some of its keys (default: all).
      object_path: Where the embedding object sits in the checkpoint.
      step: The step to store at `step_path`; `None`: the optimizer's
        `iterations` (with `optimizer=None`, the tables' own step counters,
        as row-sparse layers count their tables' steps; refused where they
        differ).
      step_path: Where to store the step.

    Returns:
      `prefix`.
    """
    # Refused by this function's name for it, before any table is read.
    prefix = paths.writable_prefix(prefix, "prefix")
    tables = keras_tables(variables, optimizer, names)
    if not tables:
        raise ValueError(
            "`variables` holds no table; a checkpoint needs at least one. "
            f"Received {variables!r}."
        )
    if step is None and optimizer is not None:
        step = int(keras.ops.convert_to_numpy(optimizer.iterations))
    elif step is None:
        # Without a model optimizer, the tables' own counters: one step.
        counted = {
            t.name: int(keras.ops.convert_to_numpy(t.optimizer.iterations))
            for t in tables
        }
        if len(set(counted.values())) > 1:
            raise ValueError(
                "save_tpu_checkpoint: the tables count different steps "
                f"({counted}) and `optimizer` is None, so no one step is "
                "theirs; give `step`."
            )
        step = next(iter(counted.values()))
    return checkpoints.write_checkpoint(
        prefix,
        _tensor_states(tables),
        format="tpu-embedding",
        object_path=object_path,
        algorithms={t.name: t.definition for t in tables},
        step=step,
        step_path=step_path,
    )
