"""keras-rs takes the exact conversion, and the preflight reads its configs.

Through keras-rs's own TensorFlow conversion
(`keras_rs/src/layers/embedding/tensorflow/config_conversion.py`,
`keras_to_tf_tpu_configuration`, which runs on CPU): what reaches TensorFlow's
`TableConfig` is exactly this package's optimizer.
"""

import keras
import pytest
import sparsecore_oracle as oracle
import tensorflow as tf

import tf_tpu_embed_opt as teo

try:
    import keras_rs
    from keras_rs.src.layers.embedding.tensorflow import config_conversion
except Exception:  # noqa: BLE001 - the oracle mark reports why, in the summary
    keras_rs = config_conversion = None

pytestmark = pytest.mark.oracle("keras-rs")


TF_CLASSES = (
    tf.tpu.experimental.embedding.SGD,
    tf.tpu.experimental.embedding.Adagrad,
    tf.tpu.experimental.embedding.Adam,
    tf.tpu.experimental.embedding.FTRL,
)


def _features(**optimizers):
    features = {}
    for name, optimizer in optimizers.items():
        table = keras_rs.layers.TableConfig(
            name=f"t_{name}", vocabulary_size=64, embedding_dim=8, optimizer=optimizer
        )
        features[name] = keras_rs.layers.FeatureConfig(
            name=name, table=table, input_shape=(16, 1), output_shape=(16, 8)
        )
    return features


KERAS = {
    "sgd": lambda: keras.optimizers.SGD(0.1),
    "adagrad": lambda: keras.optimizers.Adagrad(0.1, epsilon=0.0),
    "adam": lambda: teo.optimizers.Adam(0.01, lazy=True),
    "ftrl": lambda: teo.optimizers.Ftrl(
        0.1, l2_regularization_strength=0.01, lazy=True
    ),
}


def test_exact_conversion_reaches_tensorflow_unchanged():
    converted = {
        name: teo.to_embedding(make(), engine="TPUEmbeddingV2")
        for name, make in KERAS.items()
    }
    features = _features(**converted)
    tf_features, _ = config_conversion.keras_to_tf_tpu_configuration(
        features, "auto", 1
    )
    for name, opt in converted.items():
        received = tf_features[name].table.optimizer
        assert received is opt
        # TensorFlow's class underneath: TPUEmbeddingV2's isinstance dispatch.
        assert isinstance(received, TF_CLASSES)
    assert teo.check_engine(features).exact
    # Adam keeps Keras's bias correction: a learning rate TPUEmbeddingV2 calls.
    assert callable(tf_features["adam"].table.optimizer.learning_rate)


@pytest.mark.parametrize(
    "make",
    [
        lambda: keras.optimizers.SGD(0.1),
        lambda: keras.optimizers.Adagrad(0.1),
    ],
)
def test_stock_keras_that_keras_rs_converts_exactly(make):
    # keras-rs reads 0.1 back from Keras's float32 variable: the same float32.
    report = teo.check_engine(_features(x=make()))
    assert report.exact, report.problems()


def test_stock_keras_ftrl_changes_math_in_keras_rs():
    # Keras's Ftrl steps every row of a sparse gradient (a zero gradient still
    # moves an FTRL row); keras-rs maps it to the lazy engine FTRL.
    report = teo.check_engine(
        _features(x=keras.optimizers.Ftrl(0.1, l1_regularization_strength=0.01))
    )
    assert not report.exact
    (setting,) = [s for s in report.table("t_x").dropped if s.verdict == "changed"]
    assert "lazy" in setting.reason


def test_keras_schedule_through_keras_rs():
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)
    sgd = keras.optimizers.SGD(schedule)
    assert teo.check_engine(_features(x=sgd)).exact
    adam = teo.optimizers.Adam(schedule, lazy=True)
    # keras-rs refuses the twin; the exact conversion keeps the bias correction.
    report = teo.check_engine(
        _features(x=teo.to_embedding(adam, engine="TPUEmbeddingV2"))
    )
    assert report.exact


def test_stock_keras_adam_changes_math_in_keras_rs():
    features = _features(adam=keras.optimizers.Adam(0.01))
    tf_features, _ = config_conversion.keras_to_tf_tpu_configuration(
        features, "auto", 1
    )
    received = tf_features["adam"].table.optimizer
    # keras-rs: lazy TPU Adam, epsilon inside the square root, no bias
    # correction - three differences from keras.optimizers.Adam.
    assert received.lazy_adam and received.sum_inside_sqrt
    assert not callable(received.learning_rate)
    report = teo.check_engine(features)
    (setting,) = [s for s in report.table("t_adam").dropped if s.verdict == "changed"]
    assert "keras-rs maps keras.optimizers.Adam by name" in setting.reason
    # It runs, with other math: changed, not refused.
    assert report.runs and not report.exact
    assert report.table("t_adam").rejected == ()
    with pytest.raises(ValueError, match="keras-rs maps keras.optimizers.Adam"):
        teo.check_engine(features, strict=True)
    # And the exact conversion refuses stock (non-lazy) Keras Adam for SparseCore.
    with pytest.raises(ValueError, match="lazy_adam=False"):
        teo.to_embedding(keras.optimizers.Adam(0.01), engine="TPUEmbeddingV2")
    # TensorCore's engine has an exact conversion, which is not keras-rs's.
    exact = teo.to_embedding(keras.optimizers.Adam(0.01), engine="TPUEmbedding")
    assert sorted(teo.embedding.arguments(exact)) == sorted(
        teo.embedding.arguments(received)
    )
    report = teo.check_engine(features, "TPUEmbedding")
    (setting,) = [s for s in report.table("t_adam").dropped if s.verdict == "changed"]
    assert "the exact conversion is Adam(" in setting.reason
    assert report.runs and not report.exact


@pytest.mark.parametrize(
    "make, reason",
    [
        (lambda: keras.optimizers.Adagrad(0.1, weight_decay=0.01), "weight_decay"),
        (
            lambda: keras.optimizers.SGD(0.1, gradient_accumulation_steps=4),
            "gradient_accumulation_steps",
        ),
    ],
)
def test_keras_rs_changes_are_reported(make, reason):
    report = teo.check_engine(_features(x=make()))
    assert not report.exact
    assert reason in " ".join(report.problems())


@pytest.mark.parametrize("engine", ["TPUEmbedding", "TPUEmbeddingV2"])
def test_a_table_without_optimizer_takes_the_global_one_as_keras_rs(engine):
    # keras-rs's TensorFlow layer hands TPUEmbedding None for the table, which
    # then takes the DistributedEmbedding's `optimizer=`: check_engine's.
    features = _features(x=None)
    report = teo.check_engine(features, engine)
    assert not report.runs and "no global optimizer" in str(report)
    report = teo.check_engine(features, engine, optimizer=keras.optimizers.Adagrad(0.1))
    assert report.runs and report.tables[0].algorithm == "Adagrad"


def test_keras_rs_refusals_are_reported():
    report = teo.check_engine(_features(x=teo.optimizers.Adagrad(0.1)))
    (setting,) = report.table("t_x").rejected
    assert "keras-rs refuses it" in setting.reason
    assert setting.value == "Adagrad" and "object at 0x" not in str(report)
    assert not report.runs


def test_keras_rs_stacking():
    shared = teo.to_embedding(keras.optimizers.Adagrad(0.1, epsilon=0.0))
    features = _features(a=shared, b=shared, c=teo.embedding.SGD(0.1))
    report = teo.check_engine(features)
    assert sorted(report.stacks.values()) == [("t_a", "t_b"), ("t_c",)]
    assert report.table("t_a").stack == report.table("t_b").stack


def test_keras_rs_stacking_follows_the_config_given():
    # A SparseCoreEmbeddingConfig given wins over keras-rs's own (which
    # stacks); stacking disabled leaves each table alone, as TPUEmbeddingV2.
    from tensorflow.python.tpu import tpu_embedding_v3

    shared = teo.to_embedding(keras.optimizers.Adagrad(0.1, epsilon=0.0))
    features = _features(a=shared, b=shared)
    config = tpu_embedding_v3.SparseCoreEmbeddingConfig(disable_table_stacking=True)
    report = teo.check_engine(features, sparse_core_embedding_config=config)
    assert sorted(report.stacks.values()) == [("t_a",), ("t_b",)]
    assert sorted(teo.check_engine(features).stacks.values()) == [("t_a", "t_b")]


def test_a_nest_mixing_keras_rs_and_tensorflow_features_is_refused():
    table = tf.tpu.experimental.embedding.TableConfig(
        64, 8, optimizer=teo.embedding.SGD(0.1), name="tf_table"
    )
    features = {
        **_features(a=teo.embedding.SGD(0.1)),
        "tf": tf.tpu.experimental.embedding.FeatureConfig(table=table),
    }
    with pytest.raises(
        TypeError, match=r"argument `obj` mixes TensorFlow and keras-rs"
    ):
        teo.check_engine(features)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: teo.embedding.AdagradMomentum(0.1), "Unknown optimizer type"),
        (lambda: teo.embedding.Momentum(0.1), "Unknown optimizer type"),
        (lambda: teo.embedding.RMSProp(0.1), "Unknown optimizer type"),
        (lambda: teo.optimizers.Adagrad(0.1), "Unsupported optimizer type"),
    ],
)
def test_what_keras_rs_refuses_as_the_readme_says(make, message):
    """README, keras-rs: only SGD, Adagrad, Adam and FTRL pass through."""
    features = _features(t=make())
    with pytest.raises(ValueError, match=message):
        config_conversion.keras_to_tf_tpu_configuration(features, "auto", 1)
    report = teo.check_engine(features)
    assert not report.runs
    assert report.tables[0].verdict("optimizer") == "rejected"


def test_features_keras_rs_cannot_build_are_refused_not_reported_as_running():
    # keras-rs splits the global batch over the chips and refuses a batch they
    # do not divide (keras_to_tf_tpu_feature_config): 16 over 3 chips.
    features = _features(x=keras.optimizers.SGD(0.1))
    assert teo.check_engine(features, num_partitions=4).runs
    with pytest.raises(ValueError) as raised:
        teo.check_engine(features, num_partitions=3)
    message = str(raised.value)
    assert message.startswith(
        "check_engine: keras-rs cannot build TensorFlow's configuration of "
        "argument `obj` for num_partitions=3: "
    )
    assert "Batch size 16 is not a multiple of the number of TPUs 3" in message


@pytest.mark.parametrize("engine", ["TPUEmbedding", "TPUEmbeddingV2"])
def test_two_keras_rs_tables_of_one_name_are_refused(monkeypatch, engine):
    """keras-rs hands TensorFlow one table per TableConfig, by its name:
    TensorFlow's engines raise for a name two tables share."""
    features = {}
    for feature in ("a", "b"):
        table = keras_rs.layers.TableConfig(
            name="t",
            vocabulary_size=64,
            embedding_dim=8,
            optimizer=keras.optimizers.SGD(0.1),
        )
        features[feature] = keras_rs.layers.FeatureConfig(
            name=feature, table=table, input_shape=(16, 1), output_shape=(16, 8)
        )
    tf_features, _ = config_conversion.keras_to_tf_tpu_configuration(
        features, "auto", 1
    )
    with pytest.raises(ValueError, match="Tables must have a unique name"):
        oracle.build(monkeypatch, tf_features)
    report = teo.check_engine(features, engine)
    assert not report.runs
    assert [t.verdict("name") for t in report.tables] == ["rejected"] * 2
    assert "another table is named 't' too" in str(report)
    # keras-rs's TensorFlow layer hands TensorFlow only the tables it places
    # on SparseCore (`_placement_to_path_to_feature_config["sparsecore"]`);
    # one on the default device is an embedding layer of its own.
    features["b"].table.placement = "default_device"
    report = teo.check_engine(features, engine)
    assert [t.verdict("name") for t in report.tables] == ["passed"] * 2


@pytest.mark.parametrize("engine", ["TPUEmbedding", "TPUEmbeddingV2"])
def test_a_default_device_table_is_reported_as_the_models_optimizer_trains_it(
    engine,
):
    """keras-rs's TensorFlow layer, like its JAX one, hands TensorFlow's
    engine only the tables it places on SparseCore; a table on the default
    device is a Keras embedding layer that the model's optimizer trains
    (tests/test_jax_engine.py, test_keras_rs_default_device_tables_keep_their_
    optimizer, on both backends). check_engine said TensorFlow ran its
    optimizer, exactly, and stacked it."""
    shared = teo.to_embedding(keras.optimizers.Adagrad(0.1, epsilon=0.0))
    features = _features(a=shared, b=shared)
    features["b"].table.placement = "default_device"
    report = teo.check_engine(features, engine)
    on_device = report.table("t_b")
    assert on_device.verdict("placement") == "changed"
    assert on_device.algorithm is None and on_device.stack is None
    assert "model's optimizer trains" in on_device.dropped[0].reason
    assert report.runs and not report.exact
    assert report.table("t_a").exact
    if engine == "TPUEmbeddingV2":
        assert dict(report.stacks) == {"t_a": ("t_a",)}
    # As on jax-tpu-embedding.
    jax_report = teo.check_engine(features, "jax-tpu-embedding").table("t_b")
    assert jax_report.dropped == on_device.dropped


def test_check_engine_assumes_one_chip_unless_told():
    """`num_partitions` defaults to one chip, which divides any batch."""
    table = keras_rs.layers.TableConfig(
        name="t", vocabulary_size=64, embedding_dim=8, optimizer="sgd"
    )
    features = {
        "f": keras_rs.layers.FeatureConfig(
            name="f", table=table, input_shape=(3, 1), output_shape=(3, 8)
        )
    }
    assert teo.check_engine(features).runs
    with pytest.raises(ValueError, match="Batch size 3 is not a multiple"):
        teo.check_engine(features, num_partitions=2)


def test_keras_rs_without_its_tensorflow_conversion_is_named(monkeypatch):
    """Where keras-rs's TensorFlow conversion cannot be imported (a keras-rs
    built for another TensorFlow), check_engine says what it needs."""
    from tf_tpu_embed_opt.conversions import preflight

    monkeypatch.setattr(preflight, "_keras_rs_module", lambda: None)
    with pytest.raises(
        ValueError, match=r"^check_engine: reading a keras-rs configuration needs"
    ):
        teo.check_engine(_features(x=keras.optimizers.SGD(0.1)))


def test_keras_rs_passes_clipvalue_to_tensorcore_exactly():
    """keras-rs hands TensorFlow a Keras optimizer's clipvalue, which the
    exact conversion keeps too: the same (min, max) on TPUEmbedding, which
    clips; TPUEmbeddingV2 drops it."""
    features = _features(x=keras.optimizers.SGD(0.1, clipvalue=0.5))
    tf_features, _ = config_conversion.keras_to_tf_tpu_configuration(
        features, "auto", 1
    )
    received = tf_features["x"].table.optimizer
    assert (received.clip_gradient_min, received.clip_gradient_max) == (-0.5, 0.5)
    assert teo.check_engine(features, "TPUEmbedding").exact
    report = teo.check_engine(features, "TPUEmbeddingV2")
    assert report.table("t_x").verdict("clipvalue") == "dropped"
