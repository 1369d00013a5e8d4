"""The row-sparse lookup on Keras's JAX backend: the table steps in the backward
pass.

A `jax.custom_vjp`: the forward pass gathers rows; the backward pass sums each
looked-up id's gradient rows, steps those rows of the table and of its slots
with the table's optimizer, and returns the stepped table and slots in place of
their gradients. The layer marks those variables `overwrite_with_gradient`, so
Keras's optimizer writes them as they are. No gradient the size of the table
exists: the backward pass writes the stepped rows into the table's buffer,
which Keras's JAX trainer donates, so XLA updates it in place.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Sequence, Tuple

import jax
import jax.numpy as jnp
import keras

from tf_tpu_embed_opt.layers import ids as ids_module

__all__ = ["VARIABLE_CLASS", "after", "checked_ids", "lookup"]

# The table and its slots are plain Keras variables here: Keras assigns them
# the whole stepped array that the backward pass returns.
VARIABLE_CLASS = keras.Variable

RowsStep = Callable[[Any, Tuple[Any, ...], Any, Any, Any], Tuple[Any, Tuple[Any, ...]]]


def _step(rows_step: RowsStep, ids, table, slots, learning_rate, iterations, cot):
    flat = ids.reshape(-1)
    count = flat.shape[0]
    gradient = cot.reshape(count, table.shape[1]).astype(table.dtype)
    # Each looked-up id once (ascending); padding entries hold an id past the
    # table, gather zeros and are dropped when written back.
    distinct, inverse = jnp.unique(
        flat, size=count, fill_value=table.shape[0], return_inverse=True
    )
    # Each id's rows summed in the order they appear, as TensorFlow's segment
    # sum does for the TensorFlow backend's lazy path.
    summed = jax.ops.segment_sum(gradient, inverse.reshape(-1), num_segments=count)

    def rows(value):
        return jnp.take(value, distinct, axis=0, mode="fill", fill_value=0)

    new_rows, new_slot_rows = rows_step(
        rows(table), tuple(rows(s) for s in slots), summed, learning_rate, iterations
    )
    new_table = table.at[distinct].set(new_rows.astype(table.dtype), mode="drop")
    new_slots = tuple(
        s.at[distinct].set(r.astype(s.dtype), mode="drop")
        for s, r in zip(slots, new_slot_rows)
    )
    return new_table, new_slots


def lookup(
    rows_step: RowsStep,
    ids: Any,
    table: Any,
    slots: Sequence[Any],
    learning_rate: Any,
    iterations: Any,
    absent: bool = False,
) -> Any:
    """`table[ids]`; differentiating it steps the looked-up rows.

    Args:
      rows_step: `(rows, slot_rows, summed_gradient_rows, learning_rate,
        iterations) -> (new_rows, new_slot_rows)`, the table optimizer's step.
      ids: Integer ids, any shape.
      table: The `[rows, dim]` table variable.
      slots: The table optimizer's slot variables, each shaped like `table`.
      learning_rate: The table optimizer's learning rate of this step.
      iterations: Steps the table optimizer took before this one.
      absent: An id equal to the table's row count is no lookup: it reads
        zeros and steps no row.

    Returns:
      `[*ids.shape, dim]` rows. The "gradients" of `table` and `slots` are
      their stepped values; of the other arguments, zero.
    """

    @jax.custom_vjp
    def gather(table, slots, learning_rate, iterations):
        if absent:
            # The absent id is past the table: `fill` reads zeros for it.
            return jnp.take(table, ids, axis=0, mode="fill", fill_value=0)
        return jnp.take(table, ids, axis=0)

    def forward(table, slots, learning_rate, iterations):
        return gather(table, slots, learning_rate, iterations), (
            table,
            slots,
            learning_rate,
            iterations,
        )

    def backward(residuals, cot):
        table, slots, learning_rate, iterations = residuals
        new_table, new_slots = _step(
            rows_step, ids, table, slots, learning_rate, iterations, cot
        )
        return (
            new_table,
            new_slots,
            _zero_cotangent(learning_rate),
            _zero_cotangent(iterations),
        )

    gather.defvjp(forward, backward)
    return gather(table.value, tuple(s.value for s in slots), learning_rate, iterations)


def after(tensor: Any) -> Any:
    """No ordering is needed: a refused step's new state is never kept."""
    return contextlib.nullcontext()


def checked_ids(ids: Any, rows: int, absent: bool, name: str) -> Any:
    """`ids`, refused where one is outside the table (`layers.ids`): with
    `OutOfRangeIds` at once where they are concrete; in a compiled step, when
    it runs, from a host callback given the ids (JAX raises it as a
    `JaxRuntimeError` whose message ends with the refusal; the step's new
    state is not kept, and Keras's trainer, which donated the model's arrays
    to the step, is left without them)."""
    if not isinstance(ids, jax.core.Tracer):
        ids_module.check_ids(ids, rows, absent, name)
        return ids
    # One reduction each step (as unsigned, a negative id is larger than any
    # table); the host sees the ids only for a batch that has such an id (a
    # callback run in every step of every table cost a 26-table model 40% of
    # its step; a program with callbacks still costs: docs/benchmarks.md).
    largest = jnp.max(ids.astype(jnp.uint32 if ids.dtype == jnp.int32 else jnp.uint64))
    outside = largest >= ids_module.limit(rows, absent)
    jax.lax.cond(
        outside,
        lambda: jax.debug.callback(
            functools.partial(
                ids_module.check_ids, rows=rows, absent=absent, name=name
            ),
            ids,
        ),
        lambda: None,
    )
    return ids


def _zero_cotangent(value: Any) -> Any:
    value = jnp.asarray(value)
    if jnp.issubdtype(value.dtype, jnp.inexact):
        return jnp.zeros_like(value)
    return jnp.zeros(value.shape, dtype=jax.dtypes.float0)
