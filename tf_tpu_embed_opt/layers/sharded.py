"""Tables sharded over parameter servers: the layer, and the whole surface.

This is the public `tf_tpu_embed_opt.sharded`. Its `Embedding` is
`keras.layers.Embedding` reading a sharded table row by row; the optimizer
side (`ShardedOptimizerMixin`, `gradients`, `lookup`, `checkpointable`, ...)
lives with the twins in `tf_tpu_embed_opt.optimizers.sharded`, whose
docstring says how a sharded table trains, and is re-exported here.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from tf_tpu_embed_opt.optimizers.sharded import (
    CheckpointedShards,
    ShardedOptimizerMixin,
    checkpointable,
    gradients,
    lookup,
    shards_of,
    split_gradient,
    wait_for_steps_in_flight,
)

__all__ = [
    "CheckpointedShards",
    "Embedding",
    "ShardedOptimizerMixin",
    "checkpointable",
    "gradients",
    "lookup",
    "shards_of",
    "split_gradient",
    "wait_for_steps_in_flight",
]


# Registered as "ShardedEmbedding": "tf_tpu_embed_opt>Embedding" is the
# row-sparse `tf_tpu_embed_opt.layers.Embedding`, whose `from_config` still
# reads files this layer wrote under that name (they have no `optimizer`).
@keras.saving.register_keras_serializable(
    package="tf_tpu_embed_opt", name="ShardedEmbedding"
)
class Embedding(keras.layers.Embedding):
    """`keras.layers.Embedding` that reads a sharded table row by row.

    Same arguments and weights as `keras.layers.Embedding`; when its table is
    sharded (created under `ParameterServerStrategy` with a
    `variable_partitioner`), `call` reads only the looked-up rows from their
    parameter servers (see `lookup`). Otherwise it is Keras's layer.

    Saved in `.keras` files under the registered name
    `"tf_tpu_embed_opt>ShardedEmbedding"`.
    """

    def build(self, input_shape: Any = None) -> None:
        super().build(input_shape)
        checkpointable([getattr(self, "_embeddings", None)])

    def call(self, inputs: Any) -> Any:
        """Looks up `inputs` in the table."""
        if shards_of(self.embeddings) is None:
            return super().call(inputs)
        if inputs.dtype != "int32" and inputs.dtype != "int64":
            inputs = tf.cast(inputs, "int32")
        outputs = lookup(self.embeddings, inputs)
        return tf.cast(outputs, self.compute_dtype)
