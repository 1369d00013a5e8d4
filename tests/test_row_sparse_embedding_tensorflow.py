"""`layers.Embedding` on Keras's TensorFlow backend: what only TensorFlow has.

- A training step reads the table and its slots by rows only. A whole read
  (`ReadVariableOp`) of a variable that the step then scatters into makes
  TensorFlow copy the whole variable (copy-on-write), which at 1M rows was
  most of the step (`benchmarks/row_sparse_embedding.py`). The test looks at
  the traced step's graph, not at its time.
- `tf.distribute` strategies that mirror variables are refused: each replica
  would step the table with its own part of the batch.
- `tf.train.Checkpoint` (and so `tf.train.CheckpointManager`) of a model
  holds each layer's table, slots and step, and restores them into a new
  model before it is built, as a custom loop resumes. TensorFlow's
  checkpoints follow a Keras layer's attributes, not the lists and dicts
  Keras tracks (a Keras-3-on-TensorFlow limit: a custom layer keeping its
  weights in a list saves none of them); the slots, the stacks and keras-rs's
  replaced tables were in such containers, and a resumed run stepped on from
  fresh slots (or, stacked, fresh tables) without a word.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import exact_tensorflow, keras_face, keras_rs_or_skip

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


_IDS = np.array([[1, 2], [3, 1], [5, 5], [1, 0]], "int32")
_TARGETS = np.array([[0.5], [-1.0], [2.0], [0.25]], "float32")


def _resumable_model(kind):
    """A model whose tables are the package's layers, built the same way
    each time; `kind` is how the tables are held."""
    ids = keras.Input((2,), dtype="int32")

    def table(name, rows=8):
        # Adam with bias correction: the step counter enters each step.
        return teo.layers.Embedding(
            rows, 3, optimizer=teo.optimizers.Adam(0.1, lazy=True), name=name
        )

    if kind == "Embedding":
        vectors = keras.layers.Flatten()(table("table")(ids))
    elif kind == "StackedEmbedding":
        first, second = teo.layers.StackedEmbedding(
            [table("first"), table("second", rows=6)], name="stacked"
        )([ids[:, 0], ids[:, 1]])
        vectors = keras.layers.Concatenate()([first, second])
    else:
        keras_rs = keras_rs_or_skip()
        config = keras_rs.layers.TableConfig(
            name="items",
            vocabulary_size=8,
            embedding_dim=3,
            optimizer=teo.optimizers.Adam(0.1, lazy=True),
            placement="default_device",
        )
        features = {
            "items": keras_rs.layers.FeatureConfig(
                name="items", table=config, input_shape=(4, 2), output_shape=(4, 3)
            )
        }
        embedding = teo.layers.row_sparse_tables(
            keras_rs.layers.DistributedEmbedding(features),
            stack=kind == "row_sparse_tables(stack=True)",
        )
        vectors = embedding({"items": ids})["items"]
    return keras.Model(ids, keras.layers.Dense(1)(vectors))


def _custom_step(model, dense):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(_IDS, training=True) - _TARGETS) ** 2)
    grads = tape.gradient(loss, model.trainable_variables)
    dense.apply(grads, model.trainable_variables)


@pytest.mark.parametrize("with_optimizer", [False, True], ids=["model", "model+opt"])
@pytest.mark.parametrize(
    "kind",
    [
        "Embedding",
        "StackedEmbedding",
        "row_sparse_tables",
        "row_sparse_tables(stack=True)",
    ],
)
def test_a_tensorflow_checkpoint_resumes_a_custom_loop_bit_for_bit(
    kind, with_optimizer, tmp_path
):
    # The oracle: the same run, not interrupted.
    model = _resumable_model(kind)
    dense = keras.optimizers.SGD(0.1)
    for _ in range(3):
        _custom_step(model, dense)
    saved = {"model": model, **({"optimizer": dense} if with_optimizer else {})}
    path = tf.train.Checkpoint(**saved).write(str(tmp_path / "ckpt"))
    _custom_step(model, dense)

    # Restored as tf.train.CheckpointManager's users restore: into a new
    # model, before its first call builds it.
    resumed = _resumable_model(kind)
    resumed_dense = keras.optimizers.SGD(0.1)
    restored = {"model": resumed}
    if with_optimizer:
        restored["optimizer"] = resumed_dense
    tf.train.Checkpoint(**restored).read(path)
    resumed(_IDS)
    _custom_step(resumed, resumed_dense)

    names = [v.path for v in model.variables]
    assert names and len(resumed.variables) == len(names)
    for name, want, got in zip(names, model.variables, resumed.variables):
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(got), keras.ops.convert_to_numpy(want), name
        )


class _Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.table = teo.layers.Embedding(
            8, 3, optimizer=teo.optimizers.Adam(0.1, lazy=True), name="table"
        )
        self.flat = keras.layers.Flatten()
        self.out = keras.layers.Dense(1)

    def call(self, ids):
        return self.out(self.flat(self.table(ids)))


def test_a_subclassed_model_restored_once_built_resumes_bit_for_bit(tmp_path):
    """A subclassed model's layers (Keras's own too) take a checkpoint's
    values only once built, as the guide says: built, its optimizer built,
    then restored, it steps on as the uninterrupted run."""
    keras.utils.set_random_seed(1)
    model, dense = _Subclassed(), keras.optimizers.SGD(0.1)
    for _ in range(3):
        _custom_step(model, dense)
    path = tf.train.Checkpoint(model=model, optimizer=dense).write(
        str(tmp_path / "ckpt")
    )
    _custom_step(model, dense)
    keras.utils.set_random_seed(2)
    resumed, resumed_dense = _Subclassed(), keras.optimizers.SGD(0.1)
    resumed(_IDS)
    resumed_dense.build(resumed.trainable_variables)
    tf.train.Checkpoint(model=resumed, optimizer=resumed_dense).read(
        path
    ).assert_consumed()
    _custom_step(resumed, resumed_dense)
    for want, got in zip(model.variables, resumed.variables):
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(got), keras.ops.convert_to_numpy(want), want.path
        )


def test_open_checkpoint_sends_a_keras_models_checkpoint_to_its_model(tmp_path):
    model = _resumable_model("Embedding")
    _custom_step(model, keras.optimizers.SGD(0.1))
    path = tf.train.Checkpoint(model=model).write(str(tmp_path / "ckpt"))
    with pytest.raises(
        ValueError,
        match=r"a TensorFlow checkpoint of a Keras model whose tables are "
        r"tf_tpu_embed_opt\.layers\.Embedding layers \(at \['model/_operations/1'\]\)"
        r", which is not read here: restore it into its model "
        r"\(tf\.train\.Checkpoint\(model=model\)\.read\(path\)\) and write the "
        r"tables with tf_tpu_embed_opt\.save_tpu_checkpoint\.",
    ):
        teo.checkpoints.open_checkpoint(path)


# Ragged ids with duplicates within and across examples; rows 0, 4, 6 and 7
# are never looked up.
_RAGGED = ([[1, 2, 1], [3], [2, 2, 5, 1]], [[5], [3, 3, 1], [2]])
_RAGGED_TARGETS = np.array([[1.0], [-1.0], [0.5]], "float32")
_W0 = np.random.default_rng(5).normal(size=(8, 3)).astype("float32")


def _ragged_model(layers, stacked=False):
    """Ragged ids of two features, each looked up in its table, summed over
    each example's ids, then over the rows' elements (nothing else trains)."""
    inputs = [keras.Input(shape=(None,), dtype="int32", ragged=True) for _ in layers]
    if stacked:
        looked = teo.layers.StackedEmbedding(layers, name="stacked")(inputs)
    else:
        looked = [layer(ids) for layer, ids in zip(layers, inputs)]
    pooled = [
        keras.layers.Lambda(lambda rows: tf.reduce_sum(rows, axis=1))(rows)
        for rows in looked
    ]
    total = keras.layers.Lambda(
        lambda parts: tf.reduce_sum(tf.concat(parts, axis=1), axis=1, keepdims=True)
    )(pooled)
    return keras.Model(inputs, total)


def _ragged_fit(model, jit_compile):
    ids = tuple(tf.ragged.constant(i, dtype=tf.int32) for i in _RAGGED)
    dataset = tf.data.Dataset.from_tensor_slices((ids, _RAGGED_TARGETS)).batch(3)
    model.jit_compile = jit_compile
    model.fit(dataset, epochs=3, verbose=0)


def _initial(index):
    return keras.initializers.Constant(_W0 + index)


@pytest.mark.parametrize("jit_compile", [False, True], ids=["eager-graph", "xla"])
def test_ragged_ids_step_as_keras_embedding_with_the_twin(jit_compile):
    """Keras's Embedding looks a `tf.RaggedTensor` up (a ragged result); the
    row-sparse layer failed on one ("The truth value of an array ... is
    ambiguous"). It now looks the flat ids up and steps exactly as the
    oracle: Keras's Embedding whose `tf.IndexedSlices` gradient the twin
    steps (duplicates summed, lazy), as the model's optimizer."""
    oracle_tables = [
        keras.layers.Embedding(8, 3, embeddings_initializer=_initial(i))
        for i in range(2)
    ]
    oracle = _ragged_model(oracle_tables)
    oracle.compile(optimizer=teo.optimizers.Adam(0.1, lazy=True), loss="mse")
    _ragged_fit(oracle, jit_compile)

    tables = [
        teo.layers.Embedding(
            8,
            3,
            optimizer=teo.optimizers.Adam(0.1, lazy=True),
            embeddings_initializer=_initial(i),
            name=f"table_{i}",
        )
        for i in range(2)
    ]
    model = _ragged_model(tables)
    model.compile(optimizer="sgd", loss="mse")
    _ragged_fit(model, jit_compile)
    for table, expected in zip(tables, oracle_tables):
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(table.embeddings.value),
            keras.ops.convert_to_numpy(expected.embeddings.value),
        )
    untouched = keras.ops.convert_to_numpy(tables[0].embeddings.value)[[0, 4, 6, 7]]
    np.testing.assert_array_equal(untouched, (_W0 + 0)[[0, 4, 6, 7]])
    rows = tables[0](tf.ragged.constant([[1, 2], [3]], dtype=tf.int32))
    assert isinstance(rows, tf.RaggedTensor) and rows.shape.as_list() == [2, None, 3]


def test_stacked_ragged_ids_step_as_the_separate_layers():
    def tables():
        return [
            teo.layers.Embedding(
                8,
                3,
                optimizer=teo.optimizers.Adam(0.1, lazy=True),
                embeddings_initializer=_initial(i),
                name=f"table_{i}",
            )
            for i in range(2)
        ]

    separate = tables()
    model = _ragged_model(separate)
    model.compile(optimizer="sgd", loss="mse")
    _ragged_fit(model, False)
    stacked_model = _ragged_model(tables(), stacked=True)
    stacked_model.compile(optimizer="sgd", loss="mse")
    _ragged_fit(stacked_model, False)
    stacked = stacked_model.get_layer("stacked")
    for table in separate:
        np.testing.assert_array_equal(
            stacked.get_table(table.name)["embeddings"],
            keras.ops.convert_to_numpy(table.embeddings.value),
        )


def test_ragged_ids_outside_the_table_are_refused_or_read_zeros():
    ids = tf.ragged.constant([[1, 9], [3]], dtype=tf.int32)
    refusing = teo.layers.Embedding(
        8, 3, optimizer=teo.optimizers.Adagrad(0.1), name="items"
    )
    with pytest.raises(teo.layers.OutOfRangeIds, match=r"Embedding `items`: id 9"):
        refusing(ids)
    zeros = teo.layers.Embedding(
        8, 3, optimizer=teo.optimizers.Adagrad(0.1), out_of_range_ids="zeros"
    )
    rows = zeros(ids)
    np.testing.assert_array_equal(rows[0][1].numpy(), np.zeros(3, "float32"))


def _ragged_keras_rs_features(keras_rs, **table):
    """One keras-rs feature of ragged ids (3 examples) summed from an 8 x 3
    default-device Adagrad table; `table`: more TableConfig arguments (or
    others than these)."""
    table = {"optimizer": keras.optimizers.Adagrad(0.1), "combiner": "sum", **table}
    config = keras_rs.layers.TableConfig(
        name="items",
        vocabulary_size=8,
        embedding_dim=3,
        placement="default_device",
        **table,
    )
    return {
        "items": keras_rs.layers.FeatureConfig(
            name="items", table=config, input_shape=(3, None), output_shape=(3, 3)
        )
    }


@pytest.mark.parametrize("stack", [False, True], ids=["separate", "stacked"])
def test_keras_rs_tables_take_ragged_ids_as_keras_optimizer_steps_them(stack):
    """Stock keras-rs looks ragged ids up on its default device; its tables
    made row-sparse refused them. The oracle: stock keras-rs, its table
    stepped by `keras_optimizer`'s twin on the `tf.IndexedSlices` gradient."""
    keras_rs = keras_rs_or_skip()
    ids = tf.ragged.constant(_RAGGED[0], dtype=tf.int32)
    projection = np.array([[0.5], [-1.0], [2.0]], "float32")

    def trained(row_sparse):
        features = _ragged_keras_rs_features(
            keras_rs, initializer=keras.initializers.Constant(_W0)
        )
        embedding = keras_rs.layers.DistributedEmbedding(features)
        if row_sparse:
            embedding = teo.layers.row_sparse_tables(embedding, stack=stack)
        inputs = keras.Input(
            shape=(None,), dtype="int32", ragged=True, name="items", batch_size=3
        )
        rows = embedding({"items": inputs})["items"]
        out = keras.layers.Lambda(lambda pooled: tf.matmul(pooled, projection))(rows)
        model = keras.Model({"items": inputs}, out)
        dense = keras.optimizers.SGD(0.1)
        model.compile(
            optimizer="sgd" if row_sparse else teo.keras_optimizer(features, dense),
            loss="mse",
        )
        data = tf.data.Dataset.from_tensor_slices(({"items": ids}, _RAGGED_TARGETS))
        model.fit(data.batch(3), epochs=3, verbose=0)
        return np.asarray(embedding.get_embedding_tables()["items"])

    expected = trained(row_sparse=False)
    table = trained(row_sparse=True)
    np.testing.assert_array_equal(table, expected)
    np.testing.assert_array_equal(
        np.flatnonzero((table != _W0).any(axis=1)), [1, 2, 3, 5]
    )


# Two batches of ragged ids (`_RAGGED`) and their weights: ragged as the ids,
# or one per example. Rows 1, 2, 3 and 5 are looked up with weight 0 in one
# batch and with another weight in the other; in the first batch row 2 only
# with weight 0.
_RAGGED_WEIGHTS = {
    "ragged": (
        [[1.0, 0.0, 2.0], [0.5], [0.0, 0.0, 1.5, 1.0]],
        [[0.0], [1.0, 2.0, 0.0], [1.0]],
    ),
    "per-example": ([2.0, 0.0, 1.0], [0.0, 1.0, 0.5]),
}


def _without_weightless(ids, weights):
    """`ids` and `weights` (one batch) without the entries of weight 0 (per
    example: the example's ids)."""
    if not isinstance(weights[0], list):
        return [row if w else [] for row, w in zip(ids, weights)], weights
    kept = [[(i, w) for i, w in zip(*row) if w] for row in zip(ids, weights)]
    return [[i for i, _ in row] for row in kept], [[w for _, w in row] for row in kept]


@pytest.mark.parametrize("weights", sorted(_RAGGED_WEIGHTS))
@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("stack", [False, True], ids=["separate", "stacked"])
def test_keras_rs_tables_take_ragged_ids_with_weights_as_keras_rs(
    stack, combiner, weights
):
    """Ragged ids with weights failed deep in the lookup ("object of type
    'RaggedTensor' has no len()"), then were refused; stock keras-rs takes
    them. An entry of weight 0 is no lookup (no output, no step of its row
    or of its slots). The oracle: stock keras-rs, given the ids without
    those entries, its table stepped by `keras_optimizer`'s twin of lazy
    Adam (which would step a zero row's moments) on the `tf.IndexedSlices`
    gradient; the rows sit elsewhere in that gradient than here, hence
    `exact_tensorflow`."""
    keras_rs = keras_rs_or_skip()
    projection = np.array([[0.5], [-1.0], [2.0]], "float32")

    def trained(row_sparse):
        features = _ragged_keras_rs_features(
            keras_rs,
            initializer=keras.initializers.Constant(_W0),
            combiner=combiner,
            optimizer=teo.optimizers.Adam(0.1, lazy=True),
        )
        embedding = keras_rs.layers.DistributedEmbedding(features)
        if row_sparse:
            embedding = teo.layers.row_sparse_tables(embedding, stack=stack)
        inputs = keras.Input(
            shape=(None,), dtype="int32", ragged=True, name="items", batch_size=3
        )
        ragged_weights = weights == "ragged"
        weighed = keras.Input(
            shape=(None,) if ragged_weights else (),
            ragged=ragged_weights,
            name="weights",
            batch_size=3,
        )
        rows = embedding({"items": inputs}, weights={"items": weighed})["items"]
        out = keras.layers.Lambda(lambda pooled: tf.matmul(pooled, projection))(rows)
        model = keras.Model({"items": inputs, "weights": weighed}, out)
        dense = keras.optimizers.SGD(0.1)
        model.compile(
            optimizer="sgd" if row_sparse else teo.keras_optimizer(features, dense),
            loss="mse",
        )
        batches = []
        for ids, weight in zip(_RAGGED, _RAGGED_WEIGHTS[weights]):
            if not row_sparse:
                ids, weight = _without_weightless(ids, weight)
            batches.append(
                {
                    "items": tf.ragged.constant(ids, dtype=tf.int32),
                    "weights": tf.ragged.constant(weight, dtype=tf.float32)
                    if ragged_weights
                    else tf.constant(weight, tf.float32),
                }
            )
        with exact_tensorflow():
            for _ in range(3):
                for x in batches:
                    model.train_on_batch(x, _RAGGED_TARGETS)
        table = np.asarray(embedding.get_embedding_tables()["items"])
        return table, [model.predict_on_batch(x) for x in batches]

    (expected, expected_out), (table, out) = trained(False), trained(True)
    np.testing.assert_array_equal(table, expected)
    np.testing.assert_array_equal(out, expected_out)
    np.testing.assert_array_equal(
        np.flatnonzero((table != _W0).any(axis=1)), [1, 2, 3, 5]
    )
