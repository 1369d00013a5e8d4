"""keras-rs tables off SparseCore, trained row by row with their own optimizers.

keras-rs's `DistributedEmbedding` gives each table placed on the default device
(`placement="default_device"`, or `"auto"` off TPU) a `keras_rs.layers.
EmbedReduce`, a `keras.layers.Embedding`: its whole table is the gradient and
the model's optimizer trains it, whatever the table's `optimizer`.
`row_sparse_tables` swaps each for `EmbedReduce` below, the same layer with this
package's row-sparse lookup (`Embedding`): the table steps in the backward pass
with its own optimizer, on the looked-up rows only, as SparseCore steps it.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import keras
from keras import ops

from tf_tpu_embed_opt import preflight_jax
from tf_tpu_embed_opt.layers.embedding import Embedding, table_optimizer
from tf_tpu_embed_opt.optimizers import backend

__all__ = ["row_sparse_tables"]


@functools.lru_cache(maxsize=None)
def embed_reduce_class() -> type:
    """`EmbedReduce`: keras-rs's `EmbedReduce` whose lookup is `Embedding`'s.

    Made on first use, so that keras-rs stays optional.
    """
    import keras_rs

    @keras.saving.register_keras_serializable(package="tf_tpu_embed_opt")
    class EmbedReduce(keras_rs.layers.EmbedReduce, Embedding):
        """keras-rs's `EmbedReduce` (lookup, weights, combiner) with the
        row-sparse lookup of `tf_tpu_embed_opt.layers.Embedding`.

        An entry whose weight is 0 is no lookup: it adds nothing to the output
        (as in keras-rs) and steps no row. keras-rs pads ragged inputs this
        way on JAX, and SparseCore never sees such padding.
        """

        _absent_ids = True

        def call(self, inputs: Any, weights: Any = None, training: Any = None):
            if not _is_dense(inputs):
                raise TypeError(
                    f"tf_tpu_embed_opt EmbedReduce {self.name!r}: the row-sparse "
                    "lookup takes dense ids; received "
                    f"{type(inputs).__name__}. On TensorFlow a keras-rs table "
                    "with sparse or ragged inputs is row-sparse already: train "
                    "it with tf_tpu_embed_opt.keras_optimizer instead."
                )
            if weights is not None:
                inputs = _absent_where_weightless(inputs, weights, self.input_dim)
            self._training_of_caller = training
            try:
                return keras_rs.layers.EmbedReduce.call(self, inputs, weights)
            finally:
                self._training_of_caller = None

    EmbedReduce.__module__ = __name__
    return EmbedReduce


def _is_dense(inputs: Any) -> bool:
    if backend.BACKEND == "tensorflow":
        import tensorflow as tf

        return not isinstance(inputs, (tf.SparseTensor, tf.RaggedTensor))
    from jax.experimental import sparse

    return not isinstance(inputs, sparse.JAXSparse)


def _absent_where_weightless(inputs: Any, weights: Any, input_dim: int) -> Any:
    """`inputs`, with `input_dim` (no lookup) where the weight is 0."""
    weights = ops.convert_to_tensor(weights)
    while len(weights.shape) < len(inputs.shape):
        weights = ops.expand_dims(weights, -1)
    weightless = ops.broadcast_to(ops.equal(weights, 0), ops.shape(inputs))
    return ops.where(weightless, ops.cast(input_dim, inputs.dtype), inputs)


def row_sparse_tables(embedding: Any, *, engine: Optional[str] = None) -> Any:
    """Trains a keras-rs `DistributedEmbedding`'s default-device tables row by
    row, each with its own optimizer, in the backward pass.

    The one-line change for keras-rs off SparseCore (`placement=
    "default_device"`, or `"auto"` on CPU/GPU), before the layer is built:

    ```python
    embedding = tf_tpu_embed_opt.layers.row_sparse_tables(
        keras_rs.layers.DistributedEmbedding(feature_configs))
    ```

    Each such table's `EmbedReduce` becomes this package's `EmbedReduce`: the
    same lookup, weights and combiner, with the lookup of
    `tf_tpu_embed_opt.layers.Embedding`. The table and its slots step only on
    the looked-up rows, duplicates summed, by the engine's lazy rule, and the
    model's optimizer never touches them. Entries whose weight is 0 (keras-rs's
    padding of ragged inputs on JAX) are no lookup. SparseCore tables are left
    as they are.

    Args:
      embedding: A `keras_rs.layers.DistributedEmbedding`, not yet built.
      engine: `None`: each table's own Keras optimizer, through its twin
        (stock `SGD` and `Adagrad`, or a lazy twin; Keras's own `Adam` and
        `Ftrl` step every row and are refused). `"jax-tpu-embedding"`: what
        keras-rs's JAX layer hands SparseCore for it (lazy `Adam` and `FTRL`
        included), so a CPU/GPU run computes what the SparseCore job computes.

    Returns:
      `embedding`, changed in place.

    Raises:
      TypeError: Not a keras-rs `DistributedEmbedding`, or this keras-rs keeps
        its default-device layers elsewhere.
      ValueError: It is built, has no default-device tables, `engine` is
        unknown, or a table's optimizer cannot run row by row (named).
    """
    if not preflight_jax._is_keras_rs(embedding, "DistributedEmbedding"):
        raise TypeError(
            "row_sparse_tables: argument `embedding` must be a "
            f"keras_rs.layers.DistributedEmbedding; received {embedding!r} of "
            f"type {type(embedding).__name__}."
        )
    if embedding.built:
        raise ValueError(
            "row_sparse_tables: argument `embedding` is built already; call "
            "it on the DistributedEmbedding before the model uses it."
        )
    placed = getattr(embedding, "_placement_to_path_to_feature_config", None)
    layers = getattr(embedding, "_default_device_embedding_layers", None)
    if placed is None or (layers is None and "default_device" in placed):
        raise TypeError(
            "row_sparse_tables: this keras-rs keeps its default-device tables "
            "in a way this package does not know (tested with keras-rs 0.4)."
        )
    features = placed.get("default_device", {})
    if not features:
        raise ValueError(
            "row_sparse_tables: the DistributedEmbedding has no table on the "
            "default device (tables it places on SparseCore are stepped there)."
        )
    optimizers = preflight_jax.keras_rs_table_optimizers(
        list(features.items()), engine, "row_sparse_tables"
    )
    embed_reduce = embed_reduce_class()
    # Every replacement first, so that a refused table changes nothing.
    replacements = {}
    for path, old in layers.items():
        if id(old) in replacements:
            continue  # a table shared by several features
        table = features[path].table
        try:
            optimizer = table_optimizer(optimizers[table.name])
        except (TypeError, ValueError) as error:
            hint = (
                ""
                if engine is not None
                else " With engine='jax-tpu-embedding' a table follows what "
                "keras-rs hands SparseCore (lazy Adam and FTRL)."
            )
            raise type(error)(f"Table {table.name!r}: {error}{hint}") from None
        replacements[id(old)] = embed_reduce(
            name=old.name,
            input_dim=old.input_dim,
            output_dim=old.output_dim,
            embeddings_initializer=old.embeddings_initializer,
            combiner=old.combiner,
            optimizer=optimizer,
        )
    for path in list(layers):
        # `pop` untracks keras-rs's layer, so it leaves no weights behind.
        layers[path] = replacements[id(layers.pop(path))]
    return embedding
