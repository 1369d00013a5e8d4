"""Bad input is refused with an error that explains itself.

Every case asserts the exception type and that the message names the argument,
the value received (its `repr`) and, where there is one, what is allowed. The
cases are written out here from the requirement, not derived from the package's
own definitions, so a bound that drifts in an algorithm module shows up as a
failure. Valid boundary values are checked to be accepted.
"""

import re

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st
from proto_oracle import expected_proto
from tensorflow.core.protobuf.tpu import (
    optimization_parameters_pb2,
    tpu_embedding_configuration_pb2,
)

import tf_tpu_embed_opt as teo

E = teo.embedding
TF_EMBEDDING = tf.tpu.experimental.embedding
OptimizationParameters = optimization_parameters_pb2.OptimizationParameters
_Status = optimization_parameters_pb2.GradientAccumulationStatus
_Packing = optimization_parameters_pb2.LowDimensionalPackingStatus

TENSORFLOW_BACKED = ["SGD", "Adagrad", "AdagradMomentum", "Adam", "FTRL"]
BEYOND_TENSORFLOW = [
    "Momentum",
    "RMSProp",
    "CenteredRMSProp",
    "Adadelta",
    "ProximalAdagrad",
    "ProximalYogi",
]
ALL = TENSORFLOW_BACKED + BEYOND_TENSORFLOW
WITH_SLOTS = [name for name in ALL if name != "SGD"]

NAN = float("nan")
INF = float("inf")

# Allowed-value phrases the messages must contain.
NON_NEGATIVE = ">= 0"
POSITIVE = "> 0"
NON_POSITIVE = "<= 0"
UNIT_OPEN = "in [0, 1)"
UNIT_CLOSED = "in [0, 1]"
BOOL = "True or False"


def _pattern(*fragments):
    """A regex that matches a message containing every fragment, in any order."""
    return "(?s)" + "".join(f"(?=.*{re.escape(f)})" for f in fragments)


def _cls(name):
    return getattr(E, name)


# Callables with a known repr, used both as inputs and as expected fragments.
def _lr_needs_step(step):
    return 0.1


def _lr_needs_keyword(*, step):
    return 0.1


class _ScheduleNeedsStep:
    def __call__(self, step):
        return 0.1

    def __repr__(self):
        return "_ScheduleNeedsStep()"


_SCHEDULE_NEEDS_STEP = _ScheduleNeedsStep()


def _lr_constant():
    return 0.1


def _lr_default_step(step=0):
    return 0.1


def _slots_0():
    return {}


def _slots_1(table):
    return {}


def _slots_4(table, slot_names, initializers, extra):
    return {}


def _slots_keyword_only(table, slot_names, *, extra):
    return {}


def _slots_2(table, slot_names):
    return {}


def _slots_3(table, slot_names, initializers):
    return {}


def _slots_2_or_3(table, slot_names, initializers=None):
    return {}


def _slots_varargs(*args):
    return {}


# ---------------------------------------------------------------------------
# Constructors.
# ---------------------------------------------------------------------------


def _case(cls, kwargs, exc, fragments, label):
    """One constructor case; the class name always leads the message."""
    return pytest.param(cls, kwargs, exc, (f"{cls}:", *fragments), id=f"{cls}-{label}")


def _bad(cls, name, value, exc, allowed=None, label=None):
    """`cls(name=value)` raises `exc` naming `name`, `repr(value)`, `allowed`."""
    fragments = [f"`{name}`", repr(value)]
    if allowed is not None:
        fragments.append(allowed)
    label = label if label is not None else f"{name}={value!r}"
    return _case(cls, {name: value}, exc, fragments, label)


_LEARNING_RATE = [
    # (value, exception, allowed, label)
    (-0.1, ValueError, NON_NEGATIVE, None),
    (-1, ValueError, NON_NEGATIVE, None),
    (-1e-300, ValueError, NON_NEGATIVE, None),
    (NAN, ValueError, "finite", None),
    (INF, ValueError, "finite", None),
    (-INF, ValueError, "finite", None),
    ("0.1", TypeError, "callable", None),
    (None, TypeError, "callable", None),
    (True, TypeError, "callable", None),
    (False, TypeError, "callable", None),
    ([0.1], TypeError, "callable", None),
    (1j, TypeError, "callable", None),
    (_lr_needs_step, TypeError, "no arguments", "callable-needs-step"),
    (_lr_needs_keyword, TypeError, "no arguments", "callable-needs-keyword"),
    (_SCHEDULE_NEEDS_STEP, TypeError, "no arguments", "schedule-needs-step"),
]

_COMMON = [
    # (kwargs, exception, fragments, label)
    (
        {"clip_weight_min": 1.0, "clip_weight_max": 0.0},
        ValueError,
        ("`clip_weight_min`", "`clip_weight_max`", "1.0", "0.0", "<="),
        "clip_weight_min>clip_weight_max",
    ),
    ({"clip_weight_min": NAN}, ValueError, ("`clip_weight_min`", "nan"), None),
    ({"clip_weight_max": "1"}, TypeError, ("`clip_weight_max`", "'1'"), None),
    ({"clip_weight_max": True}, TypeError, ("`clip_weight_max`", "True"), None),
    # TensorFlow accepts clipvalue=0.0 (the range (-0.0, 0.0)); a negative c
    # would be a range with min > max.
    ({"clipvalue": -1.0}, ValueError, ("`clipvalue`", "-1.0", NON_NEGATIVE), None),
    ({"clipvalue": NAN}, ValueError, ("`clipvalue`", "nan"), None),
    ({"clipvalue": INF}, ValueError, ("`clipvalue`", "inf"), None),
    (
        {"clipvalue": (1.0, -1.0)},
        ValueError,
        ("`clipvalue`", "(1.0, -1.0)", "min <= max"),
        None,
    ),
    ({"clipvalue": (1.0,)}, ValueError, ("`clipvalue`", "(1.0,)", "(min, max)"), None),
    (
        {"clipvalue": (-1.0, 0.0, 1.0)},
        ValueError,
        ("`clipvalue`", "(-1.0, 0.0, 1.0)", "(min, max)"),
        None,
    ),
    ({"clipvalue": ()}, ValueError, ("`clipvalue`", "()", "(min, max)"), None),
    (
        {"clipvalue": [-1.0, 1.0]},
        TypeError,
        ("`clipvalue`", "[-1.0, 1.0]", "(min, max) tuple"),
        None,
    ),
    ({"clipvalue": "1"}, TypeError, ("`clipvalue`", "'1'"), None),
    ({"clipvalue": True}, TypeError, ("`clipvalue`", "True"), None),
    ({"clipvalue": (None, NAN)}, ValueError, ("`clipvalue`", "nan"), None),
    ({"clipvalue": ("-1", None)}, TypeError, ("`clipvalue`", "'-1'"), None),
    (
        {"clipvalue": 1.0, "use_gradient_accumulation": False},
        ValueError,
        ("clipvalue=1.0", "use_gradient_accumulation=False"),
        "clipvalue-without-accumulation",
    ),
    (
        {"clipvalue": (None, 1.0), "use_gradient_accumulation": False},
        ValueError,
        ("clipvalue=(None, 1.0)", "use_gradient_accumulation=False"),
        "clipvalue-tuple-without-accumulation",
    ),
    (
        {"weight_decay_factor": -0.1},
        ValueError,
        ("`weight_decay_factor`", "-0.1", NON_NEGATIVE),
        None,
    ),
    ({"weight_decay_factor": NAN}, ValueError, ("`weight_decay_factor`", "nan"), None),
    (
        {"weight_decay_factor": "0.1"},
        TypeError,
        ("`weight_decay_factor`", "'0.1'"),
        None,
    ),
    (
        {"multiply_weight_decay_factor_by_learning_rate": 1},
        TypeError,
        ("`multiply_weight_decay_factor_by_learning_rate`", "1", BOOL),
        None,
    ),
    (
        {"use_gradient_accumulation": "yes"},
        TypeError,
        ("`use_gradient_accumulation`", "'yes'", BOOL),
        None,
    ),
    (
        {"use_gradient_accumulation": 1},
        TypeError,
        ("`use_gradient_accumulation`", "1", BOOL),
        None,
    ),
    (
        {"use_gradient_accumulation": None},
        TypeError,
        ("`use_gradient_accumulation`", "None", BOOL),
        None,
    ),
    (
        {"low_dimensional_packing_status": 1},
        TypeError,
        ("`low_dimensional_packing_status`", "1", BOOL),
        None,
    ),
    (
        {"low_dimensional_packing_status": "True"},
        TypeError,
        ("`low_dimensional_packing_status`", "'True'", BOOL),
        None,
    ),
    ({"lr": 0.1}, TypeError, ("'lr'", "unexpected keyword"), "unknown-keyword-lr"),
    (
        {"learning_rate": 0.1, "not_an_argument": 1},
        TypeError,
        ("'not_an_argument'",),
        "unknown-keyword",
    ),
]

_HYPERS = [
    # initial_accumulator_value > 0.
    *(
        _bad(cls, "initial_accumulator_value", value, ValueError, POSITIVE)
        for cls in ("Adagrad", "FTRL", "ProximalAdagrad", "ProximalYogi")
        for value in (0.0, 0, -0.1)
    ),
    *(
        _bad(cls, "initial_accumulator_value", value, exc)
        for cls in ("Adagrad", "FTRL", "ProximalAdagrad", "ProximalYogi")
        for value, exc in ((NAN, ValueError), (INF, ValueError), ("1", TypeError))
    ),
    # Betas in [0, 1).
    *(
        _bad(cls, name, value, ValueError, UNIT_OPEN)
        for cls in ("Adam", "ProximalYogi")
        for name in ("beta_1", "beta_2")
        for value in (1.0, 1, 1.5, -0.1, -1e-9)
    ),
    *(
        _bad(cls, name, value, exc)
        for cls in ("Adam", "ProximalYogi")
        for name in ("beta_1", "beta_2")
        for value, exc in ((NAN, ValueError), (True, TypeError), ("0.9", TypeError))
    ),
    # AdagradMomentum beta2 in [0, 1].
    *(
        _bad("AdagradMomentum", "beta2", value, ValueError, UNIT_CLOSED)
        for value in (1.5, 1.0000001, 2, -0.1)
    ),
    _bad("AdagradMomentum", "beta2", NAN, ValueError),
    _bad("AdagradMomentum", "beta2", None, TypeError),
    # epsilon > 0.
    *(
        _bad(cls, "epsilon", value, ValueError, POSITIVE)
        for cls in (
            "Adam",
            "AdagradMomentum",
            "RMSProp",
            "CenteredRMSProp",
            "Adadelta",
            "ProximalYogi",
        )
        for value in (0.0, -1e-07)
    ),
    *(
        _bad(cls, "epsilon", value, exc)
        for cls in (
            "Adam",
            "AdagradMomentum",
            "RMSProp",
            "CenteredRMSProp",
            "Adadelta",
            "ProximalYogi",
        )
        for value, exc in ((NAN, ValueError), ("1e-7", TypeError))
    ),
    # Other decay rates in [0, 1).
    _bad("Momentum", "momentum", 1.0, ValueError, UNIT_OPEN),
    _bad("Momentum", "momentum", -0.1, ValueError, UNIT_OPEN),
    _bad("AdagradMomentum", "momentum", 1.5, ValueError, UNIT_CLOSED),
    _bad("RMSProp", "rho", 1.0, ValueError, UNIT_OPEN),
    _bad("RMSProp", "momentum", -0.1, ValueError, UNIT_OPEN),
    _bad("CenteredRMSProp", "rho", 1.5, ValueError, UNIT_OPEN),
    _bad("Adadelta", "rho", 1.0, ValueError, UNIT_OPEN),
    _bad("AdagradMomentum", "exponent", 0.0, ValueError, POSITIVE),
    _bad("AdagradMomentum", "exponent", -2, ValueError, POSITIVE),
    # FTRL.
    _bad("FTRL", "learning_rate_power", 0.5, ValueError, NON_POSITIVE),
    _bad("FTRL", "learning_rate_power", 1e-9, ValueError, NON_POSITIVE),
    _bad("FTRL", "learning_rate_power", NAN, ValueError),
    _bad("FTRL", "beta", -0.1, ValueError, NON_NEGATIVE),
    # Negative regularization.
    *(
        _bad(cls, name, value, ValueError, NON_NEGATIVE)
        for cls in ("FTRL", "ProximalAdagrad", "ProximalYogi")
        for name in ("l1_regularization_strength", "l2_regularization_strength")
        for value in (-0.1, -1)
    ),
    *(
        _bad(cls, name, "0", TypeError)
        for cls in ("FTRL", "ProximalAdagrad", "ProximalYogi")
        for name in ("l1_regularization_strength", "l2_regularization_strength")
    ),
    # Bool arguments.
    _bad("Momentum", "use_nesterov", 1, TypeError, BOOL),
    _bad("AdagradMomentum", "use_nesterov", 1, TypeError, BOOL),
    _bad("AdagradMomentum", "use_nesterov", "False", TypeError, BOOL),
    _bad("Adam", "lazy_adam", "yes", TypeError, BOOL),
    _bad("Adam", "lazy_adam", 0, TypeError, BOOL),
    _bad("Adam", "sum_inside_sqrt", None, TypeError, BOOL),
    _bad("FTRL", "multiply_linear_by_learning_rate", 1, TypeError, BOOL),
    _bad("FTRL", "allow_zero_accumulator", "no", TypeError, BOOL),
    # Non-lazy Adam needs gradient accumulation.
    _case(
        "Adam",
        {"lazy_adam": False, "use_gradient_accumulation": False},
        ValueError,
        ("`lazy_adam=False`", "use_gradient_accumulation=False"),
        "non-lazy-without-accumulation",
    ),
    # SGD has no slots, hence no slot_variable_creation_fn.
    _case(
        "SGD",
        {"slot_variable_creation_fn": _slots_3},
        TypeError,
        ("'slot_variable_creation_fn'",),
        "slot_variable_creation_fn-not-an-argument",
    ),
]

_SLOT_FNS = [
    # (value, label, allowed)
    ("not callable", "string", "callable"),
    (42, "int", "callable"),
    (_slots_0, "0-args", "2 positional"),
    (_slots_1, "1-arg", "2 positional"),
    (_slots_4, "4-args", "2 positional"),
    (_slots_keyword_only, "required-keyword-only", "2 positional"),
]

CONSTRUCTOR_CASES = [
    *(
        _bad(cls, "learning_rate", value, exc, allowed, label=label)
        for cls in ALL
        for value, exc, allowed, label in _LEARNING_RATE
    ),
    *(
        _case(
            cls,
            kwargs,
            exc,
            fragments,
            label or ",".join(f"{k}={v!r}" for k, v in kwargs.items()),
        )
        for cls in ALL
        for kwargs, exc, fragments, label in _COMMON
    ),
    *_HYPERS,
    *(
        _bad(
            cls,
            "slot_variable_creation_fn",
            value,
            TypeError,
            allowed,
            label=f"slot_variable_creation_fn-{label}",
        )
        for cls in WITH_SLOTS
        for value, label, allowed in _SLOT_FNS
    ),
    *(
        _case(
            cls,
            {"low_dimensional_packing_status": True},
            ValueError,
            ("`low_dimensional_packing_status=True`", "not allowed"),
            "low_dimensional_packing_status=True",
        )
        for cls in BEYOND_TENSORFLOW
    ),
]


@pytest.mark.parametrize("cls, kwargs, exc, fragments", CONSTRUCTOR_CASES)
def test_constructor_refuses(cls, kwargs, exc, fragments):
    with pytest.raises(exc, match=_pattern(*fragments)):
        _cls(cls)(**kwargs)


@pytest.mark.parametrize("cls", ALL)
def test_too_many_positional_arguments_name_the_class(cls):
    with pytest.raises(TypeError, match=_pattern(f"{cls}:", "positional")):
        _cls(cls)(*([0.1] * 30))


@pytest.mark.parametrize("cls", ALL)
def test_argument_given_twice_names_the_class(cls):
    with pytest.raises(TypeError, match=_pattern(f"{cls}:", "'learning_rate'")):
        _cls(cls)(0.1, learning_rate=0.2)


VALID_CASES = [
    *(
        pytest.param(cls, {"learning_rate": value}, id=f"{cls}-learning_rate-{label}")
        for cls in ALL
        for value, label in (
            (0.0, "0.0"),
            (0, "0"),
            (1, "1"),
            (np.float32(0.5), "np.float32"),
            (np.float64(0.0), "np.float64-0"),
            (_lr_constant, "callable"),
            (_lr_default_step, "callable-default-argument"),
        )
    ),
    *(
        pytest.param(cls, kwargs, id=f"{cls}-{label}")
        for cls in ALL
        for kwargs, label in (
            ({"clipvalue": (None, 1.0)}, "clipvalue=(None, 1.0)"),
            ({"clipvalue": (-1.0, None)}, "clipvalue=(-1.0, None)"),
            ({"clipvalue": (-1.0, -1.0)}, "clipvalue-min==max"),
            ({"clipvalue": (-2, 3)}, "clipvalue-int-tuple"),
            ({"clipvalue": 1e-30}, "clipvalue-tiny"),
            ({"clipvalue": 3}, "clipvalue-int"),
            ({"weight_decay_factor": 0.0}, "weight_decay_factor=0.0"),
            (
                {
                    "weight_decay_factor": 0.1,
                    "multiply_weight_decay_factor_by_learning_rate": True,
                },
                "weight_decay-multiplied",
            ),
            (
                {"clip_weight_min": -1.0, "clip_weight_max": -1.0},
                "clip_weight_min==max",
            ),
            ({"clip_weight_min": -1.0}, "clip_weight_min-only"),
            ({"use_gradient_accumulation": False}, "no-accumulation"),
            ({"use_gradient_accumulation": np.True_}, "numpy-bool"),
        )
    ),
    *(
        pytest.param(cls, {"low_dimensional_packing_status": True}, id=f"{cls}-packing")
        for cls in TENSORFLOW_BACKED
    ),
    *(
        pytest.param(cls, {"slot_variable_creation_fn": fn}, id=f"{cls}-slots-{label}")
        for cls in WITH_SLOTS
        for fn, label in (
            (_slots_2, "2-args"),
            (_slots_3, "3-args"),
            (_slots_2_or_3, "2-or-3-args"),
            (_slots_varargs, "varargs"),
        )
    ),
    pytest.param("Adam", {"beta_1": 0.0, "beta_2": 0.0}, id="Adam-betas=0"),
    pytest.param("Adam", {"beta_1": 0.999999}, id="Adam-beta_1<1"),
    pytest.param("Adam", {"lazy_adam": False}, id="Adam-non-lazy-accumulating"),
    pytest.param("Adam", {"epsilon": 1e-30}, id="Adam-epsilon-tiny"),
    pytest.param("ProximalYogi", {"beta_1": 0.0, "beta_2": 0.0}, id="Yogi-betas=0"),
    pytest.param("AdagradMomentum", {"beta2": 1}, id="AdagradMomentum-beta2=1"),
    pytest.param("AdagradMomentum", {"beta2": 1.0}, id="AdagradMomentum-beta2=1.0"),
    pytest.param("AdagradMomentum", {"beta2": 0.0}, id="AdagradMomentum-beta2=0"),
    pytest.param(
        "AdagradMomentum",
        {"momentum": 0.0, "use_nesterov": True},
        id="AdagradMomentum-momentum=0",
    ),
    pytest.param("Momentum", {"momentum": 0.0}, id="Momentum-momentum=0"),
    pytest.param("RMSProp", {"rho": 0.0, "momentum": 0.0}, id="RMSProp-zeros"),
    pytest.param("CenteredRMSProp", {"rho": 0.0}, id="CenteredRMSProp-rho=0"),
    pytest.param("Adadelta", {"rho": 0.0}, id="Adadelta-rho=0"),
    pytest.param(
        "FTRL",
        {
            "learning_rate_power": 0.0,
            "l1_regularization_strength": 0.0,
            "l2_regularization_strength": 0.0,
            "beta": 0.0,
        },
        id="FTRL-zeros",
    ),
    pytest.param("FTRL", {"initial_accumulator_value": 1e-30}, id="FTRL-tiny-acc"),
    pytest.param(
        "ProximalAdagrad",
        {"l1_regularization_strength": 0.0, "l2_regularization_strength": 0.0},
        id="ProximalAdagrad-zeros",
    ),
    pytest.param(
        "Momentum", {"use_nesterov": np.True_}, id="Momentum-use_nesterov-numpy-bool"
    ),
]


@pytest.mark.parametrize("cls, kwargs", VALID_CASES)
def test_constructor_accepts_boundary_values(cls, kwargs):
    opt = _cls(cls)(**kwargs)
    for name, value in kwargs.items():
        if name in ("clipvalue", "slot_variable_creation_fn"):
            continue
        assert getattr(opt, name) is value or getattr(opt, name) == value


def _lr_keyword_with_default(*, scale=1.0):
    return 0.1 * scale


@pytest.mark.parametrize(
    "rate",
    [
        lambda: 0.1,
        lambda step=0: 0.1,
        lambda *args: 0.1,
        lambda **kwargs: 0.1,
        _lr_keyword_with_default,
    ],
    ids=["none", "defaulted", "var-positional", "var-keyword", "keyword-default"],
)
def test_a_callable_learning_rate_that_takes_no_arguments_is_taken(rate):
    """TPUEmbedding calls a dynamic learning rate with no arguments; those
    it cannot call so are refused (`_LEARNING_RATE`), these taken."""
    for cls in ALL:
        assert _cls(cls)(learning_rate=rate).learning_rate is rate


@settings(max_examples=40, deadline=None)
@given(
    cls=st.sampled_from(ALL),
    value=st.floats(max_value=-1e-300, allow_nan=False, allow_infinity=False),
)
def test_any_negative_learning_rate_is_refused(cls, value):
    with pytest.raises(
        ValueError, match=_pattern(f"{cls}:", "`learning_rate`", repr(value))
    ):
        _cls(cls)(learning_rate=value)


@settings(max_examples=40, deadline=None)
@given(
    cls=st.sampled_from(["Adam", "ProximalYogi"]),
    name=st.sampled_from(["beta_1", "beta_2"]),
    value=st.floats(max_value=-1e-300, allow_nan=False, allow_infinity=False)
    | st.floats(min_value=1.0, allow_nan=False, allow_infinity=False),
)
def test_any_beta_outside_unit_interval_is_refused(cls, name, value):
    with pytest.raises(
        ValueError, match=_pattern(f"{cls}:", f"`{name}`", repr(value), UNIT_OPEN)
    ):
        _cls(cls)(**{name: value})


# ---------------------------------------------------------------------------
# from_proto.
# ---------------------------------------------------------------------------


def _proto(opt, *edits):
    """`to_proto(opt)` with `(dotted.field, value)` edits applied.

    A value of `...` marks a sub-message as present (`SetInParent`); `None`
    clears the field (or the oneof).
    """

    def build():
        params = teo.to_proto(opt())
        for path, value in edits:
            *parents, leaf = path.split(".")
            target = params
            for parent in parents:
                target = getattr(target, parent)
            if value is ...:
                getattr(target, leaf).SetInParent()
            elif value is None:
                target.ClearField(leaf)
            else:
                setattr(target, leaf, value)
        return params

    return build


def _dynamic_sgd_proto():
    return teo.to_proto(E.SGD(learning_rate=_lr_constant), learning_rate_tag=0)


# Oneof members the engine declares and this package does not implement; older
# TensorFlow releases (2.16) lack the newest (lion, frequency_aware_adagrad).
_UNIMPLEMENTED = [
    oneof
    for oneof in [
        "lion",
        "bounded_adagrad",
        "online_yogi",
        "frequency_aware_adagrad",
        "mdl_adagrad_light",
        "frequency_estimator",
        "user_defined_program",
        "assign",
    ]
    if oneof in OptimizationParameters.DESCRIPTOR.fields_by_name
]

FROM_PROTO_CASES = [
    # (params factory, keyword arguments, exception, fragments, id)
    pytest.param(
        OptimizationParameters,
        {},
        ValueError,
        ("`params`", "no optimization algorithm"),
        id="empty-proto",
    ),
    pytest.param(
        _proto(E.SGD, ("parameters", None)),
        {},
        ValueError,
        ("`params`", "no optimization algorithm"),
        id="algorithm-cleared",
    ),
    *(
        pytest.param(
            _proto(E.SGD, (oneof, ...)),
            {},
            ValueError,
            (f"`{oneof}`", "not implemented", "adam", "proximal_yogi"),
            id=f"unimplemented-{oneof}",
        )
        for oneof in _UNIMPLEMENTED
    ),
    pytest.param(
        lambda: b"\xff\xff\xff\xff",
        {},
        ValueError,
        ("`params`", "OptimizationParameters"),
        id="garbage-bytes",
    ),
    pytest.param(
        lambda: bytearray(b"\x0a\x05ab"),
        {},
        ValueError,
        ("`params`", "OptimizationParameters"),
        id="truncated-bytearray",
    ),
    pytest.param(
        _dynamic_sgd_proto,
        {},
        ValueError,
        ("`learning_rate", "dynamic"),
        id="dynamic-learning-rate-without-callable",
    ),
    pytest.param(
        _dynamic_sgd_proto,
        {"learning_rate": 0.5},
        (TypeError, ValueError),
        ("`learning_rate", "0.5", "callable"),
        id="dynamic-learning-rate-with-constant",
    ),
    pytest.param(
        _dynamic_sgd_proto,
        {"learning_rate": _lr_needs_step},
        ValueError,
        ("`learning_rate`", repr(_lr_needs_step), "no arguments"),
        id="dynamic-learning-rate-callable-needs-step",
    ),
    pytest.param(
        _proto(E.SGD, ("learning_rate", None)),
        {},
        ValueError,
        ("`learning_rate",),
        id="learning-rate-unset",
    ),
    pytest.param(
        _proto(E.Adam, ("simulated_quantization.enabled", True)),
        {},
        ValueError,
        ("`simulated_quantization`",),
        id="simulated-quantization",
    ),
    pytest.param(
        _proto(E.Adam, ("simulated_quantization", ...)),
        {},
        ValueError,
        ("`simulated_quantization`",),
        id="simulated-quantization-empty",
    ),
    pytest.param(
        _proto(E.SGD, ("hot_id_replication_configuration", ...)),
        {},
        ValueError,
        ("`hot_id_replication_configuration`",),
        id="hot-id-replication",
    ),
    # Out-of-range values: the error names the constructor argument.
    *(
        pytest.param(
            _proto(opt, (field, value)),
            {},
            ValueError,
            (f"`{name}`", repr(value), *allowed),
            id=f"{field}={value!r}",
        )
        for opt, field, value, name, allowed in (
            (E.Adam, "adam.beta1", 1.5, "beta_1", (UNIT_OPEN,)),
            (E.Adam, "adam.beta1", 1.0, "beta_1", (UNIT_OPEN,)),
            (E.Adam, "adam.beta2", -0.5, "beta_2", (UNIT_OPEN,)),
            (E.Adam, "adam.epsilon", 0.0, "epsilon", (POSITIVE,)),
            (E.Adam, "adam.epsilon", NAN, "epsilon", ("finite",)),
            (E.Adam, "adam.beta2", INF, "beta_2", ("finite",)),
            (E.Adam, "learning_rate.constant", -1.0, "learning_rate", ()),
            (E.Adam, "learning_rate.constant", NAN, "learning_rate", ()),
            (E.SGD, "learning_rate.constant", INF, "learning_rate", ()),
            (E.AdagradMomentum, "adagrad_momentum.beta2", 2.0, "beta2", ()),
            (E.AdagradMomentum, "adagrad_momentum.exponent", 0.0, "exponent", ()),
            (E.FTRL, "ftrl.lr_power", 0.5, "learning_rate_power", (NON_POSITIVE,)),
            (E.FTRL, "ftrl.l1", -1.0, "l1_regularization_strength", ()),
            (E.FTRL, "ftrl.l2", -1.0, "l2_regularization_strength", ()),
            (E.FTRL, "ftrl.beta", NAN, "beta", ()),
            (E.Momentum, "momentum.momentum", 1.0, "momentum", (UNIT_OPEN,)),
            (E.RMSProp, "rms_prop.rho", 1.0, "rho", (UNIT_OPEN,)),
            (E.RMSProp, "rms_prop.epsilon", -1.0, "epsilon", (POSITIVE,)),
            (E.Adadelta, "adadelta.epsilon", 0.0, "epsilon", (POSITIVE,)),
            (
                E.ProximalAdagrad,
                "proximal_adagrad.l1",
                -1.0,
                "l1_regularization_strength",
                (),
            ),
            (E.ProximalYogi, "proximal_yogi.beta1", 1.5, "beta_1", (UNIT_OPEN,)),
            (E.ProximalYogi, "proximal_yogi.epsilon", NAN, "epsilon", ()),
            (E.SGD, "weight_decay_factor", -0.5, "weight_decay_factor", ()),
            (E.SGD, "clipping_limits.lower.value", NAN, "clip_weight_min", ()),
        )
    ),
    pytest.param(
        _proto(
            E.SGD,
            ("clipping_limits.lower.value", 1.0),
            ("clipping_limits.upper.value", 0.0),
        ),
        {},
        ValueError,
        ("`clip_weight_min`", "`clip_weight_max`", "1.0", "0.0"),
        id="clip-weight-min>max",
    ),
    pytest.param(
        _proto(
            E.SGD,
            ("gradient_clipping_limits.lower.value", 1.0),
            ("gradient_clipping_limits.upper.value", -1.0),
        ),
        {},
        ValueError,
        ("`clipvalue`", "(1.0, -1.0)"),
        id="gradient-clipping-min>max",
    ),
    pytest.param(
        _proto(
            E.SGD,
            ("gradient_clipping_limits.upper.value", 1.0),
            ("gradient_accumulation_status", _Status.DISABLED),
        ),
        {},
        ValueError,
        ("clipvalue=(None, 1.0)", "use_gradient_accumulation=False"),
        id="gradient-clipping-without-accumulation",
    ),
    pytest.param(
        _proto(
            E.Adam,
            ("adam.use_non_lazy_adam", True),
            ("gradient_accumulation_status", _Status.DISABLED),
        ),
        {},
        ValueError,
        ("`lazy_adam=False`", "use_gradient_accumulation=False"),
        id="non-lazy-adam-without-accumulation",
    ),
    pytest.param(
        _proto(E.SGD, ("multiply_weight_decay_factor_by_learning_rate", True)),
        {},
        ValueError,
        ("`multiply_weight_decay_factor_by_learning_rate`", "`weight_decay_factor`"),
        id="multiply-decay-without-decay",
    ),
    pytest.param(
        _proto(E.Momentum, ("low_dimensional_packing_status", _Packing.ENABLED)),
        {},
        ValueError,
        ("`low_dimensional_packing_status=True`", "Momentum"),
        id="momentum-packing",
    ),
    pytest.param(
        lambda: _proto(E.Adam, ("adam.beta1", 1.5))().SerializeToString(),
        {},
        ValueError,
        ("`beta_1`", "1.5"),
        id="bytes-adam-beta1=1.5",
    ),
    # Keywords the proto already holds.
    *(
        pytest.param(
            _proto(opt),
            {name: value},
            TypeError,
            ("from_proto", f"'{name}'"),
            id=f"{opt.__name__}-keyword-{name}",
        )
        for opt, name, value in (
            (E.Adam, "beta_1", 0.5),
            (E.Adam, "epsilon", 1e-8),
            (E.Adam, "lazy_adam", False),
            (E.FTRL, "learning_rate_power", -0.5),
            (E.FTRL, "l1_regularization_strength", 0.1),
            (E.SGD, "use_gradient_accumulation", False),
            (E.SGD, "clipvalue", 1.0),
            (E.SGD, "clip_weight_min", -1.0),
            (E.SGD, "weight_decay_factor", 0.1),
            (E.SGD, "low_dimensional_packing_status", True),
            (E.SGD, "slot_variable_creation_fn", _slots_3),
            (E.Adam, "initial_accumulator_value", 0.5),
            (E.Adagrad, "not_an_argument", 1),
        )
    ),
    pytest.param(
        _proto(E.Adam),
        {"learning_rate": _lr_constant},
        (TypeError, ValueError),
        ("`learning_rate`", "constant"),
        id="keyword-learning_rate-with-constant-proto",
    ),
    # Keywords the proto cannot hold are still validated.
    pytest.param(
        _proto(E.Adagrad),
        {"initial_accumulator_value": 0.0},
        ValueError,
        ("`initial_accumulator_value`", "0.0", POSITIVE),
        id="Adagrad-keyword-initial_accumulator_value=0",
    ),
    pytest.param(
        _proto(E.Adagrad),
        {"slot_variable_creation_fn": _slots_1},
        ValueError,
        ("`slot_variable_creation_fn`", repr(_slots_1)),
        id="Adagrad-keyword-slot_variable_creation_fn-1-arg",
    ),
]


@pytest.mark.parametrize("build, kwargs, exc, fragments", FROM_PROTO_CASES)
def test_from_proto_refuses(build, kwargs, exc, fragments):
    params = build()
    with pytest.raises(exc, match=_pattern(*fragments)):
        teo.from_proto(params, **kwargs)


_SGD_INSTANCE = E.SGD(learning_rate=0.01)


@pytest.mark.parametrize(
    "params",
    [
        pytest.param(42, id="int"),
        pytest.param("adam {}", id="text-format-string"),
        pytest.param(_SGD_INSTANCE, id="optimizer-instead-of-proto"),
        pytest.param([1, 2], id="list"),
    ],
)
def test_from_proto_refuses_non_proto(params):
    with pytest.raises(
        TypeError,
        match=_pattern(
            "`params`",
            "OptimizationParameters",
            type(params).__name__,
            repr(params),
        ),
    ):
        teo.from_proto(params)


def test_from_proto_refuses_another_message_type():
    other = tpu_embedding_configuration_pb2.TPUEmbeddingConfiguration()
    with pytest.raises(
        TypeError, match=_pattern("`params`", "TPUEmbeddingConfiguration")
    ):
        teo.from_proto(other)


@pytest.mark.parametrize(
    "build, kwargs, expected",
    [
        pytest.param(
            _proto(E.Adagrad),
            {"initial_accumulator_value": 0.5},
            {"initial_accumulator_value": 0.5},
            id="Adagrad-initial_accumulator_value",
        ),
        pytest.param(
            _proto(E.Adagrad),
            {"slot_variable_creation_fn": _slots_2},
            {"slot_variable_creation_fn": _slots_2},
            id="Adagrad-slot_variable_creation_fn",
        ),
        pytest.param(
            _dynamic_sgd_proto,
            {"learning_rate": _lr_constant},
            {"learning_rate": _lr_constant},
            id="dynamic-learning-rate",
        ),
        pytest.param(
            lambda: teo.to_proto(E.SGD(learning_rate=0.0)).SerializeToString(),
            {},
            {"learning_rate": 0.0},
            id="bytes-learning_rate=0",
        ),
        pytest.param(
            _proto(E.Adam, ("adam.beta1", 0.0), ("adam.beta2", 0.0)),
            {},
            {"beta_1": 0.0, "beta_2": 0.0},
            id="Adam-betas=0",
        ),
        pytest.param(
            _proto(E.AdagradMomentum, ("adagrad_momentum.beta2", 1.0)),
            {},
            {"beta2": 1.0},
            id="AdagradMomentum-beta2=1",
        ),
        pytest.param(
            _proto(E.SGD, ("gradient_clipping_limits.upper.value", 1.0)),
            {},
            {"clip_gradient_min": None, "clip_gradient_max": 1.0},
            id="clipvalue-(None, 1.0)",
        ),
    ],
)
def test_from_proto_accepts(build, kwargs, expected):
    opt = teo.from_proto(build(), **kwargs)
    for name, value in expected.items():
        assert getattr(opt, name) == value


# ---------------------------------------------------------------------------
# to_proto.
# ---------------------------------------------------------------------------

_DYNAMIC_SGD = E.SGD(learning_rate=_lr_constant)

TO_PROTO_CASES = [
    pytest.param(
        _DYNAMIC_SGD,
        None,
        ValueError,
        ("`learning_rate_tag`", repr(_lr_constant)),
        id="callable-without-tag",
    ),
    pytest.param(
        E.SGD(learning_rate=0.5),
        0,
        ValueError,
        ("`learning_rate_tag`", "0.5", "learning_rate_tag=0"),
        id="constant-with-tag",
    ),
    pytest.param(
        _DYNAMIC_SGD,
        -1,
        ValueError,
        ("`learning_rate_tag`", "-1", "non-negative int"),
        id="negative-tag",
    ),
    pytest.param(
        _DYNAMIC_SGD,
        2**31,
        ValueError,
        ("`learning_rate_tag`", "2147483648", "at most 2147483647"),
        id="tag-above-int32",
    ),
    pytest.param(
        _DYNAMIC_SGD,
        "0",
        TypeError,
        ("`learning_rate_tag`", "'0'", "non-negative int"),
        id="string-tag",
    ),
    pytest.param(
        _DYNAMIC_SGD,
        1.0,
        TypeError,
        ("`learning_rate_tag`", "1.0", "non-negative int"),
        id="float-tag",
    ),
    pytest.param(
        _DYNAMIC_SGD,
        True,
        TypeError,
        ("`learning_rate_tag`", "True", "non-negative int"),
        id="bool-tag",
    ),
    *(
        pytest.param(
            opt,
            None,
            TypeError,
            ("`opt`", repr(opt), "embedding optimizer"),
            id=f"not-an-optimizer-{label}",
        )
        for opt, label in (
            (42, "int"),
            (None, "None"),
            ("sgd", "string"),
            (E.SGD, "class-not-instance"),
            (OptimizationParameters(), "proto"),
        )
    ),
]


@pytest.mark.parametrize("opt, tag, exc, fragments", TO_PROTO_CASES)
def test_to_proto_refuses(opt, tag, exc, fragments):
    with pytest.raises(exc, match=_pattern(*fragments)):
        teo.to_proto(opt, learning_rate_tag=tag)


def test_to_proto_tag_is_keyword_only():
    with pytest.raises(TypeError, match=_pattern("to_proto")):
        teo.to_proto(_DYNAMIC_SGD, 0)


@pytest.mark.parametrize(
    "opt, tag",
    [
        pytest.param(_DYNAMIC_SGD, 0, id="tag-0"),
        pytest.param(_DYNAMIC_SGD, np.int64(3), id="numpy-tag"),
        pytest.param(_DYNAMIC_SGD, 2**31 - 1, id="largest-int32-tag"),
        pytest.param(E.SGD(learning_rate=0.0), None, id="learning_rate=0"),
        pytest.param(TF_EMBEDDING.Adam(learning_rate=0.0), None, id="tensorflow-Adam"),
    ],
)
def test_to_proto_accepts(opt, tag):
    params = teo.to_proto(opt, learning_rate_tag=tag)
    if tag is None:
        assert params.learning_rate.constant == 0.0
    else:
        assert params.learning_rate.dynamic.tag == int(tag)


# ---------------------------------------------------------------------------
# tpu_embedding_configuration.
# ---------------------------------------------------------------------------


def _table(name="t", optimizer=None, default_optimizer=True):
    if optimizer is None and default_optimizer:
        optimizer = E.SGD(learning_rate=0.1)
    return TF_EMBEDDING.TableConfig(
        vocabulary_size=8, dim=4, optimizer=optimizer, name=name
    )


def _feature(table=None, output_shape=(2,), name="f"):
    return TF_EMBEDDING.FeatureConfig(
        table if table is not None else _table(),
        output_shape=list(output_shape) if output_shape is not None else None,
        name=name,
    )


def _config_case(make, exc, fragments, id, **kwargs):
    return pytest.param(make, kwargs, exc, fragments, id=id)


CONFIGURATION_CASES = [
    _config_case(
        lambda: [_feature(), "nope"],
        TypeError,
        (
            "`feature_config`",
            "'nope'",
            "FeatureConfig",
            "of type str at feature_config[1].",
        ),
        "string-feature",
    ),
    _config_case(
        lambda: {"a": _table()},
        TypeError,
        ("`feature_config`", "TableConfig", "FeatureConfig"),
        "table-instead-of-feature",
    ),
    _config_case(lambda: [], ValueError, ("`feature_config`",), "no-features"),
    _config_case(
        _feature,
        ValueError,
        ("`num_hosts`", "0", ">= 1"),
        "num_hosts=0",
        num_hosts=0,
    ),
    _config_case(
        _feature,
        ValueError,
        ("`num_hosts`", "-2", ">= 1"),
        "num_hosts=-2",
        num_hosts=-2,
    ),
    _config_case(
        _feature,
        TypeError,
        ("`num_hosts`", "True", "int"),
        "num_hosts=True",
        num_hosts=True,
    ),
    _config_case(
        _feature,
        TypeError,
        ("`num_hosts`", "2.0", "int"),
        "num_hosts=2.0",
        num_hosts=2.0,
    ),
    _config_case(
        _feature,
        TypeError,
        ("`num_tensor_cores`", "False", "int"),
        "num_tensor_cores=False",
        num_tensor_cores=False,
    ),
    _config_case(
        _feature,
        ValueError,
        ("`num_tensor_cores`", "0", ">= 1"),
        "num_tensor_cores=0",
        num_tensor_cores=0,
    ),
    _config_case(
        _feature,
        TypeError,
        ("`num_cores_per_replica`", "True", "int"),
        "num_cores_per_replica=True",
        num_tensor_cores=4,
        num_cores_per_replica=True,
    ),
    _config_case(
        _feature,
        ValueError,
        ("`num_cores_per_replica`", "0", ">= 1"),
        "num_cores_per_replica=0",
        num_tensor_cores=4,
        num_cores_per_replica=0,
    ),
    _config_case(
        _feature,
        ValueError,
        ("`num_tensor_cores`", "3", "`num_cores_per_replica`", "2", "multiple"),
        "cores-not-a-multiple",
        num_tensor_cores=3,
        num_cores_per_replica=2,
    ),
    _config_case(
        _feature,
        TypeError,
        ("`pipeline_execution_with_tensor_core`", "1", BOOL),
        "pipeline-not-bool",
        pipeline_execution_with_tensor_core=1,
    ),
    _config_case(
        lambda: [_feature(_table("t"), name="a"), _feature(_table("t"), name="b")],
        ValueError,
        ("unique", "'t'"),
        "duplicate-table-names",
    ),
    _config_case(
        lambda: [
            _feature(_table(None), name="a"),
            _feature(_table("table_0"), name="b"),
        ],
        ValueError,
        ("unique", "'table_0'"),
        "duplicate-with-default-name",
    ),
    _config_case(
        lambda: _feature(_table("n", default_optimizer=False)),
        ValueError,
        ("'n'", "no optimizer", "`optimizer`"),
        "no-optimizer",
    ),
    _config_case(
        lambda: _feature(_table("n", default_optimizer=False)),
        TypeError,
        ("`optimizer`", "42", "embedding optimizer"),
        "global-optimizer-not-an-optimizer",
        optimizer=42,
    ),
    _config_case(
        lambda: _feature(_table("t", optimizer="sgd")),
        TypeError,
        ("'t'", "'sgd'", "embedding optimizer"),
        "table-optimizer-not-an-optimizer",
    ),
    _config_case(
        lambda: _feature(output_shape=None, name="g"),
        ValueError,
        ("'g'", "output_shape", "`per_replica_input_shapes`"),
        "unknown-output-shape",
    ),
    _config_case(
        lambda: _feature(output_shape=(None, 2), name="g"),
        ValueError,
        ("'g'", "output_shape", "`per_replica_input_shapes`"),
        "partly-unknown-output-shape",
    ),
    _config_case(
        lambda: _feature(output_shape=None, name="g"),
        ValueError,
        ("`per_replica_input_shapes`", "1", "2"),
        "input-shapes-count",
        per_replica_input_shapes=[[2], [3]],
    ),
    # An unnamed feature is named by its place, an unnamed table by the name
    # TPUEmbedding gives it (it said "feature None (table None)").
    _config_case(
        lambda: {"items": [_feature(_table(None), output_shape=None, name=None)]},
        ValueError,
        (
            "the output shape of the feature at feature_config['items'][0] "
            "(table 'table_0') is not known",
        ),
        "unknown-output-shape-unnamed",
    ),
    _config_case(
        lambda: [_feature(output_shape=None, name=None)],
        ValueError,
        ("rank >= 1; received () for the feature at feature_config[0] (table 't').",),
        "input-shape-rank-unnamed",
        per_replica_input_shapes=[tf.TensorShape([])],
    ),
    _config_case(
        lambda: _feature(),
        ValueError,
        (
            "input shape (3, 1) gives output shape (3,) for feature 'f' (table "
            "'t'), which conflicts with its configured output_shape (2,).",
        ),
        "input-shape-conflicts",
        per_replica_input_shapes=[tf.TensorShape([3, 1])],
    ),
]


@pytest.mark.parametrize("make, kwargs, exc, fragments", CONFIGURATION_CASES)
def test_configuration_refuses(make, kwargs, exc, fragments):
    with pytest.raises(exc, match=_pattern(*fragments)):
        teo.tpu_embedding_configuration(make(), **kwargs)


def _expected_configuration(
    optimizer=("SGD", 0.1), num_tensor_cores=1, input_shape=2, cores_per_replica=None
):
    """The whole configuration for one table "t" (8 x 4) and one feature "f"."""
    config = tpu_embedding_configuration_pb2.TPUEmbeddingConfiguration()
    table = config.table_descriptor.add(name="t", vocabulary_size=8, dimension=4)
    name, rate = optimizer
    table.optimization_parameters.CopyFrom(
        expected_proto(name, {"learning_rate": rate})
    )
    config.mode = tpu_embedding_configuration_pb2.TPUEmbeddingConfiguration.TRAINING
    config.num_hosts = 1
    config.num_tensor_cores = num_tensor_cores
    config.feature_descriptor.add(name="f", input_shape=[input_shape])
    if cores_per_replica is not None:
        config.spmd_sharding.enabled = True
        config.spmd_sharding.num_cores_per_replica = cores_per_replica
    return config


@pytest.mark.parametrize(
    "make, kwargs, expected",
    [
        pytest.param(_feature, {}, {}, id="minimal"),
        pytest.param(
            _feature,
            {"num_tensor_cores": 4, "num_cores_per_replica": 2},
            {"num_tensor_cores": 4, "cores_per_replica": 2},
            id="model-parallel",
        ),
        pytest.param(
            lambda: _feature(_table("n", default_optimizer=False)),
            {"optimizer": E.Adagrad()},
            {"optimizer": ("Adagrad", 0.001)},
            id="global-optimizer",
        ),
        pytest.param(
            lambda: _feature(_table("t", optimizer=TF_EMBEDDING.SGD(0.1))),
            {},
            {},
            id="tensorflow-optimizer",
        ),
        pytest.param(
            lambda: _feature(output_shape=None),
            {"per_replica_input_shapes": [[4]]},
            {"input_shape": 4},
            id="input-shapes",
        ),
    ],
)
def test_configuration_accepts(make, kwargs, expected):
    config = teo.tpu_embedding_configuration(make(), **kwargs)
    wanted = _expected_configuration(**expected)
    if "optimizer" in kwargs:
        wanted.table_descriptor[0].name = "n"
    assert config == wanted, config
