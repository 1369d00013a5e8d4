"""Checkpoints with optimizer state, between the TPU layouts and Keras.

Modules, from the bottom up: `keys` (TensorFlow's checkpoint key escaping,
without TensorFlow), `tpu_layout` and `tpu_writer` (the `TPUEmbedding`
layout: a reader and a writer of table states, re-exported here), `sparsecore` (the
`TPUEmbeddingV2` SparseCore layout: `sparsecore_stacks`, `sparsecore_reader`,
`sparsecore_writer`), `keras_state` (Keras variables and
optimizer slots to and from table states) and `multi_optimizer` (a
per-table Keras `MultiOptimizer` from a TPU configuration, and back).
"""

from tf_tpu_embed_opt.checkpoints.tpu_layout import (
    PARAMETERS,
    TableInfo,
    TPUCheckpointReader,
    algorithms_for_slots,
    check_table_state,
    checkpoint_key,
)
from tf_tpu_embed_opt.checkpoints.tpu_writer import write_tpu_checkpoint

__all__ = [
    "PARAMETERS",
    "TableInfo",
    "TPUCheckpointReader",
    "write_tpu_checkpoint",
    "algorithms_for_slots",
    "check_table_state",
    "checkpoint_key",
]
