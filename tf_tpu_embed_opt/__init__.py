"""One optimizer definition for Keras layers and TPU embedding tables.

`tf_tpu_embed_opt.embedding` holds TPUEmbedding parameter classes (drop-in for
`tf.tpu.experimental.embedding.*`, plus the engine's optimizers TensorFlow does
not expose); `to_proto` / `from_proto` convert them to and from
`tensorflow.tpu.OptimizationParameters`; `tpu_embedding_configuration` builds
the `TPUEmbeddingConfiguration` a `TPUEmbedding` would send to the TPU.
"""

try:
    import tensorflow  # noqa: F401
except ImportError as error:  # pragma: no cover - exercised in a bare venv
    raise ImportError(
        "tf_tpu_embed_opt needs TensorFlow 2.16-2.21, which it does not install "
        "by default so that a TPU VM keeps its own build. Install one extra: "
        "`pip install tf_tpu_embed_opt[cpu]` (tensorflow-cpu), "
        "`[tensorflow]` (tensorflow) or `[tpu]` (tensorflow-tpu). "
        f"Original error: {error}"
    ) from error

from tf_tpu_embed_opt import (
    checkpoints,
    embedding,
    keras_state,
    multi_optimizer,
    optimizers,
)
from tf_tpu_embed_opt.checkpoints import TPUCheckpointReader, write_tpu_checkpoint
from tf_tpu_embed_opt.configuration import tpu_embedding_configuration
from tf_tpu_embed_opt.convert import to_embedding, to_keras
from tf_tpu_embed_opt.keras_state import load_into_keras, save_tpu_checkpoint
from tf_tpu_embed_opt.multi_optimizer import embedding_optimizers, keras_optimizer
from tf_tpu_embed_opt.optimizer_spec import OptimizerSpec, from_spec, to_spec
from tf_tpu_embed_opt.proto import from_proto, to_proto

__version__ = "0.1.0"

__all__ = [
    "embedding",
    "optimizers",
    "from_proto",
    "to_proto",
    "to_embedding",
    "to_keras",
    "OptimizerSpec",
    "to_spec",
    "from_spec",
    "tpu_embedding_configuration",
    "checkpoints",
    "keras_state",
    "multi_optimizer",
    "TPUCheckpointReader",
    "write_tpu_checkpoint",
    "load_into_keras",
    "save_tpu_checkpoint",
    "keras_optimizer",
    "embedding_optimizers",
    "__version__",
]
