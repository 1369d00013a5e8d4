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

from tf_tpu_embed_opt.embedding.parameters import (
    FTRL,
    SGD,
    Adadelta,
    Adagrad,
    AdagradMomentum,
    Adam,
    CenteredRMSProp,
    EmbeddingOptimizer,
    Momentum,
    ProximalAdagrad,
    ProximalYogi,
    RMSProp,
    arguments,
    class_for,
    definition_of,
)

__all__ = [
    "SGD",
    "Adagrad",
    "AdagradMomentum",
    "Adam",
    "FTRL",
    "Momentum",
    "RMSProp",
    "CenteredRMSProp",
    "Adadelta",
    "ProximalAdagrad",
    "ProximalYogi",
    "EmbeddingOptimizer",
    "arguments",
    "class_for",
    "definition_of",
]
