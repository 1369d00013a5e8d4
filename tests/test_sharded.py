"""Sharded variables in one process: the pieces of `tf_tpu_embed_opt.sharded`.

A variable creator splits the model's matrices into `ShardedVariable`s on this
machine, as `ParameterServerStrategy` with a partitioner does over servers
(tests/test_parameter_servers.py runs the real cluster). Every optimizer
trains them and must give what it gives unsharded, with Keras's own loop.
"""

from __future__ import annotations

import contextlib

import numpy as np
import ps_training
import pytest
import tensorflow as tf
from conftest import every_optimizer
from tensorflow.python.distribute import sharded_variable

from tf_tpu_embed_opt.layers import sharded

ROWS = 23
STEPS = 20
TOLERANCE = 1e-6


@contextlib.contextmanager
def sharding(count):
    """Creates each matrix with more rows than `count` as `count` shards."""

    def creator(next_creator, **kwargs):
        shape = kwargs.get("shape")
        initial = kwargs["initial_value"]
        value = tf.convert_to_tensor(initial() if callable(initial) else initial)
        if value.shape.rank != 2 or value.shape[0] <= count:
            return next_creator(**dict(kwargs, initial_value=value))
        del shape
        name = kwargs.get("name") or "sharded"
        parts = np.array_split(np.arange(value.shape[0]), count)
        shards = [
            next_creator(
                **dict(
                    kwargs,
                    initial_value=tf.gather(value, rows),
                    shape=None,
                    name=f"{name}/part_{i}",
                )
            )
            for i, rows in enumerate(parts)
        ]
        return sharded_variable.ShardedVariable(shards, name=name)

    with tf.variable_creator_scope(creator):
        yield


def train_sharded(name, shards):
    with sharding(shards):
        model = ps_training.make_model(ROWS)
    optimizer = ps_training.optimizer_factories()[name]()
    optimizer.build(model.trainable_variables)
    assert sharded.shards_of(model.table.embeddings) is not None

    @tf.function
    def step(ids, labels):
        with tf.GradientTape() as tape:
            loss = ps_training.loss_of(model, ids, labels)
        variables = model.trainable_variables
        grads = sharded.gradients(tape, loss, variables)
        optimizer.apply_gradients(zip(grads, variables))

    for ids, labels in ps_training.batches(ROWS, STEPS):
        step(ids, labels)
    return model, optimizer


@every_optimizer("name", ps_training.REPRESENTATIVE)
@pytest.mark.parametrize("shards", [2, 3])
@pytest.mark.parametrize("name", list(ps_training.optimizer_factories()))
def test_sharded_training_matches_unsharded(name, shards):
    model, optimizer = train_sharded(name, shards)
    got = ps_training.state_of(model, optimizer)
    expected = ps_training.reference(name, ROWS, STEPS)
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        scale = np.maximum(1.0, np.abs(value))
        assert np.max(np.abs(got[key] - value) / scale) <= TOLERANCE, key
    # One slot shard per table shard, with the table shard's rows.
    table = sharded.shards_of(model.table.embeddings)
    for variable in optimizer.variables:
        slot = sharded.shards_of(variable)
        if slot is not None and variable.shape == model.table.embeddings.shape:
            assert [s.shape for s in slot] == [s.shape for s in table]
            assert [s.device for s in slot] == [s.device for s in table]


def test_split_gradient_routes_rows_to_their_shards():
    shards = [tf.Variable(tf.zeros([n, 2])) for n in (3, 3, 2)]
    gradient = tf.IndexedSlices(
        tf.constant([[1.0, 1], [2, 2], [3, 3], [4, 4], [5, 5]]),
        tf.constant([7, 0, 3, 0, 5]),
        tf.constant([8, 2]),
    )
    parts = sharded.split_gradient(gradient, shards)
    assert [p.indices.numpy().tolist() for p in parts] == [[0, 0], [0, 2], [1]]
    assert [p.values.numpy()[:, 0].tolist() for p in parts] == [
        [2.0, 4.0],
        [3.0, 5.0],
        [1.0],
    ]
    assert [p.dense_shape.numpy().tolist() for p in parts] == [[3, 2], [3, 2], [2, 2]]
    dense = sharded.split_gradient(tf.reshape(tf.range(16.0), [8, 2]), shards)
    assert [d.shape[0] for d in dense] == [3, 3, 2]
    assert dense[2].numpy().tolist() == [[12.0, 13.0], [14.0, 15.0]]


def test_gradients_of_a_lookup_are_row_sparse_with_global_ids():
    with sharding(3):
        table = tf.Variable(tf.reshape(tf.range(16.0), [8, 2]))
    ids = tf.constant([7, 1, 7, 4])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(sharded.lookup(table, ids))
    (gradient,) = sharded.gradients(tape, loss, [table])
    assert isinstance(gradient, tf.IndexedSlices)
    # One row per distinct id: each row crosses the network once per step.
    assert sorted(gradient.indices.numpy().tolist()) == [1, 4, 7]
    assert gradient.dense_shape.numpy().tolist() == [8, 2]
    np.testing.assert_array_equal(
        tf.convert_to_tensor(gradient).numpy(),
        tf.math.unsorted_segment_sum(tf.ones([4, 2]), ids, 8).numpy(),
    )


def test_unsharded_variables_pass_through():
    variable = tf.Variable([1.0, 2.0])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(variable * variable)
    (gradient,) = sharded.gradients(tape, loss, [variable])
    assert gradient.numpy().tolist() == [2.0, 4.0]
    assert sharded.shards_of(variable) is None


def test_the_variable_list_helpers_refuse_one_variable():
    """`checkpointable(v)` and `wait_for_steps_in_flight(v)` iterated one
    variable row by row: a `tf.Variable` was left alone without a word (a
    Keras variable failed inside TensorFlow), and a number failed in
    Python's words. A list is what they take."""
    import keras

    for function in (sharded.checkpointable, sharded.wait_for_steps_in_flight):
        for bad in (tf.Variable([[1.0], [2.0]]), keras.Variable([[1.0]]), 3):
            with pytest.raises(TypeError, match=r"`variables` must be a list of"):
                function(bad)
        function([tf.Variable([1.0])])


def test_tables_without_a_model_optimizer_wait_for_their_own_variables(
    monkeypatch,
):
    """Before a checkpoint reads or writes tables, the steps in flight on
    parameter servers are waited for through the variables they change. A
    table whose layer keeps its own optimizer comes with no model optimizer
    (no step counter to wait on): its table and slots must be what is waited
    for (tests/test_consistent_checkpoints.py runs the real cluster, where
    the model optimizer's counter always answers)."""
    import tf_tpu_embed_opt as teo
    from tf_tpu_embed_opt.checkpoints.keras import tables as keras_tables
    from tf_tpu_embed_opt.optimizers import sharded as parameter_servers

    layer = teo.layers.Embedding(
        ROWS, 4, optimizer=teo.optimizers.Adagrad(0.1), name="users"
    )
    layer.build()
    waited = []
    real = parameter_servers.wait_for_steps_in_flight

    def wait(variables):
        waited.append(list(variables))
        real(variables)

    monkeypatch.setattr(parameter_servers, "wait_for_steps_in_flight", wait)
    (table,) = keras_tables.keras_tables({"users": layer}, None)
    assert [[v.path for v in group] for group in waited] == [
        [layer.embeddings.path, layer.slots["accumulators"].path]
    ]
    assert table.variable is layer.embeddings


def test_sharded_variables_refuse_ema():
    import tf_tpu_embed_opt as teo

    with sharding(2):
        model = ps_training.make_model(ROWS)
    optimizer = teo.optimizers.Adagrad(use_ema=True)
    with pytest.raises(ValueError, match="`use_ema` is not supported for sharded"):
        optimizer.build(model.trainable_variables)


def test_bad_inputs_name_the_argument():
    shards = [tf.Variable(tf.zeros([3, 2])), tf.Variable(tf.zeros([2, 2]))]
    with pytest.raises(ValueError, match=r"`gradient` must have as many rows.*\(5"):
        sharded.split_gradient(tf.zeros([4, 2]), shards)
    with pytest.raises(ValueError, match="`shards` must be a non-empty list"):
        sharded.split_gradient(tf.zeros([4, 2]), [])
    with pytest.raises(TypeError, match="`tape` must be the tf.GradientTape"):
        sharded.gradients(None, tf.constant(1.0), shards)


def test_a_sparse_step_reads_and_writes_only_looked_up_rows():
    """In the step's graph, the table and slot shards are only gathered and
    scattered (no whole-shard read), and each shard's update ops sit with it."""
    import tf_tpu_embed_opt as teo

    with sharding(3):
        table = sharded.Embedding(ROWS, 4)
        table.build((None,))
    optimizer = teo.optimizers.Adagrad(0.1)
    optimizer.build(table.trainable_variables)

    @tf.function
    def step(ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(table(ids)))
        grads = sharded.gradients(tape, loss, table.trainable_variables)
        optimizer.apply_gradients(zip(grads, table.trainable_variables))

    graph = step.get_concrete_function(tf.TensorSpec([None], tf.int32)).graph
    inner = {id(external): internal for external, internal in graph.captures}
    slot = next(v for v in optimizer.variables if v.shape == table.embeddings.shape)
    watched = [*sharded.shards_of(table.embeddings), *sharded.shards_of(slot)]
    assert len(watched) == 6
    operations = graph.get_operations()
    for shard in watched:
        uses, handles = set(), [inner[id(shard.handle)]]
        while handles:
            handle = handles.pop()
            for op in operations:
                if any(tensor is handle for tensor in op.inputs):
                    if op.type == "Identity":  # the handle passed on
                        handles.append(op.outputs[0])
                    else:
                        uses.add(op.type)
        assert uses and uses <= {"ResourceGather", "ResourceScatterUpdate"}, uses


def test_gradients_join_shards_without_a_gradient():
    """A shard the loss does not reach has no gradient (`None`): the table's
    gradient stays row-sparse where the others are (global ids), and is
    zero on that shard's rows where they are dense."""
    with sharding(2):
        table = tf.Variable(tf.reshape(tf.range(12.0), [6, 2]))
    first, _ = sharded.shards_of(table)
    with tf.GradientTape(persistent=True) as tape:
        looked_up = tf.reduce_sum(tf.gather(first, [2, 0, 2]))
        dense = tf.reduce_sum(tf.square(first))
    (gradient,) = sharded.gradients(tape, looked_up, [table])
    assert isinstance(gradient, tf.IndexedSlices)
    assert gradient.dense_shape.numpy().tolist() == [6, 2]
    expected = np.zeros([6, 2], "float32")
    expected[[0, 2]] = [[1.0, 1.0], [2.0, 2.0]]
    np.testing.assert_array_equal(tf.convert_to_tensor(gradient).numpy(), expected)
    (gradient,) = sharded.gradients(tape, dense, [table])
    assert not isinstance(gradient, tf.IndexedSlices)
    expected = np.zeros([6, 2], "float32")
    expected[:3] = 2 * np.arange(6.0).reshape(3, 2)
    np.testing.assert_array_equal(gradient.numpy(), expected)
    (nothing,) = sharded.gradients(tape, tf.constant(1.0), [table])
    assert nothing is None


def test_split_gradient_of_a_vector():
    """A sharded vector (one value per row, e.g. a per-row bias) splits as
    a matrix does; a scalar has no rows to split."""
    shards = [tf.Variable(tf.zeros([3])), tf.Variable(tf.zeros([2]))]
    sparse = tf.IndexedSlices(tf.constant([1.0, 2.0, 3.0]), tf.constant([4, 0, 3]))
    first, second = sharded.split_gradient(sparse, shards)
    assert first.indices.numpy().tolist() == [0]
    assert second.indices.numpy().tolist() == [1, 0]
    np.testing.assert_array_equal(
        tf.convert_to_tensor(second).numpy(), np.array([3.0, 1.0], "float32")
    )
    dense = sharded.split_gradient(tf.range(5.0), shards)
    assert [part.numpy().tolist() for part in dense] == [[0.0, 1.0, 2.0], [3.0, 4.0]]
    with pytest.raises(ValueError, match="rank >= 1"):
        sharded.split_gradient(tf.constant(1.0), [tf.Variable(1.0)])


def _sharded_embedding(count, rows=ROWS, seed=0):
    """A `sharded.Embedding` whose table is `count` shards (unsharded for 1),
    filled with distinct values."""
    import keras

    with sharding(count) if count > 1 else contextlib.nullcontext():
        layer = sharded.Embedding(rows, 4)
        layer.build((None,))
    values = np.random.default_rng(seed).normal(size=(rows, 4)).astype("float32")
    layer.embeddings.assign(values)
    assert isinstance(layer.embeddings, keras.Variable)
    return layer, values


@pytest.mark.parametrize("target", [1, 2, 3])
def test_a_sharded_table_checkpoint_restores_into_any_shard_count(tmp_path, target):
    """`tf.train.Checkpoint` saves a sharded Keras table as one tensor and
    restores it into any number of shards, or into one process."""
    saved, values = _sharded_embedding(3)
    path = tf.train.Checkpoint(table=saved).write(str(tmp_path / "ckpt"))
    restored, _ = _sharded_embedding(target, seed=1)
    tf.train.Checkpoint(table=restored).read(path).assert_consumed()
    np.testing.assert_array_equal(
        tf.convert_to_tensor(restored.embeddings.value).numpy(), values
    )


def test_a_checkpoint_of_another_row_count_is_refused(tmp_path):
    saved, _ = _sharded_embedding(2, rows=ROWS + 1)
    path = tf.train.Checkpoint(table=saved).write(str(tmp_path / "ckpt"))
    target, values = _sharded_embedding(3)
    with pytest.raises(ValueError, match=rf"must have {ROWS} rows; received one of"):
        tf.train.Checkpoint(table=target).read(path)
    np.testing.assert_array_equal(
        tf.convert_to_tensor(target.embeddings.value).numpy(), values
    )
