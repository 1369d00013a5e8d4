"""`tpu_embedding_configuration` against TensorFlow's own `TPUEmbedding`.

Oracles: for everything but the optimizer fields, `TPUEmbedding.__init__` and
`_create_config_proto` of the installed TensorFlow, run under a stand-in
TPUStrategy (only the attributes they read). For the optimizer fields of each
table, the independent field table of `tests/proto_oracle.py` (under any
protobuf; handing this package's optimizers to TensorFlow would compare the
package's writer with itself) and the whole message written by TensorFlow with
TensorFlow's own optimizer classes (under any protobuf: see
`conftest.tensorflow_writable`).
"""

import copy
from unittest import mock

import pytest
import tensorflow as tf
from conftest import tensorflow_writable
from proto_oracle import expected_proto
from tensorflow.python.distribute import tpu_strategy
from tensorflow.python.tpu import tpu_embedding_v2

import tf_tpu_embed_opt as teo

E = tf.tpu.experimental.embedding


class _Extended:
    def __init__(self, num_hosts, num_replicas, cores_per_replica):
        self.num_hosts = num_hosts
        self._num_replicas_in_sync = num_replicas
        self._device_assignment = (
            mock.Mock(num_cores_per_replica=cores_per_replica)
            if cores_per_replica
            else None
        )


def tensorflow_configuration(
    feature_config,
    optimizer,
    num_hosts,
    num_replicas,
    cores_per_replica=None,
    pipeline=False,
    input_shapes=None,
):
    strategy = object.__new__(tpu_strategy.TPUStrategyV2)
    strategy._extended = _Extended(num_hosts, num_replicas, cores_per_replica)
    with (
        mock.patch.object(
            tpu_embedding_v2.distribute_lib, "get_strategy", return_value=strategy
        ),
        mock.patch.object(
            tpu_embedding_v2.tpu_embedding_v2_utils,
            "get_list_of_hosts",
            return_value=[f"host{i}" for i in range(num_hosts)],
        ),
    ):
        embedding = tpu_embedding_v2.TPUEmbedding(
            feature_config, optimizer, pipeline_execution_with_tensor_core=pipeline
        )
        if input_shapes is not None:
            embedding._get_and_update_output_shapes_from_input(input_shapes)
        return embedding._create_config_proto()


def shared_rate():
    return 0.3


def other_rate():
    return 0.7


# Per table with its own optimizer: (class name, arguments, learning rate).
# Every hyperparameter the proto holds is given, so the field table renders
# the expected fields without reading any default from the package; edge
# values included (zero decay with the multiply flag, one clip end alone).
OUR_TABLE_OPTIMIZERS = (
    (
        "Adagrad",
        {
            "clipvalue": 2.0,
            "weight_decay_factor": 0.0,
            "multiply_weight_decay_factor_by_learning_rate": True,
        },
        shared_rate,
    ),
    ("RMSProp", {"rho": 0.8, "momentum": 0.5, "epsilon": 1e-6}, other_rate),
    (
        "Adam",
        {
            "beta_1": 0.85,
            "beta_2": 0.99,
            "epsilon": 1e-5,
            "lazy_adam": False,
            "sum_inside_sqrt": False,
            "low_dimensional_packing_status": True,
            "clip_weight_max": 4.0,
            "weight_decay_factor": 0.125,
            "multiply_weight_decay_factor_by_learning_rate": True,
        },
        shared_rate,
    ),
)
THEIR_TABLE_OPTIMIZERS = (
    OUR_TABLE_OPTIMIZERS[0],
    (
        "FTRL",
        {
            "learning_rate_power": -0.25,
            "l1_regularization_strength": 0.1,
            "l2_regularization_strength": 0.0,
            "beta": 0.5,
            "multiply_linear_by_learning_rate": True,
            "allow_zero_accumulator": False,
            "clip_weight_min": -1.0,
            "use_gradient_accumulation": False,
        },
        other_rate,
    ),
    OUR_TABLE_OPTIMIZERS[2],
)
GLOBAL_OPTIMIZER = (
    "ProximalAdagrad",
    {"l1_regularization_strength": 0.0, "l2_regularization_strength": 0.01},
    0.05,
)
# TPUEmbedding tags distinct callables in table order: shared 0, other 1.
TAGS = {shared_rate: 0, other_rate: 1}


def make(module, name, arguments, rate):
    return getattr(module, name)(rate, **arguments)


def build_features(module, table_optimizers):
    """Three tables, four features, shared and distinct dynamic rates."""
    first, second, third = (make(module, *entry) for entry in table_optimizers)
    video = E.TableConfig(vocabulary_size=2, dim=4, name="video", optimizer=first)
    user = E.TableConfig(vocabulary_size=16, dim=2, optimizer=second)
    item = E.TableConfig(vocabulary_size=100, dim=8, name="item", optimizer=third)
    global_table = E.TableConfig(vocabulary_size=7, dim=3, name="global")
    return {
        "watched": E.FeatureConfig(table=video, output_shape=[8]),
        "favorited": E.FeatureConfig(table=video, output_shape=[8], name="fav"),
        "friends": E.FeatureConfig(table=user, output_shape=[8, 3]),
        "items": (
            E.FeatureConfig(table=item, output_shape=[8]),
            E.FeatureConfig(table=global_table, output_shape=[8], name="g"),
        ),
    }


def expected_optimizer_fields(table_optimizers, global_optimizer):
    """Each table's OptimizationParameters, rendered by the field table."""
    expected = []
    for name, arguments, rate in (*table_optimizers, global_optimizer):
        tag = TAGS.get(rate) if callable(rate) else None
        expected.append(expected_proto(name, {"learning_rate": rate, **arguments}, tag))
    return expected


def without_optimizer_fields(config):
    copied = type(config)()
    copied.CopyFrom(config)
    for table in copied.table_descriptor:
        table.ClearField("optimization_parameters")
    return copied


def serialized(message):
    return message.SerializeToString(deterministic=True)


def assert_optimizer_fields(config, table_optimizers, global_optimizer):
    written = [t.optimization_parameters for t in config.table_descriptor]
    expected = expected_optimizer_fields(table_optimizers, global_optimizer)
    assert len(written) == len(expected)
    for table, mine, wanted in zip(config.table_descriptor, written, expected):
        assert serialized(mine) == serialized(wanted), (table.name, mine, wanted)


@pytest.mark.parametrize(
    "num_hosts,num_replicas,cores_per_replica,pipeline",
    [(1, 1, None, False), (4, 32, None, True), (2, 4, 2, False)],
)
def test_matches_tensorflow_with_our_optimizers(
    num_hosts, num_replicas, cores_per_replica, pipeline
):
    features = build_features(teo.embedding, OUR_TABLE_OPTIMIZERS)
    global_optimizer = make(teo.embedding, *GLOBAL_OPTIMIZER)
    mine = teo.tpu_embedding_configuration(
        features,
        global_optimizer,
        num_hosts=num_hosts,
        num_tensor_cores=num_replicas * (cores_per_replica or 1),
        num_cores_per_replica=cores_per_replica,
        pipeline_execution_with_tensor_core=pipeline,
    )
    # The optimizer fields against the independent field table.
    assert_optimizer_fields(mine, OUR_TABLE_OPTIMIZERS, GLOBAL_OPTIMIZER)
    # Everything else against TensorFlow's own builder (to which this
    # package's optimizers are only stand-ins: their fields are cleared).
    reference = tensorflow_configuration(
        copy.deepcopy(features),
        global_optimizer,
        num_hosts,
        num_replicas,
        cores_per_replica,
        pipeline,
    )
    assert serialized(without_optimizer_fields(mine)) == serialized(
        without_optimizer_fields(reference)
    )
    assert [t.name for t in mine.table_descriptor] == [
        "video",
        "table_1",
        "item",
        "global",
    ]
    # TensorFlow gives each host at least one row.
    assert [t.vocabulary_size for t in mine.table_descriptor] == [
        max(size, num_hosts) for size in (2, 16, 100, 7)
    ]
    assert [t.dimension for t in mine.table_descriptor] == [4, 2, 8, 3]
    # Features in the order of the flattened (key-sorted) feature config.
    assert [f.table_id for f in mine.feature_descriptor] == [0, 1, 2, 3, 0]
    assert mine.num_hosts == num_hosts
    assert mine.num_tensor_cores == num_replicas * (cores_per_replica or 1)
    assert mine.pipeline_execution_with_tensor_core == pipeline


def test_tensorflow_optimizers_under_any_protobuf():
    """TensorFlow's own classes: their fields as the field table says."""
    features = build_features(E, THEIR_TABLE_OPTIMIZERS)
    mine = teo.tpu_embedding_configuration(
        features, E.SGD(0.4), num_hosts=4, num_tensor_cores=8
    )
    assert_optimizer_fields(mine, THEIR_TABLE_OPTIMIZERS, ("SGD", {}, 0.4))


def test_matches_tensorflow_with_tensorflow_optimizers():
    """TensorFlow's own builder and writer with TensorFlow's own classes."""
    features = build_features(E, THEIR_TABLE_OPTIMIZERS)
    mine = teo.tpu_embedding_configuration(
        features, E.SGD(0.4), num_hosts=4, num_tensor_cores=8
    )
    theirs = copy.deepcopy(features)
    for feature in tf.nest.flatten(theirs):
        if feature.table.optimizer is not None:
            feature.table.optimizer = tensorflow_writable(feature.table.optimizer)
    reference = tensorflow_configuration(theirs, tensorflow_writable(E.SGD(0.4)), 4, 8)
    assert serialized(mine) == serialized(reference)
    assert_optimizer_fields(reference, THEIR_TABLE_OPTIMIZERS, ("SGD", {}, 0.4))


def test_inputs_are_not_mutated():
    features = build_features(teo.embedding, OUR_TABLE_OPTIMIZERS)
    before = repr(features)
    teo.tpu_embedding_configuration(features, teo.embedding.SGD(0.1))
    assert repr(features) == before
    assert features["friends"].table.name is None
    assert features["items"][1].table.optimizer is None


def test_output_shapes_from_input_shapes():
    table = E.TableConfig(
        vocabulary_size=10, dim=4, name="t", optimizer=teo.embedding.SGD()
    )
    sequence = E.TableConfig(
        vocabulary_size=10, dim=4, name="s", optimizer=teo.embedding.SGD()
    )
    features = [
        E.FeatureConfig(table=table),
        E.FeatureConfig(table=sequence, max_sequence_length=5),
    ]
    shapes = [tf.TensorShape([16, 3]), tf.TensorShape([16, 7])]
    mine = teo.tpu_embedding_configuration(features, per_replica_input_shapes=shapes)
    reference = tensorflow_configuration(
        copy.deepcopy(features), None, 1, 1, input_shapes=shapes
    )
    assert mine == reference
    assert list(mine.feature_descriptor[1].input_shape) == [16, 5]


def test_tensorflow_optimizers_work_under_any_protobuf():
    table = E.TableConfig(vocabulary_size=10, dim=4, name="t")
    config = teo.tpu_embedding_configuration(
        E.FeatureConfig(table=table, output_shape=[2]),
        E.Adagrad(0.1, low_dimensional_packing_status=True),
    )
    params = config.table_descriptor[0].optimization_parameters
    assert params.WhichOneof("parameters") == "adagrad"
    assert params.low_dimensional_packing_status == 1


def test_quantization_config_is_written():
    table = E.TableConfig(
        vocabulary_size=10,
        dim=4,
        name="t",
        quantization_config=E.QuantizationConfig(num_buckets=4, lower=-1.0, upper=1.0),
    )
    config = teo.tpu_embedding_configuration(
        E.FeatureConfig(table=table, output_shape=[2]), teo.embedding.SGD(0.1)
    )
    quantization = config.table_descriptor[
        0
    ].optimization_parameters.simulated_quantization
    assert quantization.enabled and quantization.num_buckets == 4
    assert quantization.clipping_limits.lower.value == -1.0
