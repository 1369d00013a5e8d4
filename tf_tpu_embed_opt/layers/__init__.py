"""Keras layers that carry their table's optimizer.

`Embedding`: a drop-in `keras.layers.Embedding` whose table steps only the
rows a batch looked up, with its own optimizer, inside the backward pass
(TPUEmbedding's contract on CPU/GPU), on Keras's TensorFlow and JAX backends.
"""

from tf_tpu_embed_opt.layers.embedding import Embedding, table_optimizer

__all__ = ["Embedding", "table_optimizer"]

Embedding.__module__ = __name__
