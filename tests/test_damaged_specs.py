"""Damaged `OptimizerSpec`s are refused; they never come back as another optimizer.

Oracles: the optimizer that went into `to_spec` (equality on the embedding face,
`get_config` on the Keras face) and the protobuf wire format (a spec cut at a
field boundary parses without error, so only the reader can notice what is
missing).
"""

import keras
import pytest
from google.protobuf import text_format

import tf_tpu_embed_opt as teo
from tf_tpu_embed_opt import optimizer_spec


def _rate():
    return 0.05


def _specs():
    """(id, optimizer, to_spec keywords, from_spec keywords), both faces."""
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)
    return [
        ("embedding-adam", teo.embedding.Adam(0.01, beta_1=0.7), {}, {}),
        (
            "embedding-ftrl",
            teo.embedding.FTRL(0.2, clipvalue=(-1.0, 2.0), beta=0.5),
            {},
            {},
        ),
        (
            "embedding-yogi-dynamic",
            teo.embedding.ProximalYogi(_rate, beta_1=0.8),
            {"learning_rate_tag": 3},
            {"learning_rate": _rate},
        ),
        (
            "keras-twin-of-tpu-adam",
            teo.to_keras(teo.embedding.Adam(0.01, beta_1=0.7)),
            {},
            {},
        ),
        (
            "keras-rmsprop",
            teo.optimizers.RMSprop(0.01, centered=True, momentum=0.5),
            {},
            {},
        ),
        ("keras-adagrad-schedule", teo.optimizers.Adagrad(schedule), {}, {}),
        ("keras-clippy", teo.optimizers.ClippyAdagrad(0.1), {}, {}),
    ]


SPECS = _specs()


def _same(a, b):
    if isinstance(a, keras.optimizers.Optimizer):
        return type(a) is type(b) and a.get_config() == b.get_config()
    return type(a) is type(b) and list(a.__dict__.items()) == list(b.__dict__.items())


@pytest.mark.parametrize("name, opt, write, read", SPECS, ids=[s[0] for s in SPECS])
def test_every_truncation_is_refused_or_identical(name, opt, write, read):
    data = teo.to_spec(opt, **write).SerializeToString()
    whole = teo.from_spec(data, **read)
    assert _same(whole, opt)
    accepted = []
    for cut in range(len(data)):
        try:
            back = teo.from_spec(data[:cut], **read)
        except ValueError as error:
            assert str(error).startswith("from_spec: "), (cut, error)
            continue
        assert _same(back, opt), (cut, back)
        accepted.append(cut)
    # Only a cut right before `optimization_parameters` (the last field) keeps
    # every argument; it gives back the same optimizer.
    spec = teo.to_spec(opt, **write)
    if spec.HasField("optimization_parameters"):
        without = optimizer_spec.OptimizerSpec()
        without.CopyFrom(spec)
        without.ClearField("optimization_parameters")
        assert accepted == [len(without.SerializeToString())]
    else:
        assert accepted == []


def test_adam_cut_after_the_learning_rate_is_refused_naming_what_is_missing():
    """The issue's example: beta_1=0.7 must not come back as 0.9."""
    spec = teo.to_spec(teo.embedding.Adam(0.01, beta_1=0.7))
    cut = optimizer_spec.OptimizerSpec()
    cut.CopyFrom(spec)
    del cut.arguments[:]
    cut.ClearField("optimization_parameters")
    with pytest.raises(ValueError, match="lacks argument") as info:
        teo.from_spec(cut.SerializeToString())
    message = str(info.value)
    for name in ("`beta_1`", "`beta_2`", "`epsilon`", "`lazy_adam`", "`clipvalue`"):
        assert name in message
    assert "truncated" in message


@pytest.mark.parametrize("name, opt, write, read", SPECS, ids=[s[0] for s in SPECS])
def test_each_missing_argument_is_named(name, opt, write, read):
    spec = teo.to_spec(opt, **write)
    for index in range(len(spec.arguments)):
        damaged = optimizer_spec.OptimizerSpec()
        damaged.CopyFrom(spec)
        missing = damaged.arguments[index].name
        del damaged.arguments[index]
        with pytest.raises(ValueError, match=f"lacks argument\\(s\\) `{missing}`;"):
            teo.from_spec(damaged, **read)


def test_embedding_parameters_that_disagree_are_refused():
    spec = teo.to_spec(teo.embedding.Adam(0.01, beta_1=0.7))
    spec.optimization_parameters.adam.beta1 = 0.9
    with pytest.raises(ValueError, match="disagree"):
        teo.from_spec(spec)


def test_keras_parameters_that_disagree_are_refused():
    spec = teo.to_spec(teo.to_keras(teo.embedding.Adam(0.01, beta_1=0.7)))
    assert spec.HasField("optimization_parameters")
    spec.optimization_parameters.adam.beta1 = 0.9
    with pytest.raises(ValueError, match="disagree with the arguments of the Adam"):
        teo.from_spec(spec)


def test_keras_parameters_for_an_optimizer_the_engine_cannot_run_are_refused():
    spec = teo.to_spec(teo.optimizers.ClippyAdagrad(0.1))
    assert not spec.HasField("optimization_parameters")
    spec.optimization_parameters.CopyFrom(teo.to_proto(teo.embedding.Adagrad(0.1)))
    with pytest.raises(ValueError, match="cannot run this ClippyAdagrad"):
        teo.from_spec(spec)
    amsgrad = teo.to_spec(teo.optimizers.Adam(0.01, amsgrad=True))
    amsgrad.optimization_parameters.CopyFrom(teo.to_proto(teo.embedding.Adam(0.01)))
    with pytest.raises(ValueError, match="inconsistent"):
        teo.from_spec(amsgrad)


def test_a_keras_twin_with_a_dynamic_tag_round_trips():
    # Keras Adam's bias correction makes the engine's learning rate dynamic;
    # the check reads the tag the spec was written with.
    opt = teo.optimizers.Adam(0.01)
    spec = teo.to_spec(opt, learning_rate_tag=4)
    params = spec.optimization_parameters
    assert params.learning_rate.dynamic.tag == 4
    assert teo.from_spec(spec.SerializeToString()).get_config() == opt.get_config()


@pytest.mark.parametrize("data", [b"", ""])
def test_an_empty_spec_is_refused_as_empty(data):
    with pytest.raises(ValueError, match="the spec is empty"):
        teo.from_spec(data)


def test_the_text_format_is_held_to_the_same_rule():
    spec = teo.to_spec(teo.embedding.Adagrad(0.1, initial_accumulator_value=0.5))
    text = text_format.MessageToString(spec)
    kept = [
        line
        for line in text.split("arguments {")
        if "initial_accumulator_value" not in line
    ]
    with pytest.raises(ValueError, match="`initial_accumulator_value`"):
        teo.from_spec("arguments {".join(kept))
