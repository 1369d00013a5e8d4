"""Malformed input ends in ValueError/TypeError, never a crash or a wrong optimizer.

Random and truncated bytes, mutated numeric fields and unknown keys are fed to
every reader (`from_proto`, `from_spec`, `from_config`). A reader either refuses
with `ValueError`/`TypeError`, or returns an optimizer whose own proto or spec
reads back to the same optimizer.
"""

import keras
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tf_tpu_embed_opt as teo
from tf_tpu_embed_opt.definitions import registry

CLEAN = (ValueError, TypeError)
SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def _sample_protos():
    return [
        teo.to_proto(teo.embedding.class_for(d)()).SerializeToString()
        for d in registry.DEFINITIONS
    ]


PROTOS = _sample_protos()
SPECS = [
    teo.to_spec(teo.embedding.class_for(d)()).SerializeToString()
    for d in registry.DEFINITIONS
] + [teo.to_spec(teo.optimizers.Adam()).SerializeToString()]


def _read_proto(data):
    try:
        opt = teo.from_proto(data)
    except CLEAN:
        return
    # Accepted: a valid optimizer that its own proto reproduces exactly.
    assert teo.from_proto(teo.to_proto(opt)) == opt


@SETTINGS
@given(data=st.binary(max_size=200))
def test_from_proto_random_bytes(data):
    _read_proto(data)


@SETTINGS
@given(index=st.integers(0, len(PROTOS) - 1), cut=st.integers(0, 200))
def test_from_proto_truncated(index, cut):
    _read_proto(PROTOS[index][:cut])


@SETTINGS
@given(
    index=st.integers(0, len(PROTOS) - 1),
    position=st.integers(0, 400),
    byte=st.integers(0, 255),
)
def test_from_proto_flipped_byte(index, position, byte):
    data = bytearray(PROTOS[index])
    if data:
        data[position % len(data)] = byte
    _read_proto(bytes(data))


@pytest.mark.parametrize(
    "field,value",
    [
        ("adam.beta1", float("nan")),
        ("adam.beta2", float("inf")),
        ("adam.epsilon", -1.0),
        ("learning_rate.constant", float("-inf")),
        ("learning_rate.constant", -0.5),
        ("weight_decay_factor", float("nan")),
        ("clipping_limits.lower.value", float("nan")),
    ],
)
def test_from_proto_out_of_range_values(field, value):
    params = teo.to_proto(teo.embedding.Adam(0.1))
    target = params
    *parents, leaf = field.split(".")
    for parent in parents:
        target = getattr(target, parent)
    setattr(target, leaf, value)
    with pytest.raises(ValueError):
        teo.from_proto(params)


def _read_spec(data):
    try:
        opt = teo.from_spec(data)
    except CLEAN:
        return
    again = teo.from_spec(teo.to_spec(opt))
    if isinstance(opt, keras.optimizers.Optimizer):
        assert again.get_config() == opt.get_config()
    else:
        assert again == opt


@SETTINGS
@given(data=st.binary(max_size=300))
def test_from_spec_random_bytes(data):
    _read_spec(data)


@SETTINGS
@given(index=st.integers(0, len(SPECS) - 1), cut=st.integers(0, 600))
def test_from_spec_truncated(index, cut):
    _read_spec(SPECS[index][:cut])


@SETTINGS
@given(text=st.text(max_size=200))
def test_from_spec_random_text(text):
    _read_spec(text)


@pytest.mark.parametrize(
    "config,error",
    [
        ({"epsilon": "small"}, TypeError),
        ({"epsilon": -1.0}, ValueError),
        ({"initial_accumulator_value": None}, TypeError),
        ({"unknown_key": 1}, ValueError),
        ({"clip_weight_min": 1.0, "clip_weight_max": 0.0}, ValueError),
        ({"multiply_weight_decay_factor_by_learning_rate": "yes"}, TypeError),
    ],
)
def test_from_config_bad_keys(config, error):
    base = teo.optimizers.Adagrad().get_config()
    base.update(config)
    with pytest.raises(error):
        teo.optimizers.Adagrad.from_config(base)


def test_from_config_round_trip_is_exact_for_every_key():
    optimizer = teo.optimizers.Ftrl(
        0.3,
        l1_regularization_strength=0.1,
        multiply_linear_by_learning_rate=True,
        clip_weight_max=2.0,
    )
    config = optimizer.get_config()
    assert teo.optimizers.Ftrl.from_config(dict(config)).get_config() == config
    assert (
        keras.optimizers.deserialize(keras.optimizers.serialize(optimizer)).get_config()
        == config
    )


@pytest.mark.parametrize(
    "cls",
    [teo.optimizers.Adagrad, teo.optimizers.RMSprop, teo.optimizers.ClippyAdagrad],
)
def test_from_config_missing_keys_take_defaults_as_in_keras(cls):
    config = cls(epsilon=0.5).get_config()
    del config["epsilon"]
    rebuilt = cls.from_config(config).get_config()
    expected = cls(name=config["name"]).get_config()
    assert rebuilt == expected
    # Keras's from_config calls cls(**config): a non-mapping is a TypeError.
    stock = getattr(keras.optimizers, cls.__name__, keras.optimizers.Adagrad)
    for optimizer_class in (cls, stock):
        with pytest.raises(TypeError):
            optimizer_class.from_config(["not", "a", "dict"])
