"""An independent oracle for `OptimizationParameters`, and every argument mix.

Written from the proto (`tensorflow/core/protobuf/tpu/optimization_parameters.proto`)
and TensorFlow's `_Optimizer._set_optimization_parameters`, not from this
package's definitions: for each embedding class, its proto oneof and
{argument: (proto field, negated)}. `expected_proto` renders what the TPU
engine must receive; `expected_arguments` is what a reader must give back.

`every_combination` enumerates every combination of the common constructor
arguments the classes accept, edge values included (weight decay absent, zero
and positive, each with the multiply flag absent, off and on; each clip end
alone, both, equal ends, zero ends; accumulation on and off; packing), for the
default hyperparameters and for every mix of the boolean hyperparameters, plus
each float hyperparameter at its edges. Exhaustive, not random: a bug that
needs one particular mix (the multiply flag without a decay) cannot slip
through a lucky draw.
"""

import itertools
import math

import numpy as np
from tensorflow.core.protobuf.tpu import optimization_parameters_pb2

OptimizationParameters = optimization_parameters_pb2.OptimizationParameters

PROTO_FIELDS = {
    "SGD": ("stochastic_gradient_descent", {}),
    "Adagrad": ("adagrad", {}),
    "AdagradMomentum": (
        "adagrad_momentum",
        {
            "momentum": ("momentum", False),
            "use_nesterov": ("use_nesterov", False),
            "exponent": ("exponent", False),
            "beta2": ("beta2", False),
            "epsilon": ("epsilon", False),
        },
    ),
    "Adam": (
        "adam",
        {
            "beta_1": ("beta1", False),
            "beta_2": ("beta2", False),
            "epsilon": ("epsilon", False),
            "lazy_adam": ("use_non_lazy_adam", True),
            "sum_inside_sqrt": ("use_sum_inside_sqrt", False),
        },
    ),
    "FTRL": (
        "ftrl",
        {
            "l1_regularization_strength": ("l1", False),
            "l2_regularization_strength": ("l2", False),
            "learning_rate_power": ("lr_power", False),
            "beta": ("beta", False),
            "multiply_linear_by_learning_rate": ("multiply_linear_by_lr", False),
            "allow_zero_accumulator": ("allow_zero_accumulator", False),
        },
    ),
    "Momentum": (
        "momentum",
        {"momentum": ("momentum", False), "use_nesterov": ("use_nesterov", False)},
    ),
    "RMSProp": (
        "rms_prop",
        {
            "rho": ("rho", False),
            "momentum": ("momentum", False),
            "epsilon": ("epsilon", False),
        },
    ),
    "CenteredRMSProp": (
        "centered_rms_prop",
        {
            "rho": ("rho", False),
            "momentum": ("momentum", False),
            "epsilon": ("epsilon", False),
        },
    ),
    "Adadelta": (
        "adadelta",
        {"rho": ("rho", False), "epsilon": ("epsilon", False)},
    ),
    "ProximalAdagrad": (
        "proximal_adagrad",
        {
            "l1_regularization_strength": ("l1", False),
            "l2_regularization_strength": ("l2", False),
        },
    ),
    "ProximalYogi": (
        "proximal_yogi",
        {
            "l1_regularization_strength": ("l1", False),
            "l2_regularization_strength": ("l2", False),
            "beta_1": ("beta1", False),
            "beta_2": ("beta2", False),
            "epsilon": ("epsilon", False),
        },
    ),
}

# TensorFlow's five classes take `low_dimensional_packing_status=True`; the
# engine-only ones refuse it (a zero-gradient step is not a no-op for them).
PACKING_ALLOWED = {"SGD", "Adagrad", "AdagradMomentum", "Adam", "FTRL"}

# Per class, the float hyperparameters with values at and near their edges
# (each allowed by the class), and the boolean ones. Hyperparameters that the
# proto cannot hold (initial_accumulator_value) are absent: they never reach
# the proto.
FLOAT_EDGES = {
    "SGD": {},
    "Adagrad": {},
    "AdagradMomentum": {
        "momentum": [0.0, 0.5, 0.999],
        "exponent": [1e-07, 1.0, 2.5],
        "beta2": [0.0, 0.5, 1.0],
        "epsilon": [1e-10, 1.0],
    },
    "Adam": {
        "beta_1": [0.0, 0.5, 0.999],
        "beta_2": [0.0, 0.5, 0.999],
        "epsilon": [1e-07, 1.5],
    },
    "FTRL": {
        "learning_rate_power": [0.0, -0.5, -2.0],
        "l1_regularization_strength": [0.0, 0.25],
        "l2_regularization_strength": [0.0, 0.25],
        "beta": [0.0, 0.75],
    },
    "Momentum": {"momentum": [0.0, 0.5, 0.999]},
    "RMSProp": {
        "rho": [0.0, 0.5, 0.999],
        "momentum": [0.0, 0.5, 0.999],
        "epsilon": [1e-07, 1.5],
    },
    "CenteredRMSProp": {
        "rho": [0.0, 0.5, 0.999],
        "momentum": [0.0, 0.5, 0.999],
        "epsilon": [1e-07, 1.5],
    },
    "Adadelta": {"rho": [0.0, 0.5, 0.999], "epsilon": [1e-07, 1.5]},
    "ProximalAdagrad": {
        "l1_regularization_strength": [0.0, 0.25],
        "l2_regularization_strength": [0.0, 0.25],
    },
    "ProximalYogi": {
        "beta_1": [0.0, 0.5, 0.999],
        "beta_2": [0.0, 0.5, 0.999],
        "epsilon": [1e-07, 1.5],
        "l1_regularization_strength": [0.0, 0.25],
        "l2_regularization_strength": [0.0, 0.25],
    },
}

BOOL_HYPERS = {
    "AdagradMomentum": ["use_nesterov"],
    "Adam": ["lazy_adam", "sum_inside_sqrt"],
    "FTRL": ["multiply_linear_by_learning_rate", "allow_zero_accumulator"],
    "Momentum": ["use_nesterov"],
}

WEIGHT_CLIPS = [
    (None, None),
    (-1.5, None),
    (None, 2.5),
    (-1.5, 2.5),
    (0.75, 0.75),
    (0.0, None),
    (None, 0.0),
    (0.0, 0.0),
]
GRADIENT_CLIPS = [
    None,
    2.0,
    (-1.0, None),
    (None, 3.0),
    (-1.0, 3.0),
    (0.5, 0.5),
    (0.0, None),
    (None, 0.0),
    (None, None),
]
DECAYS = [None, 0.0, 0.25]
MULTIPLY_FLAGS = [None, False, True]


def dynamic_rate():
    return 0.01


def _common_combinations(name):
    packings = [False, True] if name in PACKING_ALLOWED else [False]
    accumulation = [(False, None)] + [(True, clip) for clip in GRADIENT_CLIPS]
    for (low, high), (accumulate, clip), decay, multiply, packing in itertools.product(
        WEIGHT_CLIPS, accumulation, DECAYS, MULTIPLY_FLAGS, packings
    ):
        yield {
            "use_gradient_accumulation": accumulate,
            "clip_weight_min": low,
            "clip_weight_max": high,
            "weight_decay_factor": decay,
            "multiply_weight_decay_factor_by_learning_rate": multiply,
            "clipvalue": clip,
            "low_dimensional_packing_status": packing,
        }


def _accepted(name, arguments):
    # Non-lazy Adam needs gradient accumulation (TensorFlow refuses it too).
    return not (
        name == "Adam"
        and arguments.get("lazy_adam") is False
        and not arguments.get("use_gradient_accumulation", True)
    )


def every_combination(name):
    """Every accepted argument mix for embedding class `name` (see module doc).

    Yields keyword-argument dicts; arguments left out take the defaults.
    """
    bools = BOOL_HYPERS.get(name, [])
    for flags in itertools.product([False, True], repeat=len(bools)):
        hypers = dict(zip(bools, flags))
        for common in _common_combinations(name):
            arguments = {"learning_rate": 0.5, **hypers, **common}
            if _accepted(name, arguments):
                yield arguments
    # The learning rate's forms and each float hyperparameter at its edges,
    # with the common arguments at their defaults and all of them set.
    busy = {
        "clip_weight_min": -1.5,
        "clip_weight_max": 2.5,
        "weight_decay_factor": 0.25,
        "multiply_weight_decay_factor_by_learning_rate": True,
        "clipvalue": (-1.0, 3.0),
    }
    for common in ({}, busy):
        for rate in (0.0, 1e-3, 7.5, dynamic_rate):
            yield {"learning_rate": rate, **common}
        for hyper, values in FLOAT_EDGES[name].items():
            for value in values:
                yield {"learning_rate": 0.5, hyper: value, **common}


def _float32(value):
    # The proto keeps float32; a reader gives back its shortest decimal.
    return float(str(np.float32(value)))


def expected_proto(name, arguments, tag=None):
    """Renders the OptimizationParameters for `name(**arguments)`.

    Common arguments missing from `arguments` are at TensorFlow's defaults
    (no clips, no decay, accumulation on, no packing); every hyperparameter the
    proto holds must be given.
    """
    params = OptimizationParameters()
    rate = arguments.get("learning_rate")
    if callable(rate):
        params.learning_rate.dynamic.tag = tag
    elif rate is not None:
        params.learning_rate.constant = rate
    status = optimization_parameters_pb2.GradientAccumulationStatus
    params.gradient_accumulation_status = (
        status.ENABLED
        if arguments.get("use_gradient_accumulation", True)
        else status.DISABLED
    )
    if arguments.get("clip_weight_min") is not None:
        params.clipping_limits.lower.value = arguments["clip_weight_min"]
    if arguments.get("clip_weight_max") is not None:
        params.clipping_limits.upper.value = arguments["clip_weight_max"]
    clip = arguments.get("clipvalue")
    if clip is not None:
        low, high = clip if isinstance(clip, tuple) else (-clip, clip)
        if low is not None:
            params.gradient_clipping_limits.lower.value = low
        if high is not None:
            params.gradient_clipping_limits.upper.value = high
    # TensorFlow writes the decay only when it is non-zero, and the multiply
    # flag only together with it (the engine ignores the flag without decay).
    if arguments.get("weight_decay_factor"):
        params.weight_decay_factor = arguments["weight_decay_factor"]
        if arguments.get("multiply_weight_decay_factor_by_learning_rate"):
            params.multiply_weight_decay_factor_by_learning_rate = True
    if arguments.get("low_dimensional_packing_status"):
        params.low_dimensional_packing_status = (
            optimization_parameters_pb2.LowDimensionalPackingStatus.ENABLED
        )
    oneof, fields = PROTO_FIELDS[name]
    getattr(params, oneof).SetInParent()
    for argument, (field, negated) in fields.items():
        value = arguments[argument]
        setattr(getattr(params, oneof), field, (not value) if negated else value)
    return params


def expected_arguments(name, arguments, defaults):
    """What a reader must rebuild from `expected_proto(name, arguments)`.

    Args:
      name: The embedding class name.
      arguments: Constructor arguments (missing ones take `defaults`).
      defaults: The class's constructor defaults, e.g. from TensorFlow's
        signature or the class's documented defaults.

    Returns:
      {argument: value} for the arguments the proto holds, floats as the
      shortest decimals of their float32 values: a zero or absent decay reads
      back as None with no multiply flag, an unset flag as None, a scalar
      clipvalue c as (-c, c), (None, None) as None.
    """
    values = {**defaults, **arguments}
    decay = values["weight_decay_factor"]
    multiply = values["multiply_weight_decay_factor_by_learning_rate"]
    clip = values["clipvalue"]
    if clip is not None and not isinstance(clip, tuple):
        clip = (-clip, clip)
    if clip == (None, None):
        clip = None
    out = {
        "use_gradient_accumulation": values["use_gradient_accumulation"],
        "clip_weight_min": values["clip_weight_min"],
        "clip_weight_max": values["clip_weight_max"],
        "clipvalue": clip,
        "weight_decay_factor": decay if decay else None,
        "multiply_weight_decay_factor_by_learning_rate": (
            True if decay and multiply else None
        ),
        "low_dimensional_packing_status": values["low_dimensional_packing_status"],
    }
    if not callable(values["learning_rate"]):
        out["learning_rate"] = values["learning_rate"]
    for argument in PROTO_FIELDS[name][1]:
        out[argument] = values[argument]
    return {key: _as_float32(value) for key, value in out.items()}


def _as_float32(value):
    if isinstance(value, tuple):
        return tuple(_as_float32(v) for v in value)
    if isinstance(value, float) and math.isfinite(value):
        return _float32(value)
    return value
