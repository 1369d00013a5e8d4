"""The demo's training steps and TPU configuration on Keras's TensorFlow
backend: `tf.function`s over a `GradientTape`, the twin or the stock optimizer
applied to the tables' `tf.IndexedSlices` gradients."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence, Tuple

import numpy as np
import tensorflow as tf

from tf_tpu_embed_opt.embedding.configuration import tpu_embedding_configuration

__all__ = ["steps", "configuration"]


def steps(
    model: Any,
    table_variables: List[Any],
    table_optimizer: Any,
    dense_optimizer: Any,
    loss_function: Any,
) -> Tuple[Any, Any, Any]:
    """`demo_jax.steps` on TensorFlow: `tf.function`s over a `GradientTape`."""
    table_ids = {id(v) for v in table_variables}
    dense_variables = [v for v in model.trainable_variables if id(v) not in table_ids]
    table_optimizer.build(table_variables)
    dense_optimizer.build(dense_variables)
    split = len(table_variables)

    @tf.function
    def step(batch: Dict[str, Any], batch_labels: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = loss_function(batch_labels, model(batch, training=True))
        gradients = tape.gradient(loss, table_variables + dense_variables)
        # Embedding gradients arrive as tf.IndexedSlices, one entry per lookup:
        # a popular id appears many times.
        table_optimizer.apply(gradients[:split], table_variables)
        dense_optimizer.apply(gradients[split:], dense_variables)
        return loss

    @tf.function
    def held_out(batch: Dict[str, Any], batch_labels: Any) -> Any:
        return loss_function(batch_labels, model(batch, training=False))

    def tensors(batch: Mapping[str, Any]) -> Dict[str, Any]:
        return {name: tf.constant(values) for name, values in batch.items()}

    def train_step(batch: Mapping[str, Any], labels: Any) -> float:
        return float(step(tensors(batch), tf.constant(labels)))

    def evaluate(batch: Mapping[str, Any], labels: Any) -> float:
        return float(held_out(tensors(batch), tf.constant(labels)))

    def table_values() -> List[np.ndarray]:
        return [v.numpy() for v in table_variables]

    return train_step, evaluate, table_values


def configuration(
    optimizer: Any, tables: Sequence[Tuple[str, int, int]], batch: int, cores: int
) -> Any:
    """The `TPUEmbeddingConfiguration` of `tables` (name, vocabulary size,
    dimension) on one TPU host with `cores` TensorCores, `batch` examples."""
    E = tf.tpu.experimental.embedding
    per_replica = batch // cores
    feature_config = {}
    for name, vocabulary, dim in tables:
        table = E.TableConfig(vocabulary_size=vocabulary, dim=dim, name=name)
        feature_config[name] = E.FeatureConfig(
            table=table, output_shape=[per_replica], name=name
        )
    return tpu_embedding_configuration(
        feature_config, optimizer, num_hosts=1, num_tensor_cores=cores
    )
