"""A row-sparse table's step counter: a pair of float32 numbers that the
backward pass writes as it writes the rows.

Keras writes what the backward pass returns only when it applies the step,
so a counter that the backward pass advances counts exactly the steps
applied: one that a `LossScaleOptimizer` skips (non-finite gradients), one
refused for an id outside the table, and a backward pass without
`training=True` leave it as it was, as they leave the rows. It is a
trainable variable that Keras overwrites with its "gradient", like the table
and its slots, because JAX differentiates only floating-point values; and a
pair, because float32 counts exactly only to 2**24 steps (hours on an
accelerator): `[low, high]` holds `high * 2**24 + low`. Read as an integer
of the backend's (`count`): int64 on TensorFlow, int32 on JAX without
`jax_enable_x64`, where Keras's own step counter stops at 2**31 too.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from keras import ops

__all__ = ["BASE", "advanced", "count", "decode", "encode"]

# The pair's base: the first count a float32 cannot hold together with the
# next (2**24 + 1 rounds to 2**24).
BASE = 2**24

# The largest count a pair holds.
_LIMIT = BASE * BASE - 1


def encode(step: int) -> np.ndarray:
    """The pair holding `step` (an integer, 0 <= step < 2**48)."""
    if isinstance(step, (bool, np.bool_)) or not isinstance(step, (int, np.integer)):
        raise TypeError(
            "A table's step must be an integer in [0, 2**48); received "
            f"{step!r} of type {type(step).__name__}."
        )
    step = int(step)
    if not 0 <= step <= _LIMIT:
        raise ValueError(
            f"A table's step must be an integer in [0, 2**48); received {step}."
        )
    return np.array([step % BASE, step // BASE], np.float32)


def decode(pair: Any) -> int:
    """The step a concrete pair holds, as a Python int."""
    low, high = np.asarray(pair, np.float64).reshape(2)
    return int(high) * BASE + int(low)


def count(pair: Any, dtype: Any) -> Any:
    """The step a pair holds, as a tensor of the integer `dtype`."""
    low = ops.cast(pair[0], dtype)
    high = ops.cast(pair[1], dtype)
    return high * BASE + low


def advanced(pair: Any) -> Any:
    """The pair holding one step more: exact, as each part stays below
    2**24."""
    low = pair[0] + 1
    carry = ops.cast(low >= BASE, pair.dtype)
    return ops.stack([low - carry * BASE, pair[1] + carry])
