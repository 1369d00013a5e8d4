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


_ADAGRAD = registry.BY_NAME["Adagrad"]
_FTRL = registry.BY_NAME["FTRL"]


def _replaced(definition, **changes):
    """`definition` declared again with each field in `changes` replaced by
    a function of its current value."""
    fields = {
        name: change(getattr(definition, name)) for name, change in changes.items()
    }
    return dataclasses.replace(definition, **fields)


# What an author of a new algorithm module could get wrong, and what the
# definition says as it is declared (each fault alone).
_FAULTS = [
    (
        "a hyperparameter twice",
        lambda: _replaced(_ADAGRAD, hypers=lambda h: h + h[:1]),
        r"Definition Adagrad: signature \('learning_rate', "
        r"'initial_accumulator_value', 'initial_accumulator_value', .* does "
        r"not list exactly \['clip_weight_max', ",
    ),
    (
        "a check of no hyperparameter",
        lambda: _replaced(
            _FTRL, tensorflow=lambda t: dataclasses.replace(t, checks=("nope",))
        ),
        r"Definition FTRL: tensorflow_checks names unknown hyperparameters "
        r"\['nope'\]\.",
    ),
    (
        "a slot starting at no hyperparameter",
        lambda: _replaced(
            _ADAGRAD, slots=lambda s: (dataclasses.replace(s[0], initial="nope"),)
        ),
        r"Definition Adagrad: slot accumulators starts at unknown "
        r"hyperparameter 'nope'\.",
    ),
    (
        "a slot starting at no Keras argument",
        lambda: _replaced(
            _FTRL,
            slots=lambda s: (s[0], dataclasses.replace(s[1], keras_initial="nope")),
        ),
        r"Definition FTRL: slot linears starts at unknown Keras argument 'nope'\.",
    ),
    (
        "SparseCore's record listing what is no hyperparameter",
        lambda: _replaced(
            _FTRL,
            sparsecore=lambda c: dataclasses.replace(
                c, dropped={**c.dropped, "nope": (False, "planted")}
            ),
        ),
        r"Definition FTRL: its SparseCore record \(FTRL\) does not list each "
        r"hyperparameter of \['allow_zero_accumulator', .*\] exactly once: "
        r"\[.*'nope'\]\.",
    ),
    (
        "SparseCore's record of another algorithm",
        lambda: _replaced(
            _FTRL,
            sparsecore=lambda c: dataclasses.replace(c, definition="Adagrad"),
        ),
        r"^Definition FTRL: its SparseCore record is Adagrad's\.$",
    ),
    (
        "a jax-tpu-embedding slot of no slot",
        lambda: _replaced(
            _FTRL,
            jax=lambda j: dataclasses.replace(j, slots={**j.slots, "nope": "x"}),
        ),
        r"Definition FTRL: its jax-tpu-embedding face names unknown arguments "
        r"or slots \['nope'\]\.",
    ),
    (
        "a Keras argument of no hyperparameter",
        lambda: _replaced(
            _FTRL,
            keras=lambda k: dataclasses.replace(
                k, arguments=(*k.arguments, spec.KerasArg(hyper="nope"))
            ),
        ),
        r"^Definition FTRL: a Keras argument, leaves \['name', 'default', 'kind', "
        r"'doc', 'bounds'\] to inherit, but names no hyperparameter of it "
        r"\(hyper='nope'; it has \['allow_zero_accumulator', .*\]\)\.$",
    ),
    (
        "state per row on the engines",
        lambda: _replaced(
            _ADAGRAD,
            slots=lambda s: (dataclasses.replace(s[0], per_row=True),),
        ),
        r"^Definition Adagrad: a step scaled per variable or state per row "
        r"runs on no engine and takes no engine options, but it has a "
        r"TensorFlow face \(a proto\), a jax-tpu-embedding face, engine "
        r"options on its Keras face\.$",
    ),
]


@pytest.mark.parametrize(
    "make, message", [f[1:] for f in _FAULTS], ids=[f[0] for f in _FAULTS]
)
def test_a_faulty_definition_is_refused_as_it_is_declared(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_jax_fields_that_are_no_mapping_are_refused_as_declared():
    with pytest.raises(
        TypeError,
        match=r"Definition FTRL: JaxFace\.fields must map an argument to the "
        r"spec's field of another name; received \('linear',\)\.",
    ):
        _replaced(_FTRL, jax=lambda j: dataclasses.replace(j, fields=("linear",)))


def test_every_registered_definition_declares_again_unchanged():
    """The faults above are each one change from a registered definition,
    which is itself accepted when declared again from its own fields."""
    for definition in registry.ALL:
        assert dataclasses.replace(definition) == definition


def test_a_definition_is_shown_by_its_name_and_summary():
    """Its dataclass repr spelled every field (about 5,000 characters for
    Adam), where a checkpoint's reader or `load_into_keras` shows a table's
    algorithm."""
    assert repr(registry.BY_NAME["Adam"]) == (
        "<Definition 'Adam': Adam without bias correction (supply it through "
        "the learning rate).>"
    )
    for definition in registry.ALL:
        shown = repr(definition)
        assert "\n" not in shown and len(shown) < 200, shown
