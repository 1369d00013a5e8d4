"""`layers.Embedding` on Keras's TensorFlow backend: what only TensorFlow has.

- A training step reads the table and its slots by rows only. A whole read
  (`ReadVariableOp`) of a variable that the step then scatters into makes
  TensorFlow copy the whole variable (copy-on-write), which at 1M rows was
  most of the step (`benchmarks/row_sparse_embedding.py`). The test looks at
  the traced step's graph, not at its time.
- `tf.distribute` strategies that mirror variables are refused: each replica
  would step the table with its own part of the batch.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import keras_face

import tf_tpu_embed_opt as teo

pytestmark = keras_face


def _model(optimizer):
    ids = keras.Input((3,), dtype="int32")
    layer = teo.layers.Embedding(20, 4, optimizer=optimizer, name="table")
    pooled = keras.layers.GlobalAveragePooling1D()(layer(ids))
    model = keras.Model(ids, keras.layers.Dense(1)(pooled))
    return model, layer


def _whole_reads(graph, handles):
    """The ops of `graph` (and its functions) that read a variable whole,
    among the resource tensors `handles` of `graph`."""
    names = {h.name for h in handles}
    return [
        op.name
        for op in graph.get_operations()
        if op.type == "ReadVariableOp" and op.inputs[0].name in names
    ]


@pytest.mark.parametrize(
    "optimizer",
    [
        lambda: teo.optimizers.Adagrad(0.1),
        lambda: teo.optimizers.Adam(0.01, lazy=True),
    ],
    ids=["Adagrad", "Adam-lazy"],
)
def test_a_training_step_reads_the_table_and_slots_by_rows_only(optimizer):
    model, layer = _model(optimizer())
    dense = keras.optimizers.SGD(0.1)
    dense.build(model.trainable_variables)
    ids = tf.constant([[1, 2, 1], [3, 1, 5]], tf.int32)

    @tf.function
    def step(ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(ids, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        dense.apply(grads, model.trainable_variables)

    graph = step.get_concrete_function(ids).graph
    stepped = [layer.embeddings, *layer.slots.values()]
    internal = [
        graph.captures[i][1]
        for i in range(len(graph.captures))
        if any(graph.captures[i][0] is v.value.handle for v in stepped)
    ]
    assert len(internal) == len(stepped)
    assert _whole_reads(graph, internal) == []
    # The step is a step: the looked-up rows moved.
    before = keras.ops.convert_to_numpy(layer.embeddings.value).copy()
    step(ids)
    after = keras.ops.convert_to_numpy(layer.embeddings.value)
    moved = np.flatnonzero((after != before).any(axis=1))
    np.testing.assert_array_equal(moved, [1, 2, 3, 5])


def test_mirrored_strategies_are_refused_by_name():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        with pytest.raises(ValueError, match="does not run under MirroredStrategy"):
            _model(teo.optimizers.Adagrad(0.1))


def test_one_device_strategy_trains():
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        model, layer = _model(teo.optimizers.Adagrad(0.1))
        model.compile(optimizer="sgd", loss="mse")
    before = keras.ops.convert_to_numpy(layer.embeddings.value).copy()
    model.fit(
        np.array([[1, 2, 1], [3, 1, 5]], "int32"),
        np.ones((2, 1), "float32"),
        epochs=1,
        verbose=0,
    )
    after = keras.ops.convert_to_numpy(layer.embeddings.value)
    np.testing.assert_array_equal(
        np.flatnonzero((after != before).any(axis=1)), [1, 2, 3, 5]
    )
