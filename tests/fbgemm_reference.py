"""FBGEMM 1.9.0's CPU updates transcribed in NumPy, in its order (issue #54).

What `tests/test_fbgemm_golden.py` shows to equal FBGEMM's own CPU kernels
bit for bit (`tests/data/fbgemm_golden.npz`), and the spec the package's
row-wise optimizer follows (docs/tpu_semantics.md, "FBGEMM"):

- A looked-up row's gradient is the sum of its lookups' output gradients, in
  lookup order (pooled: its bags' gradients, once per occurrence).
- `EXACT_SGD`: `w <- fma(-lr, g, w)`.
- `EXACT_ADAGRAD`: `h <- fma(g, g, h)`; `w <- w - fl(lr·g) / (sqrt(h) + eps)`
  with the quotient and the subtraction in double precision.
- `EXACT_ROWWISE_ADAGRAD`: `m <- m + fl(sum of g'² / D)`, the sum of squares
  in 8 lanes (element d into lane d mod 8, each in order) added in adjacent
  pairs on the pooled path, in order on the unpooled one; `mult = lr /
  (sqrt(m) + eps)`; `w <- fma(c, w, -fl(g·mult))`, where `g' = g + fl(wd·w)`
  and `c = 1 - fl(mult·wd)` with L2 decay, `c = 1 - fl(lr·wd)` decoupled,
  `c = 1` without. The pooled CPU path ignores the weight decay (both modes).
- An FP16 table: the same float32 step from the table's float16 values, with
  float32 state, the sum of squares in order on both paths (the 8 lanes are
  the pooled kernel's on float32 tables only); only the new rows round to
  float16, to nearest. A BF16 table, for which FBGEMM has no CPU kernel, is
  given the same convention, rounding to bfloat16: not FBGEMM's measured
  step, the package's chosen one.

`fma(a, b, c)` is computed in double precision: the product of two float32
values is exact there; the sum is rounded twice (to double, then to float),
which can differ from one rounding only where the exact sum lies within
2^-29 of a float32 halfway point.
"""

from __future__ import annotations

from typing import Dict, Tuple

import fbgemm_inputs
import numpy as np

__all__ = ["run", "row_gradients"]

f32 = np.float32
f64 = np.float64


def _fma(a, b, c) -> np.ndarray:
    return (np.asarray(a, f64) * np.asarray(b, f64) + np.asarray(c, f64)).astype(f32)


def row_gradients(
    config: fbgemm_inputs.Config, ids, offsets, gradient
) -> Tuple[np.ndarray, np.ndarray]:
    """The distinct ids, ascending, and their summed gradients."""
    bags = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    sums: Dict[int, np.ndarray] = {}
    for position, (row, bag) in enumerate(zip(ids, bags)):
        value = gradient[bag] if config.pooled else gradient[position]
        sums[int(row)] = value.copy() if row not in sums else sums[int(row)] + value
    rows = np.array(sorted(sums), np.int64)
    return rows, np.stack([sums[int(r)] for r in rows]).astype(f32)


def _sum_of_squares(g: np.ndarray, pooled: bool) -> np.ndarray:
    squares = g * g  # float32 products
    lanes = 8 if pooled else 1
    sums = []
    for lane in range(min(lanes, g.shape[1])):
        total = np.zeros(g.shape[0], f32)
        for column in range(lane, g.shape[1], lanes):
            total = total + squares[:, column]
        sums.append(total)
    while len(sums) > 1:
        sums = [a + b for a, b in zip(sums[0::2], sums[1::2])]
    return sums[0]


def _step(config, w, state, rows, g, pooled_decay=False):
    lr, eps, wd = f32(config.learning_rate), f32(config.eps), f32(config.weight_decay)
    if config.optimizer == "EXACT_SGD":
        w[rows] = _fma(-lr, g, w[rows])
        return
    if config.optimizer == "EXACT_ADAGRAD":
        state[rows] = _fma(g, g, state[rows])
        quotient = (lr * g).astype(f64) / (np.sqrt(state[rows].astype(f64)) + f64(eps))
        w[rows] = (w[rows].astype(f64) - quotient).astype(f32)
        return
    # FBGEMM's pooled CPU kernel leaves the decay out (`pooled_decay`: not).
    mode = config.weight_decay_mode
    if config.pooled and not pooled_decay:
        mode = "NONE"
    squared = g + wd * w[rows] if mode == "L2" else g
    # The 8 lanes are the pooled kernel's on float32 tables only.
    lanes = config.pooled and config.precision == "FP32"
    state[rows] = state[rows] + _sum_of_squares(squared, lanes) / f32(config.dim)
    multiplier = lr / (np.sqrt(state[rows]) + eps)
    correction = np.ones_like(multiplier)
    if mode == "L2":
        correction = f32(1.0) - multiplier * wd
    elif mode == "DECOUPLE":
        correction = np.full_like(multiplier, f32(1.0) - lr * wd)
    w[rows] = _fma(correction[:, None], w[rows], -(g * multiplier[:, None]))


def run(
    config: fbgemm_inputs.Config,
    recorded=(1, 10, fbgemm_inputs.STEPS),
    pooled_decay: bool = False,
    gradient_dtype=None,
):
    """`{step: (table, state)}` after each of `recorded` steps (state `None`
    for `EXACT_SGD`; `[rows]` row-wise, the table's shape for Adagrad).
    `pooled_decay`: apply the weight decay on the pooled path too (what
    FBGEMM's GPU kernel does; its CPU kernel does not). `gradient_dtype`:
    the output gradients rounded to it first (FBGEMM given the float32
    values of a float16 model's gradients)."""
    w = fbgemm_inputs.initial_table(config).copy()
    rowwise = config.optimizer == "EXACT_ROWWISE_ADAGRAD"
    state = np.zeros(w.shape[:1] if rowwise else w.shape, f32)
    found = {}
    for step, (ids, offsets, gradient) in enumerate(fbgemm_inputs.steps(config), 1):
        if gradient_dtype is not None:
            gradient = gradient.astype(gradient_dtype).astype(f32)
        rows, g = row_gradients(config, ids, offsets, gradient)
        _step(config, w, state, rows, g, pooled_decay)
        if config.precision != "FP32":
            w[rows] = w[rows].astype(fbgemm_inputs.table_dtype(config)).astype(f32)
        if step in recorded:
            kept = None if config.optimizer == "EXACT_SGD" else state.copy()
            found[step] = (w.copy(), kept)
    return found
