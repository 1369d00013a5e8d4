"""`tf_tpu_embed_opt.layers.Embedding`: the table steps in the backward pass.

On the backend the suite runs on (TensorFlow, or JAX without TensorFlow):
- each step of the layer, driven as a Keras user drives it (a custom loop:
  `GradientTape` on TensorFlow, `stateless_call` with `jax.grad` on JAX, then
  the model optimizer's `apply`), equals the backend's validated lazy path:
  the twin applied to a row-sparse gradient (`tf.IndexedSlices`, JAX `BCOO`)
  with the same rows, to the last bit; rows never looked up, and their slots,
  stay bit-identical;
- the rows follow jax-tpu-embedding's own lowered update (`jte_oracle.py`);
- `fit`, `evaluate`, `predict`, `.keras` saving in the middle of training,
  the model optimizer never touching the table, and the refusals.
TensorFlow's fused kernels: `test_row_sparse_embedding_kernels.py`.
"""

# Runs without TensorFlow.

import warnings

import keras
import numpy as np
import pytest

import tf_tpu_embed_opt as teo

BACKEND = keras.backend.backend()
ROWS, DIM = 12, 3
# Ids per step (a batch of 2 x 3 positions), with duplicates; rows 5, 6, 8,
# 10 and 11 are never looked up.
STEP_IDS = (
    ((1, 4, 1), (7, 1, 4)),
    ((4, 4, 2), (9, 0, 2)),
    ((0, 7, 9), (7, 3, 0)),
    ((1, 2, 3), (3, 2, 1)),
)
_RNG = np.random.default_rng(7)
W0 = _RNG.normal(0.0, 1.0, (ROWS, DIM)).astype(np.float32)
# d loss / d output of each step: the loss is sum(output * G).
STEP_GRADS = tuple(
    (_RNG.normal(0.0, 1.0, (2, 3, DIM)) * 1.5).astype(np.float32) for _ in STEP_IDS
)
UNTOUCHED = sorted(set(range(ROWS)) - {i for s in STEP_IDS for r in s for i in r})

TWINS = {
    "Adagrad": lambda: teo.optimizers.Adagrad(0.2, epsilon=0.0),
    "Adam-lazy": lambda: teo.optimizers.Adam(0.05, beta_1=0.8, lazy=True),
    # The schedule is read at the table optimizer's step, as Keras reads it.
    "Adam-lazy-schedule": lambda: teo.optimizers.Adam(
        keras.optimizers.schedules.ExponentialDecay(0.05, 1, 0.5), lazy=True
    ),
    "Ftrl-lazy": lambda: teo.optimizers.Ftrl(
        0.1, l1_regularization_strength=0.01, lazy=True
    ),
    "SGD": lambda: teo.optimizers.SGD(0.3),
    "Momentum": lambda: teo.optimizers.Momentum(0.05, momentum=0.7),
    "RMSprop-lazy": lambda: teo.optimizers.RMSprop(0.01, momentum=0.5, lazy=True),
    "AdagradMomentum": lambda: teo.optimizers.AdagradMomentum(0.05, momentum=0.8),
    "ProximalYogi": lambda: teo.optimizers.ProximalYogi(0.05),
    "LaProp": lambda: teo.optimizers.LaProp(0.01),
}


def _model(optimizer, seed=0):
    keras.utils.set_random_seed(seed)
    layer = teo.layers.Embedding(
        ROWS,
        DIM,
        optimizer=optimizer,
        embeddings_initializer=keras.initializers.Constant(W0),
        name="table",
    )
    ids = keras.Input((3,), dtype="int32")
    model = keras.Model(ids, layer(ids))
    return model, layer


def _custom_loop(model, model_optimizer, steps):
    """One custom training step per (ids, G), as each backend's user writes it."""
    if BACKEND == "jax":
        import jax

        trainable = [v.value for v in model.trainable_variables]
        non_trainable = [v.value for v in model.non_trainable_variables]
        model_optimizer.build(model.trainable_variables)
        optimizer_state = [v.value for v in model_optimizer.variables]

        def loss(trainable, non_trainable, ids, g):
            out, non_trainable = model.stateless_call(
                trainable, non_trainable, ids, training=True
            )
            return (out * g).sum(), non_trainable

        for ids, g in steps:
            grads, non_trainable = jax.grad(loss, has_aux=True)(
                trainable, non_trainable, np.asarray(ids, "int32"), g
            )
            trainable, optimizer_state = model_optimizer.stateless_apply(
                optimizer_state, grads, trainable
            )
        for variable, value in zip(model.trainable_variables, trainable):
            variable.assign(value)
        for variable, value in zip(model.non_trainable_variables, non_trainable):
            variable.assign(value)
        return
    import tensorflow as tf

    for ids, g in steps:
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(np.asarray(ids, "int32"), training=True) * g)
        grads = tape.gradient(loss, model.trainable_variables)
        model_optimizer.apply(grads, model.trainable_variables)


def _row_sparse(ids, g):
    """The backend's row-sparse gradient of the table for one step."""
    ids = np.asarray(ids, "int32").reshape(-1)
    rows = np.asarray(g, "float32").reshape(-1, DIM)
    if BACKEND == "jax":
        from jax.experimental import sparse as jax_sparse

        return jax_sparse.BCOO((rows, ids[:, None]), shape=(ROWS, DIM))
    import tensorflow as tf

    return tf.IndexedSlices(rows, ids, (ROWS, DIM))


def _twin_lazy_path(make):
    twin = make()
    table = keras.Variable(W0.copy(), name="table")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for ids, g in zip(STEP_IDS, STEP_GRADS):
            twin.apply_gradients([(_row_sparse(ids, g), table)])
    index = twin._get_variable_index(table)
    slots = {
        name: keras.ops.convert_to_numpy(variables[index].value)
        for name, variables in twin._slot_variables.items()
    }
    return keras.ops.convert_to_numpy(table.value), slots


def _numpy(variable):
    return keras.ops.convert_to_numpy(variable.value)


@pytest.mark.parametrize("name", sorted(TWINS))
def test_each_step_is_the_backends_lazy_path_to_the_last_bit(name):
    model, layer = _model(TWINS[name]())
    _custom_loop(model, keras.optimizers.SGD(1.0), zip(STEP_IDS, STEP_GRADS))
    expected, expected_slots = _twin_lazy_path(TWINS[name])
    np.testing.assert_array_equal(_numpy(layer.embeddings), expected)
    assert layer.slots.keys() == expected_slots.keys()
    for slot, value in layer.slots.items():
        np.testing.assert_array_equal(_numpy(value), expected_slots[slot], slot)
    np.testing.assert_array_equal(_numpy(layer.embeddings)[UNTOUCHED], W0[UNTOUCHED])
    assert int(_numpy(layer.optimizer.iterations)) == len(STEP_IDS)


def test_the_model_optimizer_never_touches_the_table():
    # Adam with weight decay and clipping would move every row it steps; it
    # keeps no slots for the table and its slots, and writes them as given.
    model, layer = _model(teo.optimizers.Adagrad(0.2, epsilon=0.0))
    dense = keras.optimizers.Adam(0.1, weight_decay=0.5, global_clipnorm=1e-3)
    _custom_loop(model, dense, zip(STEP_IDS, STEP_GRADS))
    expected, _ = _twin_lazy_path(TWINS["Adagrad"])
    np.testing.assert_array_equal(_numpy(layer.embeddings), expected)
    assert not [v for v in dense.variables if "table" in v.path]


def test_without_training_the_backward_pass_leaves_the_table():
    model, layer = _model(teo.optimizers.SGD(0.3))
    ids = np.asarray(STEP_IDS[0], "int32")
    if BACKEND == "jax":
        import jax

        def loss(trainable):
            out, _ = model.stateless_call(
                trainable, [v.value for v in model.non_trainable_variables], ids
            )
            return (out * STEP_GRADS[0]).sum()

        grads = jax.grad(loss)([v.value for v in model.trainable_variables])
    else:
        import tensorflow as tf

        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(ids) * STEP_GRADS[0])
        grads = tape.gradient(loss, model.trainable_variables)
    keras.optimizers.SGD(1.0).apply(grads, model.trainable_variables)
    np.testing.assert_array_equal(_numpy(layer.embeddings), W0)
    assert int(_numpy(layer.optimizer.iterations)) == 0


def _fit_model(optimizer, seed=1):
    keras.utils.set_random_seed(seed)
    ids = keras.Input((3,), dtype="int32")
    layer = teo.layers.Embedding(ROWS, DIM, optimizer=optimizer, name="table")
    pooled = keras.layers.GlobalAveragePooling1D()(layer(ids))
    model = keras.Model(ids, keras.layers.Dense(1, name="head")(pooled))
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    return model, layer


DATA_IDS = np.array([s[0] for s in STEP_IDS] + [s[1] for s in STEP_IDS], "int32")
DATA_Y = np.linspace(-1.0, 1.0, len(DATA_IDS)).astype("float32")[:, None]


def test_fit_evaluate_and_predict():
    model, layer = _fit_model(teo.optimizers.Adam(0.05, lazy=True))
    before = _numpy(layer.embeddings).copy()
    batch, epochs = 2, 2
    steps = epochs * len(DATA_IDS) // batch
    model.fit(
        DATA_IDS, DATA_Y, batch_size=batch, epochs=epochs, shuffle=False, verbose=0
    )
    trained = _numpy(layer.embeddings).copy()
    looked_up = sorted(set(DATA_IDS.ravel()))
    assert (trained[looked_up] != before[looked_up]).any(axis=1).all()
    never = sorted(set(range(ROWS)) - set(looked_up))
    np.testing.assert_array_equal(trained[never], before[never])
    assert int(_numpy(layer.optimizer.iterations)) == steps
    model.evaluate(DATA_IDS, DATA_Y, verbose=0)
    model.predict(DATA_IDS, verbose=0)
    np.testing.assert_array_equal(_numpy(layer.embeddings), trained)
    assert int(_numpy(layer.optimizer.iterations)) == steps


def test_keras_file_saved_mid_training_continues_identically(tmp_path):
    def optimizer():
        return teo.optimizers.Adam(
            keras.optimizers.schedules.ExponentialDecay(0.05, 2, 0.5), lazy=True
        )

    straight, straight_layer = _fit_model(optimizer())
    straight.fit(DATA_IDS, DATA_Y, batch_size=2, epochs=2, shuffle=False, verbose=0)

    model, _ = _fit_model(optimizer())
    model.fit(DATA_IDS, DATA_Y, batch_size=2, epochs=1, shuffle=False, verbose=0)
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    layer = loaded.get_layer("table")
    assert type(layer) is teo.layers.Embedding
    assert int(_numpy(layer.optimizer.iterations)) == len(DATA_IDS) // 2
    loaded.fit(DATA_IDS, DATA_Y, batch_size=2, epochs=1, shuffle=False, verbose=0)
    for ours, theirs in zip(loaded.weights, straight.weights):
        np.testing.assert_array_equal(_numpy(ours), _numpy(theirs), ours.path)
    np.testing.assert_array_equal(
        _numpy(layer.slots["velocities"]), _numpy(straight_layer.slots["velocities"])
    )


def test_backup_and_restore_resumes_identically(tmp_path):
    """An interrupted `fit` resumed by `BackupAndRestore` ends where an
    uninterrupted one does: table, slots, the table optimizer's step."""

    def optimizer():
        return teo.optimizers.Ftrl(0.1, l1_regularization_strength=0.01, lazy=True)

    fit = dict(batch_size=2, epochs=3, shuffle=False, verbose=0)
    straight, straight_layer = _fit_model(optimizer())
    straight.fit(DATA_IDS, DATA_Y, **fit)

    class Interrupt(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                raise RuntimeError("interrupted")

    backup = keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))
    model, _ = _fit_model(optimizer())
    with pytest.raises(RuntimeError, match="interrupted"):
        model.fit(DATA_IDS, DATA_Y, callbacks=[backup, Interrupt()], **fit)
    # A new process would build the model afresh: different initial table.
    resumed, layer = _fit_model(optimizer(), seed=2)
    resumed.fit(DATA_IDS, DATA_Y, callbacks=[backup], **fit)
    assert int(_numpy(layer.optimizer.iterations)) == 3 * len(DATA_IDS) // 2
    for ours, theirs in zip(resumed.weights, straight.weights):
        np.testing.assert_array_equal(_numpy(ours), _numpy(theirs), ours.path)
    for name, slot in layer.slots.items():
        np.testing.assert_array_equal(
            _numpy(slot), _numpy(straight_layer.slots[name]), name
        )


def test_config_round_trip():
    layer = teo.layers.Embedding(
        ROWS, DIM, mask_zero=True, optimizer=teo.optimizers.Adagrad(0.3)
    )
    again = teo.layers.Embedding.from_config(layer.get_config())
    assert again.get_config() == layer.get_config()
    assert again.optimizer.get_config() == layer.optimizer.get_config()
    mask = again.compute_mask(np.array([[0, 2]]))
    assert keras.ops.convert_to_numpy(mask).tolist() == [[False, True]]


def test_stock_optimizers_are_converted_or_refused():
    layer = teo.layers.Embedding(ROWS, DIM, optimizer=keras.optimizers.Adagrad(0.1))
    assert type(layer.optimizer) is teo.optimizers.Adagrad
    assert type(teo.layers.Embedding(ROWS, DIM, optimizer="sgd").optimizer) is (
        teo.optimizers.SGD
    )
    with pytest.raises(ValueError, match="lazy=True"):
        teo.layers.Embedding(ROWS, DIM, optimizer=keras.optimizers.Adam())
    with pytest.raises(ValueError, match="lazy=True"):
        teo.layers.Embedding(ROWS, DIM, optimizer=keras.optimizers.SGD(momentum=0.9))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({}, "argument `optimizer` .*required"),
        ({"optimizer": 3}, "argument `optimizer` must be"),
        ({"optimizer": "nope"}, "names no Keras optimizer"),
        ({"optimizer": keras.optimizers.Lion()}, "argument `optimizer` must be"),
        ({"optimizer": teo.optimizers.ClippyAdagrad()}, "ClippyAdagrad"),
        (
            {"optimizer": teo.optimizers.Adagrad(clipnorm=1.0)},
            "`clipnorm`.*clipnorm=1.0",
        ),
        (
            {"optimizer": "sgd", "embeddings_regularizer": "l2"},
            "`embeddings_regularizer` must be None",
        ),
        (
            {"optimizer": "sgd", "embeddings_constraint": "unit_norm"},
            "`embeddings_constraint` must be None",
        ),
        ({"optimizer": "sgd", "lora_rank": 2}, "`lora_rank` must be None"),
    ],
)
def test_bad_arguments_are_refused_by_name(kwargs, match):
    with pytest.raises((TypeError, ValueError), match=match):
        teo.layers.Embedding(ROWS, DIM, **kwargs)


@pytest.mark.oracle("jax-tpu-embedding")
@pytest.mark.parametrize("name", ["Adagrad", "Adam", "FTRL", "LaProp"])
def test_rows_follow_jax_tpu_embeddings_own_update(name):
    import jte_oracle
    from jax_tpu_embedding.sparsecore.lib.nn import embedding_spec

    spec = {
        "Adagrad": lambda: embedding_spec.AdagradOptimizerSpec(learning_rate=0.2),
        "Adam": lambda: embedding_spec.AdamOptimizerSpec(learning_rate=0.05),
        "FTRL": lambda: embedding_spec.FTRLOptimizerSpec(
            learning_rate=0.1, l1_regularization_strength=0.01
        ),
        "LaProp": lambda: embedding_spec.LaPropOptimizerSpec(learning_rate=0.01),
    }[name]()
    table = W0.copy()
    slots = jte_oracle.initial_slots(spec, table.shape)
    for step, (ids, g) in enumerate(zip(STEP_IDS, STEP_GRADS)):
        rows = {}
        for row, grad in zip(np.ravel(ids), np.reshape(g, (-1, DIM))):
            rows[int(row)] = rows.get(int(row), 0) + grad
        table, slots = jte_oracle.step(spec, table, slots, rows, step)
    model, layer = _model(teo.to_keras(spec))
    _custom_loop(model, keras.optimizers.SGD(1.0), zip(STEP_IDS, STEP_GRADS))
    # As tests/test_jax_engine.py: the engine's float32 operations in its
    # own order, a few roundings apart from the twin's rule.
    np.testing.assert_allclose(_numpy(layer.embeddings), table, rtol=2e-6, atol=2e-6)
    np.testing.assert_array_equal(_numpy(layer.embeddings)[UNTOUCHED], W0[UNTOUCHED])


def _train_on_devices(devices, out):
    import os
    import subprocess
    import sys

    env = dict(os.environ, KERAS_BACKEND="jax")
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    script = os.path.join(os.path.dirname(__file__), "row_sparse_distributed.py")
    result = subprocess.run(
        [sys.executable, script, str(devices), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return np.load(out)


@pytest.mark.skipif(BACKEND != "jax", reason="keras.distribution runs on JAX")
def test_four_devices_equal_one(tmp_path):
    """`DataParallel`, a `LayoutMap` sharding the table's rows, and both, on 4
    simulated devices, equal 1 device to the last bit (exact by construction:
    tests/row_sparse_distributed.py), and the slots are sharded as the table."""
    one = _train_on_devices(1, tmp_path / "one.npz")
    four = _train_on_devices(4, tmp_path / "four.npz")
    labels = {key.split("/")[1] for key in four.files}
    assert labels == {"data", "rows1x4", "rows2x2"}
    for key in four.files:
        name, label, what = key.split("/")
        if what == "table_spec":
            sharded = label != "data"
            assert ("'model', None" in str(four[key])) == sharded, four[key]
        elif what == "same_layout":
            assert four[key], f"{name}/{label}: a slot is laid out unlike the table"
        else:
            np.testing.assert_array_equal(
                four[key], one[f"{name}/one/{what}"], err_msg=key
            )
