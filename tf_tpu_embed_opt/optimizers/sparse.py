"""Row-sparse gradients: summing duplicate ids, inside and outside XLA.

Used by the generated Keras twins (`optimizers`) on the TensorFlow backend.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Tuple

import tensorflow as tf
from tensorflow.compiler.tf2xla.python import xla
from tensorflow.python.ops import control_flow_util

__all__ = ["deduplicate", "in_xla_context", "update_distinct"]


def in_xla_context() -> bool:
    """Whether the op being built will be compiled by XLA (jit_compile, TPU)."""
    graph = tf.compat.v1.get_default_graph()
    return control_flow_util.GraphOrParentsInXlaContext(graph)


def deduplicate(
    indices: tf.Tensor, values: tf.Tensor, static_shape: bool = True
) -> Tuple[tf.Tensor, tf.Tensor]:
    """Sums the rows of a sparse gradient that share an id.

    With `static_shape=True` (what XLA needs) the result has as many entries as
    `indices`: the distinct ids in ascending order with their summed rows, then
    copies of the first entry. Writing every entry with a scatter therefore
    writes each distinct row once with its value, plus identical rewrites of the
    first row. With `static_shape=False` it has one entry per distinct id (in
    order of first appearance), which is cheaper outside XLA.

    Either way each id's rows are added in the order they appear in `indices`.

    Args:
      indices: `[n]` integer ids.
      values: `[n, ...]` gradient rows.
      static_shape: Keep the leading dimension `n`.

    Returns:
      `(ids, rows)`.
    """
    if not static_shape:
        ids, segments = tf.unique(indices)
        return ids, tf.math.unsorted_segment_sum(values, segments, tf.shape(ids)[0])
    count = tf.shape(indices)[0]
    ids, segments, distinct = _segments(indices)
    rows = tf.math.unsorted_segment_sum(values, segments, count)
    return _first_entries(ids, rows, distinct, count)


def _segments(indices: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """The distinct ids and where each entry goes, with static shapes.

    Returns:
      `(ids, segments, distinct)`: `[n]` ids whose first `distinct` entries
      are the distinct ids in ascending order (the rest unspecified), and
      `[n]` segments: for each entry, the position of its id in `ids`.
    """
    count = tf.shape(indices)[0]
    wide = tf.cast(count, tf.int64)
    # One int64 key per entry, (id, position): the keys are distinct, so a
    # plain ascending sort gives the stable order of the ids. XLA sorts one
    # operand with its built-in comparator; `tf.argsort(stable=True)` would
    # become a two-operand TopK sort, about 2x slower on XLA:CPU (issue #4).
    keys = tf.cast(indices, tf.int64) * wide + tf.range(wide)
    keys = xla.sort(keys) if in_xla_context() else tf.sort(keys)
    order = tf.cast(keys % wide, tf.int32)
    sorted_ids = tf.cast(keys // wide, indices.dtype)
    is_first = tf.concat(
        [tf.ones([1], tf.bool)[:count], sorted_ids[1:] != sorted_ids[:-1]], axis=0
    )
    sorted_segments = tf.cumsum(tf.cast(is_first, tf.int32)) - 1
    # Each entry's segment in entry order, so that the rows are summed where
    # they are instead of first being permuted into sorted order.
    segments = tf.scatter_nd(order[:, None], sorted_segments, [count])
    ids = tf.math.unsorted_segment_max(sorted_ids, sorted_segments, count)
    distinct = tf.reduce_sum(tf.cast(is_first, tf.int32))
    return ids, segments, distinct


def _first_entries(
    ids: tf.Tensor, rows: tf.Tensor, distinct: tf.Tensor, length: Any
) -> Tuple[tf.Tensor, tf.Tensor]:
    """The first `length` entries; those past `distinct` copy the first."""
    valid = tf.range(length) < distinct
    ids = tf.where(valid, ids[:length], ids[:1])
    rows = tf.where(
        tf.reshape(valid, [-1] + [1] * (len(rows.shape) - 1)), rows, rows[:1]
    )
    return ids, rows


# Prefix lengths tried by `update_distinct`, as fractions 1/d of the entries.
_PREFIX_DIVISORS = (8, 4, 2)


def update_distinct(
    indices: tf.Tensor,
    values: tf.Tensor,
    update: Callable[[tf.Tensor, tf.Tensor], None],
) -> None:
    """Calls `update(ids, rows)` with the summed rows of each distinct id.

    For XLA: static shapes throughout. `ids, rows` are the distinct ids in
    ascending order with their summed rows, then copies of the first
    (identical rewrites). Their number is the shortest of 1/8, 1/4, 1/2
    (rounded up) or all of the `n` entries that holds every distinct id: a
    batch has several times fewer distinct ids than entries (Zipf ids: 16,384
    entries, 3,415 distinct), and updating a copy costs as much as updating a
    distinct row.
    Each length is a branch of an XLA conditional with its own segment sum, so
    that the rows are summed into, and held in, buffers of that length.

    Args:
      indices: `[n]` integer ids.
      values: `[n, ...]` gradient rows.
      update: Writes the update of the given rows; returns nothing.
    """
    ids, segments, distinct = _segments(indices)
    count = tf.shape(indices)[0]
    # Rounded up: a branch of length 0 with entries would not compile.
    lengths = [-(-count // divisor) for divisor in _PREFIX_DIVISORS] + [count]
    # The first length that is long enough (all entries are).
    chosen = tf.reduce_sum(tf.cast(distinct > tf.stack(lengths[:-1]), tf.int32))
    # One conditional per length: with the same choice written as nested
    # conditionals, XLA:CPU copied the whole table every step (1M x 64
    # Adagrad: 330 ms instead of 5 ms).
    for index, length in enumerate(lengths):
        tf.cond(
            tf.equal(chosen, index),
            functools.partial(
                _update_segments, update, ids, values, segments, distinct, length
            ),
            _nothing,
        )


def _update_segments(update, ids, values, segments, distinct, length) -> None:
    # Every segment is below `distinct` <= `length`: no row is dropped.
    rows = tf.math.unsorted_segment_sum(values, segments, length)
    update(*_first_entries(ids, rows, distinct, length))


def _nothing() -> None:
    return None
