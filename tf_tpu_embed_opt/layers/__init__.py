"""Keras layers that carry their table's optimizer.

`Embedding`: a drop-in `keras.layers.Embedding` whose table steps only the
rows a batch looked up, with its own optimizer, inside the backward pass
(TPUEmbedding's contract on CPU/GPU), on Keras's TensorFlow and JAX backends.
`row_sparse_tables`: the same for a keras-rs `DistributedEmbedding`'s tables
off SparseCore, each with its own optimizer. `OutOfRangeIds`: the refusal of
an id outside a table; `LostArrays`: a model read after a failed step of
Keras's JAX trainer consumed its arrays. `StackedEmbedding`: many such
tables looked up and stepped as the TPU engines stack them (one dedup per
stack and step).
"""

from tf_tpu_embed_opt.layers.embedding import Embedding, table_optimizer
from tf_tpu_embed_opt.layers.ids import LostArrays, OutOfRangeIds
from tf_tpu_embed_opt.layers.keras_rs_tables import row_sparse_tables
from tf_tpu_embed_opt.layers.stacked import StackedEmbedding
from tf_tpu_embed_opt.optimizers import backend as _backend

__all__ = [
    "Embedding",
    "LostArrays",
    "OutOfRangeIds",
    "StackedEmbedding",
    "row_sparse_tables",
    "table_optimizer",
]

Embedding.__module__ = __name__
LostArrays.__module__ = __name__
OutOfRangeIds.__module__ = __name__
StackedEmbedding.__module__ = __name__

if _backend.BACKEND == "tensorflow":
    # Registers the sharded layer (`tf_tpu_embed_opt.sharded.Embedding`) with
    # Keras's serialization: its tables live on TensorFlow's parameter servers.
    from tf_tpu_embed_opt.layers import sharded  # noqa: F401
