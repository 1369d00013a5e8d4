"""Checkpoints with optimizer state, between the TPU layouts and Keras.

`open_checkpoint(path)` opens a checkpoint of any format the package reads
(TensorFlow's `TPUEmbedding` and `TPUEmbeddingV2` layouts, jax-tpu-embedding,
keras-rs and Keras `OrbaxCheckpoint` orbax steps; `formats` names them),
detecting it in one place, as a `Checkpoint` with the same methods for each
(`reader`); `write_checkpoint(path, tables, format=...)` writes the two
TensorFlow layouts and jax-tpu-embedding's steps (keras-rs's among them), in
any topology (`writer`); `describe_checkpoint(path)` says what one holds
without reading its tensors.

Modules, from the bottom up: `formats` (the formats' names and words),
`keys` (TensorFlow's checkpoint key escaping,
without TensorFlow), `tpu_layout` and `tpu_writer` (the `TPUEmbedding`
layout: a reader and a writer of table states, re-exported here), `sparsecore` (the
`TPUEmbeddingV2` SparseCore layout: `sparsecore_stacks`, `sparsecore_reader`,
`sparsecore_writer`), `keras_state` (Keras variables and
optimizer slots to and from table states) and `multi_optimizer` (a
per-table Keras `MultiOptimizer` from a TPU configuration or keras-rs's
tables, and back).

The names below load their (TensorFlow) modules on first use, so that
`multi_optimizer` serves keras-rs on Keras's JAX backend without TensorFlow.
"""

from typing import List

from tf_tpu_embed_opt import lazy

__all__ = [
    "open_checkpoint",
    "write_checkpoint",
    "describe_checkpoint",
    "detect_format",
    "Checkpoint",
    "FORMATS",
    "PARAMETERS",
    "TableInfo",
    "TPUCheckpointReader",
    "write_tpu_checkpoint",
    "algorithms_for_slots",
    "check_table_state",
    "checkpoint_key",
]

_HOMES = {
    "open_checkpoint": "reader",
    "write_checkpoint": "writer",
    "describe_checkpoint": "reader",
    "detect_format": "reader",
    "Checkpoint": "reader",
    "FORMATS": "reader",
    "PARAMETERS": "table_info",
    "TableInfo": "table_info",
    "TPUCheckpointReader": "tpu_layout",
    "algorithms_for_slots": "table_info",
    "check_table_state": "tpu_layout",
    "checkpoint_key": "tpu_layout",
    "write_tpu_checkpoint": "tpu_writer",
}


__getattr__ = lazy.module_getattr(__name__, _HOMES, globals())


def __dir__() -> List[str]:
    return list(__all__)
