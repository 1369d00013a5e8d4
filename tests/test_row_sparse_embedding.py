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

import importlib.util
import warnings

import keras
import numpy as np
import pytest
import row_sparse_distributed
import row_steps
from child_env import child_env
from conftest import (
    exact_tensorflow,
    keras_face,
    keras_rs_or_skip,
    needs_tensorflow,
    version_independent,
)

import tf_tpu_embed_opt as teo

pytestmark = keras_face

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


@pytest.fixture(params=["sparse", "every-row"] if BACKEND == "jax" else ["sparse"])
def jax_step_way(request, monkeypatch):
    """On JAX, each way the backward pass steps the table: by the distinct
    ids' rows (sort and search), or, for a table of few rows per id, every
    row with only the looked-up kept (`lookup_jax.MARKED_ROWS_PER_ID`)."""
    if BACKEND == "jax":
        from tf_tpu_embed_opt.layers import lookup_jax

        per_id = 0 if request.param == "sparse" else ROWS + 1
        monkeypatch.setattr(lookup_jax, "MARKED_ROWS_PER_ID", per_id)
    return request.param


@pytest.mark.parametrize("name", sorted(TWINS))
def test_each_step_is_the_backends_lazy_path_to_the_last_bit(name, jax_step_way):
    model, layer = _model(TWINS[name]())
    _custom_loop(model, keras.optimizers.SGD(1.0), zip(STEP_IDS, STEP_GRADS))
    expected, expected_slots = _twin_lazy_path(TWINS[name])
    np.testing.assert_array_equal(_numpy(layer.embeddings), expected)
    assert layer.slots.keys() == expected_slots.keys()
    for slot, value in layer.slots.items():
        np.testing.assert_array_equal(_numpy(value), expected_slots[slot], slot)
    np.testing.assert_array_equal(_numpy(layer.embeddings)[UNTOUCHED], W0[UNTOUCHED])
    assert int(keras.ops.convert_to_numpy(layer.optimizer.iterations)) == len(STEP_IDS)


def test_the_model_optimizer_never_touches_the_table():
    # Adam with weight decay and clipping would move every row it steps; it
    # keeps no slots for the table and its slots, and writes them as given.
    model, layer = _model(teo.optimizers.Adagrad(0.2, epsilon=0.0))
    dense = keras.optimizers.Adam(0.1, weight_decay=0.5, global_clipnorm=1e-3)
    _custom_loop(model, dense, zip(STEP_IDS, STEP_GRADS))
    expected, _ = _twin_lazy_path(TWINS["Adagrad"])
    np.testing.assert_array_equal(_numpy(layer.embeddings), expected)
    assert not [v for v in dense.variables if "table" in v.path]


class _LayerCall(keras.Model):
    """Calls the layer on the ids as given (a functional model adds a batch)."""

    def __init__(self, layer):
        super().__init__()
        self.table = layer

    def call(self, ids, training=False):
        return self.table(ids, training=training)


@pytest.mark.parametrize("name", ["Adagrad", "Adam-lazy"])
def test_a_scalar_id_steps_its_row_as_a_batch_of_one_does(name):
    # keras.layers.Embedding looks up a scalar id (its output is one row);
    # on TensorFlow the layer failed on it ("Attempting to slice scalar
    # input"), on JAX it worked.
    g = STEP_GRADS[0][0, 0]
    tables = []
    for ids, grad in ((np.array(4), g), (np.array([4]), g[None])):
        _, layer = _model(TWINS[name]())
        model = _LayerCall(layer)
        assert tuple(model(ids).shape) == (*ids.shape, DIM)
        _custom_loop(model, keras.optimizers.SGD(0.1), [(ids, grad)])
        tables.append(_numpy(layer.embeddings))
    np.testing.assert_array_equal(tables[0], tables[1])
    assert not np.array_equal(tables[0][4], W0[4])
    np.testing.assert_array_equal(np.delete(tables[0], 4, axis=0), np.delete(W0, 4, 0))


def _gradients_of_a_call(model, training, x=None, g=None):
    """The model's gradients of `sum(output * g)` for the ids `x` (by default
    `STEP_IDS[0]`, `STEP_GRADS[0]`), of a call with `training` (not given
    where it is None)."""
    x = np.asarray(STEP_IDS[0], "int32") if x is None else x
    g = STEP_GRADS[0] if g is None else g
    given = {} if training is None else {"training": training}
    if BACKEND == "jax":
        import jax

        def loss(trainable):
            out, _ = model.stateless_call(
                trainable,
                [v.value for v in model.non_trainable_variables],
                x,
                **given,
            )
            return (out * g).sum()

        return jax.grad(loss)([v.value for v in model.trainable_variables])
    import tensorflow as tf

    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(x, **given) * g)
    return tape.gradient(loss, model.trainable_variables)


def test_without_training_the_backward_pass_leaves_the_table():
    model, layer = _model(teo.optimizers.SGD(0.3))
    grads = _gradients_of_a_call(model, training=False)
    if BACKEND == "tensorflow":
        import tensorflow as tf

        # The table's and its slots' "gradients" hold no rows at all.
        sparse = [g for g in grads if isinstance(g, tf.IndexedSlices)]
        assert len(sparse) == len(layer.trainable_weights) - 1  # but the step pair
        for gradient in sparse:
            assert gradient.indices.shape[0] == gradient.values.shape[0] == 0
    keras.optimizers.SGD(1.0).apply(grads, model.trainable_variables)
    np.testing.assert_array_equal(_numpy(layer.embeddings), W0)
    assert int(keras.ops.convert_to_numpy(layer.optimizer.iterations)) == 0


def test_a_gradient_of_the_table_in_a_call_without_training_is_refused():
    """A custom loop that calls the model without `training` (a Keras
    `Embedding` trains either way) left the table untrained without a word:
    its gradient was the table itself. Refused when the gradient is taken,
    naming the layer and the two ways; gradients of the rest of the model
    (the table not among the sources, or frozen) are taken as before."""
    _, layer = _model(teo.optimizers.SGD(0.3))
    ids = keras.Input((3,), dtype="int32")
    model = keras.Model(ids, keras.layers.Dense(DIM, name="head")(layer(ids)))
    with pytest.raises(
        ValueError,
        match=r"Embedding: table 'table': a gradient of its table was taken in a call "
        r"without training=True \(training was not given\)\. .* Call the model "
        r"with training=True to train it .* or with training=False to take "
        r"gradients that leave it as it is\.",
    ):
        _gradients_of_a_call(model, training=None)
    np.testing.assert_array_equal(_numpy(layer.embeddings), W0)
    layer.trainable = False
    grads = _gradients_of_a_call(model, training=None)
    assert [v.path for v in model.trainable_variables] == ["head/kernel", "head/bias"]
    assert all(np.any(keras.ops.convert_to_numpy(g)) for g in grads)


def _scaled_loop(model, optimizer, steps, losses, compiled=False):
    """`_custom_loop` with the loss scaled by `optimizer.scale_loss`, as
    Keras's guide to mixed precision in a custom loop scales it, plus the
    model's losses where `losses` (on JAX those of `stateless_call`); on
    TensorFlow in a `tf.function` where `compiled`."""
    if BACKEND == "jax":
        import jax

        optimizer.build(model.trainable_variables)
        trainable = [v.value for v in model.trainable_variables]
        non_trainable = [v.value for v in model.non_trainable_variables]
        state = [v.value for v in optimizer.variables]

        def loss(trainable, non_trainable, state, ids, g):
            out, non_trainable, layer_losses = model.stateless_call(
                trainable, non_trainable, ids, training=True, return_losses=True
            )
            value = (out * g).sum() + (sum(layer_losses) if losses else 0.0)
            with keras.StatelessScope(state_mapping=zip(optimizer.variables, state)):
                return optimizer.scale_loss(value), non_trainable

        for ids, g in steps:
            grads, non_trainable = jax.grad(loss, has_aux=True)(
                trainable, non_trainable, state, np.asarray(ids, "int32"), g
            )
            trainable, state = optimizer.stateless_apply(state, grads, trainable)
        for variable, value in zip(model.trainable_variables, trainable):
            variable.assign(value)
        for variable, value in zip(model.non_trainable_variables, non_trainable):
            variable.assign(value)
        return
    import tensorflow as tf

    def step(ids, g):
        with tf.GradientTape() as tape:
            value = tf.reduce_sum(model(ids, training=True) * g)
            if losses:
                value += tf.add_n(model.losses)
            scaled = optimizer.scale_loss(value)
        grads = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)

    step = tf.function(step) if compiled else step
    for ids, g in steps:
        step(np.asarray(ids, "int32"), g)


_SCALERS = {
    "LossScaleOptimizer": lambda: keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(0.1)
    ),
    "loss_scale_factor": lambda: keras.optimizers.SGD(0.1, loss_scale_factor=2.0**10),
}
# On TensorFlow, the loop op by op and in a `tf.function`.
_COMPILED = [False, True] if BACKEND == "tensorflow" else [False]


@pytest.mark.parametrize("compiled", _COMPILED, ids=lambda c: "compiled" * c or "eager")
@pytest.mark.parametrize("scaler", sorted(_SCALERS))
def test_a_custom_loop_that_scales_a_loss_without_the_layers_losses_is_refused(
    scaler, compiled
):
    """Keras's pattern for a scaled loss in a custom loop (`scale_loss`,
    gradients, `apply`) leaves out `model.losses`, and with it the probe
    that tells the backward pass the scale: the table stepped 32,768 (or
    1,024) times too far without a word. Refused, naming the table and the
    way out; nothing moves."""
    model, layer = _model(teo.optimizers.Adagrad(0.2, epsilon=0.0))
    scaled = _SCALERS[scaler]()
    by = "LossScaleOptimizer" if scaler == "LossScaleOptimizer" else "SGD"
    with pytest.raises(
        ValueError,
        match=rf"Embedding: table 'table': its gradient was taken of a loss "
        rf"scaled by {by}.* that leaves out the layer's losses\. .* loss \+ "
        r"sum\(model\.losses\), or the losses of model\.stateless_call\(\.\.\., "
        r"return_losses=True\) on JAX\.",
    ):
        _scaled_loop(model, scaled, zip(STEP_IDS, STEP_GRADS), False, compiled)
    np.testing.assert_array_equal(_numpy(layer.embeddings), W0)
    for value in layer.slots.values():
        np.testing.assert_array_equal(_numpy(value), np.full_like(W0, 0.1))
    assert int(keras.ops.convert_to_numpy(layer.table_step)) == 0


@pytest.mark.parametrize("compiled", _COMPILED, ids=lambda c: "compiled" * c or "eager")
@pytest.mark.parametrize("scaler", sorted(_SCALERS) + ["unscaled"])
def test_a_custom_loop_that_scales_a_loss_with_the_layers_losses_steps_exactly(
    scaler, compiled
):
    """With `model.losses` in the scaled loss, as the guide says, the table
    steps as in the loop without scaling, bit for bit (the scales are powers
    of two); an optimizer that scales nothing (`scale_loss` hands the loss
    back) needs no losses. (In a `tf.function`, without Grappler's rsqrt
    rewrite: `exact_tensorflow`.)"""
    model, layer = _model(teo.optimizers.Adagrad(0.2, epsilon=0.0))
    _custom_loop(model, keras.optimizers.SGD(0.1), zip(STEP_IDS, STEP_GRADS))
    for losses in (True, False) if scaler == "unscaled" else (True,):
        scaled = _SCALERS.get(scaler, lambda: keras.optimizers.SGD(0.1))()
        other, other_layer = _model(teo.optimizers.Adagrad(0.2, epsilon=0.0))
        with exact_tensorflow():
            _scaled_loop(other, scaled, zip(STEP_IDS, STEP_GRADS), losses, compiled)
        for got, want in zip(other_layer.weights, layer.weights):
            np.testing.assert_array_equal(_numpy(got), _numpy(want), got.path)
    assert int(keras.ops.convert_to_numpy(other_layer.table_step)) == len(STEP_IDS)


def _fit_model(optimizer, seed=1, weights=None):
    keras.utils.set_random_seed(seed)
    ids = keras.Input((3,), dtype="int32")
    layer = teo.layers.Embedding(
        ROWS, DIM, optimizer=optimizer, weights=weights, name="table"
    )
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
    assert int(keras.ops.convert_to_numpy(layer.optimizer.iterations)) == steps
    model.evaluate(DATA_IDS, DATA_Y, verbose=0)
    model.predict(DATA_IDS, verbose=0)
    np.testing.assert_array_equal(_numpy(layer.embeddings), trained)
    assert int(keras.ops.convert_to_numpy(layer.optimizer.iterations)) == steps


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
    assert (
        int(keras.ops.convert_to_numpy(layer.optimizer.iterations))
        == len(DATA_IDS) // 2
    )
    loaded.fit(DATA_IDS, DATA_Y, batch_size=2, epochs=1, shuffle=False, verbose=0)
    for ours, theirs in zip(loaded.weights, straight.weights):
        np.testing.assert_array_equal(_numpy(ours), _numpy(theirs), ours.path)
    np.testing.assert_array_equal(
        _numpy(layer.slots["velocities"]), _numpy(straight_layer.slots["velocities"])
    )


def _two_table_model(optimizers):
    keras.utils.set_random_seed(3)
    ids = keras.Input((3,), dtype="int32")
    first = teo.layers.Embedding(ROWS, DIM, optimizer=optimizers[0], name="first")
    second = teo.layers.Embedding(ROWS, DIM, optimizer=optimizers[1], name="second")
    both = keras.layers.Concatenate()([first(ids), second(ids[:, ::-1])])
    model = keras.Model(ids, keras.layers.Dense(1)(keras.layers.Flatten()(both)))
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return model


def _tables(model):
    return {
        v.path: _numpy(v)
        for name in ("first", "second")
        for v in model.get_layer(name).weights
        + model.get_layer(name).non_trainable_weights
    }


def test_one_twin_shared_by_two_tables(tmp_path):
    """One optimizer instance given to two tables (as TPUEmbedding takes one
    optimizer for all) steps each table, its slots and its own step counter
    as an instance each would, a schedule read at each table's step; a
    `.keras` file saved mid-training reloads each table with its own
    optimizer and continues alike (Keras warns that the second table's
    optimizer was saved once, under the first)."""

    def optimizer():
        rate = keras.optimizers.schedules.ExponentialDecay(0.3, 2, 0.5)
        return teo.optimizers.Adam(rate, beta_1=0.8, lazy=True)

    fit = dict(batch_size=2, shuffle=False, verbose=0)
    apart = _two_table_model((optimizer(), optimizer()))
    apart.fit(DATA_IDS, DATA_Y, epochs=2, **fit)
    shared_optimizer = optimizer()
    shared = _two_table_model((shared_optimizer, shared_optimizer))
    assert shared.get_layer("first").optimizer is shared_optimizer
    assert shared.get_layer("second").optimizer is shared_optimizer
    shared.fit(DATA_IDS, DATA_Y, epochs=1, **fit)
    path = tmp_path / "shared.keras"
    shared.save(path)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Skipping variable loading for optimizer")
        loaded = keras.saving.load_model(path)
    for name in ("first", "second"):
        steps = loaded.get_layer(name).optimizer.iterations
        assert int(keras.ops.convert_to_numpy(steps)) == len(DATA_IDS) // 2
    loaded.fit(DATA_IDS, DATA_Y, epochs=1, **fit)
    want, got = _tables(apart), _tables(loaded)
    assert sorted(want) == sorted(got) and len(want) == 8  # table, 2 slots, step
    for path_ in want:
        np.testing.assert_array_equal(got[path_], want[path_], path_)


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
    assert (
        int(keras.ops.convert_to_numpy(layer.optimizer.iterations))
        == 3 * len(DATA_IDS) // 2
    )
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


@pytest.mark.parametrize("as_list", [False, True])
def test_weights_start_the_table_as_keras_embedding_starts_it(as_list):
    """`weights`, as `keras.layers.Embedding` takes it (the table, or a list
    of it), starts the table: lookups read what Keras's layer reads, and the
    slots start at their initial values. (Keras's own handling would set
    every weight of the layer, the slots too, from the one array.)"""
    weights = [W0] if as_list else W0
    layer = teo.layers.Embedding(
        ROWS,
        DIM,
        optimizer=teo.optimizers.Adagrad(0.2, initial_accumulator_value=0.3),
        weights=weights,
    )
    stock = keras.layers.Embedding(ROWS, DIM, weights=weights)
    ids = np.array(STEP_IDS[0], "int32")
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(layer(ids)), keras.ops.convert_to_numpy(stock(ids))
    )
    np.testing.assert_array_equal(_numpy(layer.embeddings), W0)
    np.testing.assert_array_equal(
        _numpy(layer.slots["accumulators"]), np.full((ROWS, DIM), 0.3, np.float32)
    )


def _keras_embedding_file(tmp_path, rows=ROWS):
    """The weights file of the model of `_fit_model` built with a
    `keras.layers.Embedding`, trained a few steps (its `.keras` file beside
    it), and its model."""
    keras.utils.set_random_seed(3)
    ids = keras.Input((3,), dtype="int32")
    layer = keras.layers.Embedding(rows, DIM, name="table")
    pooled = keras.layers.GlobalAveragePooling1D()(layer(ids))
    model = keras.Model(ids, keras.layers.Dense(1, name="head")(pooled))
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    model.fit(DATA_IDS % rows, DATA_Y, batch_size=2, shuffle=False, verbose=0)
    path = str(tmp_path / f"keras_embedding_{rows}.weights.h5")
    model.save_weights(path)
    model.save(path.replace(".weights.h5", ".keras"))
    return path, model


def test_a_keras_embedding_file_starts_the_table_with_fresh_optimizer_state(
    tmp_path,
):
    """A `keras.layers.Embedding`'s weights (its `.keras` file, its
    `save_weights` file: the table alone) load into the layer as `weights=`
    starts it: the table, the slots at their initial values, the table
    optimizer's step at 0, also over a trained layer; the model then trains
    on as one built with `weights=` does, bit for bit."""
    path, stock = _keras_embedding_file(tmp_path)

    def optimizer():
        return teo.optimizers.Adagrad(0.2, initial_accumulator_value=0.3)

    trained, layer = _fit_model(optimizer())
    trained.fit(DATA_IDS, DATA_Y, batch_size=2, shuffle=False, verbose=0)
    with warnings.catch_warnings():
        # Keras skips the model optimizer's state: it kept the table's too.
        warnings.simplefilter("ignore", UserWarning)
        trained.load_weights(path.replace(".weights.h5", ".keras"))
    np.testing.assert_array_equal(
        _numpy(layer.embeddings), _numpy(stock.get_layer("table").embeddings)
    )
    np.testing.assert_array_equal(
        _numpy(layer.slots["accumulators"]), np.full((ROWS, DIM), 0.3, np.float32)
    )
    assert int(keras.ops.convert_to_numpy(layer.optimizer.iterations)) == 0

    loaded, _ = _fit_model(optimizer())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        loaded.load_weights(path)
    start = [_numpy(stock.get_layer("table").embeddings)]
    started, _ = _fit_model(optimizer(), weights=start)
    started.get_layer("head").set_weights(stock.get_layer("head").get_weights())
    for model in (loaded, started):
        model.fit(DATA_IDS, DATA_Y, batch_size=2, epochs=2, shuffle=False, verbose=0)
    for ours, theirs in zip(loaded.weights, started.weights):
        np.testing.assert_array_equal(_numpy(ours), _numpy(theirs), ours.path)


def test_set_weights_takes_every_weight_or_a_keras_embeddings_table():
    """`set_weights` takes what `get_weights` gives (every weight, Keras's
    form), or the table alone, as `keras.layers.Embedding.get_weights` gives
    it: the optimizer's state then starts anew, as with `weights=`."""
    model, layer = _fit_model(
        teo.optimizers.Adagrad(0.2, initial_accumulator_value=0.3)
    )
    model.fit(DATA_IDS, DATA_Y, batch_size=2, shuffle=False, verbose=0)
    trained = layer.get_weights()
    assert len(trained) == 4  # table, accumulators, step, learning rate
    stock = keras.layers.Embedding(ROWS, DIM)
    stock.build()
    layer.set_weights(stock.get_weights())
    np.testing.assert_array_equal(_numpy(layer.embeddings), _numpy(stock.embeddings))
    np.testing.assert_array_equal(
        _numpy(layer.slots["accumulators"]), np.full((ROWS, DIM), 0.3, np.float32)
    )
    assert int(keras.ops.convert_to_numpy(layer.optimizer.iterations)) == 0
    layer.set_weights(trained)
    for ours, theirs in zip(layer.get_weights(), trained):
        np.testing.assert_array_equal(ours, theirs)
    assert int(keras.ops.convert_to_numpy(layer.optimizer.iterations)) == 4
    with pytest.raises(
        ValueError, match=r"argument `weights` must be .* received shape \(3, 12\)"
    ):
        layer.set_weights([W0.T])
    with pytest.raises(ValueError, match="argument `weights` must be .* received str"):
        layer.set_weights(["table"])
    for ours, theirs in zip(layer.get_weights(), trained):
        np.testing.assert_array_equal(ours, theirs)


def test_a_file_of_another_table_or_state_is_refused_by_layer(tmp_path):
    """A `keras.layers.Embedding` file of another table's shape, and a
    row-sparse file of another optimizer's state, are refused, naming the
    layer and what it takes; the table is left as it was. (Keras 3.15.0
    retries a layer that failed to load from another path, where it finds
    nothing, and reports that refusal instead: the shape's is also asked of
    the layer directly.)"""
    path, _ = _keras_embedding_file(tmp_path, rows=ROWS + 1)
    model, layer = _fit_model(teo.optimizers.Adagrad(0.2))
    before = _numpy(layer.embeddings).copy()
    with pytest.raises(ValueError, match="Layer 'table'"):
        model.load_weights(path)
    with pytest.raises(ValueError, match=r"file holds a table of shape \(13, 3\)"):
        layer.load_own_variables({"0": np.zeros((ROWS + 1, DIM), np.float32)})
    adam, _ = _fit_model(teo.optimizers.Adam(0.1, lazy=True))
    adam.save_weights(str(tmp_path / "adam.weights.h5"))
    with pytest.raises(ValueError, match="a keras.layers.Embedding's table alone"):
        model.load_weights(str(tmp_path / "adam.weights.h5"))
    np.testing.assert_array_equal(_numpy(layer.embeddings), before)


def test_stock_optimizers_are_converted_or_refused():
    layer = teo.layers.Embedding(ROWS, DIM, optimizer=keras.optimizers.Adagrad(0.1))
    assert type(layer.optimizer) is teo.optimizers.Adagrad
    assert type(teo.layers.Embedding(ROWS, DIM, optimizer="sgd").optimizer) is (
        teo.optimizers.SGD
    )
    # Named where the argument exists: stock Keras rejects `lazy`.
    with pytest.raises(
        ValueError,
        match=r"Pass tf_tpu_embed_opt\.optimizers\.Adam\(\.\.\., lazy=True\)",
    ):
        teo.layers.Embedding(ROWS, DIM, optimizer=keras.optimizers.Adam())
    with pytest.raises(ValueError, match="lazy=True"):
        teo.layers.Embedding(ROWS, DIM, optimizer=keras.optimizers.SGD(momentum=0.9))


def test_lora_and_quantization_are_refused_by_the_layers_name():
    """Keras's `enable_lora` and `quantize` (also through `Model.quantize`)
    would give the table variables this layer does not step row by row: both
    are refused, naming the layer, and its weights stay as they were."""
    layer = teo.layers.Embedding(
        ROWS, DIM, optimizer=teo.optimizers.Adagrad(0.1), name="items"
    )
    inputs = keras.Input((3,), dtype="int32")
    model = keras.Model(inputs, keras.ops.sum(layer(inputs), axis=1))
    weights = [(w.path, w.dtype, np.array(w)) for w in layer.weights]
    for call, refused in (
        (lambda: layer.enable_lora(4), "enable_lora is refused: LoRA trains"),
        (lambda: layer.quantize("int8"), "quantize is refused: a quantized"),
        (lambda: model.quantize("int8"), "quantize is refused: a quantized"),
    ):
        with warnings.catch_warnings():
            # Keras's Model.quantize warns of its InputLayer.
            warnings.simplefilter("ignore", UserWarning)
            with pytest.raises(ValueError, match=f"^Embedding 'items': {refused}"):
                call()
    assert [(w.path, w.dtype) for w in layer.weights] == [w[:2] for w in weights]
    for weight, (_, _, value) in zip(layer.weights, weights):
        np.testing.assert_array_equal(np.array(weight), value)


@needs_tensorflow("the embedding face's classes")
def test_an_embedding_optimizer_without_a_twin_is_refused_as_a_value():
    """An embedding-face optimizer is a kind the layer takes; one whose
    settings `to_keras` refuses is a `ValueError` carrying its reason (it
    was a `TypeError` saying the optimizer must be of a kind it is)."""
    adagrad = teo.embedding.Adagrad(0.1, use_gradient_accumulation=False)
    with pytest.raises(ValueError) as error:
        teo.layers.Embedding(ROWS, DIM, optimizer=adagrad)
    assert str(error.value) == (
        f"Embedding: argument `optimizer` {adagrad!r} has no Keras twin the "
        "layer can step with: to_keras: with use_gradient_accumulation=False "
        "the engine applies each gradient contribution as a separate step, "
        "and the Adagrad update then differs from one step with the summed "
        "gradient, which the Keras optimizer applies. Use "
        "use_gradient_accumulation=True."
    )
    # Of a kind it does not take, from TensorFlow: still a TypeError.
    import tensorflow as tf

    with pytest.raises(TypeError, match="argument `optimizer` must be .*EagerTensor"):
        teo.layers.Embedding(ROWS, DIM, optimizer=tf.constant(1.0))


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
        (
            {"optimizer": "sgd", "weights": W0.T},
            r"`weights` must be the table's initial value, an array of numbers "
            r"of shape \(12, 3\) .*; received shape \(3, 12\)\.",
        ),
        (
            {"optimizer": "sgd", "weights": [W0, W0]},
            r"`weights` must be .*; received shape \(2, 12, 3\)\.",
        ),
        ({"optimizer": "sgd", "weights": "W0"}, "`weights` .*; received str 'W0'"),
        (
            {"optimizer": "sgd", "dtype": "int32"},
            "`dtype` must give the table a float dtype .*; received 'int32'",
        ),
    ],
)
def test_bad_arguments_are_refused_by_name(kwargs, match):
    with pytest.raises((TypeError, ValueError), match=match):
        teo.layers.Embedding(ROWS, DIM, **kwargs)


def test_an_object_of_no_optimizer_library_is_refused_in_the_layers_words():
    """A value from no library of optimizers is refused with what the layer
    takes, not with to_keras's list of embedding classes it was never
    given to."""
    from tf_tpu_embed_opt.layers.table_optimizer import ALLOWED

    for bad in (3, object()):
        with pytest.raises(TypeError) as error:
            teo.layers.Embedding(ROWS, DIM, optimizer=bad)
        assert str(error.value) == (
            f"Embedding: argument `optimizer` must be {ALLOWED}; received "
            f"{bad!r} of type {type(bad).__name__}."
        )


def test_a_keras_optimizer_no_twin_mirrors_is_named_by_its_path():
    """A subclass of Keras's Adam was refused "of type Adam", the name of a
    class the layer takes; it is named by its module, Keras's own by the
    path Keras exports it at."""

    class Adam(keras.optimizers.Adam):
        pass

    for bad, where in (
        (Adam(), f"{__name__}.{Adam.__qualname__}"),
        (keras.optimizers.Lion(), "keras.optimizers.Lion"),
    ):
        with pytest.raises(TypeError) as error:
            teo.layers.Embedding(ROWS, DIM, optimizer=bad)
        assert str(error.value).endswith(f" of type {where}."), str(error.value)


@pytest.mark.oracle("jax-tpu-embedding")
@pytest.mark.parametrize("name", ["Adagrad", "Adam", "FTRL", "LaProp"])
def test_rows_follow_jax_tpu_embeddings_own_update(name, jax_step_way):
    import jte_oracle
    import row_steps
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
    # The twin of a spec runs the lowering's operations in its order: bit for
    # bit, except FTRL, which rounds apart for the reasons
    # tests/test_jax_engine.py gives (ROUNDS_APART), within the bound
    # row_steps.assert_rows derives.
    row_steps.assert_rows(
        _numpy(layer.embeddings),
        table,
        W0,
        len(STEP_IDS),
        bounded=name == "FTRL",
        what=name,
    )
    np.testing.assert_array_equal(_numpy(layer.embeddings)[UNTOUCHED], W0[UNTOUCHED])


def _child_stdout(arguments, env):
    """The standard output of a child Python run with `arguments` in `env`
    (its error output where it fails)."""
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, *arguments],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


_ON_NUMPY = """
import tf_tpu_embed_opt as teo
try:
    teo.layers.Embedding(10, 4, optimizer="sgd")
except RuntimeError as error:
    print(error)
"""


@version_independent
@pytest.mark.skipif(
    importlib.util.find_spec("jax") is None,
    reason="Keras's numpy backend imports JAX (keras/src/backend/numpy/nn.py)",
)
def test_a_backend_without_a_lookup_is_refused_naming_it():
    """On a Keras backend the layer has no lookup for (numpy here; torch
    alike), making the layer is refused with the backends it runs on and
    the one it found (the refusal was never reached)."""
    stdout = _child_stdout(["-c", _ON_NUMPY], child_env(KERAS_BACKEND="numpy"))
    assert stdout.strip() == (
        "tf_tpu_embed_opt.layers.Embedding runs on Keras's 'jax' and "
        "'tensorflow' backends; this Keras runs on 'numpy'."
    ), stdout


def _train_on_devices(devices, out):
    import os

    # The package these tests import (a scratch copy's, the wheel in CI).
    env = child_env(
        KERAS_BACKEND="jax",
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
    )
    script = os.path.join(os.path.dirname(__file__), "row_sparse_distributed.py")
    _child_stdout([script, str(devices), str(out)], env)
    return np.load(out)


# One training step of a table under a loss linear in its rows (a wide model's):
# prints the lines of XLA's optimized train step that copy a table-shaped array.
_LINEAR_LOSS_STEP = """
import glob, re, sys
import numpy as np, keras
import tf_tpu_embed_opt as teo
rows, dim = 50_000, 8
ids = keras.Input((), dtype="int32")
table = teo.layers.Embedding(rows, dim, optimizer=teo.optimizers.Adagrad(0.1))
model = keras.Model(ids, table(ids))
model.compile(
    optimizer="sgd",
    loss=lambda y, rows: keras.ops.sum(y * rows, axis=-1),
)
model.train_on_batch(np.arange(512, dtype="int32"), np.ones((512, dim), "float32"))
steps = glob.glob(sys.argv[1] + "/*train_step*after_optimizations.txt")
assert steps, "XLA dumped no train step"
copy = re.compile(r"= f32\\[%d,%d\\]\\S* copy\\(" % (rows, dim))
for path in steps:
    for line in open(path):
        if copy.search(line):
            print(line.strip()[:200])
"""


@pytest.mark.skipif(BACKEND != "jax", reason="XLA's train step of Keras's JAX backend")
def test_a_loss_linear_in_the_rows_steps_the_table_in_place(tmp_path):
    """A loss whose gradient does not read the looked-up rows (linear in
    them) gives the table's write no data dependency on the forward pass's
    read; XLA then copied the donated table twice at every step (200 ms
    against 10 ms at 1M x 64). The backward pass reads the rows it steps
    from the forward pass's, and XLA's optimized step copies no table."""
    env = child_env(KERAS_BACKEND="jax")
    env["XLA_FLAGS"] = f"--xla_dump_to={tmp_path} --xla_dump_hlo_pass_re=NONE"
    stdout = _child_stdout(["-c", _LINEAR_LOSS_STEP, str(tmp_path)], env)
    assert stdout == "", stdout


@pytest.mark.skipif(BACKEND != "jax", reason="keras.distribution runs on JAX")
def test_four_devices_equal_one(tmp_path):
    """`DataParallel`, a `LayoutMap` sharding the table's rows, and both, on
    4 simulated devices, equal 1 device to the last bit (exact by
    construction: tests/row_sparse_distributed.py); one sharding the table's
    columns within the bound of compiled steps (below). The slots are
    sharded as the table (a `[rows, 1]` slot as its rows: with the columns
    sharded, Keras refused to make it, "array axis 1 is partitioned 2 times,
    but the dimension size is 1")."""
    one = _train_on_devices(1, tmp_path / "one.npz")
    four = _train_on_devices(4, tmp_path / "four.npz")
    labels = {key.split("/")[1] for key in four.files}
    assert labels == {"data", "rows1x4", "rows2x2", "columns"}
    assert {key.split("/")[0] for key in four.files} >= {"RowWiseAdagrad"}
    for key in four.files:
        name, label, what = key.split("/")
        if what == "table_spec":
            spec = {"data": None, "columns": "None, 'model'"}.get(
                label, "'model', None"
            )
            assert spec is None or spec in str(four[key]), four[key]
            assert spec is not None or "'model'" not in str(four[key]), four[key]
        elif what == "same_layout":
            assert four[key], f"{name}/{label}: a slot is laid out unlike the table"
        else:
            # With the columns sharded XLA compiles the step's element-wise
            # ops per device, and on CPU can contract a multiply-add into one
            # FMA in one compilation and not in the other: measured on JAX
            # 0.7.1, 1 ulp, and bit for bit with
            # --xla_cpu_max_isa=SSE4_2 (docs/tpu_semantics.md, "Rounding").
            expected = one[f"{name}/one/{what}"]
            row_steps.assert_rows(
                four[key],
                expected,
                expected,
                row_sparse_distributed.STEPS,
                bounded=label == "columns" and what != "iterations",
                what=key,
            )


@pytest.mark.skipif(BACKEND != "jax", reason="keras.distribution runs on JAX")
def test_slots_of_a_table_large_enough_to_shard_at_creation(monkeypatch):
    """Under a `keras.distribution` layout Keras creates a variable of 250 MiB
    or more with `jax.jit(initializer.__call__, out_shardings=...)`, so that
    each device makes only its part; the slots' initializer must be one JAX
    can jit (it was a function: "cannot create weak reference to
    'method-wrapper' object"). Forced here for small variables."""
    import jax
    from keras.src.backend.jax import core

    sharded_at_creation = []

    def always(layout, shape):
        sharded_at_creation.append(tuple(shape))
        return True

    monkeypatch.setattr(core, "should_shard_at_init", always)
    devices = np.array(jax.devices()[:1]).reshape(1, 1)
    mesh = keras.distribution.DeviceMesh((1, 1), ("batch", "model"), devices)
    layout_map = keras.distribution.LayoutMap(mesh)
    layout_map["table/embeddings"] = ("model", None)
    distribution = keras.distribution.ModelParallel(
        layout_map=layout_map, batch_dim_name="batch"
    )
    with distribution.scope():
        table = teo.layers.Embedding(
            6,
            3,
            optimizer=teo.optimizers.Adagrad(0.1, initial_accumulator_value=0.25),
            name="table",
        )
        table.build()
        twin = teo.optimizers.Adagrad(0.1, initial_accumulator_value=0.5)
        weights = keras.Variable(np.ones((4, 3), "float32"), name="dense")
        twin.build([weights])
    assert (6, 3) in sharded_at_creation and (4, 3) in sharded_at_creation
    np.testing.assert_array_equal(_numpy(table.slots["accumulators"]), 0.25)
    np.testing.assert_array_equal(_numpy(twin.variables[-1]), 0.5)


# keras-rs tables off SparseCore: `row_sparse_tables`.

KRS_IDS = {
    # Duplicate users (0 three times, 5 twice); users 10-19 never looked up.
    "users": np.array([0, 5, 0, 3, 5, 0, 7, 9], "int32"),
    "items": np.array([0, 4, 4, 4, 7, 9, 11, 29], "int32"),
}
KRS_Y = np.linspace(-1.0, 1.0, 8).astype("float32")[:, None]


def _keras_rs():
    return keras_rs_or_skip()


def _keras_rs_model(users_optimizer, row_sparse, engine=None, stack=False):
    keras_rs = _keras_rs()
    tables = {
        name: keras_rs.layers.TableConfig(
            name=name,
            vocabulary_size=size,
            embedding_dim=4,
            optimizer=optimizer,
            placement="default_device",
            # Seeded: keras-rs's default initializer is seeded at import.
            initializer=keras.initializers.RandomUniform(seed=size),
        )
        for name, size, optimizer in (
            ("users", 20, users_optimizer),
            ("items", 30, "sgd"),
        )
    }
    features = {
        name: keras_rs.layers.FeatureConfig(
            name=name, table=table, input_shape=(8,), output_shape=(8, 4)
        )
        for name, table in tables.items()
    }
    keras.utils.set_random_seed(3)
    inputs = {
        name: keras.Input(shape=(), dtype="int32", batch_size=8, name=name)
        for name in features
    }
    embedding = keras_rs.layers.DistributedEmbedding(features)
    if row_sparse:
        embedding = teo.layers.row_sparse_tables(embedding, engine=engine, stack=stack)
    outputs = embedding(inputs)
    joined = keras.layers.Concatenate()([outputs["users"], outputs["items"]])
    model = keras.Model(inputs, keras.layers.Dense(1, name="head")(joined))
    return model, embedding


@pytest.mark.parametrize("stack", [False, True], ids=["separate", "stacked"])
def test_keras_rs_tables_refuse_a_gradient_of_a_call_without_training(stack):
    """keras-rs's `DistributedEmbedding` takes `training=False` where a call
    does not give it, and Keras hands that to its tables: a custom loop
    without `training` trained the dense layers and left the tables as they
    were. Refused, as for `layers.Embedding`; with `training=True` the
    tables step."""
    model, embedding = _keras_rs_model(
        keras.optimizers.Adagrad(0.1), row_sparse=True, stack=stack
    )
    rng = np.random.default_rng(4)
    x = {
        "users": rng.integers(0, 20, 8).astype("int32"),
        "items": rng.integers(0, 30, 8).astype("int32"),
    }
    model(x)
    before = _tables_of(embedding)
    with pytest.raises(ValueError, match="a gradient of its table was taken in a call"):
        _gradients_of_a_call(model, None, x, 1.0)
    grads = _gradients_of_a_call(model, True, x, 1.0)
    keras.optimizers.SGD(0.1).apply(grads, model.trainable_variables)
    after = _tables_of(embedding)
    for name in ("users", "items"):
        assert not np.array_equal(after[name], before[name]), name


def _table(model, name):
    (variable,) = [v for v in model.weights if v.path.endswith(f"{name}/embeddings")]
    return _numpy(variable)


def test_keras_rs_tables_train_row_by_row_with_their_own_optimizer():
    """Each default-device table steps with its own optimizer: keras-rs with
    Keras's own `MultiOptimizer`, built by hand, is the oracle (stock Adagrad
    and SGD leave rows without gradient unchanged, so lazy equals dense).
    Distinct users: on TensorFlow stock Adagrad squares each duplicate of an
    `IndexedSlices` apart (duplicates: the test below, and the layer's).
    On JAX both step op by op (`jit_compile=False`), where each operation
    rounds once: compiled, the two graphs fuse apart and XLA:CPU contracts
    some multiply-adds into FMAs in one and not the other (1 ulp apart from
    JAX 0.12; test_training_features bounds the compiled step)."""
    data = dict(KRS_IDS, users=np.array([0, 5, 1, 3, 6, 2, 7, 9], "int32"))
    as_written = {"jit_compile": False} if BACKEND == "jax" else {}
    model, _ = _keras_rs_model(keras.optimizers.Adagrad(0.1), row_sparse=False)
    model.compile(
        optimizer=keras.optimizers.MultiOptimizer(
            keras.optimizers.OptimizerMap(
                keras.optimizers.SGD(0.5),
                {
                    ".*/users/embeddings": keras.optimizers.Adagrad(0.1),
                    ".*/items/embeddings": keras.optimizers.SGD(),
                },
            )
        ),
        loss="mse",
        **as_written,
    )
    before = {n: _table(model, n) for n in KRS_IDS}
    model.fit(data, KRS_Y, batch_size=8, epochs=2, verbose=0)
    ours, embedding = _keras_rs_model(keras.optimizers.Adagrad(0.1), row_sparse=True)
    ours.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse", **as_written)
    ours.fit(data, KRS_Y, batch_size=8, epochs=2, verbose=0)
    for name in data:
        got, want = _table(ours, name), _table(model, name)
        if BACKEND == "jax":
            np.testing.assert_array_equal(got, want, err_msg=name)
        else:
            # As test_jax_engine._assert_same_step: Keras steps each
            # duplicate of an IndexedSlices apart, the twin sums them first.
            bound = 16 * np.finfo(np.float32).eps * (np.abs(before[name]) + 1)
            assert (np.abs(got - want) <= bound).all(), name
    np.testing.assert_array_equal(
        _table(ours, "users")[10:], before["users"][10:], "rows never looked up"
    )
    layers = embedding._default_device_embedding_layers
    assert type(layers["users"]).__module__ == "tf_tpu_embed_opt.layers.keras_rs_tables"
    assert sorted(layers["users"].slots) == ["accumulators"]


@pytest.mark.oracle("jax-tpu-embedding")
def test_keras_rs_tables_follow_the_sparsecore_job():
    """With engine='jax-tpu-embedding' a keras-rs Adam table steps as
    jax-tpu-embedding's own lowered update steps what keras-rs hands it
    (lazy Adam): one step, gradients worked out by hand."""
    import jte_oracle
    from keras_rs.src.layers.embedding.jax import config_conversion

    adam = keras.optimizers.Adam(0.01)
    spec = config_conversion.keras_to_jte_optimizer(adam)
    model, _ = _keras_rs_model(adam, row_sparse=True, engine="jax-tpu-embedding")
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
    users, items = _table(model, "users"), _table(model, "items")
    kernel = _numpy(model.get_layer("head").kernel)
    bias = _numpy(model.get_layer("head").bias)
    prediction = (
        np.concatenate([users[KRS_IDS["users"]], items[KRS_IDS["items"]]], 1) @ kernel
        + bias
    )
    d_prediction = 2.0 * (prediction - KRS_Y) / len(KRS_Y)  # mse, mean of 8
    rows = {}
    for row, d in zip(KRS_IDS["users"], d_prediction[:, 0]):
        rows[int(row)] = rows.get(int(row), 0) + d * kernel[:4, 0]
    expected, _ = jte_oracle.step(
        spec, users, jte_oracle.initial_slots(spec, users.shape), rows, 0
    )
    model.fit(KRS_IDS, KRS_Y, batch_size=8, epochs=1, verbose=0)
    # The gradients are summed in float64 here, in float32 there.
    np.testing.assert_allclose(_table(model, "users"), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(_table(model, "users")[10:], users[10:])


def _lazy_adam_users(keras_rs):
    """A keras-rs feature `users` of 3 ids per example, its table (20 x 4,
    `sum`) trained by lazy Adam, which moves a row with a zero gradient."""
    table = keras_rs.layers.TableConfig(
        name="users",
        vocabulary_size=20,
        embedding_dim=4,
        optimizer=teo.optimizers.Adam(0.05, lazy=True),
        placement="default_device",
        combiner="sum",
        initializer=keras.initializers.RandomUniform(seed=1),
    )
    return keras_rs.layers.FeatureConfig(
        name="users", table=table, input_shape=(4, 3), output_shape=(4, 4)
    )


@pytest.mark.parametrize("jit_compile", [True, False])
def test_keras_rs_zero_weights_are_no_lookup(jit_compile):
    """keras-rs pads ragged inputs with id 0 and weight 0: such an entry
    steps no row, even with lazy Adam (which moves a row with a zero
    gradient)."""
    if jit_compile and BACKEND == "tensorflow":
        from conftest import xla_on_host

        if not xla_on_host():  # tensorflow-tpu without libtpu
            pytest.skip("this TensorFlow cannot JIT-compile on the host")
    keras_rs = _keras_rs()
    embedding = teo.layers.row_sparse_tables(
        keras_rs.layers.DistributedEmbedding({"users": _lazy_adam_users(keras_rs)})
    )
    ids = keras.Input((3,), batch_size=4, dtype="int32")
    weights = keras.Input((3,), batch_size=4)
    outputs = embedding({"users": ids}, {"users": weights})["users"]
    model = keras.Model([ids, weights], keras.layers.Dense(1)(outputs))
    model.compile(
        optimizer=keras.optimizers.SGD(0.1), loss="mse", jit_compile=jit_compile
    )
    layer = embedding._default_device_embedding_layers["users"]
    y = np.ones((4, 1), "float32")
    # Step 1 looks row 0 up (weight 1): it gets a momentum.
    x = np.array([[3, 5, 0], [5, 0, 2], [7, 3, 2], [9, 2, 0]], "int32")
    model.fit([x, np.ones((4, 3), "float32")], y, batch_size=4, verbose=0)
    before = _numpy(layer.embeddings).copy()
    momenta = _numpy(layer.slots["momenta"]).copy()
    assert (momenta[0] != 0).all()
    # Step 2: id 0 is padding only; a zero-gradient lazy Adam step would
    # move row 0 by its momentum.
    x = np.array([[3, 5, 0], [5, 0, 0], [7, 3, 0], [9, 0, 0]], "int32")
    model.fit([x, (x != 0).astype("float32")], y, batch_size=4, verbose=0)
    after = _numpy(layer.embeddings)
    np.testing.assert_array_equal(after[0], before[0])
    np.testing.assert_array_equal(_numpy(layer.slots["momenta"])[0], momenta[0])
    assert (after[[3, 5, 7, 9]] != before[[3, 5, 7, 9]]).any(axis=1).all()


@pytest.mark.parametrize("stack", [False, True])
def test_keras_rs_per_example_weights_of_zero_are_no_lookup(stack):
    """keras-rs takes one weight per example for several ids each (weights
    of lower rank than the ids): an example of weight 0 adds nothing, as in
    keras-rs, and steps none of its rows, even with lazy Adam."""
    keras_rs = _keras_rs()

    def embedding(row_sparse):
        feature = _lazy_adam_users(keras_rs)
        layer = keras_rs.layers.DistributedEmbedding({"users": feature})
        return teo.layers.row_sparse_tables(layer, stack=stack) if row_sparse else layer

    ids = keras.Input((3,), batch_size=4, dtype="int32")
    weights = keras.Input((), batch_size=4)
    ours = embedding(True)
    outputs = ours({"users": ids}, {"users": weights})["users"]
    model = keras.Model([ids, weights], keras.layers.Dense(1)(outputs))
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    y = np.ones((4, 1), "float32")
    x = np.array([[3, 5, 1], [5, 1, 2], [7, 3, 2], [11, 12, 13]], "int32")
    model.fit([x, np.ones(4, "float32")], y, batch_size=4, verbose=0)
    tables = ours.get_embedding_tables
    before = keras.ops.convert_to_numpy(tables()["users"]).copy()
    per_example = np.array([1.0, 0.5, 2.0, 0.0], "float32")
    theirs = embedding(False)
    theirs({"users": x}, {"users": per_example})
    theirs._default_device_embedding_layers["users"].embeddings.assign(before)
    # The same rows, weighed and summed in keras-rs's operations and order.
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(ours({"users": x}, {"users": per_example})["users"]),
        keras.ops.convert_to_numpy(
            theirs({"users": x}, {"users": per_example})["users"]
        ),
    )
    model.fit([x, per_example], y, batch_size=4, verbose=0)
    after = keras.ops.convert_to_numpy(tables()["users"])
    np.testing.assert_array_equal(after[[11, 12, 13]], before[[11, 12, 13]])
    assert (after[[1, 2, 3, 5, 7]] != before[[1, 2, 3, 5, 7]]).any(axis=1).all()


def test_row_sparse_tables_refusals():
    keras_rs = _keras_rs()
    with pytest.raises(TypeError, match="DistributedEmbedding"):
        teo.layers.row_sparse_tables(keras.layers.Embedding(3, 2))
    with pytest.raises(ValueError, match="Table 'users'.*lazy=True.*jax-tpu-embedding"):
        _keras_rs_model(keras.optimizers.Adam(0.01), row_sparse=True)
    with pytest.raises(ValueError, match="row_sparse_tables: argument `engine`"):
        _keras_rs_model("adagrad", row_sparse=True, engine="TPUEmbedding")
    _, embedding = _keras_rs_model("adagrad", row_sparse=False)
    with pytest.raises(ValueError, match="built already"):
        teo.layers.row_sparse_tables(embedding)
    # A refused table changes nothing.
    table = keras_rs.layers.TableConfig(
        name="t", vocabulary_size=5, embedding_dim=2, placement="default_device"
    )
    feature = keras_rs.layers.FeatureConfig(
        name="f", table=table, input_shape=(2,), output_shape=(2, 2)
    )
    # A keras-rs that keeps its default-device tables elsewhere: said so.
    unknown = "keeps its default-device tables in a way this package does not know"
    for name in (
        "_placement_to_path_to_feature_config",
        "_default_device_embedding_layers",
    ):
        embedding = keras_rs.layers.DistributedEmbedding({"f": feature})
        delattr(embedding, name)
        with pytest.raises(TypeError, match=unknown):
            teo.layers.row_sparse_tables(embedding)
    embedding = keras_rs.layers.DistributedEmbedding({"f": feature})
    layers = dict(embedding._default_device_embedding_layers)
    with pytest.raises(ValueError, match="Table 't'"):
        teo.layers.row_sparse_tables(embedding)  # keras-rs's default: Adam
    assert dict(embedding._default_device_embedding_layers) == layers
    assert type(embedding) is keras_rs.layers.DistributedEmbedding
    if not all(importlib.util.find_spec(m) for m in ("jax", "jax_tpu_embedding")):
        # keras-rs with TensorFlow alone (no `[jax]` extra): said by name.
        with pytest.raises(ValueError, match=r"needs keras-rs's JAX conversion"):
            teo.layers.row_sparse_tables(embedding, engine="jax-tpu-embedding")
        return
    teo.layers.row_sparse_tables(embedding, engine="jax-tpu-embedding")
    with pytest.raises(
        ValueError, match="has row-sparse tables already .*; call it once"
    ):
        teo.layers.row_sparse_tables(embedding)


def _tables_model(
    optimizers,
    rows,
    widths,
    *,
    stack,
    combiner="mean",
    weighted=False,
    oracle=False,
    head=True,
):
    """keras-rs tables `rows` ({name: rows}) with `optimizers` ({name: Keras
    optimizer}), read by the features `widths` ({feature: ids per example,
    `None` for one id per example as a 1-D input}; feature `t_2` reads table
    `t`); a batch of 8, a head of ones.
    `oracle`: keras-rs's own layer, each table trained by its optimizer
    through Keras's `MultiOptimizer`.
    `head=False`: the features' outputs, joined, are the model's output (4
    per feature): no sum across features, whose order the compiler chooses
    (XLA at jax 0.9.1 orders the head's sum of a stacked and an unstacked
    model apart), so each row's gradient is exact by construction."""
    keras_rs = _keras_rs()
    tables = {
        name: keras_rs.layers.TableConfig(
            name=name,
            vocabulary_size=count,
            embedding_dim=4,
            optimizer=optimizers[name],
            placement="default_device",
            combiner=combiner,
            initializer=keras.initializers.RandomUniform(seed=count),
        )
        for name, count in rows.items()
    }
    features = {
        name: keras_rs.layers.FeatureConfig(
            name=name,
            table=tables[name.split("_")[0]],
            input_shape=(8,) if width is None else (8, width),
            output_shape=(8, 4),
        )
        for name, width in widths.items()
    }
    embedding = keras_rs.layers.DistributedEmbedding(features)
    if not oracle:
        embedding = teo.layers.row_sparse_tables(embedding, stack=stack)
    shapes = {name: () if w is None else (w,) for name, w in widths.items()}
    ids = {
        name: keras.Input(shape, batch_size=8, dtype="int32", name=name)
        for name, shape in shapes.items()
    }
    weights = {
        name: keras.Input(shape, batch_size=8, name=f"{name}_weights")
        for name, shape in shapes.items()
    }
    looked = embedding(ids, weights if weighted else None)
    joined = keras.layers.Concatenate()([looked[name] for name in widths])
    if head:
        joined = keras.layers.Dense(1, kernel_initializer=keras.initializers.Ones())(
            joined
        )
    model = keras.Model([ids, weights] if weighted else ids, joined)
    optimizer = keras.optimizers.SGD(0.1)
    if oracle:
        optimizer = keras.optimizers.MultiOptimizer(
            keras.optimizers.OptimizerMap(
                optimizer,
                {f".*/{n}/embeddings": optimizers[n] for n in tables},
            )
        )
    model.compile(optimizer=optimizer, loss="mse")
    return model, embedding


def _shared_table_model(stack, combiner, oracle=False):
    """Tables `users`, `items` and `ads`, `items` read by two features of
    different widths; Adagrad for each, `users` with another learning rate
    (a stack of its own)."""
    rates = {"users": 0.2, "items": 0.1, "ads": 0.1}
    optimizers = {name: keras.optimizers.Adagrad(rate) for name, rate in rates.items()}
    widths = {"users": 3, "items": 3, "items_2": 2, "ads": 3}
    return _tables_model(
        optimizers, SHARED_ROWS, widths, stack=stack, combiner=combiner, oracle=oracle
    )


SHARED_ROWS = {"users": 40, "items": 50, "ads": 45}
_SHARED_RNG = np.random.default_rng(11)
# With duplicates, within and across examples.
SHARED_IDS = {
    name: _SHARED_RNG.integers(0, 20, (8, width)).astype("int32")
    for name, width in (("users", 3), ("items", 3), ("items_2", 2), ("ads", 3))
}
# Each id once per table, across its features: on TensorFlow Keras's
# Adagrad steps each duplicate of an `IndexedSlices` apart.
_ORDERS = {name: _SHARED_RNG.permutation(rows) for name, rows in SHARED_ROWS.items()}
DISTINCT_IDS = {
    "users": _ORDERS["users"][:24].reshape(8, 3),
    "items": _ORDERS["items"][:24].reshape(8, 3),
    "items_2": _ORDERS["items"][24:40].reshape(8, 2),
    "ads": _ORDERS["ads"][:24].reshape(8, 3),
}
# Some entries weightless (no lookup), some weighted 2.
SHARED_WEIGHTS = {
    name: _SHARED_RNG.choice([0.0, 1.0, 2.0], ids.shape).astype("float32")
    for name, ids in SHARED_IDS.items()
}
SHARED_Y = _SHARED_RNG.normal(size=(8, 1)).astype("float32")
# Targets of three features' outputs joined (`_tables_model(head=False)`).
JOINED_Y = np.random.default_rng(12).normal(size=(8, 12)).astype("float32")


def _tables_of(embedding):
    tables = embedding.get_embedding_tables().items()
    return {k: keras.ops.convert_to_numpy(v) for k, v in tables}


def test_keras_rs_stacked_tables_equal_keras_rs_with_its_own_optimizers():
    """Oracle: keras-rs's own layer trained by Keras's `MultiOptimizer`
    (stock Adagrad, whose step leaves rows without gradient as they are).
    `items` is read by two features: the stack looks all its ids up in one
    call, so each row steps once. The head's gradient reaches the tables
    through sums whose order differs, hence the bound of the test above."""
    oracle, want = _shared_table_model(False, "mean", oracle=True)
    model, embedding = _shared_table_model(True, "mean")
    before = _tables_of(want)
    for each in (oracle, model):
        each.fit(
            DISTINCT_IDS, SHARED_Y, batch_size=8, epochs=2, shuffle=False, verbose=0
        )
    got, expected = _tables_of(embedding), _tables_of(want)
    for name in ("users", "items", "ads"):
        bound = 16 * np.finfo(np.float32).eps * (np.abs(before[name]) + 1)
        assert (np.abs(got[name] - expected[name]) <= bound).all(), name
        assert not np.array_equal(got[name], before[name]), name
    # (keras-rs orders the features by name.)
    assert embedding.default_device_stacks.stacks == (("ads", "items"), ("users",))


# Each combiner, and the path without weights (keras-rs's ones); ids of one
# per example (1-D, `width` None), where `sum` scales each row by its weight
# and `mean` and `sqrtn` give the row whatever its weight.
@pytest.mark.parametrize(
    "combiner, weighted, width",
    [
        ("mean", False, 3),
        ("sum", True, 3),
        ("sqrtn", True, 3),
        ("sum", True, None),
        ("mean", True, None),
        ("sqrtn", True, None),
    ],
)
def test_keras_rs_stacked_tables_step_as_the_separate_ones(combiner, weighted, width):
    """The stacked form equals the per-table form (keras-rs's `EmbedReduce`
    for the combiner) to the last bit, weights and every combiner included,
    for tables each read by one feature."""
    first = slice(None) if width else 0
    x = {k: v[:, first] for k, v in SHARED_IDS.items() if k != "items_2"}
    w = {k: v[:, first] for k, v in SHARED_WEIGHTS.items() if k != "items_2"}
    assert {0.0, 2.0} <= set(np.concatenate([v.reshape(-1) for v in w.values()]))
    results = []
    for stack in (False, True):
        model, embedding = _one_feature_per_table_model(
            stack, combiner, weighted, width, head=False
        )
        before = _tables_of(embedding)
        with exact_tensorflow():
            model.fit(
                [x, w] if weighted else x,
                JOINED_Y,
                batch_size=8,
                epochs=2,
                shuffle=False,
                verbose=0,
            )
        results.append(
            (_tables_of(embedding), model.predict([x, w] if weighted else x, verbose=0))
        )
    (separate, separate_out), (stacked, stacked_out) = results
    for name in separate:
        np.testing.assert_array_equal(stacked[name], separate[name], err_msg=name)
        assert not np.array_equal(stacked[name], before[name]), name
    np.testing.assert_array_equal(stacked_out, separate_out)
    if weighted:
        # An entry of weight 0 is no lookup where the weight counts; keras-rs
        # takes none for `mean` and `sqrtn` of one id per example.
        weighs = width is not None or combiner == "sum"
        looked_up = x["users"][w["users"] != 0] if weighs else x["users"]
        slots = embedding.default_device_stacks.get_table("users")
        never = np.setdiff1d(np.arange(20), looked_up)
        assert 0 < never.size < 20
        np.testing.assert_array_equal(slots["momenta"][never], 0.0)
        assert (slots["momenta"][np.unique(looked_up)] != 0).any(axis=1).all()


@pytest.mark.parametrize("stack", [False, True])
@pytest.mark.parametrize("combiner", ["mean", "sqrtn", "sum"])
def test_keras_rs_tables_of_one_id_per_example_weigh_as_keras_rs(combiner, stack):
    """Oracle: keras-rs's own layer, each table stepped by Keras's `Adagrad`
    through `MultiOptimizer`. With one id per example `mean` and `sqrtn` give
    an example its row whatever its weight, 0 included (keras-rs takes no
    weights there), and the row steps; `sum` scales the row by its weight,
    and an entry of weight 0 reads zeros and steps no row. Ids distinct, so
    Keras's dense step of the whole table is the row-sparse one."""
    x = {k: v[:, 0] for k, v in DISTINCT_IDS.items() if k != "items_2"}
    w = {k: v[:, 0] for k, v in SHARED_WEIGHTS.items() if k != "items_2"}
    weightless = w["users"] == 0
    assert 0 < weightless.sum() < 8
    results = []
    for oracle in (True, False):
        optimizers = {
            name: keras.optimizers.Adagrad(0.1) for name in ("users", "items", "ads")
        }
        model, embedding = _tables_model(
            optimizers,
            SHARED_ROWS,
            dict.fromkeys(optimizers, None),
            stack=stack and not oracle,
            combiner=combiner,
            weighted=True,
            oracle=oracle,
            head=False,
        )
        before = _tables_of(embedding)
        looked = keras.ops.convert_to_numpy(model.predict([x, w], verbose=0))
        with exact_tensorflow():
            model.fit([x, w], JOINED_Y, batch_size=8, shuffle=False, verbose=0)
        results.append((before, looked, _tables_of(embedding)))
    (start, want, expected), (before, got, stepped) = results
    for name in start:
        np.testing.assert_array_equal(before[name], start[name], err_msg=name)
    np.testing.assert_array_equal(got, want)
    users = got[:, :4]
    if combiner == "sum":
        np.testing.assert_array_equal(users[weightless], 0.0)
    else:
        np.testing.assert_array_equal(users, before["users"][x["users"]])
    for name in expected:
        bound = 4 * np.finfo(np.float32).eps * (np.abs(expected[name]) + 1)
        assert (np.abs(stepped[name] - expected[name]) <= bound).all(), name
    moved = (stepped["users"] != before["users"]).any(axis=1)
    np.testing.assert_array_equal(
        moved[x["users"]], ~weightless if combiner == "sum" else True
    )


def _one_feature_per_table_model(stack, combiner, weighted, width=3, head=True):
    optimizers = {
        "users": teo.optimizers.Adam(0.05, lazy=True),
        "items": keras.optimizers.Adagrad(0.1),
        "ads": keras.optimizers.Adagrad(0.1),
    }
    rows = {"users": 20, "items": 30, "ads": 25}
    widths = dict.fromkeys(rows, width)
    return _tables_model(
        optimizers,
        rows,
        widths,
        stack=stack,
        combiner=combiner,
        weighted=weighted,
        head=head,
    )


@pytest.mark.parametrize("stack", [False, True])
def test_keras_rs_tables_refuse_sparse_ids_by_feature(stack):
    """The row-sparse lookup takes dense ids: a sparse batch (TensorFlow's
    `SparseTensor`, JAX's `BCOO`) is refused, naming the table or feature
    and the way on that backend (TensorFlow's sparse lookup, or dense ids
    with weights, an entry of weight 0 being no lookup)."""
    model, embedding = _one_feature_per_table_model(stack, "sum", False)
    ids = np.array([[1, 0, 2]] * 8, "int32")
    x = {name: ids for name in ("users", "items", "ads")}
    model.predict(x, verbose=0)
    if BACKEND == "jax":
        from jax.experimental import sparse

        x["users"] = sparse.BCOO.fromdense(ids)
        instead = "dense, with weights: an entry whose weight is 0 is no lookup"
    else:
        import tensorflow as tf

        x["users"] = tf.sparse.from_dense(ids)
        instead = "row-sparse already: train it with tf_tpu_embed_opt.keras_optimizer"
    owner = "feature 'users'" if stack else "EmbedReduce 'users'"
    kind = type(x["users"]).__name__
    takes = "dense ids" if BACKEND == "jax" else "dense or ragged ids"
    refusal = f"{owner}.*takes {takes}; received {kind}.*{instead}"
    with pytest.raises(TypeError, match=refusal):
        embedding(x)


def test_keras_rs_stacked_tables_are_read_and_written_by_name():
    model, embedding = _shared_table_model(True, "sum")
    stacks = embedding.default_device_stacks
    tables = embedding.get_embedding_tables()
    assert sorted(tables) == ["ads", "items", "users"]
    for name, value in tables.items():
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(value), stacks.get_table(name)["embeddings"]
        )
    # No weights of keras-rs's own layers are left behind: the stacks'
    # tables and slots, and each stack's optimizer's step and rate.
    paths = [w.path for w in embedding.weights]
    assert not [
        p for p in paths if p.endswith(("/users/embeddings", "/items/embeddings"))
    ]
    assert sum(p.endswith("/embeddings") for p in paths) == 2
    new = np.full((SHARED_ROWS["items"], 4), 0.5, "float32")
    if hasattr(embedding, "set_embedding_tables"):  # keras-rs's JAX layer
        embedding.set_embedding_tables({"items": new})
    else:
        stacks.set_table("items", {"embeddings": new})
    np.testing.assert_array_equal(stacks.get_table("items")["embeddings"], new)
    # The checkpoint functions find each table by name in the model.
    from tf_tpu_embed_opt.checkpoints.keras.tables import _targets

    targets = _targets(model, ["items", "users"])
    np.testing.assert_array_equal(targets["items"].numpy(), new)


def test_a_table_read_twice_in_a_step_is_refused():
    """A layer called twice in one training step would step its table once
    per call, each from the same rows: refused, on the first step (its
    trace), naming the layer; inference may call it twice."""
    table = teo.layers.Embedding(ROWS, DIM, optimizer=keras.optimizers.Adagrad(0.1))
    first = keras.Input((2,), dtype="int32")
    second = keras.Input((3,), dtype="int32")
    pooled = [keras.ops.sum(table(x), axis=1) for x in (first, second)]
    model = keras.Model([first, second], keras.layers.Concatenate()(pooled))
    model.compile(optimizer="sgd", loss="mse")
    x = [np.zeros((4, 2), "int32"), np.ones((4, 3), "int32")]
    assert model.predict(x, verbose=0).shape == (4, 2 * DIM)
    # Once per forward pass it may be called in training, too.
    table(x[0], training=True)
    table(x[1], training=True)
    before = _numpy(table.embeddings).copy()
    with pytest.raises(ValueError, match="called a second time in one training step"):
        model.fit(x, np.zeros((4, 2 * DIM), "float32"), verbose=0)
    if BACKEND == "tensorflow":
        # (Keras's JAX trainer, stopped while it traces the step, leaves
        # the model's variables without their values.)
        np.testing.assert_array_equal(_numpy(table.embeddings), before)


def test_a_table_in_time_distributed_is_refused_naming_the_call_on_every_step():
    """`keras.layers.TimeDistributed` calls its layer once per time step: the
    refusal of a second call says so, and what to do instead, the layer
    called on the ids of every step, reads what `TimeDistributed` around
    Keras's `Embedding` reads."""
    ids = keras.Input((5, 3), dtype="int32")
    table = teo.layers.Embedding(ROWS, DIM, optimizer=keras.optimizers.Adagrad(0.1))
    distributed = keras.Model(ids, keras.layers.TimeDistributed(table)(ids))
    distributed.compile(optimizer="sgd", loss="mse")
    x = np.arange(4 * 5 * 3).reshape(4, 5, 3).astype("int32") % ROWS
    y = np.zeros((4, 5, 3, DIM), "float32")
    reference = keras.layers.Embedding(ROWS, DIM)
    reference.build()
    reference.embeddings.assign(_numpy(table.embeddings))
    stepped = keras.Model(ids, keras.layers.TimeDistributed(reference)(ids))
    looked_up = keras.ops.convert_to_numpy(table(x))
    np.testing.assert_array_equal(looked_up, stepped.predict(x, verbose=0))
    with pytest.raises(ValueError, match=r"TimeDistributed .* once per time step"):
        distributed.fit(x, y, verbose=0)


class _Tower(keras.layers.Layer):
    """A layer that calls a table layer, with no `build` of its own: Keras
    builds it by tracing its call (shape inference, before any variable of
    the table exists)."""

    def __init__(self, tables, **kwargs):
        super().__init__(**kwargs)
        self.tables = tables

    def call(self, ids, training=None):
        rows = self.tables(ids, training=training)
        return rows[0] if isinstance(rows, list) else rows


@pytest.mark.parametrize("kind", ["embedding", "stacked"])
def test_a_layer_that_calls_a_table_builds_without_a_warning_and_trains(kind):
    """On TensorFlow the lookup read the table's variable before Keras had
    made it, and Keras warned that the layer "looks like it has unbuilt
    state" and could not be traced (its call "may be crashing")."""
    table = teo.layers.Embedding(ROWS, DIM, optimizer=keras.optimizers.Adagrad(0.1))
    tables = table if kind == "embedding" else teo.layers.StackedEmbedding([table])
    ids = keras.Input((3,), dtype="int32")
    x = (np.arange(4 * 3).reshape(4, 3) % ROWS).astype("int32")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*unbuilt state")
        rows = _Tower(tables)(ids if kind == "embedding" else [ids])
        flat = keras.layers.Flatten()(rows)
        model = keras.Model(ids, keras.layers.Dense(1)(flat))
        model.compile(optimizer="sgd", loss="mse")
        model.fit(x, np.ones((4, 1), "float32"), verbose=0)
    steps = [
        int(keras.ops.convert_to_numpy(layer.table_step))
        for layer in model._flatten_layers()
        if isinstance(layer, teo.layers.Embedding) and layer.built
    ]
    assert steps == [1]


# What a model does with a read of its table (or a slot) besides the lookup,
# each shaped as the rows (batch, 3, DIM).
_TABLE_READS = {
    "scores against every row": lambda layer, rows: keras.ops.matmul(
        keras.ops.matmul(rows, keras.ops.transpose(layer.embeddings)),
        layer.embeddings,
    ),
    "a penalty on the table": lambda layer, rows: (
        rows + 0.01 * keras.ops.sum(keras.ops.square(layer.embeddings))
    ),
    "a penalty on a slot": lambda layer, rows: (
        rows + keras.ops.sum(layer.slots["accumulators"])
    ),
    "scores against every row, under stop_gradient": lambda layer, rows: (
        keras.ops.matmul(
            keras.ops.matmul(
                rows, keras.ops.transpose(keras.ops.stop_gradient(layer.embeddings))
            ),
            keras.ops.stop_gradient(layer.embeddings),
        )
    ),
}


class _ReadsItsTable(keras.Model):
    """Looks ids up in `table` (`ROWS` x `DIM`, from `W0`) and reads the
    table or a slot itself (`_TABLE_READS[read]`)."""

    def __init__(self, read, table):
        super().__init__(name="reads_its_table")
        self.read = read
        self.table = table

    def call(self, ids, training=None):
        return _TABLE_READS[self.read](self.table, self.table(ids, training=training))


def _adagrad():
    return teo.optimizers.Adagrad(0.2, epsilon=0.0)


def _reads_its_table(read):
    table = teo.layers.Embedding(
        ROWS,
        DIM,
        optimizer=_adagrad(),
        embeddings_initializer=keras.initializers.Constant(W0),
        name="table",
    )
    model = _ReadsItsTable(read, table)
    model(np.zeros((2, 3), "int32"))
    return model, table


_REFUSED_READS = [read for read in _TABLE_READS if "stop_gradient" not in read]


@pytest.mark.parametrize("read", _REFUSED_READS)
def test_a_gradient_through_a_read_of_the_table_is_refused_in_fit(read):
    """The table's gradient is its stepped rows, which Keras writes as they
    are: a gradient through another read of the table or a slot (weight
    tying, a penalty) was added to them, and the sum written over the table
    (on TensorFlow the rows never looked up became the read's gradient, on
    JAX they moved by it), without a word. Refused when the step is traced,
    naming the layer and the variable."""
    model, table = _reads_its_table(read)
    model.compile(optimizer="sgd", loss="mse")
    variable = "accumulator" if "slot" in read else "embeddings"
    before = {
        v.path: _numpy(v).copy() for v in (table.embeddings, *table.slots.values())
    }
    x = np.asarray(STEP_IDS[0], "int32")
    with pytest.raises(
        ValueError,
        match=rf"Embedding: table 'table': \S*table/{variable} \(a row-sparse table or "
        r"one of its optimizer's slots\) was read outside the layer's lookup, "
        r"and the loss's gradient reaches it through that read",
    ):
        model.fit(x, np.zeros((2, 3, DIM), "float32"), verbose=0)
    if BACKEND == "tensorflow":
        # (Keras's JAX trainer, stopped while it traces the step, leaves
        # the model's variables without their values.)
        for v in (table.embeddings, *table.slots.values()):
            np.testing.assert_array_equal(_numpy(v), before[v.path])
        assert _step_of(table) == 0
        assert int(model.optimizer.iterations) == 0


@pytest.mark.parametrize("read", _REFUSED_READS)
def test_a_gradient_through_a_read_of_the_table_is_refused_in_a_custom_loop(read):
    """As in `fit`: a `GradientTape` (TensorFlow) or `jax.grad` of
    `stateless_call` (JAX) refuses it, and nothing is written."""
    model, table = _reads_its_table(read)
    before = _numpy(table.embeddings).copy()
    with pytest.raises(ValueError, match="was read outside the layer's lookup"):
        _custom_loop(model, keras.optimizers.SGD(0.1), [(STEP_IDS[0], STEP_GRADS[0])])
    np.testing.assert_array_equal(_numpy(table.embeddings), before)
    assert _step_of(table) == 0


def test_a_read_of_the_table_under_stop_gradient_trains_as_keras_embedding():
    """A read the loss takes no gradient through (`stop_gradient`) is taken.
    The oracle: Keras's `Embedding` with the same read, trained by the twin
    as the model's optimizer, to the last bit; the rows never looked up do
    not move."""
    read = "scores against every row, under stop_gradient"
    steps = list(zip(STEP_IDS, STEP_GRADS))
    model, table = _reads_its_table(read)
    _custom_loop(model, keras.optimizers.SGD(0.1), steps)
    stock = keras.layers.Embedding(
        ROWS, DIM, embeddings_initializer=keras.initializers.Constant(W0)
    )
    oracle = _ReadsItsTable(read, stock)
    oracle(np.zeros((2, 3), "int32"))
    _custom_loop(oracle, _adagrad(), steps)
    trained = _numpy(table.embeddings)
    np.testing.assert_array_equal(trained, _numpy(stock.embeddings))
    np.testing.assert_array_equal(trained[UNTOUCHED], W0[UNTOUCHED])
    assert not np.array_equal(trained, W0)


def test_row_sparse_tables_refuses_a_shared_table_unless_stacked():
    keras_rs = _keras_rs()
    table = keras_rs.layers.TableConfig(
        name="items",
        vocabulary_size=9,
        embedding_dim=2,
        optimizer="adagrad",
        placement="default_device",
    )
    features = {
        name: keras_rs.layers.FeatureConfig(
            name=name, table=table, input_shape=(4,), output_shape=(4, 2)
        )
        for name in ("clicked", "viewed")
    }
    embedding = keras_rs.layers.DistributedEmbedding(features)
    layers = dict(embedding._default_device_embedding_layers)
    with pytest.raises(
        ValueError,
        match=r"'items' is read by the features \['clicked', 'viewed'\].*stack=True",
    ):
        teo.layers.row_sparse_tables(embedding)
    assert dict(embedding._default_device_embedding_layers) == layers
    with pytest.raises(
        TypeError, match="argument `stack` must be True or False; received 'yes'"
    ):
        teo.layers.row_sparse_tables(embedding, stack="yes")
    teo.layers.row_sparse_tables(embedding, stack=True)
    assert embedding.default_device_stacks.stacks == (("items",),)
    ids = {name: np.arange(4, dtype="int32") for name in features}
    weights = {name: np.ones((4,), "float32") for name in features}
    assert embedding(ids, weights)["viewed"].shape == (4, 2)
    weights["viewed"] = np.ones((3,), "float32")
    with pytest.raises(ValueError, match=r"feature 'viewed'.*`weights`, \(3,\)"):
        embedding(ids, weights)


def test_summary_counts_the_slots_as_the_guide_says():
    """The guide's Limits: Keras counts each slot as trainable parameters
    beside the table, and the table's step counter (two numbers) too, and the
    table optimizer's learning rate as a non-trainable one."""
    for optimizer, slots in ((teo.optimizers.Adagrad(0.1), 1), ("sgd", 0)):
        table = teo.layers.Embedding(ROWS, DIM, optimizer=optimizer)
        inputs = keras.Input((2,), dtype="int32")
        model = keras.Model(inputs, table(inputs))
        trainable = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
        assert trainable == ROWS * DIM * (1 + slots) + 2
        assert len(table.slots) == slots
        assert len(model.non_trainable_weights) == 1  # its learning rate


def _step_of(layer):
    return int(keras.ops.convert_to_numpy(layer.optimizer.iterations))


def test_the_step_counter_counts_past_what_float32_holds():
    """The step counter is a float32 pair: it counts on past 2**24, where one
    float32 stops (2**24 + 1 rounds to 2**24), as the backward pass steps it."""
    model, layer = _model(teo.optimizers.Adam(0.05, lazy=True))
    layer.set_table_step(2**24 - 1)
    _custom_loop(model, keras.optimizers.SGD(1.0), zip(STEP_IDS[:2], STEP_GRADS[:2]))
    assert _step_of(layer) == int(keras.ops.convert_to_numpy(layer.table_step))
    assert _step_of(layer) == 2**24 + 1
    with pytest.raises(
        ValueError, match=r"step must be an integer in \[0, 2\*\*48\); received -1"
    ):
        layer.set_table_step(-1)
    for bad in (1.5, True, "3"):
        with pytest.raises(TypeError, match=f"received {bad!r} of type"):
            layer.set_table_step(bad)
    # Above what the backend's counter holds (int32 on JAX without x64), a
    # step is refused: it read back wrapped around (2**40 as 0).
    dtype = keras.backend.standardize_dtype(layer.optimizer.iterations.dtype)
    largest = int(np.iinfo(dtype).max)
    # (int64 on TensorFlow: the pair's own 2**48 comes first.)
    bound = min(largest, 2**48 - 1)
    match = rf"at most {largest} here" if largest == bound else r"\[0, 2\*\*48\)"
    with pytest.raises(ValueError, match=match):
        layer.set_table_step(bound + 1)
    assert _step_of(layer) == 2**24 + 1
    layer.set_table_step(bound)
    assert _step_of(layer) == bound


def test_a_checkpoint_step_the_counters_cannot_hold_is_refused_before_loading(
    tmp_path,
):
    """`load_into_keras` of a step above what Keras's step counters hold here
    (int32 on JAX without x64) is refused before a table changes: it loaded
    the tables, then failed on Keras's `OverflowError` (or read back the
    row-sparse layer's step wrapped around). Where they hold it (int64 on
    TensorFlow), it loads."""
    pytest.importorskip("orbax.checkpoint")
    from tf_tpu_embed_opt.checkpoints import write_checkpoint
    from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import specs

    state = {
        "parameters": np.full((16, DIM), 0.25, "float32"),
        "accumulators": np.full((16, DIM), 0.5, "float32"),
    }
    step = write_checkpoint(
        tmp_path,
        {"users": state},
        format="jax-tpu-embedding",
        step=2**40,
        embedding_spec=specs.embedding_spec_for(
            {"users": (16, DIM)}, num_devices=1, sparsecores_per_device=2
        ),
        algorithms={"users": "Adagrad"},
    )
    layer = teo.layers.Embedding(
        16, DIM, optimizer=teo.optimizers.Adagrad(0.1), name="users"
    )
    layer.build()
    before = keras.ops.convert_to_numpy(layer.embeddings)
    dtype = keras.backend.standardize_dtype(layer.optimizer.iterations.dtype)
    if np.iinfo(dtype).max < 2**40:
        with pytest.raises(ValueError, match=rf"{2**40} is more than .*\({dtype}"):
            teo.load_into_keras(step, {"users": layer}, None)
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(layer.embeddings), before
        )
        assert _step_of(layer) == 0
    else:
        teo.load_into_keras(step, {"users": layer}, None)
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(layer.embeddings), state["parameters"]
        )
        assert _step_of(layer) == 2**40


def test_the_largest_step_a_counter_holds_is_taken_and_one_more_refused():
    """The bound of the refusal above is the counter's own largest value:
    that step is taken, the next refused (on either backend's dtype)."""
    from tf_tpu_embed_opt.checkpoints.keras import tables as keras_tables

    layer = teo.layers.Embedding(
        16, DIM, optimizer=teo.optimizers.Adagrad(0.1), name="users"
    )
    layer.build()
    tables = keras_tables.keras_tables({"users": layer}, None)
    dtype = keras.backend.standardize_dtype(layer.optimizer.iterations.dtype)
    largest = int(np.iinfo(dtype).max)
    keras_tables.check_step(None, tables, largest)
    with pytest.raises(
        ValueError,
        match=rf"^The step {largest + 1} is more than Keras's step counter "
        rf"holds here \({dtype}: at most {largest}\); nothing was loaded\.$",
    ):
        keras_tables.check_step(None, tables, largest + 1)


def test_a_file_with_the_integer_step_counter_loads():
    """`.keras` files and weights of version 0.1.0 hold the table optimizer's
    integer step counter where the pair is now: it loads as that step."""
    layer = teo.layers.Embedding(ROWS, DIM, optimizer=teo.optimizers.Adagrad(0.1))
    layer.build()
    accumulator = np.full((ROWS, DIM), 0.5, "float32")
    layer.load_own_variables(
        {"0": W0, "1": accumulator, "2": np.int64(2**24 + 5), "3": np.float32(0.2)}
    )
    assert _step_of(layer) == 2**24 + 5
    np.testing.assert_array_equal(_numpy(layer.embeddings), W0)
    np.testing.assert_array_equal(_numpy(layer.slots["accumulators"]), accumulator)


def test_a_layer_that_calls_the_table_builds_and_trains():
    # Keras infers the shape of a layer without `compute_output_shape` by
    # tracing its call; on JAX with symbolic sizes, as an export traces (which
    # refuses the id check), but lowering nothing: the check stays.
    class Pooled(keras.layers.Layer):
        def __init__(self):
            super().__init__()
            self.table = teo.layers.Embedding(
                ROWS, DIM, optimizer=teo.optimizers.SGD(0.5)
            )

        def call(self, ids):
            return keras.ops.sum(self.table(ids), axis=1)

    inputs = keras.Input((3,), dtype="int32")
    pooled = Pooled()
    model = keras.Model(inputs, keras.layers.Dense(1)(pooled(inputs)))
    model.compile(optimizer="sgd", loss="mse")
    model.fit(np.array(STEP_IDS[0], "int32"), np.ones((2, 1)), verbose=0)
    assert int(keras.ops.convert_to_numpy(pooled.table.table_step)) == 1
    with pytest.raises(Exception, match="id 12 is outside the table"):
        model.predict(np.array([[1, 2, ROWS]], "int32"), verbose=0)


@pytest.mark.parametrize("algorithm", ["Adagrad", "LaProp"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_table_of_a_16_bit_dtype_fits_and_unscales_exactly(dtype, algorithm):
    # The loss-scale probe is a loss Keras sums with the model's (float32):
    # a float16 probe failed `fit` on TensorFlow. A LossScaleOptimizer's
    # scale, a power of two, divides out exactly: the same table as without.
    # LaProp's √(1 − β₁²), a float32 tensor, failed every 16-bit step on
    # TensorFlow.
    def trained(model_optimizer):
        keras.utils.set_random_seed(1)
        ids = keras.Input((3,), dtype="int32")
        table_optimizer = getattr(teo.optimizers, algorithm)(0.1)
        layer = teo.layers.Embedding(ROWS, DIM, optimizer=table_optimizer, dtype=dtype)
        pooled = keras.layers.GlobalAveragePooling1D()(layer(ids))
        model = keras.Model(ids, keras.layers.Dense(1)(pooled))
        model.compile(optimizer=model_optimizer, loss="mse")
        before = _numpy(layer.embeddings).copy()
        model.fit(DATA_IDS, DATA_Y, batch_size=2, shuffle=False, verbose=0)
        return before, _numpy(layer.embeddings), layer

    before, table, layer = trained(keras.optimizers.SGD(0.01))
    assert keras.backend.standardize_dtype(table.dtype) == dtype
    looked_up = sorted(set(DATA_IDS.ravel()))
    assert (table[looked_up] != before[looked_up]).any(axis=1).all()
    never = sorted(set(range(ROWS)) - set(looked_up))
    np.testing.assert_array_equal(table[never], before[never])
    assert int(keras.ops.convert_to_numpy(layer.table_step)) == len(DATA_IDS) // 2
    scaled = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01))
    np.testing.assert_array_equal(trained(scaled)[1], table)


def test_a_decay_rate_a_16_bit_table_rounds_to_its_bound_is_refused():
    """bfloat16 holds Adam's default beta_2 = 0.999 as 1.0: its bias
    correction √(1 − β₂ᵗ) is then 0 and no row moves (Keras's own Adam on a
    bfloat16 variable, the oracle, moves none either). Training such a table
    is refused when the model's optimizer is built on it, before anything
    trains, naming the value; the model still predicts (on JAX too, whose
    trainer had not taken its arrays yet), and the table loads and serves. A
    beta_2 that bfloat16 holds, or a float16 table (0.999 is 0.99902 there),
    trains."""
    variable = keras.Variable(np.ones((2, 2)), dtype="bfloat16")
    keras.optimizers.Adam(0.1).apply_gradients([(keras.ops.ones((2, 2)), variable)])
    np.testing.assert_array_equal(_numpy(variable).astype(np.float32), 1.0)

    def model_of(optimizer, dtype):
        layer = teo.layers.Embedding(
            ROWS, DIM, optimizer=optimizer, dtype=dtype, name="items"
        )
        ids = keras.Input((3,), dtype="int32")
        model = keras.Model(ids, keras.layers.Flatten()(layer(ids)))
        model.compile(optimizer="sgd", loss="mse")
        return model, layer

    y = np.ones((len(DATA_IDS), 3 * DIM))
    for algorithm in ("Adam", "ProximalYogi"):
        optimizer = getattr(teo.optimizers, algorithm)(0.1, lazy=True)
        model, layer = model_of(optimizer, "bfloat16")
        before = _numpy(layer.embeddings).copy()
        with pytest.raises(ValueError) as refused:
            model.fit(DATA_IDS, y, verbose=0)
        assert str(refused.value) == (
            "Embedding: table 'items' is bfloat16, which holds beta_2=0.999 as "
            f"1.0; {algorithm} needs beta_2 in [0, 1), so the table would not "
            "step as configured. Give the table float32, or a beta_2 that "
            "bfloat16 holds (it loads and serves as it is)."
        )
        np.testing.assert_array_equal(_numpy(layer.embeddings), before)
        assert int(keras.ops.convert_to_numpy(layer.table_step)) == 0
        rows = model.predict(DATA_IDS[:1], verbose=0).reshape(3, DIM)
        np.testing.assert_array_equal(rows, before[DATA_IDS[0]].astype(np.float32))
    # Stacked, the stack is named by its tables.
    tables = [
        teo.layers.Embedding(
            ROWS,
            DIM,
            optimizer=teo.optimizers.Adam(0.1, lazy=True),
            name=name,
            dtype="bfloat16",
        )
        for name in ("users", "items")
    ]
    stacked = teo.layers.StackedEmbedding(tables, name="stacked")
    inputs = [keras.Input((3,), dtype="int32") for _ in tables]
    flat = [keras.layers.Flatten()(out) for out in stacked(inputs)]
    model = keras.Model(inputs, keras.layers.Concatenate()(flat))
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ValueError) as refused:
        model.fit([DATA_IDS, DATA_IDS], np.ones((len(DATA_IDS), 6 * DIM)), verbose=0)
    assert str(refused.value).startswith(
        "StackedEmbedding 'stacked': the stack of tables 'users', 'items' "
        "('stack_0') is bfloat16, which holds beta_2=0.999 as 1.0; Adam needs"
    )
    for dtype, beta_2 in (("bfloat16", 0.99), ("float16", 0.999)):
        optimizer = teo.optimizers.Adam(0.1, beta_2=beta_2, lazy=True)
        model, layer = model_of(optimizer, dtype)
        before = _numpy(layer.embeddings).copy()
        model.fit(DATA_IDS, y, verbose=0)
        looked_up = sorted(set(DATA_IDS.ravel()))
        moved = (_numpy(layer.embeddings) != before).any(axis=1)
        assert moved[looked_up].all(), (dtype, beta_2)


@pytest.mark.parametrize(
    "dtype, exact", [("float16", 2**11), ("bfloat16", 2**8), ("float32", 2**24)]
)
def test_float_ids_are_refused_past_the_integers_the_float_holds(dtype, exact):
    """A float holds every integer up to 2**p exactly (p: its significand's
    bits, as NumPy's `finfo` gives them) and no more: id 2**p + 1 rounds to
    2**p, a row of a larger table, without a word (it did, in
    `keras.layers.Embedding` too). Such ids are refused where the table
    has rows past 2**p, before anything trains; the bound itself is taken."""
    import ml_dtypes

    from tf_tpu_embed_opt.layers import ids as ids_module

    # The bound, against the dtype itself: 2**p is held, 2**p + 1 rounds.
    as_float = np.dtype(getattr(ml_dtypes, dtype, dtype))
    assert float(np.array(exact, as_float)) == exact
    assert float(np.array(exact - 1, as_float)) == exact - 1
    assert float(np.array(exact + 1, as_float)) == exact
    assert ids_module.integer_dtype(dtype, exact, False, "t", "int64") == "int32"
    with pytest.raises(ValueError, match="would read and step a neighbouring row"):
        ids_module.integer_dtype(dtype, exact + 1, False, "t", "int64")
    # keras-rs's absent id (`rows`) must be exact as well.
    with pytest.raises(ValueError, match=f"its ids come as {dtype}"):
        ids_module.integer_dtype(dtype, exact, True, "t", "int64")
    if dtype == "float32":
        return  # A 2**24-row table is left to the arithmetic above.
    for rows, refused in ((exact, False), (exact + 1, True)):
        ids = keras.Input((2,), dtype=dtype)
        table = teo.layers.Embedding(
            rows, 1, optimizer=teo.optimizers.SGD(1.0), name="items"
        )
        if refused:
            with pytest.raises(
                ValueError, match=f"Embedding `items`: its ids come as {dtype}"
            ) as error:
                table(ids)
            assert f"the table has {rows:,} rows" in str(error.value)
            assert 'keras.Input(..., dtype="int32")' in str(error.value)
            continue
        model = keras.Model(ids, keras.layers.Flatten()(table(ids)))
        model.compile(optimizer="sgd", loss="mse")
        before = _numpy(table.embeddings).copy()
        model.fit(np.array([[exact - 1, 0]], dtype), np.ones((1, 2)), verbose=0)
        moved = np.nonzero((_numpy(table.embeddings) != before).any(axis=1))[0]
        assert moved.tolist() == [0, exact - 1]
    # A stack refuses by the table's name.
    tables = [
        teo.layers.Embedding(rows, 1, optimizer=teo.optimizers.SGD(1.0), name=name)
        for rows, name in ((4, "small"), (exact + 1, "large"))
    ]
    inputs = [keras.Input((1,), dtype=dtype) for _ in tables]
    with pytest.raises(ValueError, match="Embedding `large`: its ids come as"):
        teo.layers.StackedEmbedding(tables, name="stacked")(inputs)


@pytest.mark.parametrize("dtype", ["uint32", "uint64"])
def test_unsigned_ids_are_checked_as_the_ids_they_are(dtype):
    """Hashed ids often come unsigned. In the table they step the rows
    int32 ids step; past it they are refused, as the id they are (a uint64
    id of 2**32 + 5 wrapped to 5 when cast to int32, and read row 5; on JAX
    without x64 a uint32 id of 2**31 + 5 was refused as -2147483643). JAX
    without `jax_enable_x64` truncates 64-bit ids to
    32 bits as Keras hands it the batch, before any layer: the guide says
    so; `test_64_bit_ids_on_jax_with_x64_are_refused` checks it with x64."""

    def trained(ids_dtype, x):
        keras.utils.set_random_seed(3)
        ids = keras.Input((3,), dtype=ids_dtype)
        table = teo.layers.Embedding(ROWS, DIM, optimizer=teo.optimizers.Adagrad(0.1))
        model = keras.Model(ids, keras.layers.Flatten()(table(ids)))
        model.compile(optimizer="sgd", loss="mse")
        model.fit(x.astype(ids_dtype), np.ones((len(x), 3 * DIM)), verbose=0)
        return _numpy(table.embeddings)

    np.testing.assert_array_equal(trained(dtype, DATA_IDS), trained("int32", DATA_IDS))
    if BACKEND == "jax" and dtype == "uint64":
        return
    past = np.array([[1, 2**32 + 5 if dtype == "uint64" else 2**31 + 5, 3]])
    with pytest.raises(Exception, match=f"id {past[0, 1]} is outside the table"):
        trained(dtype, past)


@pytest.mark.parametrize("dtype", ["int32", "int64", "uint64"])
def test_64_bit_ids_that_jax_truncates_are_warned_about(dtype):
    """JAX without x64 (this suite's) truncates 64-bit ids before any layer
    sees them: declared so, the model's build says it, naming the table and
    the two ways out. TensorFlow keeps them: no warning."""
    ids = keras.Input((2,), dtype=dtype)
    layer = teo.layers.Embedding(ROWS, DIM, optimizer=teo.optimizers.SGD(0.1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        layer(ids)
    ours = [str(w.message) for w in caught if "jax_enable_x64" in str(w.message)]
    if BACKEND == "jax" and dtype != "int32":
        (message,) = ours
        assert f"Embedding `{layer.name}`: its ids are declared {dtype}" in message
        assert "cannot be refused" in message and "before the model" in message
    else:
        assert ours == []


_X64_CHILD = r"""
import jax

jax.config.update("jax_enable_x64", True)
import keras
import numpy as np

import tf_tpu_embed_opt as teo

ids = keras.Input((1,), dtype="int64")
table = teo.layers.Embedding(10, 2, optimizer=teo.optimizers.SGD(1.0))
model = keras.Model(ids, keras.layers.Flatten()(table(ids)))
model.compile(optimizer="sgd", loss="mse")
try:
    model.fit(np.array([[2**32 + 5]], "int64"), np.ones((1, 2)), verbose=0)
except Exception as error:  # noqa: BLE001 - JAX's host callback error
    print("refused" if "id 4294967301 is outside the table" in str(error) else error)
"""


@pytest.mark.skipif(BACKEND != "jax", reason="jax_enable_x64 is JAX's")
def test_64_bit_ids_on_jax_with_x64_are_refused():
    """The guide's way to keep 64-bit ids whole on JAX (in a child: x64 is
    process-wide)."""
    stdout = _child_stdout(["-c", _X64_CHILD], child_env(KERAS_BACKEND="jax"))
    assert stdout.strip().splitlines()[-1:] == ["refused"], stdout


@pytest.mark.parametrize("stacked", [False, True], ids=["Embedding", "stacked"])
def test_sparse_ids_are_refused_naming_the_table(stacked):
    """Keras's Embedding reads row 0 wherever sparse ids (TensorFlow's
    `SparseTensor`, JAX's `BCOO`) have no entry; the row-sparse lookup failed
    on them ("'SparseTensor' object has no attribute 'numpy'", JAX's "sparse
    rule for lt is not implemented"). Refused, naming the table and the
    way on this backend."""
    dense = np.array([[1, 0, 2], [3, 0, 0]], "int32")
    if BACKEND == "jax":
        from jax.experimental import sparse

        ids = sparse.BCOO.fromdense(dense)
        takes, instead = "dense ids", "them dense, padded with an id outside"
    else:
        import tensorflow as tf

        ids = tf.sparse.from_dense(dense)
        takes, instead = "dense or ragged ids", r"them ragged \(tf\.RaggedTensor"
    table = teo.layers.Embedding(
        8, 3, optimizer=teo.optimizers.Adagrad(0.1), name="items"
    )
    layer = teo.layers.StackedEmbedding([table]) if stacked else table
    with pytest.raises(
        TypeError,
        match=rf"Embedding `items`: the row-sparse lookup takes {takes}; received "
        rf"{type(ids).__name__}\. Keras's Embedding reads row 0 wherever sparse "
        rf"ids have no entry, .* Give {instead}",
    ):
        layer([ids] if stacked else ids)
