"""`tpu_embedding_configuration` against TensorFlow's own `TPUEmbedding`.

Oracle: `TPUEmbedding.__init__` and `_create_config_proto` of the installed
TensorFlow, run under a stand-in TPUStrategy (only the attributes they read),
with this package's optimizers (which write their protos under any protobuf)
and, where protobuf < 7.34, TensorFlow's own optimizer classes.
"""

import copy
from unittest import mock

import pytest
import tensorflow as tf
from conftest import TENSORFLOW_PROTO_SKIP_REASON, TENSORFLOW_WRITES_PROTOS
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


def build_features(make_optimizers):
    """Three tables, four features, shared and distinct dynamic rates."""
    shared_rate = lambda: 0.3  # noqa: E731
    other_rate = lambda: 0.7  # noqa: E731
    first, second, third = make_optimizers(shared_rate, other_rate)
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


def ours(shared, other):
    return (
        teo.embedding.Adagrad(shared, clipvalue=2.0),
        teo.embedding.RMSProp(other, momentum=0.5),
        teo.embedding.Adam(
            shared, lazy_adam=False, low_dimensional_packing_status=True
        ),
    )


def theirs(shared, other):
    return (
        E.Adagrad(shared, clipvalue=2.0),
        E.FTRL(other, l1_regularization_strength=0.1),
        E.Adam(shared, lazy_adam=False, low_dimensional_packing_status=True),
    )


@pytest.mark.parametrize(
    "num_hosts,num_replicas,cores_per_replica,pipeline",
    [(1, 1, None, False), (4, 32, None, True), (2, 4, 2, False)],
)
def test_matches_tensorflow_with_our_optimizers(
    num_hosts, num_replicas, cores_per_replica, pipeline
):
    features = build_features(ours)
    global_optimizer = teo.embedding.ProximalAdagrad(
        0.05, l2_regularization_strength=0.01
    )
    mine = teo.tpu_embedding_configuration(
        features,
        global_optimizer,
        num_hosts=num_hosts,
        num_tensor_cores=num_replicas * (cores_per_replica or 1),
        num_cores_per_replica=cores_per_replica,
        pipeline_execution_with_tensor_core=pipeline,
    )
    reference = tensorflow_configuration(
        copy.deepcopy(features),
        global_optimizer,
        num_hosts,
        num_replicas,
        cores_per_replica,
        pipeline,
    )
    assert mine == reference
    assert [t.name for t in mine.table_descriptor] == [
        "video",
        "table_1",
        "item",
        "global",
    ]
    tags = [
        t.optimization_parameters.learning_rate.WhichOneof("learning_rate")
        for t in mine.table_descriptor
    ]
    assert tags == ["dynamic", "dynamic", "dynamic", "constant"]
    assert [
        t.optimization_parameters.learning_rate.dynamic.tag
        for t in mine.table_descriptor[:3]
    ] == [0, 1, 0]


@pytest.mark.skipif(not TENSORFLOW_WRITES_PROTOS, reason=TENSORFLOW_PROTO_SKIP_REASON)
def test_matches_tensorflow_with_tensorflow_optimizers():
    features = build_features(theirs)
    mine = teo.tpu_embedding_configuration(
        features, E.SGD(0.4), num_hosts=4, num_tensor_cores=8
    )
    reference = tensorflow_configuration(copy.deepcopy(features), E.SGD(0.4), 4, 8)
    assert mine.SerializeToString(deterministic=True) == reference.SerializeToString(
        deterministic=True
    )


def test_inputs_are_not_mutated():
    features = build_features(ours)
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
