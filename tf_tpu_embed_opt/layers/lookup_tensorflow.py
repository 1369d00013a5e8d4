"""The row-sparse lookup on Keras's TensorFlow backend: the table steps in the
backward pass.

A `tf.custom_gradient`: the forward pass gathers rows; the backward pass sums
each looked-up id's gradient rows (`optimizers/sparse.py`, static shapes under
XLA), steps those rows of the table and of its slots with the table's
optimizer, and returns the stepped rows as `tf.IndexedSlices` in place of the
gradients of the table and the slots. The layer marks those variables
`overwrite_with_gradient`; Keras's optimizer then assigns the "gradient", which
`RowWritableVariable` writes as a scatter of those rows only.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence, Tuple

import keras
import tensorflow as tf

from tf_tpu_embed_opt.optimizers.sparse import deduplicate, in_xla_context

__all__ = ["VARIABLE_CLASS", "RowWritableVariable", "lookup"]

RowsStep = Callable[[Any, Tuple[Any, ...], Any, Any, Any], Tuple[Any, Tuple[Any, ...]]]


class RowWritableVariable(keras.Variable):
    """A Keras variable whose `assign` of a `tf.IndexedSlices` writes only its
    rows (Keras's own `assign` would make it dense, zeros elsewhere)."""

    def assign(self, value: Any) -> Any:
        if isinstance(value, tf.IndexedSlices):
            rows = tf.cast(value.values, self._value.dtype)
            self._value.scatter_update(tf.IndexedSlices(rows, value.indices))
            return value
        return super().assign(value)


VARIABLE_CLASS = RowWritableVariable


def lookup(
    rows_step: RowsStep,
    ids: Any,
    table: Any,
    slots: Sequence[Any],
    learning_rate: Any,
    iterations: Any,
) -> Any:
    """`table[ids]`; differentiating it steps the looked-up rows.

    Args:
      rows_step: `(rows, slot_rows, summed_gradient_rows, learning_rate,
        iterations) -> (new_rows, new_slot_rows)`, the table optimizer's step.
      ids: Integer ids, any shape.
      table: `[rows, dim]` values of the table.
      slots: Values of the table optimizer's slots, each shaped like `table`.
      learning_rate: The table optimizer's learning rate of this step.
      iterations: Steps the table optimizer took before this one.

    Returns:
      `[*ids.shape, dim]` rows. The "gradients" of `table` and `slots` are
      their stepped rows, as `tf.IndexedSlices`.
    """

    @tf.custom_gradient
    def gather(table, *slots):
        def backward(cot):
            flat = tf.reshape(ids, [-1])
            gradient = tf.cast(tf.reshape(cot, [-1, tf.shape(table)[1]]), table.dtype)
            distinct, summed = deduplicate(flat, gradient, in_xla_context())
            new_rows, new_slot_rows = rows_step(
                tf.gather(table, distinct),
                tuple(tf.gather(s, distinct) for s in slots),
                summed,
                learning_rate,
                iterations,
            )
            shape = tf.shape(table, out_type=distinct.dtype)
            return [tf.IndexedSlices(new_rows, distinct, shape)] + [
                tf.IndexedSlices(rows, distinct, shape) for rows in new_slot_rows
            ]

        return tf.gather(table, ids), backward

    return gather(table, *slots)
