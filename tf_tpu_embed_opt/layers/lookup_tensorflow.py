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
    absent: bool = False,
) -> Any:
    """`table[ids]`; differentiating it steps the looked-up rows.

    The arguments are `lookup_jax.lookup`'s. The "gradients" of `table` and
    `slots` are their stepped rows, as `tf.IndexedSlices`.
    """

    # The variables are read inside the function, not passed in: the
    # backward pass then gathers their rows afresh, and no read of the whole
    # table is held until the optimizer scatters into it (measured: a 1M-row
    # Adagrad step went from 28.9 to 26.4 ms).
    handles = [_handle(v) for v in (table, *slots)]

    rows_count = tf.shape(handles[0], out_type=ids.dtype)[0]

    @tf.custom_gradient
    def gather(ids):
        if absent:
            present = tf.not_equal(ids, rows_count)
            outputs = tf.gather(handles[0], tf.where(present, ids, 0))
            outputs = tf.where(present[..., None], outputs, 0.0)
        else:
            outputs = tf.gather(handles[0], ids)
        for slot in handles[1:]:
            # Read (no rows) so that the backward pass is handed the slots too.
            tf.gather(slot, ids[:0])

        def backward(cot, variables=None):
            flat = tf.reshape(ids, [-1])
            table = handles[0]
            gradient = tf.cast(
                tf.reshape(cot, [-1, tf.shape(outputs)[-1]]), table.dtype
            )
            xla = in_xla_context()
            if absent and not xla:
                # Under XLA the absent id's rows gather zeros and its writes
                # are dropped (XLA's out-of-bounds rules); here, leave it out.
                present = tf.not_equal(flat, rows_count)
                flat = tf.boolean_mask(flat, present)
                gradient = tf.boolean_mask(gradient, present)
            distinct, summed = deduplicate(flat, gradient, xla)
            new_rows, new_slot_rows = rows_step(
                tf.gather(table, distinct),
                tuple(tf.gather(s, distinct) for s in handles[1:]),
                summed,
                learning_rate,
                iterations,
            )
            shape = tf.shape(table, out_type=distinct.dtype)
            stepped = {
                id(handle): tf.IndexedSlices(rows, distinct, shape)
                for handle, rows in zip(handles, (new_rows, *new_slot_rows))
            }
            return None, [stepped[id(v)] for v in variables]

        return outputs, backward

    return gather(ids)


def _handle(variable: Any) -> Any:
    """The `tf.Variable` behind a Keras variable."""
    return getattr(variable, "_value", variable)
