"""Keras layers that carry their table's optimizer.

`Embedding`: a drop-in `keras.layers.Embedding` whose table steps only the
rows a batch looked up, with its own optimizer, inside the backward pass
(TPUEmbedding's contract on CPU/GPU), on Keras's TensorFlow and JAX backends.
`row_sparse_tables`: the same for a keras-rs `DistributedEmbedding`'s tables
off SparseCore, each with its own optimizer. `OutOfRangeIds`: the refusal of
an id outside a table.
"""

from tf_tpu_embed_opt.layers.embedding import Embedding, table_optimizer
from tf_tpu_embed_opt.layers.ids import OutOfRangeIds
from tf_tpu_embed_opt.layers.keras_rs_tables import row_sparse_tables

__all__ = ["Embedding", "OutOfRangeIds", "row_sparse_tables", "table_optimizer"]

Embedding.__module__ = __name__
OutOfRangeIds.__module__ = __name__
