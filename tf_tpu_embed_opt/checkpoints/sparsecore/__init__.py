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
- `checkpoints.write_checkpoint(path, states, format="sparsecore",
  layouts=..., algorithms=...)` writes such states in
  the stacked, padded, sharded form `TPUEmbeddingV2` itself saves (object
  graph, keys, per-device slices and the layouts proto), which a
  `TPUEmbeddingV2` restores directly when its layouts are the same and
  through TensorFlow's `EmbeddingReshardCallback` when they differ (in
  TensorFlow 2.20 only when both stack the same tables together), and which
  `TPUEmbeddingForServing` restores on CPU.
- `stack_layouts(feature_config, optimizer, num_replicas=...)` computes the
  layouts a TPU job's `TPUEmbeddingV2` will use, on CPU.
- `checkpoints.describe_checkpoint(path)` says what a checkpoint holds
  without reading its tensors.

This module's own `write_checkpoint` and `describe_checkpoint`, the earlier
spellings of those two, still run with a `DeprecationWarning` for one
release.

The layout facts, with their sources in TensorFlow, are in
docs/tpu_semantics.md, section "SparseCore checkpoint layout".
"""

from tf_tpu_embed_opt.checkpoints.shared.stacks import (
    LAYOUTS_KEY,
    PARAMETERS,
    checkpoint_key,
    group_layouts,
    parse_layouts,
    shard_tables,
    stack_layouts,
    unshard_table,
)
from tf_tpu_embed_opt.checkpoints.sparsecore.reader import (
    SparseCoreCheckpointReader,
    describe_checkpoint,
    read_layouts,
    read_tables,
)
from tf_tpu_embed_opt.checkpoints.sparsecore.writer import write_checkpoint

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
