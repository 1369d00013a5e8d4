"""The project's OptimizerSpec proto: round trips, versions, staleness, hostile input.

Oracles: equality and `get_config` of the optimizers themselves (round trips
must give back what went in), `to_proto` for the embedded engine parameters,
and protoc (grpcio-tools) recompiling the `.proto` source for the checked-in
descriptor.
"""

import importlib.util
import pathlib
import re
import sys

import keras
import pytest
from conftest import arguments_for
from google.protobuf import text_format
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tf_tpu_embed_opt as teo
from tf_tpu_embed_opt import optimizer_spec
from tf_tpu_embed_opt.definitions import registry

ROOT = pathlib.Path(__file__).resolve().parent.parent
ALL = list(registry.DEFINITIONS)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), tag=st.integers(0, 5))
@pytest.mark.parametrize("definition", ALL, ids=[d.name for d in ALL])
def test_embedding_round_trip(definition, data, tag):
    arguments = data.draw(arguments_for(definition))
    opt = teo.embedding.class_for(definition)(**arguments)
    rate = arguments["learning_rate"]
    dynamic = callable(rate)
    spec = teo.to_spec(opt, learning_rate_tag=tag if dynamic else None)
    assert spec.spec_version == optimizer_spec.SPEC_VERSION
    assert spec.face == optimizer_spec.Face.EMBEDDING
    assert spec.optimization_parameters == teo.to_proto(
        opt, learning_rate_tag=tag if dynamic else None
    )
    back_rate = {"learning_rate": rate} if dynamic else {}
    for form in (spec, spec.SerializeToString(), text_format.MessageToString(spec)):
        back = teo.from_spec(form, **back_rate)
        assert type(back) is type(opt)
        assert back == opt
        # Nothing lost: even values the engine proto cannot hold survive.
        assert list(back.__dict__.items()) == list(opt.__dict__.items())


def test_embedding_values_the_engine_proto_cannot_hold_survive():
    opt = teo.embedding.ProximalYogi(
        0.123456789, initial_accumulator_value=0.3333333333333, epsilon=1e-3
    )
    back = teo.from_spec(teo.to_spec(opt))
    assert back.initial_accumulator_value == 0.3333333333333
    assert back.learning_rate == 0.123456789
    assert teo.from_proto(teo.to_proto(opt)).initial_accumulator_value == 1e-6


KERAS_CASES = [
    lambda: teo.optimizers.SGD(0.1, momentum=0.9, nesterov=True),
    lambda: teo.optimizers.Adagrad(0.05, epsilon=0.0, clip_weight_min=-1.0),
    lambda: teo.optimizers.AdagradMomentum(0.1, momentum=0.5, exponent=3),
    lambda: teo.optimizers.Adam(amsgrad=True, weight_decay=0.01, clipnorm=1.0),
    lambda: teo.optimizers.Adam(0.01, lazy=True, sum_inside_sqrt=True),
    lambda: teo.optimizers.Ftrl(l2_shrinkage_regularization_strength=0.1),
    lambda: teo.optimizers.Momentum(use_nesterov=True, clip_gradient_max=2.0),
    lambda: teo.optimizers.RMSprop(centered=True, momentum=0.3),
    lambda: teo.optimizers.Adadelta(use_ema=True, ema_overwrite_frequency=3),
    lambda: teo.optimizers.ProximalAdagrad(gradient_accumulation_steps=4),
    lambda: teo.optimizers.ProximalYogi(
        keras.optimizers.schedules.ExponentialDecay(0.1, 100, 0.9)
    ),
    lambda: teo.optimizers.ClippyAdagrad(0.2, export_clipping_factors=True),
    # jax-tpu-embedding's own algorithms.
    lambda: teo.optimizers.LaProp(0.01, beta_2=0.9, initial_slot_value=0.5),
    lambda: teo.optimizers.F2A(
        keras.optimizers.schedules.ExponentialDecay(0.1, 100, 0.9), rho=0.7
    ),
    lambda: teo.optimizers.ClippyAdagrad(use_standard_accumulator_update=True),
]


@pytest.mark.parametrize("make", KERAS_CASES, ids=range(len(KERAS_CASES)))
def test_keras_round_trip(make):
    opt = make()
    spec = teo.to_spec(opt)
    assert spec.face == optimizer_spec.Face.KERAS
    assert spec.algorithm == type(opt).__name__
    for form in (spec, spec.SerializeToString(), text_format.MessageToString(spec)):
        back = teo.from_spec(form)
        assert type(back) is type(opt)
        assert back.get_config() == opt.get_config()


def test_every_keras_class_round_trips():
    classes = [
        getattr(teo.optimizers, name)
        for name in teo.optimizers.__all__
        if name != "TwinOptimizer"
        and isinstance(getattr(teo.optimizers, name), type)
        and issubclass(getattr(teo.optimizers, name), keras.optimizers.Optimizer)
    ]
    assert {"LaProp", "F2A", "ClippyAdagrad", "Adam"} <= {c.__name__ for c in classes}
    for cls in classes:
        opt = cls()
        back = teo.from_spec(teo.to_spec(opt).SerializeToString())
        assert type(back) is cls
        assert back.get_config() == opt.get_config()


def test_keras_spec_embeds_engine_parameters_when_the_engine_can_run_it():
    exact = teo.to_spec(teo.optimizers.Adagrad(0.1, epsilon=0.0))
    assert exact.optimization_parameters.WhichOneof("parameters") == "adagrad"
    assert exact.optimization_parameters.learning_rate.constant == pytest.approx(0.1)
    adam = teo.to_spec(teo.optimizers.Adam(), learning_rate_tag=3)
    # Keras Adam's bias correction: a dynamic learning rate on the engine.
    assert adam.optimization_parameters.learning_rate.dynamic.tag == 3
    assert adam.optimization_parameters.adam.use_non_lazy_adam
    assert not teo.to_spec(teo.optimizers.Adam(amsgrad=True)).HasField(
        "optimization_parameters"
    )
    assert not teo.to_spec(teo.optimizers.ClippyAdagrad()).HasField(
        "optimization_parameters"
    )
    # No TPUEmbedding proto has LaProp.
    assert not teo.to_spec(teo.optimizers.LaProp()).HasField("optimization_parameters")


def test_newer_version_is_refused():
    spec = teo.to_spec(teo.embedding.SGD(0.1))
    spec.spec_version = optimizer_spec.SPEC_VERSION + 1
    with pytest.raises(ValueError, match="newer tf_tpu_embed_opt"):
        teo.from_spec(spec)


def _spec_text(**fields):
    spec = teo.to_spec(teo.embedding.Adagrad(0.1))
    for name, value in fields.items():
        setattr(spec, name, value)
    return spec


HOSTILE = [
    (b"\xff\xfe\x00garbage", ValueError, "not an OptimizerSpec"),
    ('face: KERAS algorithm: "Adagrad"', ValueError, "spec_version"),
    ("not a proto", ValueError, "text format"),
    (42, TypeError, "`spec`"),
    (_spec_text(spec_version=0), ValueError, "spec_version"),
    (_spec_text(face=0), ValueError, "face"),
    (_spec_text(algorithm="Lion"), ValueError, "Lion"),
]


@pytest.mark.parametrize("spec,error,fragment", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_specs(spec, error, fragment):
    with pytest.raises(error, match=fragment):
        teo.from_spec(spec)


def test_inconsistent_or_invalid_arguments_are_refused():
    spec = teo.to_spec(teo.embedding.Adam(0.1))
    for argument in spec.arguments:
        if argument.name == "beta_1":
            argument.number = 0.5
    with pytest.raises(ValueError, match="disagree"):
        teo.from_spec(spec)
    for argument in spec.arguments:
        if argument.name == "beta_1":
            argument.number = 1.5
    spec.ClearField("optimization_parameters")
    with pytest.raises(ValueError, match="beta_1"):
        teo.from_spec(spec)
    for argument in spec.arguments:
        if argument.name == "beta_1":
            argument.number = float("nan")
    # The spec's own words, not a constructor's that also refuses it.
    with pytest.raises(ValueError, match=r"`beta_1` is nan; values must be finite"):
        teo.from_spec(spec)
    extra = teo.to_spec(teo.embedding.SGD(0.1))
    extra.arguments.add(name="momentum", number=0.9)
    with pytest.raises(ValueError, match=r"SGD has no argument\(s\) \['momentum'\]"):
        teo.from_spec(extra)
    rateless = teo.to_spec(teo.embedding.SGD(0.1))
    rateless.ClearField("learning_rate")
    with pytest.raises(ValueError, match="needs `learning_rate.constant` or"):
        teo.from_spec(rateless)
    duplicate = teo.to_spec(teo.embedding.SGD(0.1))
    duplicate.arguments.add(name="clip_weight_min", number=0.0)
    with pytest.raises(ValueError, match="more than once"):
        teo.from_spec(duplicate)
    keras_spec = teo.to_spec(teo.optimizers.Adagrad())
    keras_spec.arguments.add(name="bogus", flag=True)
    with pytest.raises(ValueError, match="bogus"):
        teo.from_spec(keras_spec)


def test_dynamic_learning_rate_needs_the_callable():
    rate = lambda: 0.1  # noqa: E731
    spec = teo.to_spec(teo.embedding.Adagrad(rate), learning_rate_tag=2)
    assert spec.learning_rate.dynamic_tag == 2
    with pytest.raises(ValueError, match="dynamic learning rate"):
        teo.from_spec(spec)
    assert teo.from_spec(spec, learning_rate=rate) == teo.embedding.Adagrad(rate)
    # A value that is no callable is the wrong kind, not missing (it was
    # told to "pass the callable"), as from_proto says.
    with pytest.raises(TypeError, match=r"must be a callable .*received 0\.1"):
        teo.from_spec(spec, learning_rate=0.1)
    with pytest.raises(ValueError, match="learning_rate_tag"):
        teo.to_spec(teo.embedding.Adagrad(rate))


@pytest.mark.parametrize(
    "tag, error, words",
    [
        ("1", TypeError, "non-negative int"),
        (True, TypeError, "non-negative int"),
        (-1, ValueError, "non-negative int"),
        (2**31, ValueError, "at most 2147483647"),
    ],
)
@pytest.mark.parametrize("face", ["embedding", "keras"])
def test_a_bad_learning_rate_tag_is_refused_by_to_spec_on_either_face(
    face, tag, error, words
):
    # Before, the Keras face passed a tag above the proto's int32 to protobuf
    # ("Value out of range"), and every refusal was signed `to_proto`.
    opt = (
        teo.embedding.Adagrad(lambda: 0.1)
        if face == "embedding"
        else teo.optimizers.Adam(0.01)
    )
    with pytest.raises(error, match=rf"^to_spec: .*`learning_rate_tag`.*{words}"):
        teo.to_spec(opt, learning_rate_tag=tag)


@pytest.mark.parametrize(
    "opt, why",
    [
        (lambda: teo.optimizers.Adagrad(0.1), "the constant 0.1"),
        (lambda: teo.optimizers.Adam(amsgrad=True), "amsgrad=True"),
        (lambda: teo.optimizers.ClippyAdagrad(), "no embedding engine equivalent"),
    ],
)
def test_a_tag_without_a_callable_engine_learning_rate_is_refused(opt, why):
    # It was dropped without a word: the spec recorded no dynamic learning rate.
    with pytest.raises(ValueError, match=rf"applies only to .*{re.escape(why)}"):
        teo.to_spec(opt(), learning_rate_tag=3)
    dynamic = teo.to_spec(teo.optimizers.Adam(0.01), learning_rate_tag=3)
    assert dynamic.optimization_parameters.learning_rate.dynamic.tag == 3


@pytest.mark.parametrize(
    "name", ["SGD", "Adagrad", "Adam", "Ftrl", "RMSprop", "Adadelta"]
)
def test_a_stock_keras_optimizer_is_refused_with_the_twin_to_record(name):
    """Keras's own class was "received Adam", though Adam is among the
    classes named as allowed; the refusal names it keras.optimizers.Adam and
    gives the recipe of its twin, which then records and reads back with
    Keras's config."""
    stock = getattr(keras.optimizers, name)(learning_rate=0.02)
    with pytest.raises(TypeError) as raised:
        teo.to_spec(stock)
    message = str(raised.value)
    recipe = f"tf_tpu_embed_opt.optimizers.{name}.from_config(opt.get_config())"
    assert f"received keras.optimizers.{name}, Keras's own class" in message
    assert recipe in message
    twin = getattr(teo.optimizers, name).from_config(stock.get_config())
    back = teo.from_spec(teo.to_spec(twin))
    assert type(back) is getattr(teo.optimizers, name)
    theirs = stock.get_config()
    assert {key: back.get_config()[key] for key in theirs} == theirs


def test_a_stock_keras_optimizer_whose_config_cannot_be_read_is_refused_alike():
    """The refusal reads the class alone: Keras's Adam with a lambda for its
    learning rate raised OSError from serializing the lambda's source."""
    with pytest.raises(
        TypeError, match=r"received keras\.optimizers\.Adam, Keras's own"
    ):
        teo.to_spec(keras.optimizers.Adam(lambda: 0.01))


def test_other_keras_optimizers_are_refused_by_their_full_name():
    class Adam(keras.optimizers.Optimizer):
        pass

    mine = Adam(learning_rate=0.1)
    with pytest.raises(TypeError, match=rf"received {__name__}\.test_other.*\.Adam\.$"):
        teo.to_spec(mine)
    scaled = keras.optimizers.LossScaleOptimizer(teo.optimizers.Adagrad(0.1))
    with pytest.raises(
        TypeError, match="LossScaleOptimizer.*record the inner_optimizer"
    ):
        teo.to_spec(scaled)
    teo.to_spec(scaled.inner_optimizer)  # what it says to do records
    with pytest.raises(TypeError, match=r"received keras\.optimizers\.Lion\.$"):
        teo.to_spec(keras.optimizers.Lion())


def test_unrecordable_settings_are_refused():
    with pytest.raises(ValueError, match="`slot_variable_creation_fn` is a callable"):
        teo.to_spec(teo.embedding.Adagrad(slot_variable_creation_fn=lambda t, n, i: {}))
    with pytest.raises(ValueError, match="learning rate"):
        teo.to_spec(teo.optimizers.Adagrad(lambda: 0.1))
    with pytest.raises(TypeError, match="SGD"):
        teo.to_spec(keras.optimizers.SGD())
    with pytest.raises(TypeError):
        teo.to_spec("Adagrad")


@pytest.mark.skipif(
    importlib.util.find_spec("grpc_tools") is None,
    reason="grpcio-tools is not installed (CI installs it in the protobuf 7 leg)",
)
def test_checked_in_descriptor_is_current():
    sys.path.insert(0, str(ROOT / "protos"))
    try:
        import generate
    finally:
        sys.path.pop(0)
    expected = generate.render(generate.compile_descriptor())
    assert generate.TARGET.read_text() == expected, (
        "tf_tpu_embed_opt/optimizer_spec/descriptor.py is stale: run "
        "python protos/generate.py"
    )
