"""The embedding face against TensorFlow: signatures, attributes, protos, ops.

Oracles: TensorFlow's own `tf.tpu.experimental.embedding` classes (signature
introspection, `__dict__`, hash, and proto bytes written by TensorFlow's own
`_set_optimization_parameters`, under any protobuf: see
`conftest.tensorflow_writable`), an
explicit field table written in `tests/proto_oracle.py` (proto rendering and
reading under any protobuf, over every accepted argument combination),
and the TPU op definitions in `op_def_registry`.
"""

import inspect
import re

import pytest
import tensorflow as tf
from conftest import (
    BEYOND_TENSORFLOW,
    TENSORFLOW_BACKED,
    arguments_for,
    as_written,
    tensorflow_writable,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from proto_oracle import (
    PROTO_FIELDS,
    every_combination,
    expected_arguments,
    expected_proto,
)
from tensorflow.core.protobuf.tpu import (
    optimization_parameters_pb2,
    tpu_embedding_configuration_pb2,
)
from tensorflow.python.framework import op_def_registry
from tensorflow.python.tpu import tpu_embedding_v2_utils

import tf_tpu_embed_opt as teo
from tf_tpu_embed_opt.definitions import registry
from tf_tpu_embed_opt.embedding import parameters, proto

TF_EMBEDDING = tf.tpu.experimental.embedding
ALL = list(registry.DEFINITIONS)
OptimizationParameters = optimization_parameters_pb2.OptimizationParameters

# Slot names from the TPU ops; initial values documented per class.
SLOTS = {
    "SGD": [],
    "Adagrad": [("accumulators", "initial_accumulator_value")],
    "AdagradMomentum": [("accumulators", 0.0), ("momenta", 0.0)],
    "Adam": [("momenta", 0.0), ("velocities", 0.0)],
    "FTRL": [("accumulators", "initial_accumulator_value"), ("linears", 0.0)],
    "Momentum": [("momenta", 0.0)],
    "RMSProp": [("ms", 0.0), ("mom", 0.0)],
    "CenteredRMSProp": [("ms", 0.0), ("mom", 0.0), ("mg", 0.0)],
    "Adadelta": [("accumulators", 0.0), ("updates", 0.0)],
    "ProximalAdagrad": [("accumulators", "initial_accumulator_value")],
    "ProximalYogi": [("v", "initial_accumulator_value"), ("m", 0.0)],
}

OP_NAMES = {
    "SGD": "StochasticGradientDescent",
    "Adagrad": "Adagrad",
    "AdagradMomentum": "AdagradMomentum",
    "Adam": "ADAM",
    "FTRL": "FTRL",
    "Momentum": "Momentum",
    "RMSProp": "RMSProp",
    "CenteredRMSProp": "CenteredRMSProp",
    "Adadelta": "Adadelta",
    "ProximalAdagrad": "ProximalAdagrad",
    "ProximalYogi": "ProximalYogi",
}


def ids(definitions):
    return [d.name for d in definitions]


def cls(definition):
    return getattr(teo.embedding, definition.name)


def test_public_surface():
    assert sorted(teo.embedding.__all__) == sorted(
        [d.name for d in registry.DEFINITIONS]
        + ["EmbeddingOptimizer", "arguments", "class_for", "definition_of"]
    )
    assert set(PROTO_FIELDS) == {d.name for d in registry.DEFINITIONS}


def test_the_base_class_is_refused_naming_the_classes_to_use():
    # It failed on a missing attribute, `_definition`; the Keras face's base,
    # TwinOptimizer, already said what to use (tests/test_optimizers.py).
    with pytest.raises(TypeError, match=r"EmbeddingOptimizer is the base .*SGD, Ada"):
        teo.embedding.EmbeddingOptimizer(0.1)


@pytest.mark.parametrize("definition", TENSORFLOW_BACKED, ids=ids(TENSORFLOW_BACKED))
def test_signature_matches_tensorflow(definition):
    ours = inspect.signature(cls(definition)).parameters
    theirs = inspect.signature(getattr(TF_EMBEDDING, definition.name)).parameters
    assert [(p.name, p.kind, p.default) for p in ours.values()] == [
        (p.name, p.kind, p.default) for p in theirs.values()
    ]
    # Annotations as TensorFlow's (what help() and the reference show), but
    # for two whose TensorFlow types are private (`TableVariable`,
    # `Initializer`) or narrower than what both take (clipvalue's None ends).
    differ = {"slot_variable_creation_fn", "clipvalue"}
    assert [(p.name, p.annotation) for p in ours.values() if p.name not in differ] == [
        (p.name, p.annotation) for p in theirs.values() if p.name not in differ
    ]


@pytest.mark.parametrize("definition", TENSORFLOW_BACKED, ids=ids(TENSORFLOW_BACKED))
def test_subclasses_tensorflow_class(definition):
    opt = cls(definition)()
    assert isinstance(opt, getattr(TF_EMBEDDING, definition.name))
    assert isinstance(opt, tpu_embedding_v2_utils._Optimizer)


@pytest.mark.parametrize("definition", BEYOND_TENSORFLOW, ids=ids(BEYOND_TENSORFLOW))
def test_beyond_tensorflow_classes(definition):
    opt = cls(definition)()
    assert isinstance(opt, tpu_embedding_v2_utils._Optimizer)
    names = list(inspect.signature(cls(definition)).parameters)
    common = [
        "use_gradient_accumulation",
        "clip_weight_min",
        "clip_weight_max",
        "weight_decay_factor",
        "multiply_weight_decay_factor_by_learning_rate",
        "slot_variable_creation_fn",
        "clipvalue",
        "low_dimensional_packing_status",
    ]
    assert names[0] == "learning_rate"
    assert names[-len(common) :] == common


BEYOND_SIGNATURES = {
    "Momentum": (["momentum", "use_nesterov"], 0.01, [0.9, False]),
    "RMSProp": (["rho", "momentum", "epsilon"], 0.001, [0.9, 0.0, 1e-07]),
    "CenteredRMSProp": (["rho", "momentum", "epsilon"], 0.001, [0.9, 0.0, 1e-07]),
    "Adadelta": (["rho", "epsilon"], 0.001, [0.95, 1e-07]),
    "ProximalAdagrad": (
        [
            "initial_accumulator_value",
            "l1_regularization_strength",
            "l2_regularization_strength",
        ],
        0.001,
        [0.1, 0.0, 0.0],
    ),
    "ProximalYogi": (
        [
            "beta_1",
            "beta_2",
            "epsilon",
            "l1_regularization_strength",
            "l2_regularization_strength",
            "initial_accumulator_value",
        ],
        0.01,
        [0.9, 0.999, 1e-3, 0.0, 0.0, 1e-6],
    ),
}


@pytest.mark.parametrize("name", sorted(BEYOND_SIGNATURES))
def test_beyond_tensorflow_hyperparameters(name):
    hypers, rate, defaults = BEYOND_SIGNATURES[name]
    parameters = list(
        inspect.signature(getattr(teo.embedding, name)).parameters.values()
    )
    assert parameters[0].default == rate
    own = parameters[1 : 1 + len(hypers)]
    assert [p.name for p in own] == hypers
    assert [p.default for p in own] == defaults


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
@pytest.mark.parametrize("definition", TENSORFLOW_BACKED, ids=ids(TENSORFLOW_BACKED))
def test_attributes_and_hash_match_tensorflow(definition, data):
    arguments = data.draw(arguments_for(definition))
    ours = cls(definition)(**arguments)
    theirs = getattr(TF_EMBEDDING, definition.name)(**arguments)
    assert list(ours.__dict__.items()) == list(theirs.__dict__.items())
    assert hash(ours) == hash(theirs)
    assert ours == cls(definition)(**arguments)
    assert ours == theirs and theirs == ours


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), tag=st.integers(0, 7), num_hosts=st.integers(1, 4))
@pytest.mark.parametrize("definition", TENSORFLOW_BACKED, ids=ids(TENSORFLOW_BACKED))
def test_proto_bytes_match_tensorflow(definition, data, tag, num_hosts):
    arguments = data.draw(arguments_for(definition))
    ours = cls(definition)(**arguments)
    theirs = getattr(TF_EMBEDDING, definition.name)(**arguments)

    mine = OptimizationParameters()
    ours._set_optimization_parameters(mine)
    reference = OptimizationParameters()
    tensorflow_writable(theirs)._set_optimization_parameters(reference)
    assert mine.SerializeToString(deterministic=True) == reference.SerializeToString(
        deterministic=True
    )

    # The table-descriptor path writes the learning rate and packing too.
    table = TF_EMBEDDING.TableConfig(
        vocabulary_size=3, dim=2, name="t", optimizer=tensorflow_writable(theirs)
    )
    config = tpu_embedding_configuration_pb2.TPUEmbeddingConfiguration()
    descriptor = config.table_descriptor.add()
    index = (
        {arguments["learning_rate"]: tag}
        if callable(arguments["learning_rate"])
        else {}
    )
    table._set_table_descriptor(descriptor, num_hosts, index)
    written = teo.to_proto(ours, learning_rate_tag=tag if index else None)
    assert written.SerializeToString(
        deterministic=True
    ) == descriptor.optimization_parameters.SerializeToString(deterministic=True)
    # TensorFlow's own instances are accepted by to_proto (rebuilt as ours).
    assert teo.to_proto(theirs, learning_rate_tag=tag if index else None) == written


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), tag=st.integers(0, 7))
@pytest.mark.parametrize("definition", ALL, ids=ids(ALL))
def test_proto_matches_independent_rendering(definition, data, tag):
    arguments = data.draw(arguments_for(definition))
    opt = cls(definition)(**arguments)
    tag = tag if callable(arguments["learning_rate"]) else None
    written = teo.to_proto(opt, learning_rate_tag=tag)
    expected = expected_proto(definition.name, arguments, tag)
    assert written.SerializeToString(deterministic=True) == expected.SerializeToString(
        deterministic=True
    )


def _serialized(params):
    return params.SerializeToString(deterministic=True)


def _defaults(name):
    parameters = inspect.signature(getattr(teo.embedding, name)).parameters
    return {p.name: p.default for p in parameters.values() if p.name != "self"}


@pytest.mark.parametrize("definition", ALL, ids=ids(ALL))
def test_every_combination_written_and_read_as_the_field_table_says(definition):
    """Writer and reader over every accepted mix, edge values included."""
    name = definition.name
    defaults = _defaults(name)
    count = 0
    for given_arguments in every_combination(name):
        arguments = {**defaults, **given_arguments}
        opt = getattr(teo.embedding, name)(**given_arguments)
        tag = 3 if callable(arguments["learning_rate"]) else None
        expected = expected_proto(name, arguments, tag)
        written = teo.to_proto(opt, learning_rate_tag=tag)
        assert _serialized(written) == _serialized(expected), (arguments, written)
        rate = {"learning_rate": arguments["learning_rate"]} if tag is not None else {}
        back = teo.from_proto(_serialized(expected), **rate)
        assert type(back) is type(opt)
        read = teo.embedding.arguments(back)
        wanted = expected_arguments(name, arguments, defaults)
        assert {k: read[k] for k in wanted} == wanted, given_arguments
        count += 1
    # The enumeration really is exhaustive (guards against an empty generator).
    assert count >= 720


@pytest.mark.parametrize("definition", TENSORFLOW_BACKED, ids=ids(TENSORFLOW_BACKED))
def test_every_combination_written_as_tensorflow_writes_it(definition):
    name = definition.name
    for arguments in every_combination(name):
        theirs = getattr(TF_EMBEDDING, name)(**arguments)
        reference = OptimizationParameters()
        tensorflow_writable(theirs)._set_optimization_parameters(reference)
        mine = OptimizationParameters()
        getattr(teo.embedding, name)(**arguments)._set_optimization_parameters(mine)
        assert _serialized(mine) == _serialized(reference), arguments
        if arguments["learning_rate"] == 0.5:
            continue
        # The learning rate's forms: the whole table descriptor.
        table = TF_EMBEDDING.TableConfig(
            vocabulary_size=3, dim=2, name="t", optimizer=tensorflow_writable(theirs)
        )
        config = tpu_embedding_configuration_pb2.TPUEmbeddingConfiguration()
        descriptor = config.table_descriptor.add()
        dynamic = callable(arguments["learning_rate"])
        table._set_table_descriptor(
            descriptor, 1, {arguments["learning_rate"]: 2} if dynamic else {}
        )
        written = teo.to_proto(theirs, learning_rate_tag=2 if dynamic else None)
        assert _serialized(written) == _serialized(
            descriptor.optimization_parameters
        ), arguments


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
@pytest.mark.parametrize("definition", ALL, ids=ids(ALL))
def test_proto_round_trip(definition, data):
    arguments = data.draw(arguments_for(definition))
    opt = cls(definition)(**arguments)
    rate = arguments["learning_rate"]
    dynamic = callable(rate)
    params = teo.to_proto(opt, learning_rate_tag=0 if dynamic else None)
    kept = {
        h.name: arguments[h.name] for h in definition.hypers if h.proto_field is None
    }
    back = teo.from_proto(params, learning_rate=rate if dynamic else None, **kept)
    # A zero decay, and the multiply flag without a decay, are not in the proto.
    written = cls(definition)(**as_written(arguments))
    assert type(back) is type(opt)
    assert back == written
    assert hash(back) == hash(written)
    assert teo.to_proto(back, learning_rate_tag=0 if dynamic else None) == params
    # Serialized bytes are accepted as well.
    assert (
        teo.from_proto(
            params.SerializeToString(), learning_rate=rate if dynamic else None, **kept
        )
        == written
    )


def test_from_proto_reads_float32_as_shortest_decimal():
    opt = teo.embedding.Adam(learning_rate=0.001, beta_1=0.85, epsilon=1e-08)
    back = teo.from_proto(teo.to_proto(opt))
    assert back.learning_rate == 0.001
    assert back.beta_1 == 0.85
    assert back.epsilon == 1e-08


def test_from_proto_unspecified_accumulation_means_enabled():
    params = OptimizationParameters()
    params.learning_rate.constant = 0.5
    params.adagrad.SetInParent()
    opt = teo.from_proto(params, initial_accumulator_value=0.25)
    assert opt == teo.embedding.Adagrad(0.5, initial_accumulator_value=0.25)


@pytest.mark.parametrize("definition", ALL, ids=ids(ALL))
def test_slot_names_match_op_definitions(definition):
    load = op_def_registry.get(f"LoadTPUEmbedding{OP_NAMES[definition.name]}Parameters")
    retrieve = op_def_registry.get(
        f"RetrieveTPUEmbedding{OP_NAMES[definition.name]}Parameters"
    )
    opt = cls(definition)()
    expected = [name for name, _ in SLOTS[definition.name]]
    assert opt._slot_names() == expected
    assert [a.name for a in load.input_arg] == ["parameters"] + expected
    assert [a.name for a in retrieve.output_arg] == ["parameters"] + expected


@pytest.mark.parametrize("definition", ALL, ids=ids(ALL))
def test_slot_initial_values(definition):
    opt = cls(definition)()
    initializers = opt._slot_initializers()
    assert len(initializers) == len(SLOTS[definition.name])
    for initializer, (_, initial) in zip(initializers, SLOTS[definition.name]):
        value = getattr(opt, initial) if isinstance(initial, str) else initial
        tensor = initializer(shape=(3, 2), dtype=tf.float32)
        assert tf.reduce_all(tensor == value)


@pytest.mark.parametrize("definition", ALL, ids=ids(ALL))
def test_load_and_retrieve_ops_build_in_a_graph(definition):
    opt = cls(definition)()
    with tf.Graph().as_default() as graph:
        parameters = tf.zeros((4, 2))
        slots = {name: tf.zeros((4, 2)) for name in opt._slot_names()}
        load = opt._load()(
            parameters=parameters,
            **slots,
            table_name="t",
            num_shards=1,
            shard_id=0,
        )
        retrieved = opt._retrieve()(table_name="t", num_shards=1, shard_id=0)
    op_name = f"LoadTPUEmbedding{OP_NAMES[definition.name]}Parameters"
    assert load.type == op_name
    # The op reads the parameters, then each slot, in the op definition's order.
    fed = [parameters] + [slots[name] for name in opt._slot_names()]
    assert [t.name for t in load.inputs] == [t.name for t in fed]
    outputs = retrieved if isinstance(retrieved, (list, tuple)) else [retrieved]
    if slots:
        assert list(retrieved._fields) == ["parameters"] + opt._slot_names()
    assert len(outputs) == 1 + len(slots)
    assert all(o.op.type == f"Retrieve{op_name[4:]}" for o in outputs)
    types = {op.type for op in graph.get_operations()}
    assert f"RetrieveTPUEmbedding{OP_NAMES[definition.name]}Parameters" in types


@pytest.mark.parametrize("definition", ALL, ids=ids(ALL))
def test_slots_created_by_tpu_embedding_on_cpu(definition):
    table = TF_EMBEDDING.TableConfig(vocabulary_size=5, dim=3, name="t")
    feature = TF_EMBEDDING.FeatureConfig(table=table)
    embedding = TF_EMBEDDING.TPUEmbedding(feature, cls(definition)(0.5))
    embedding.build()
    variables = embedding._variables["t"]
    assert sorted(variables) == sorted(["parameters"] + cls(definition)()._slot_names())
    for name, initial in SLOTS[definition.name]:
        value = (
            getattr(table.optimizer, initial) if isinstance(initial, str) else initial
        )
        assert tf.reduce_all(variables[name] == value)


@pytest.mark.parametrize("arity", [2, 3])
def test_slot_variable_creation_fn_both_forms(arity):
    calls = []

    def two(table, slot_names):
        calls.append(("two", list(slot_names)))
        return {n: tf.Variable(tf.fill(table.shape, 7.0), name=n) for n in slot_names}

    def three(table, slot_names, initializers):
        calls.append(("three", list(slot_names), len(initializers)))
        return {
            n: tf.Variable(init(table.shape, dtype=tf.float32), name=n)
            for n, init in zip(slot_names, initializers)
        }

    fn = two if arity == 2 else three
    opt = teo.embedding.FTRL(
        0.1, initial_accumulator_value=0.3, slot_variable_creation_fn=fn
    )
    table = TF_EMBEDDING.TableConfig(vocabulary_size=4, dim=2, name="t", optimizer=opt)
    embedding = TF_EMBEDDING.TPUEmbedding(TF_EMBEDDING.FeatureConfig(table=table), None)
    embedding.build()
    variables = embedding._variables["t"]
    if arity == 2:
        assert calls == [("two", ["accumulators", "linears"])]
        assert tf.reduce_all(variables["accumulators"] == 7.0)
    else:
        assert calls == [("three", ["accumulators", "linears"], 2)]
        assert tf.reduce_all(variables["accumulators"] == 0.3)
        assert tf.reduce_all(variables["linears"] == 0.0)


def test_accepted_by_table_config_and_serving():
    opt = teo.embedding.Momentum(0.1, momentum=0.5)
    table = TF_EMBEDDING.TableConfig(vocabulary_size=4, dim=2, name="t", optimizer=opt)
    serving = TF_EMBEDDING.TPUEmbeddingForServing(
        TF_EMBEDDING.FeatureConfig(table=table), opt
    )
    serving.build()
    assert "t" in {t.name for t in serving.embedding_tables}


def test_repr_is_readable_and_rebuilds():
    opt = teo.embedding.Adam(0.1, lazy_adam=False, clipvalue=1.0)
    text = repr(opt)
    assert text == (
        "Adam(learning_rate=0.1, beta_1=0.9, beta_2=0.999, epsilon=1e-07, "
        "lazy_adam=False, sum_inside_sqrt=True, clipvalue=(-1.0, 1.0))"
    )
    assert eval(text, {"Adam": teo.embedding.Adam}) == opt


def test_class_docstrings_state_update_rule_and_slots():
    for definition in registry.DEFINITIONS:
        doc = cls(definition).__doc__
        assert definition.math in doc
        for slot in definition.slots:
            assert slot.name in doc


@pytest.mark.parametrize("name", list(parameters.embedding_classes()))
def test_class_docstrings_name_every_argument_in_the_signatures_order(name):
    """`help(teo.embedding.FTRL)` lists each argument the constructor takes,
    once and in its order (FTRL's late arguments after the shared ones), and
    `slot_variable_creation_fn` only where TensorFlow's class takes it; then
    each slot, or `none` (SGD)."""
    embedding_class = getattr(teo.embedding, name)
    args = embedding_class.__doc__.split("\nArgs:\n")[1].split("\n\n")[0]
    listed = re.findall(r"^  (\w+): \S", args, flags=re.MULTILINE)
    assert listed == list(inspect.signature(embedding_class).parameters)
    assert ("slot_variable_creation_fn" in listed) == (name != "SGD")
    slots = embedding_class.__doc__.split(
        "\nSlots (names of the load/retrieve op inputs):\n"
    )[1]
    named = re.findall(r"^  (\w+)", slots, flags=re.MULTILINE)
    expected = [slot.name for slot in embedding_class._definition.slots]
    assert named == (expected or ["none"])


def test_tensorflow_class_rebuilds_as_ours():
    theirs = TF_EMBEDDING.FTRL(
        0.2, l1_regularization_strength=0.5, clipvalue=(None, 3.0)
    )
    mine = proto.as_embedding_optimizer(theirs)
    assert type(mine) is teo.embedding.FTRL
    assert list(mine.__dict__.items()) == list(theirs.__dict__.items())
