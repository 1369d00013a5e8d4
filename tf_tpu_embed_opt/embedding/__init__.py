"""The embedding face: TPUEmbedding optimizer parameter classes.

`SGD`, `Adagrad`, `AdagradMomentum`, `Adam` and `FTRL` are drop-in for
`tf.tpu.experimental.embedding.*` (they subclass TensorFlow's own classes);
`Momentum`, `RMSProp`, `CenteredRMSProp`, `Adadelta`, `ProximalAdagrad` and
`ProximalYogi` are engine optimizers TensorFlow has no class for. Each class is
generated from its algorithm's definition (`tf_tpu_embed_opt.definitions`).

The subpackage also holds what the embedding face writes and reads:
`proto` (`OptimizationParameters`) and `configuration` (the
`TPUEmbeddingConfiguration` a `TPUEmbedding` sends to the TPU).
"""

from tf_tpu_embed_opt.embedding import parameters
from tf_tpu_embed_opt.embedding.parameters import (
    EmbeddingOptimizer,
    arguments,
    class_for,
    definition_of,
)

# One class per algorithm of the TensorFlow engines, by its name (`SGD`,
# `FTRL`, `RMSProp`, ...): derived from the definitions.
globals().update(parameters.embedding_classes())

__all__ = [
    *parameters.embedding_classes(),
    "EmbeddingOptimizer",
    "arguments",
    "class_for",
    "definition_of",
]
