"""The embedding face accepts and refuses what TensorFlow's own classes do.

TensorFlow's `tpu_embedding_v2_utils_test.py` is not in the wheel; these are
its accept/refuse checks, widened to a grid of edge arguments, with
TensorFlow's classes in `tf.tpu.experimental.embedding` as the oracle (their
constructors run under every protobuf; only their proto writing fails under
protobuf >= 7.34). The rule (DESIGN.md, conventions): where TensorFlow refuses,
this package refuses with an exception of the same class, and with two invalid
arguments TensorFlow's error comes first; where TensorFlow accepts, this
package accepts, except for values from which TensorFlow would write a wrong
proto. Those are listed here, independently of the implementation, and in the
README's "Differences from Keras and TensorFlow" table.
"""

from __future__ import annotations

import inspect
import math
from typing import Any, Dict, List, Tuple

import pytest
import tensorflow as tf

import tf_tpu_embed_opt as teo

TF_EMBEDDING = tf.tpu.experimental.embedding
NAMES = [
    name
    for name in ("SGD", "Adagrad", "AdagradMomentum", "Adam", "FTRL")
    if hasattr(TF_EMBEDDING, name)
]
NAN = float("nan")
INF = float("inf")


def _fn3(table, slot_names, initializers):
    return {}


EDGES: Dict[str, List[Any]] = {
    "learning_rate": [0.0, 0.5, 1, -0.1, NAN, INF, True, "a", None, lambda: 0.1],
    "use_gradient_accumulation": [True, False, 0, 1, "yes", None],
    "clip_weight_min": [None, 0.0, -1.0, 1, NAN, "a", True],
    "clip_weight_max": [None, 0.0, -1.0, NAN, "a"],
    "weight_decay_factor": [None, 0.0, 0, 0.5, -1.0, NAN, "a"],
    "multiply_weight_decay_factor_by_learning_rate": [None, True, False, 0, "x"],
    "slot_variable_creation_fn": [None, _fn3, 1, "f"],
    "clipvalue": [
        None,
        0.0,
        -0.0,
        1,
        2.5,
        -1.0,
        NAN,
        INF,
        "a",
        True,
        (None, None),
        (0.0, 0.0),
        (None, 1.0),
        (-1.0, None),
        (1.0, -1.0),
        (-1.0,),
    ],
    "low_dimensional_packing_status": [False, True, 1, "yes", None],
    "initial_accumulator_value": [0.1, 1, 0.0, -1.0, NAN, INF, "a", True],
    "beta_1": [0.0, 0.5, 1.0, -0.1, 1, NAN, "a"],
    "beta_2": [0.0, 0.5, 1.0, -0.1, NAN],
    "epsilon": [1e-3, 1, 0.0, -1.0, NAN, INF, "a"],
    "lazy_adam": [True, False, 0, "x"],
    "sum_inside_sqrt": [False, 0, "x"],
    "momentum": [0.0, 0.5, 1.0, -0.5, 2.0, NAN, "a"],
    "use_nesterov": [True, 1, "x"],
    "exponent": [1.0, 3, 0.0, -1.0, NAN, "a"],
    "beta2": [0.0, 0.5, 1.0, 2.0, -1.0, NAN],
    "learning_rate_power": [0.0, -1, -0.5, 0.5, NAN, "a"],
    "l1_regularization_strength": [0.0, 1, -1.0, NAN, "a"],
    "l2_regularization_strength": [0.5, -1.0, NAN],
    "beta": [0.0, 1, -1.0, NAN, "a"],
    "multiply_linear_by_learning_rate": [True, 1, "x"],
    "allow_zero_accumulator": [True, 1, "x"],
}

_FLAGS = {
    "use_gradient_accumulation",
    "multiply_weight_decay_factor_by_learning_rate",
    "low_dimensional_packing_status",
    "lazy_adam",
    "sum_inside_sqrt",
    "use_nesterov",
    "multiply_linear_by_learning_rate",
    "allow_zero_accumulator",
}
# None means "not set" for these (TensorFlow's defaults).
_OPTIONAL = {
    "clip_weight_min",
    "clip_weight_max",
    "weight_decay_factor",
    "multiply_weight_decay_factor_by_learning_rate",
    "slot_variable_creation_fn",
    "clipvalue",
}
# Where the engine's math is defined (docs/tpu_semantics.md): outside, the
# proto TensorFlow would write is wrong even if TensorFlow accepts the value.
_DOMAIN = {
    "learning_rate": lambda v: v >= 0,
    "weight_decay_factor": lambda v: v >= 0,
    "l1_regularization_strength": lambda v: v >= 0,
    "l2_regularization_strength": lambda v: v >= 0,
    "beta": lambda v: v >= 0,
    "learning_rate_power": lambda v: v <= 0,
    "momentum": lambda v: 0 <= v <= 1,
    "beta2": lambda v: 0 <= v <= 1,
}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _wrong_proto(name: str, value: Any) -> bool:
    """Whether TensorFlow would write a wrong proto from `name=value`."""
    if value is None:
        return name not in _OPTIONAL
    if name == "learning_rate" and callable(value):
        return False
    if name == "slot_variable_creation_fn":
        return False
    if name in _FLAGS:
        # A proto bool written from a truth value: "no", 0.5, ... mean nothing.
        return not isinstance(value, bool)
    if name == "clipvalue":
        if isinstance(value, tuple):
            if len(value) != 2:
                return True
            bounds = [b for b in value if b is not None]
            if any(not _is_number(b) or not math.isfinite(b) for b in bounds):
                return True
            return len(bounds) == 2 and bounds[0] > bounds[1]
        # c means the range (-c, c): a negative c has min > max.
        return not _is_number(value) or not math.isfinite(value) or value < 0
    if not _is_number(value) or not math.isfinite(value):
        return True
    return not _DOMAIN.get(name, lambda v: True)(value)


def _outcome(cls: type, kwargs: Dict[str, Any]) -> Any:
    try:
        cls(**kwargs)
    except (TypeError, ValueError) as error:
        return error
    return None


def _cases() -> List[Tuple[str, str, Any]]:
    cases = []
    for name in NAMES:
        parameters = inspect.signature(getattr(TF_EMBEDDING, name)).parameters
        for argument, values in EDGES.items():
            if argument in parameters:
                cases += [(name, argument, value) for value in values]
    return cases


CASES = _cases()


@pytest.mark.parametrize(
    "name,argument,value",
    CASES,
    ids=[f"{n}-{a}={v!r}" for n, a, v in CASES],
)
def test_accepts_and_refuses_what_tensorflow_does(name, argument, value):
    kwargs = {argument: value}
    if argument == "clipvalue" and value is not None:
        kwargs["use_gradient_accumulation"] = True
    theirs = _outcome(getattr(TF_EMBEDDING, name), kwargs)
    ours = _outcome(getattr(teo.embedding, name), kwargs)
    if theirs is not None:
        assert isinstance(ours, type(theirs)), (theirs, ours)
        return
    if _wrong_proto(argument, value):
        assert ours is not None, "accepted a value that writes a wrong proto"
        assert f"`{argument}`" in str(ours), ours  # names the argument
    else:
        assert ours is None, ours


TENSORFLOW_FIRST = [
    # (class, arguments): TensorFlow refuses one argument, this package would
    # also refuse another that TensorFlow accepts; TensorFlow's comes first.
    ("Adagrad", {"slot_variable_creation_fn": 1, "learning_rate": "a"}),
    ("SGD", {"clipvalue": 1.0, "use_gradient_accumulation": 0, "clip_weight_min": NAN}),
    ("Adagrad", {"initial_accumulator_value": 0.0, "use_gradient_accumulation": "y"}),
    ("FTRL", {"initial_accumulator_value": -1.0, "l1_regularization_strength": "a"}),
    ("AdagradMomentum", {"epsilon": 0.0, "momentum": "a"}),
    ("AdagradMomentum", {"exponent": 0.0, "beta2": NAN, "learning_rate": None}),
    ("Adam", {"beta_1": 1.0, "lazy_adam": "x"}),
    ("Adam", {"epsilon": 0.0, "weight_decay_factor": "a"}),
    (
        "Adam",
        {
            "lazy_adam": False,
            "use_gradient_accumulation": False,
            "clip_weight_max": "a",
        },
    ),
]


@pytest.mark.parametrize(
    "name,kwargs", TENSORFLOW_FIRST, ids=[str(i) for i in range(len(TENSORFLOW_FIRST))]
)
def test_refuses_in_tensorflows_order(name, kwargs):
    theirs = _outcome(getattr(TF_EMBEDDING, name), kwargs)
    ours = _outcome(getattr(teo.embedding, name), kwargs)
    assert theirs is not None
    assert isinstance(ours, type(theirs)), (theirs, ours)
    # The error is about the argument TensorFlow refuses.
    refused = [a for a in kwargs if a in str(theirs)] or list(kwargs)[:1]
    assert any(f"{a}" in str(ours) for a in refused), (theirs, ours)


def test_clipvalue_zero_is_tensorflows_range():
    """TensorFlow stores c as (-c, c): 0.0 clips every gradient to zero."""
    for name in NAMES:
        theirs = getattr(TF_EMBEDDING, name)(clipvalue=0.0)
        ours = getattr(teo.embedding, name)(clipvalue=0.0)
        assert (ours.clip_gradient_min, ours.clip_gradient_max) == (
            theirs.clip_gradient_min,
            theirs.clip_gradient_max,
        )
        assert ours == theirs and hash(ours) == hash(theirs)


@pytest.mark.parametrize("name", NAMES)
def test_gradient_clipping_needs_accumulation(name):
    """As TensorFlow's own test: the accumulation error comes first."""
    for clipvalue in (0.0, (None, 1.0), -1.0, "a"):
        for cls in (getattr(TF_EMBEDDING, name), getattr(teo.embedding, name)):
            with pytest.raises(ValueError, match="accumulation"):
                cls(use_gradient_accumulation=False, clipvalue=clipvalue)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(
    "clipvalue,expected",
    [((-1.0, 1.0), (-1.0, 1.0)), (1.0, (-1.0, 1.0)), ((None, 1), (None, 1.0))],
    ids=["tuple", "scalar", "tuple-with-none"],
)
def test_gradient_clip_attributes_as_tensorflow(name, clipvalue, expected):
    for cls in (getattr(TF_EMBEDDING, name), getattr(teo.embedding, name)):
        opt = cls(clipvalue=clipvalue)
        assert (opt.clip_gradient_min, opt.clip_gradient_max) == expected


@pytest.mark.parametrize("name", NAMES)
def test_equal_and_hash_as_tensorflow(name):
    ours = getattr(teo.embedding, name)
    assert ours(0.1) == ours(0.1) and hash(ours(0.1)) == hash(ours(0.1))
    assert ours(0.1) != ours(0.2) and hash(ours(0.1)) != hash(ours(0.2))
    theirs = getattr(TF_EMBEDDING, name)
    assert ours(0.1) == theirs(0.1) and hash(ours(0.1)) == hash(theirs(0.1))
