"""Per-table optimizers as one keras.optimizers.MultiOptimizer, and back.

Oracles: the engine rule in float32 NumPy for the tables, Keras's own Adam for
the dense layers, TensorFlow's `TPUEmbeddingForServing` for the checkpoint
layout, and Keras's `.keras` saving for the state.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from child_env import child_env
from tensorflow.python.tpu.tpu_embedding_for_serving import TPUEmbeddingForServing

import tf_tpu_embed_opt as teo
from tf_tpu_embed_opt import checkpoints
from tf_tpu_embed_opt.checkpoints.keras import state as keras_state
from tf_tpu_embed_opt.conversions import multi_optimizer
from tf_tpu_embed_opt.definitions import rules

TFE = tf.tpu.experimental.embedding

pytestmark = pytest.mark.skipif(
    not hasattr(keras.optimizers, "MultiOptimizer"),
    reason=f"Keras {keras.__version__} has no keras.optimizers.MultiOptimizer",
)

SIZES = {"user": (7, 3), "item": (5, 3)}


def _feature_config():
    user = TFE.TableConfig(7, 3, name="user", optimizer=teo.embedding.Adam(0.05))
    item = TFE.TableConfig(5, 3, name="item")  # takes the global optimizer
    return {
        "user": TFE.FeatureConfig(table=user),
        "item": TFE.FeatureConfig(table=item),
        "item_again": TFE.FeatureConfig(table=item, name="item_again"),
    }


GLOBAL = teo.embedding.Adagrad(0.1, initial_accumulator_value=0.2)


def _model():
    keras.utils.set_random_seed(1)
    user = keras.Input((2,), dtype="int32", name="user_ids")
    item = keras.Input((2,), dtype="int32", name="item_ids")
    u = keras.layers.Embedding(7, 3, name="user")(user)
    i = keras.layers.Embedding(5, 3, name="item")(item)
    x = keras.layers.Concatenate()(
        [keras.layers.Flatten()(u), keras.layers.Flatten()(i)]
    )
    out = keras.layers.Dense(1, name="dense")(x)
    return keras.Model([user, item], out)


class _Ranker(keras.Model):
    """The same model subclassed: its variables' paths start with its name
    ("ranker/user/embeddings")."""

    def __init__(self):
        super().__init__(name="ranker")
        self.user = keras.layers.Embedding(7, 3, name="user")
        self.item = keras.layers.Embedding(5, 3, name="item")
        self.dense = keras.layers.Dense(1, name="dense")

    def call(self, inputs):
        user, item = inputs
        flat = [
            keras.ops.reshape(self.user(user), (-1, 6)),
            keras.ops.reshape(self.item(item), (-1, 6)),
        ]
        return self.dense(keras.ops.concatenate(flat, axis=1))


def _subclassed_model():
    keras.utils.set_random_seed(1)
    model = _Ranker()
    model(_batch(0)[0])
    return model


def _layer_of(variable):
    """The name of the layer that holds `variable` ("user", "dense")."""
    return variable.path.split("/")[-2]


def _batch(seed):
    rng = np.random.default_rng(seed)
    return (
        [rng.integers(0, 7, (8, 2)), rng.integers(0, 5, (8, 2))],
        rng.normal(size=(8, 1)).astype(np.float32),
    )


@pytest.mark.parametrize("make_model", [_model, _subclassed_model])
def test_keras_optimizer_routes_tables_to_twins_and_the_rest_to_dense(make_model):
    """Also in a subclassed model, whose tables are "ranker/user/embeddings":
    they were trained by the dense optimizer, as no table's path matched."""
    model = make_model()
    dense = keras.optimizers.Adam(0.01)
    optimizer = multi_optimizer.keras_optimizer(
        _feature_config(), dense, embedding_optimizer=GLOBAL
    )
    assert isinstance(optimizer, keras.optimizers.MultiOptimizer)
    x, y = _batch(0)
    with tf.GradientTape() as tape:
        loss = keras.losses.mean_squared_error(y, model(x))
    variables = model.trainable_variables
    grads = tape.gradient(loss, variables)
    before = {v.path: v.numpy().copy() for v in variables}

    # Oracles: Keras's Adam on the dense variables, the engine rule on tables.
    reference = keras.optimizers.Adam(0.01)
    dense_vars = [
        keras.Variable(before[v.path], name=v.name)
        for v in variables
        if _layer_of(v) == "dense"
    ]
    reference.apply(
        [g for g, v in zip(grads, variables) if _layer_of(v) == "dense"],
        dense_vars,
    )
    optimizer.apply(grads, variables)
    for variable, expected in zip(
        [v for v in variables if _layer_of(v) == "dense"], dense_vars
    ):
        np.testing.assert_array_equal(variable.numpy(), expected.numpy())
    engine = {"user": teo.embedding.Adam(0.05), "item": GLOBAL}
    for grad, variable in zip(grads, variables):
        table = _layer_of(variable)
        if table not in engine:
            continue
        definition = teo.embedding.definition_of(engine[table])
        hypers = {h.name: getattr(engine[table], h.name) for h in definition.hypers}
        ids, inverse = np.unique(grad.indices.numpy(), return_inverse=True)
        summed = np.zeros((len(ids), 3), np.float32)
        np.add.at(summed, inverse.reshape(-1), grad.values.numpy())
        slots = {
            s.name: np.full((len(ids), 3), s.initial_value(hypers), np.float32)
            for s in definition.slots
        }
        rows, _ = rules.tpu_step(
            definition,
            rules.NUMPY,
            before[variable.path][ids],
            slots,
            summed,
            np.float32(engine[table].learning_rate),
            hypers,
        )
        np.testing.assert_array_max_ulp(variable.numpy()[ids], rows, maxulp=1)
        untouched = np.setdiff1d(np.arange(variable.shape[0]), ids)
        np.testing.assert_array_equal(
            variable.numpy()[untouched], before[variable.path][untouched]
        )


def test_keras_optimizer_fits_and_goes_back_to_the_table_optimizers():
    model = _model()
    optimizer = multi_optimizer.keras_optimizer(
        _feature_config(), keras.optimizers.Adam(0.01), embedding_optimizer=GLOBAL
    )
    model.compile(optimizer=optimizer, loss="mse")
    x, y = _batch(1)
    history = model.fit(x, y, epochs=3, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    back = multi_optimizer.embedding_optimizers(
        optimizer, {"user": model.get_layer("user"), "item": "item/embeddings"}
    )
    assert back["user"] == teo.embedding.Adam(0.05)
    assert back["item"] == GLOBAL
    # Whole, it is refused with the reason of Keras's class it extends.
    with pytest.raises(
        TypeError,
        match=r"TableMultiOptimizer, a keras.optimizers."
        r"MultiOptimizer \(an optimizer per variable: convert the one",
    ):
        teo.to_embedding(optimizer)


def test_embedding_optimizers_refuses_what_the_engine_cannot_do():
    optimizer = keras.optimizers.MultiOptimizer(
        keras.optimizers.OptimizerMap(
            keras.optimizers.SGD(),
            {"user/embeddings": keras.optimizers.Adam(amsgrad=True)},
        )
    )
    with pytest.raises(ValueError, match=r"Table 'user'.*amsgrad=True"):
        multi_optimizer.embedding_optimizers(optimizer, {"user": "user/embeddings"})


def test_keras_optimizer_refusals():
    with pytest.raises(ValueError, match="Table 'item' has no optimizer"):
        multi_optimizer.keras_optimizer(_feature_config(), keras.optimizers.Adam())
    with pytest.raises(TypeError, match="dense_optimizer"):
        multi_optimizer.keras_optimizer(_feature_config(), "adam")
    with pytest.raises(ValueError, match=r"missing \['item'\]"):
        multi_optimizer.keras_optimizer(
            _feature_config(),
            keras.optimizers.Adam(),
            embedding_optimizer=GLOBAL,
            variables={"user": "user/embeddings"},
        )
    with pytest.raises(TypeError, match="FeatureConfig or TableConfig"):
        multi_optimizer.keras_optimizer([1, 2], keras.optimizers.Adam())


def _misnamed_model():
    """`_model` with its tables' layers named otherwise than the tables."""
    keras.utils.set_random_seed(1)
    user = keras.Input((2,), dtype="int32")
    item = keras.Input((2,), dtype="int32")
    u = keras.layers.Embedding(7, 3, name="user_embedding")(user)
    i = keras.layers.Embedding(5, 3, name="item")(item)
    x = keras.layers.Concatenate()(
        [keras.layers.Flatten()(u), keras.layers.Flatten()(i)]
    )
    return keras.Model([user, item], keras.layers.Dense(1, name="dense")(x))


def test_a_table_no_variable_matches_is_refused_when_the_optimizer_is_built():
    """Keras's MultiOptimizer trains a variable no key matches with its
    default optimizer: the table 'user' (layer 'user_embedding') stepped
    with the dense Adam, without a word."""
    model = _misnamed_model()
    default = keras.optimizers.MultiOptimizer(
        keras.optimizers.OptimizerMap(
            keras.optimizers.Adam(0.01),
            {"(?:.*/)?user/embeddings": teo.to_keras(GLOBAL)},
        )
    )
    default.build(model.trainable_variables)
    embeddings = model.get_layer("user_embedding").embeddings
    assert default._optimizer_map(embeddings) is default.optimizers[-1]
    assert isinstance(default.optimizers[-1], keras.optimizers.Adam)

    optimizer = multi_optimizer.keras_optimizer(
        _feature_config(), keras.optimizers.Adam(0.01), embedding_optimizer=GLOBAL
    )
    model.compile(optimizer=optimizer, loss="mse")
    before = [w.copy() for w in model.get_weights()]
    words = (
        r"^keras_optimizer: table 'user' matches none of the variables .* "
        r"Embedding layers: \['user_embedding/embeddings', 'item/embeddings'\]"
    )
    with pytest.raises(ValueError, match=words):
        model.fit(*_batch(0), verbose=0)
    for weight, start in zip(model.get_weights(), before):
        np.testing.assert_array_equal(weight, start)
    assert not optimizer.built
    # Given its variable, the same table trains with its twin.
    named = multi_optimizer.keras_optimizer(
        _feature_config(),
        keras.optimizers.Adam(0.01),
        embedding_optimizer=GLOBAL,
        variables={
            "user": model.get_layer("user_embedding"),
            "item": "item/embeddings",
        },
    )
    named.build(model.trainable_variables)
    assert type(named._optimizer_map(embeddings)).__module__.startswith(
        "tf_tpu_embed_opt"
    )
    # Two sub-models each with an Embedding "user" (Keras names layers
    # uniquely among siblings only): both were trained by the table's twin.
    ids = keras.Input((2,), dtype="int32")
    towers = [
        keras.Model(ids, keras.layers.Embedding(7, 3, name="user")(ids), name=t)
        for t in ("a", "b")
    ]
    twice = keras.Model(ids, keras.layers.Concatenate()([t(ids) for t in towers]))
    with pytest.raises(ValueError, match=r"table 'user' matches 2 of the variables"):
        multi_optimizer.keras_optimizer(
            {"user": GLOBAL}, keras.optimizers.Adam(0.01)
        ).build(twice.trainable_variables)
    # A path given that no variable has is refused the same way.
    typo = multi_optimizer.keras_optimizer(
        _feature_config(),
        keras.optimizers.Adam(0.01),
        embedding_optimizer=GLOBAL,
        variables={"user": "usr/embeddings", "item": "item/embeddings"},
    )
    with pytest.raises(ValueError, match=r"table 'user' .* 'usr/embeddings'"):
        typo.apply(
            [keras.ops.zeros(v.shape) for v in model.trainable_variables],
            model.trainable_variables,
        )


def test_a_loss_scaled_dense_optimizer_is_refused_where_it_is_given():
    """The MultiOptimizer took it and refused it when built, in the first
    step: "LossScaleOptimizer cannot be used inside an MultiOptimizer"."""
    scaled = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam())
    inside = keras.optimizers.MultiOptimizer(keras.optimizers.OptimizerMap(scaled))
    with pytest.raises(ValueError, match="LossScaleOptimizer cannot be used"):
        inside.build(_model().trainable_variables)
    with pytest.raises(TypeError, match=r"`dense_optimizer` is a LossScaleOpt.*wrap"):
        multi_optimizer.keras_optimizer(
            _feature_config(), scaled, embedding_optimizer=GLOBAL
        )


def _unbuilt_user():
    return keras.layers.Embedding(7, 3, name="user")


# Refusals no test reached before (found by mutating the module): each call,
# and the words that name what was wrong.
REFUSED = {
    "unnamed table": (
        lambda: multi_optimizer.keras_optimizer(
            [TFE.TableConfig(7, 3, optimizer=GLOBAL)], keras.optimizers.Adam()
        ),
        ValueError,
        r"Every TableConfig needs a `name`",
    ),
    "unbuilt layer": (
        lambda: multi_optimizer.keras_optimizer(
            {"user": GLOBAL},
            keras.optimizers.Adam(),
            variables={"user": _unbuilt_user()},
        ),
        ValueError,
        r"^Table 'user': the Embedding layer 'user' is not built",
    ),
    "variable of another kind": (
        lambda: multi_optimizer.keras_optimizer(
            {"user": GLOBAL}, keras.optimizers.Adam(), variables={"user": 3}
        ),
        TypeError,
        r"^Table 'user': the variable must be given as its path .* received 3 of "
        r"type int",
    ),
    "variables not a mapping": (
        lambda: multi_optimizer.keras_optimizer(
            {"user": GLOBAL},
            keras.optimizers.Adam(),
            variables=[("user", "user/embeddings")],
        ),
        TypeError,
        r"^`variables` must be a mapping .*; received list",
    ),
    "engine for a TensorFlow configuration": (
        lambda: multi_optimizer.keras_optimizer(
            {"user": GLOBAL}, keras.optimizers.Adam(), engine="jax-tpu-embedding"
        ),
        ValueError,
        r"^keras_optimizer: argument `engine` is for keras-rs's tables; received "
        r"'jax-tpu-embedding'",
    ),
    "two tables, one variable": (
        lambda: multi_optimizer.keras_optimizer(
            {"user": GLOBAL, "item": GLOBAL},
            keras.optimizers.Adam(),
            variables={"user": "x/embeddings", "item": "x/embeddings"},
        ),
        ValueError,
        r"Several tables map to the same variables \['x/embeddings'\]",
    ),
    "no variables": (
        lambda: multi_optimizer.embedding_optimizers(keras.optimizers.Adam(), {}),
        TypeError,
        r"^`variables` must be a non-empty mapping .*; received \{\}",
    ),
    "variables a list": (
        lambda: multi_optimizer.embedding_optimizers(keras.optimizers.Adam(), ["user"]),
        TypeError,
        r"^`variables` must be a non-empty mapping .*; received \['user'\]",
    ),
    "a callable's table by path": (
        lambda: multi_optimizer.embedding_optimizers(
            keras.optimizers.MultiOptimizer(lambda v: keras.optimizers.Adagrad(0.1)),
            {"user": "user/embeddings"},
        ),
        TypeError,
        r"^Table 'user': this MultiOptimizer chooses by a callable, which needs "
        r"the keras.Variable itself; received 'user/embeddings'",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_bad_tables_and_variables_are_refused_naming_them(case):
    call, error, words = REFUSED[case]
    with pytest.raises(error, match=words):
        call()


def test_one_keras_optimizer_serves_every_table():
    one = keras.optimizers.Adagrad(0.1, initial_accumulator_value=0.2)
    result = multi_optimizer.embedding_optimizers(
        one, {"user": "user/embeddings", "item": "item/embeddings"}
    )
    assert result == {"user": GLOBAL, "item": GLOBAL}


def test_a_callable_multi_optimizer_is_read_through_the_variable_itself():
    table = keras.Variable(np.zeros((7, 3), np.float32), name="embeddings")
    chosen = keras.optimizers.Adagrad(0.1, initial_accumulator_value=0.2)
    multi = keras.optimizers.MultiOptimizer(
        lambda v: chosen if v is table else keras.optimizers.SGD()
    )
    result = multi_optimizer.embedding_optimizers(multi, {"user": table})
    assert result == {"user": GLOBAL}


@pytest.mark.parametrize("global_optimizer", [3, "adagrad", keras.optimizers.Adam()])
def test_keras_optimizer_refuses_a_global_optimizer_of_another_kind(global_optimizer):
    # Every table below has its own optimizer: the global one was ignored
    # without a word before, where tpu_embedding_configuration refused it.
    table = TFE.TableConfig(7, 3, name="user", optimizer=teo.embedding.Adam(0.05))
    with pytest.raises(
        TypeError, match=r"^keras_optimizer: argument `embedding_optimizer` must be"
    ):
        multi_optimizer.keras_optimizer(
            [TFE.FeatureConfig(table=table)],
            keras.optimizers.Adam(),
            embedding_optimizer=global_optimizer,
        )


def test_keras_optimizer_without_multi_optimizer_is_a_clear_import_error(
    monkeypatch,
):
    monkeypatch.delattr(keras.optimizers, "MultiOptimizer")
    with pytest.raises(ImportError, match="MultiOptimizer does not exist"):
        multi_optimizer.keras_optimizer({"t": GLOBAL}, keras.optimizers.Adam())


def _state(optimizer):
    # Keyed by position and the variable's own name (optimizer names differ
    # between instances: adam, adam_1, ...).
    return {
        (i, v.path.split("/")[-1]): v.numpy() for i, v in enumerate(optimizer.variables)
    }


def _per_table(scaled):
    """keras_optimizer's MultiOptimizer; `scaled`: inside a
    LossScaleOptimizer, as `mixed_float16` compiles it (`model.optimizer`)."""
    optimizer = multi_optimizer.keras_optimizer(
        _feature_config(), keras.optimizers.Adam(0.01), embedding_optimizer=GLOBAL
    )
    return keras.optimizers.LossScaleOptimizer(optimizer) if scaled else optimizer


def test_a_mixed_float16_model_compiles_its_optimizer_inside_a_loss_scaler():
    """What `_per_table(scaled=True)` stands for: Keras's own wrapping."""
    policy = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_float16")
    try:
        model = _model()
        model.compile(optimizer=_per_table(False), loss="mse")
    finally:
        keras.config.set_dtype_policy(policy)
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert isinstance(model.optimizer.inner_optimizer, keras.optimizers.MultiOptimizer)


@pytest.mark.parametrize("scaled", [False, True], ids=["plain", "loss-scaled"])
def test_state_survives_keras_save_and_checkpoint(tmp_path, scaled):
    """Loss-scaled, `checkpoint_objects` tracked only the LossScaleOptimizer:
    the checkpoint held none of the inner optimizers' slots."""
    model = _model()
    optimizer = _per_table(scaled)
    model.compile(optimizer=optimizer, loss="mse")
    x, y = _batch(2)
    model.fit(x, y, epochs=2, verbose=0)
    expected = _state(optimizer)
    assert any(p == "user_embeddings_velocity" for _, p in expected)

    model.save(tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras")
    actual = _state(loaded.optimizer)
    assert actual.keys() == expected.keys()
    for path, value in expected.items():
        np.testing.assert_array_equal(actual[path], value, err_msg=path)

    prefix = tf.train.Checkpoint(
        model=model, **multi_optimizer.checkpoint_objects(optimizer)
    ).save(str(tmp_path / "tf" / "ckpt"))
    fresh = _model()
    fresh_optimizer = _per_table(scaled)
    fresh_optimizer.build(fresh.trainable_variables)
    tf.train.Checkpoint(
        model=fresh, **multi_optimizer.checkpoint_objects(fresh_optimizer)
    ).restore(prefix).assert_existing_objects_matched()
    actual = _state(fresh_optimizer)
    for path, value in expected.items():
        np.testing.assert_array_equal(actual[path], value, err_msg=path)


def _following(dense):
    """The tables' optimizers converted from `dense`: their learning rates
    follow its steps (`KerasStepLearningRate`)."""
    user = TFE.TableConfig(7, 3, name="user", optimizer=teo.to_embedding(dense))
    item = TFE.TableConfig(5, 3, name="item")
    features = {
        "user": TFE.FeatureConfig(table=user),
        "item": TFE.FeatureConfig(table=item),
    }
    model = _model()
    optimizer = multi_optimizer.keras_optimizer(
        features, dense, embedding_optimizer=teo.to_embedding(dense)
    )
    model.compile(optimizer=optimizer, loss="mse")
    return model


@pytest.mark.parametrize(
    "dense",
    [
        # Keras Adam's bias correction: a factor of the dense optimizer's step.
        lambda: keras.optimizers.Adam(0.01),
        lambda: keras.optimizers.Adagrad(
            keras.optimizers.schedules.ExponentialDecay(0.1, 1, 0.5), epsilon=1e-10
        ),
    ],
    ids=["adam", "adagrad-schedule"],
)
def test_tables_following_the_dense_optimizer_save_and_go_on(tmp_path, dense):
    """`model.save` raised TypeError ("Cannot serialize object
    KerasStepLearningRate"): the twins follow the dense optimizer's steps.
    Saved as a schedule of their own steps, the model goes on bit for bit as
    one never saved."""
    x, y = _batch(2)
    unsaved = _following(dense())
    unsaved.fit(x, y, epochs=3, shuffle=False, verbose=0)
    model = _following(dense())
    model.fit(x, y, epochs=1, shuffle=False, verbose=0)
    model.save(tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras")
    rates = [o._learning_rate for o in loaded.optimizer.optimizers[:2]]
    assert [type(r).__name__ for r in rates] == ["KerasStepSchedule"] * 2
    loaded.fit(x, y, epochs=2, shuffle=False, verbose=0)
    for a, b in zip(unsaved.get_weights(), loaded.get_weights()):
        np.testing.assert_array_equal(b, a)


def test_a_twin_that_stepped_apart_from_the_optimizer_it_follows_is_not_saved():
    dense = keras.optimizers.Adam(0.01)
    twin = teo.to_keras(teo.to_embedding(dense))
    table = keras.Variable(np.zeros((4, 2), np.float32))
    twin.apply([np.ones((4, 2), np.float32)], [table])
    with pytest.raises(ValueError, match=r"has taken 1 step, .*'adam\w*' 0\."):
        twin.get_config()
    dense.iterations.assign(1)
    assert twin.get_config()["learning_rate"]["class_name"] == "KerasStepLearningRate"


def test_checkpoint_objects_refuses_what_tf_train_checkpoint_cannot_take():
    """A value that is no optimizer was returned as a child to track, and a
    `name` that is no identifier as a key `tf.train.Checkpoint(**...)`
    refuses; both are refused by name."""
    optimizer = multi_optimizer.keras_optimizer(
        _feature_config(), keras.optimizers.Adam(0.01), embedding_optimizer=GLOBAL
    )
    with pytest.raises(TypeError, match=r"`optimizer` must be a Keras .*received 3"):
        multi_optimizer.checkpoint_objects(3)
    for name in (3, "", "my optimizer"):
        with pytest.raises(TypeError, match=r"`name` must be an identifier"):
            multi_optimizer.checkpoint_objects(optimizer, name=name)
    plain = keras.optimizers.Adam()
    assert multi_optimizer.checkpoint_objects(plain, name="dense") == {"dense": plain}
    assert sorted(multi_optimizer.checkpoint_objects(optimizer)) == [
        "optimizer",
        *(f"optimizer_{i}" for i in range(len(optimizer.optimizers))),
    ]


@pytest.mark.parametrize("scaled", [False, True], ids=["plain", "loss-scaled"])
def test_tpu_checkpoint_to_multi_optimizer_and_back(tmp_path, scaled):
    """Loss-scaled (a `mixed_float16` model's optimizer), load_into_keras and
    save_tpu_checkpoint refused the LossScaleOptimizer, whose inner
    optimizers keep the tables' state and steps."""
    serving = TPUEmbeddingForServing(_feature_config(), GLOBAL)
    serving.build()
    rng = np.random.default_rng(3)
    for table, variables in serving._variables.items():
        for slot, variable in variables.items():
            variable.assign(rng.uniform(0.1, 1.0, variable.shape).astype(np.float32))
    root = tf.train.Checkpoint(embedding=serving)
    prefix = root.save(str(tmp_path / "tpu" / "ckpt"))

    model = _model()
    optimizer = _per_table(scaled)
    loaded = keras_state.load_into_keras(prefix, model, optimizer, step=41)
    assert {k: v.name for k, v in loaded.items()} == {"user": "Adam", "item": "Adagrad"}
    multi = optimizer.inner_optimizer if scaled else optimizer
    assert all(int(o.iterations.numpy()) == 41 for o in [multi, *multi.optimizers])
    np.testing.assert_array_equal(
        model.get_layer("user").embeddings.numpy(),
        serving._variables["user"]["parameters"].numpy(),
    )
    model.compile(optimizer=optimizer, loss="mse")
    x, y = _batch(4)
    model.fit(x, y, epochs=1, verbose=0)
    assert int(optimizer.iterations.numpy()) == 42

    out = keras_state.save_tpu_checkpoint(
        str(tmp_path / "back" / "ckpt"), model, optimizer, names=["user", "item"]
    )
    reader = checkpoints.TPUCheckpointReader(out)
    assert int(reader.read_scalar("step")) == 42
    restored = TPUEmbeddingForServing(_feature_config(), GLOBAL)
    status = tf.train.Checkpoint(embedding=restored).restore(out)
    restored.build()
    status.assert_existing_objects_matched()
    tables = keras_state.keras_tables(model, optimizer, ["user", "item"])
    for table in tables:
        variables = restored._variables[table.name]
        np.testing.assert_array_equal(
            variables["parameters"].numpy(), table.variable.numpy()
        )
        for slot, keras_slot in table.slots.items():
            np.testing.assert_array_equal(variables[slot].numpy(), keras_slot.numpy())
    # The Keras names of the engine's slots, as Keras's own Adam/Adagrad name
    # theirs: momenta -> momentum, velocities -> velocity, accumulators ->
    # accumulator.
    paths = {s: v.path.split("/")[-1] for t in tables for s, v in t.slots.items()}
    assert paths == {
        "momenta": "user_embeddings_momentum",
        "velocities": "user_embeddings_velocity",
        "accumulators": "item_embeddings_accumulator",
    }


def test_table_optimizers_from_configs_and_mappings():
    config = _feature_config()
    resolved = multi_optimizer.table_optimizers(config, GLOBAL)
    assert resolved == {"user": teo.embedding.Adam(0.05), "item": GLOBAL}
    tables = [f.table for f in config.values()]
    assert multi_optimizer.table_optimizers(tables, GLOBAL) == resolved
    assert multi_optimizer.table_optimizers({"user": None}, GLOBAL) == {"user": GLOBAL}
    with pytest.raises(TypeError, match="^The optimizer of table 'user' must be an"):
        multi_optimizer.table_optimizers({"user": keras.optimizers.Adam()})
    duplicate = TFE.TableConfig(3, 2, name="user", optimizer=GLOBAL)
    with pytest.raises(ValueError, match=r"unique names; repeated: \['user'\]"):
        multi_optimizer.table_optimizers([tables[0], duplicate])
    # A mapping keyed by what is no table name was refused as a nest that
    # "holds Adagrad(...)", a value the mapping form takes.
    with pytest.raises(TypeError, match=r"keyed by table names .* key 1 of type int"):
        multi_optimizer.table_optimizers({1: GLOBAL})


_PER_TABLE_FIT = """
import json, sys
import keras, numpy as np, tensorflow as tf
import tf_tpu_embed_opt as teo

E = tf.tpu.experimental.embedding
features = {
    "user": E.FeatureConfig(
        E.TableConfig(50, 4, name="user", optimizer=teo.embedding.Adagrad(0.1))
    ),
    "item": E.FeatureConfig(
        E.TableConfig(30, 4, name="item", optimizer=teo.embedding.SGD(0.5))
    ),
}
keras.utils.set_random_seed(0)
users = keras.Input((1,), dtype="int32")
items = keras.Input((1,), dtype="int32")
u = keras.layers.Flatten()(keras.layers.Embedding(50, 4, name="user")(users))
i = keras.layers.Flatten()(keras.layers.Embedding(30, 4, name="item")(items))
model = keras.Model([users, items], keras.layers.Dot(axes=1)([u, i]))
model.compile(
    optimizer=teo.keras_optimizer(features, keras.optimizers.SGD(0.1)), loss="mse"
)
rng = np.random.default_rng(0)
# The same start on both backends (their random initializers differ).
for weight in model.weights:
    weight.assign(rng.normal(0.0, 0.1, weight.shape).astype("float32"))
x = [rng.integers(0, 50, (64, 1)), rng.integers(0, 30, (64, 1))]
model.fit(
    x, rng.normal(size=(64, 1)), batch_size=16, epochs=2, shuffle=False, verbose=0
)
print(json.dumps({w.path: w.numpy().tolist() for w in model.weights}))
"""


_SAVED_AND_REFUSED = """
import json, sys
import numpy as np
import keras
import tf_tpu_embed_opt  # a plain import: the classes register when Keras loads

saved = keras.models.load_model(sys.argv[1])
optimizer = saved.optimizer
x = [np.array([[1, 2]]), np.array([[3, 4]])]
y = np.ones((1, 1), "float32")
saved.fit(x, y, verbose=0)
# The same tables, the user table's layer named otherwise.
user = keras.Input((2,), dtype="int32")
item = keras.Input((2,), dtype="int32")
u = keras.layers.Embedding(7, 3, name="user_embedding")(user)
i = keras.layers.Embedding(5, 3, name="item")(item)
out = keras.layers.Dense(1)(
    keras.layers.Concatenate()([keras.layers.Flatten()(u), keras.layers.Flatten()(i)])
)
model = keras.Model([user, item], out)
model.compile(optimizer=optimizer.from_config(optimizer.get_config()), loss="mse")
before = [w.copy() for w in model.get_weights()]
try:
    model.fit(x, y, verbose=0)
    refused = None
except ValueError as error:
    refused = str(error)
same = all(np.array_equal(a, b) for a, b in zip(model.get_weights(), before))
model.predict(x, verbose=0)  # the model still has its arrays
print(json.dumps({
    "class": type(optimizer).__name__,
    "tables": optimizer.get_config()["tables"],
    "refused": refused,
    "unchanged": same,
}))
"""


@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_keras_optimizer_loads_and_refuses_an_unmatched_table_on_each_backend(
    tmp_path, backend
):
    """Saved with a model, keras_optimizer's MultiOptimizer loads in a new
    process after a plain `import tf_tpu_embed_opt`, and refuses a table no
    variable matches before fit trains anything (on JAX, before fit takes the
    model's arrays out of its variables)."""
    import importlib.util
    import json
    import subprocess
    import sys

    if importlib.util.find_spec(backend) is None:
        pytest.skip(f"{backend} is not installed here (CI's first leg has it)")
    model = _model()
    model.compile(
        optimizer=multi_optimizer.keras_optimizer(
            _feature_config(), keras.optimizers.Adam(0.01), embedding_optimizer=GLOBAL
        ),
        loss="mse",
    )
    model.fit(*_batch(0), verbose=0)
    model.save(tmp_path / "model.keras")
    result = subprocess.run(
        [sys.executable, "-c", _SAVED_AND_REFUSED, str(tmp_path / "model.keras")],
        capture_output=True,
        text=True,
        env=child_env(KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3"),
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    run = json.loads(result.stdout.strip().splitlines()[-1])
    assert run["class"] == "TableMultiOptimizer"
    assert run["tables"] == {
        "user": "(?:.*/)?user/embeddings",
        "item": "(?:.*/)?item/embeddings",
    }
    assert run["refused"].startswith("keras_optimizer: table 'user' matches none")
    assert run["unchanged"]


@pytest.mark.parametrize("backend", ["jax"])
def test_keras_optimizer_trains_alike_on_another_keras_backend(backend):
    """The per-table MultiOptimizer on JAX (TensorFlow installed for the
    table configs) computes what it computes on TensorFlow. Adagrad and SGD
    step only the looked-up rows on both backends, so the two runs agree."""
    import importlib.util
    import json
    import subprocess
    import sys

    if importlib.util.find_spec(backend) is None:
        pytest.skip(f"{backend} is not installed here (CI's first leg has it)")
    runs = {}
    for name in ("tensorflow", backend):
        env = child_env(KERAS_BACKEND=name, TF_CPP_MIN_LOG_LEVEL="3")
        result = subprocess.run(
            [sys.executable, "-c", _PER_TABLE_FIT],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert result.returncode == 0, result.stderr[-2000:]
        runs[name] = json.loads(result.stdout.strip().splitlines()[-1])
    assert runs["tensorflow"].keys() == runs[backend].keys()
    for path, value in runs["tensorflow"].items():
        np.testing.assert_allclose(
            runs[backend][path], value, rtol=1e-5, atol=1e-6, err_msg=path
        )
