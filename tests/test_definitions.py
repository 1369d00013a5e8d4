"""What a definition leaves implied is filled in from what it says once.

A hyperparameter's proto field is its own name on the TensorFlow engines
unless it says another (a slot's initial value is never in the proto); a
Keras face's default learning rate is the embedding face's unless it says
another. Checked on a definition built here and, against TensorFlow's own
`OptimizationParameters` messages, on every registered one.
"""

# The first two tests run without TensorFlow.

import dataclasses

import pytest

from tf_tpu_embed_opt.definitions import registry, spec


def _definition(tensorflow, hypers, keras):
    return spec.Definition(
        name="Planted",
        learning_rate_default=0.05,
        hypers=hypers,
        slots=(spec.Slot("accumulators", "initial_accumulator_value", "Σ g²."),),
        rule=lambda xp, w, slots, g, lr, h: (w - lr * g, dict(slots)),
        summary="planted",
        math="w ← w − η·g",
        sources="tests/test_definitions.py",
        tensorflow=tensorflow,
        keras=keras,
    )


HYPERS = (
    spec.Hyper("beta", 0.5, "float", "Own name."),
    spec.Hyper("beta_2", 0.5, "float", "Another name.", proto_field="beta2"),
    spec.Hyper("local", 0.5, "float", "Not in the proto.", proto_field=None),
    spec.Hyper("initial_accumulator_value", 0.1, "float", "A slot's start."),
)


def test_a_hyperparameters_proto_field_is_its_own_name_unless_it_says():
    on_tensorflow = _definition(
        spec.TensorFlowFace("adagrad", "Adagrad"), HYPERS, spec.KerasFace("Planted")
    )
    assert [h.proto_field for h in on_tensorflow.hypers] == [
        "beta",
        "beta2",
        None,
        None,
    ]
    # What else the definition holds of them is as given.
    assert [h.name for h in on_tensorflow.hypers] == [h.name for h in HYPERS]
    assert [h.default for h in on_tensorflow.hypers] == [h.default for h in HYPERS]
    # Off the TensorFlow engines there is no proto: only what is said stays.
    elsewhere = _definition(None, HYPERS, spec.KerasFace("Planted"))
    assert [h.proto_field for h in elsewhere.hypers] == [None, "beta2", None, None]


def test_sparsecores_record_takes_what_its_definition_says():
    """The definition's name, its SparseCore kernel (the name in snake case),
    the hyperparameters that start slots and those the op receives."""
    record = _definition(
        spec.TensorFlowFace("adagrad", "Adagrad"),
        HYPERS,
        None,
    )
    record = dataclasses.replace(
        record, name="PlantedMomentum", sparsecore=spec.SparseCoreOptimizer()
    ).sparsecore
    assert record.definition == "PlantedMomentum"
    assert record.op == spec.SparseCoreOptimizer.op_of("planted_momentum")
    assert record.slot_hypers == ("initial_accumulator_value",)
    assert record.attributes == {"beta": "beta", "beta_2": "beta_2", "local": "local"}
    said = spec.SparseCoreOptimizer("X", "op", {"beta": "b1"}, ("local",))
    said = said.completed("Planted", ("beta", "local"), ())
    assert (said.definition, said.op, said.slot_hypers) == ("X", "op", ("local",))
    assert said.attributes == {"beta": "b1"}


def test_the_keras_default_learning_rate_is_the_embedding_faces_unless_it_says():
    implied = _definition(None, HYPERS, spec.KerasFace("Planted"))
    assert implied.keras.learning_rate == 0.05
    said = _definition(None, HYPERS, spec.KerasFace("Planted", learning_rate=0.2))
    assert said.keras.learning_rate == 0.2
    for d in registry.ALL:
        if d.keras is not None:
            assert isinstance(d.keras.learning_rate, float), d.name


def test_every_implied_proto_field_is_a_field_of_tensorflows_message():
    """The names filled in are those of TensorFlow's own proto: each
    registered algorithm's hyperparameters map onto distinct fields of its
    `OptimizationParameters` member; only slots' initial values have none."""
    pytest.importorskip("tensorflow")
    from tensorflow.core.protobuf.tpu import optimization_parameters_pb2 as pb

    members = pb.OptimizationParameters.DESCRIPTOR.fields_by_name
    for d in registry.DEFINITIONS:
        fields = members[d.proto_oneof].message_type.fields_by_name
        starts = {s.initial for s in d.slots if isinstance(s.initial, str)}
        named = [h.proto_field for h in d.hypers if h.proto_field is not None]
        assert len(set(named)) == len(named), d.name
        for hyper in d.hypers:
            if hyper.proto_field is None:
                assert hyper.name in starts, (d.name, hyper.name)
            else:
                assert hyper.proto_field in fields, (d.name, hyper.proto_field)


def test_jax_fields_map_only_the_names_that_differ():
    """Every other field is implied: a list of names is refused, naming the
    definition and the value; a field of no Keras argument is refused."""
    planted = _definition(None, HYPERS, spec.KerasFace("Planted"))
    names = [h.name for h in HYPERS]
    implied = dataclasses.replace(planted, jax=spec.JaxFace("PlantedSpec"))
    assert dict(implied.jax.fields) == {name: name for name in names}
    renamed = dataclasses.replace(
        planted, jax=spec.JaxFace("PlantedSpec", fields={"beta": "b"})
    )
    assert dict(renamed.jax.fields) == {"beta": "b", **{n: n for n in names[1:]}}
    with pytest.raises(
        TypeError, match=r"Planted: JaxFace.fields must map .*\('beta',\)"
    ):
        dataclasses.replace(planted, jax=spec.JaxFace("PlantedSpec", fields=("beta",)))
    with pytest.raises(ValueError, match=r"Planted: .* fields of no Keras argument"):
        dataclasses.replace(
            planted, jax=spec.JaxFace("PlantedSpec", fields={"gamma": "g"})
        )
