"""The TPU engine's per-row step, written once against a small array namespace.

An update rule (see `spec.Definition.update`) only uses the functions of an
`ArrayNamespace`, so the same rule runs on NumPy arrays (reference and tests)
and on TensorFlow tensors (the Keras face), on dense tensors or on the gathered
rows of a sparse gradient.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

from tf_tpu_embed_opt.definitions import spec

__all__ = [
    "ArrayNamespace",
    "NUMPY",
    "ROUNDINGS",
    "ROUNDING_KEY",
    "engine_rounded",
    "shortest_float",
    "step_math",
    "tpu_step",
]


@dataclasses.dataclass(frozen=True)
class ArrayNamespace:
    """The functions an update rule may use: element-wise ones, and `min`,
    the minimum of every element (+inf over none), which a step scaled per
    variable (`spec.VariableFactor`) reduces with.

    A rule may pass Python numbers (the hyperparameters) where an array goes:
    the Keras face's namespaces take one beside an array in the array's
    dtype, and compute a function of Python numbers alone (LaProp's
    √(1 − β₁²)) in float32, as `keras.ops` does; on TensorFlow that value then
    meets the table as a Python number would, so that a float64 or a 16-bit
    table steps too."""

    sqrt: Callable[[Any], Any]
    square: Callable[[Any], Any]
    abs: Callable[[Any], Any]
    sign: Callable[[Any], Any]
    maximum: Callable[[Any, Any], Any]
    minimum: Callable[[Any, Any], Any]
    where: Callable[[Any, Any, Any], Any]
    power: Callable[[Any, Any], Any]
    rsqrt: Callable[[Any], Any]
    divide_no_nan: Callable[[Any, Any], Any]
    min: Callable[[Any], Any]
    # Σ of same-shaped arrays, left to right: ((t₀ + t₁) + t₂) + …. Where a
    # rule's result depends on the order of a sum (a row-wise optimizer's sum
    # of squares), it sums through this: TensorFlow's graph optimizer
    # regroups a chain of `+` into one `AddN` of another order.
    sum_in_order: Callable[[Sequence[Any]], Any]
    # x cut along its last axis into `parts` equal arrays, in order.
    split: Callable[[Any, int], Any]


def _divide_no_nan(x: Any, y: Any) -> Any:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(y == 0, 0.0, x / y)


NUMPY = ArrayNamespace(
    sqrt=np.sqrt,
    square=np.square,
    abs=np.abs,
    sign=np.sign,
    maximum=np.maximum,
    minimum=np.minimum,
    where=np.where,
    power=np.power,
    rsqrt=lambda x: 1 / np.sqrt(x),
    divide_no_nan=_divide_no_nan,
    min=lambda x: np.min(x, initial=np.inf),
    sum_in_order=lambda terms: functools.reduce(np.add, terms),
    split=lambda x, parts: np.split(x, parts, axis=-1),
)


# How a twin rounds (its `rounding` argument). "keras": Keras's optimizers'
# operations in their order, with terms of the hyperparameters (1 − β₁, ...)
# computed in Python floats, as `keras.optimizers` computes them.
# "jax-tpu-embedding": the operations and order of jax-tpu-embedding's
# lowering (`sparse_dense_matmul_grad_with_<name>.py`), with every
# hyperparameter a float32 operand, as the SparseCore program computes.
ROUNDINGS: Tuple[str, ...] = ("keras", spec.JAX_ENGINE)

ROUNDING_KEY = spec.ROUNDING_KEY


def engine_rounded(hypers: Mapping[str, Any], dtype: str) -> Dict[str, Any]:
    """`hypers` as the engine holds them: floats as scalars of `dtype`.

    Arithmetic on NumPy scalars rounds in their dtype, as the engine's
    float32 operands do (`1 - np.float32(0.9)` is float32's 1 − β₁, not the
    double's), and keeps Python's truthiness for the rules' branches.
    Booleans stay Python's.
    """
    if dtype == "bfloat16":
        import ml_dtypes

        scalar: Any = ml_dtypes.bfloat16
    else:
        scalar = np.dtype(dtype).type
    rounded: Dict[str, Any] = {
        name: scalar(value)
        if isinstance(value, (float, int)) and not isinstance(value, bool)
        else value
        for name, value in hypers.items()
    }
    rounded[ROUNDING_KEY] = spec.JAX_ENGINE
    return rounded


def tpu_step(
    definition: spec.Definition,
    xp: ArrayNamespace,
    w: Any,
    slots: Mapping[str, Any],
    g: Any,
    lr: Any,
    hypers: Mapping[str, Any],
    *,
    clip_gradient_min: Optional[float] = None,
    clip_gradient_max: Optional[float] = None,
    weight_decay_factor: Optional[float] = None,
    multiply_weight_decay_factor_by_learning_rate: bool = False,
    clip_weight_min: Optional[float] = None,
    clip_weight_max: Optional[float] = None,
) -> Tuple[Any, Mapping[str, Any]]:
    """One TPU-engine step for rows whose summed gradient is `g`.

    The order is the one reconstructed in `docs/tpu_semantics.md` §1.9:
    gradient clipping, decoupled weight decay (`w -= λ·w`, λ multiplied by the
    learning rate if requested), the algorithm's update, weight clipping.

    Args:
      definition: The algorithm.
      xp: Array namespace the arrays belong to.
      w: Rows of the table.
      slots: Matching rows of each slot, keyed by slot name.
      g: Row gradients (duplicates already summed).
      lr: Learning rate of this step.
      hypers: The algorithm's hyperparameters by name.
      clip_gradient_min: Lower gradient clip, `None` for none.
      clip_gradient_max: Upper gradient clip, `None` for none.
      weight_decay_factor: Decoupled weight decay λ, `None` or 0 for none.
      multiply_weight_decay_factor_by_learning_rate: Use λ·lr instead of λ.
      clip_weight_min: Lower weight clip, `None` for none.
      clip_weight_max: Upper weight clip, `None` for none.

    Returns:
      The new rows and the new slot rows.
    """
    if clip_gradient_min is not None:
        g = xp.maximum(g, clip_gradient_min)
    if clip_gradient_max is not None:
        g = xp.minimum(g, clip_gradient_max)
    if weight_decay_factor:
        decay = weight_decay_factor
        if multiply_weight_decay_factor_by_learning_rate:
            decay = decay * lr
        w = w - decay * w
    w, slots = definition.update(xp, w, slots, g, lr, hypers)
    if clip_weight_min is not None:
        w = xp.maximum(w, clip_weight_min)
    if clip_weight_max is not None:
        w = xp.minimum(w, clip_weight_max)
    return w, slots


def step_math(math: str, options: Mapping[str, Any]) -> str:
    """`math` (an algorithm's update, `Definition.math`) within the step
    `tpu_step` runs with `options` (its keywords; `None` or absent: not
    set), in its order: `"g ← max(g, -1.0);  w ← w − 0.1·w;  " + math`."""
    factor = options.get("weight_decay_factor")
    by_rate = options.get("multiply_weight_decay_factor_by_learning_rate")
    parts = [
        _clamped(
            "g", options.get("clip_gradient_min"), options.get("clip_gradient_max")
        ),
        f"w ← w − {factor!r}{'·η' if by_rate else ''}·w" if factor else "",
        math,
        _clamped("w", options.get("clip_weight_min"), options.get("clip_weight_max")),
    ]
    return ";  ".join(part for part in parts if part)


def _clamped(name: str, low: Any, high: Any) -> str:
    if low is not None and high is not None:
        return f"{name} ← clamp({name}, {low!r}, {high!r})"
    if low is not None:
        return f"{name} ← max({name}, {low!r})"
    if high is not None:
        return f"{name} ← min({name}, {high!r})"
    return ""


def shortest_float(value: float) -> float:
    """The shortest decimal that is the same float32 as `value`.

    Engines compute in float32, so 0.001 is stored as 0.0010000000474974513;
    the argument that gives the same float32 is 0.001.
    """
    return float(str(np.float32(value)))
