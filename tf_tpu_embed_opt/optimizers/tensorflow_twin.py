"""The Keras face on Keras's TensorFlow backend: row-sparse and sharded updates.

On the TensorFlow backend an embedding's gradient is a `tf.IndexedSlices`:
duplicate ids are summed first (inside and outside XLA, `sparse`), and with
`lazy=True` only the looked-up rows of the variable and of its slots are read,
updated and written. Whole-variable updates inside a `tf.function` are
compiled with XLA for large variables, so that they write in place. Tables
sharded over parameter servers are handled by `ShardedOptimizerMixin`. This
module is imported only on the TensorFlow backend; the rule itself is the
definition's, shared with every backend (`definitions/rules.py`).
"""

from __future__ import annotations

import functools
from typing import Any, Dict, List, Sequence

import keras
import tensorflow as tf

from tf_tpu_embed_opt.definitions import rules
from tf_tpu_embed_opt.optimizers.sharded import ShardedOptimizerMixin
from tf_tpu_embed_opt.optimizers.sparse import (
    deduplicate,
    in_xla_context,
    update_distinct,
)

__all__ = ["TENSORFLOW", "TensorFlowTwinBase", "XLA_MIN_ELEMENTS"]


def _kept(tensor: Any) -> Any:
    # An addition that grappler cannot merge into the one after it: behind a
    # `Snapshot` (eagerly nothing merges, and tensors have no op).
    op = getattr(tensor, "op", None)
    if op is not None and op.type in ("Add", "AddV2", "AddN"):
        return tf.raw_ops.Snapshot(input=tensor)
    return tensor


def _sum_in_order(terms: Sequence[Any]) -> Any:
    """((t₀ + t₁) + t₂) + …, one pair at a time. In a graph, grappler's
    arithmetic optimizer merges an addition into the one after it and sorts
    the inputs of the merged `AddN` by name (measured: TensorFlow 2.16 and
    2.21), which would sum in another order; a sum of two is the same bits
    in either order, so each pair's sum is kept from the next (`_kept`)."""
    total, *rest = (_kept(term) for term in terms)
    for term in rest:
        total = _kept(tf.add(total, term))
    return total


def _of_a_number(function: Any) -> Any:
    """`function`, which on a Python number gives a Python number: float32's
    value, as `keras.ops` and JAX compute a function of a Python number, and
    which then takes the dtype of the tensor it meets, as a Python number
    does. TensorFlow's own result would stay a float32 tensor, which no
    tensor of another dtype can meet: LaProp's √(1 − β₁²) failed every step of
    a float64 or a 16-bit table."""

    def applied(x: Any) -> Any:
        if _is_number(x):
            with tf.init_scope():  # at once, also while a graph is traced
                return float(function(tf.constant(x, tf.float32)))
        return function(x)

    return applied


def _meeting(function: Any, first: int = 0) -> Any:
    """`function`, whose Python-number arguments (from position `first` on)
    take the dtype of its first tensor argument, as a Python number meeting
    a tensor does in an arithmetic operator. TensorFlow's own function takes
    them as float32 in a graph, which a tensor of another dtype cannot meet:
    a step scaled per variable (`spec.VariableFactor`), whose `min(1, bound)`
    this is, failed in a `tf.function` for a float64 or a 16-bit table."""

    def applied(*args: Any) -> Any:
        dtypes = [a.dtype for a in args[first:] if tf.is_tensor(a)]
        if dtypes:
            args = tuple(
                tf.constant(a, dtypes[0]) if index >= first and _is_number(a) else a
                for index, a in enumerate(args)
            )
        return function(*args)

    return applied


def _is_number(value: Any) -> bool:
    # A Python int or float; not a bool, and not a NumPy scalar, which holds
    # its own dtype (`rules.engine_rounded`'s hyperparameters).
    return type(value) in (int, float)


TENSORFLOW = rules.ArrayNamespace(
    sqrt=_of_a_number(tf.sqrt),
    square=tf.square,
    abs=tf.abs,
    sign=tf.sign,
    maximum=_meeting(tf.maximum),
    minimum=_meeting(tf.minimum),
    where=_meeting(tf.where, first=1),
    # tf.pow, as Keras's optimizers call it (ops.power), Ftrl's a^0.5
    # included: a square root would round differently from Keras's Ftrl.
    power=_meeting(tf.pow),
    rsqrt=_of_a_number(tf.math.rsqrt),
    divide_no_nan=tf.math.divide_no_nan,
    min=tf.reduce_min,  # +inf over no element
    sum_in_order=_sum_in_order,
    split=lambda x, parts: tf.split(x, parts, axis=-1),
)

# Whole-variable updates inside a tf.function (dense gradients, non-lazy Adam)
# of variables with at least this many elements are compiled with XLA, once
# per variable and trace (~0.1 s each). Measured on 2 CPU cores, float32 Adam
# and Adagrad: at 16,384 elements compiling is 1.1x slower than TensorFlow ops;
# from 131,072 elements on it is 1.7-9x faster.
XLA_MIN_ELEMENTS = 1 << 16


def _summed_slices(gradient: tf.IndexedSlices) -> tf.IndexedSlices:
    static_shape = in_xla_context()
    ids, rows = deduplicate(gradient.indices, gradient.values, static_shape)
    if static_shape:
        # Padding entries repeat the first row; zero them so that norms and
        # the later summation count each distinct row once.
        keep = tf.logical_or(tf.range(tf.shape(ids)[0]) == 0, ids != tf.reduce_min(ids))
        rows = tf.where(
            tf.reshape(keep, [-1] + [1] * (len(rows.shape) - 1)),
            rows,
            tf.zeros_like(rows),
        )
    return tf.IndexedSlices(rows, ids, gradient.dense_shape)


class _DivisibleSlices(tf.IndexedSlices):
    """A `tf.IndexedSlices` that Keras can unscale. `Optimizer.apply` divides
    each gradient by `loss_scale_factor` with `/`, which `tf.IndexedSlices`
    does not have: a step on an Embedding's gradient failed with a
    `TypeError`. Dividing the values divides the rows they add up to."""

    def __truediv__(self, scale: Any) -> tf.IndexedSlices:
        return tf.IndexedSlices(self.values / scale, self.indices, self.dense_shape)


def _tensor(variable: Any) -> Any:
    return variable.value if isinstance(variable, keras.Variable) else variable


def _rows_of(variable: Any, ids: Any) -> tf.Tensor:
    """The rows `ids` of `variable` (None: all of it)."""
    value = _tensor(variable)
    return tf.convert_to_tensor(value) if ids is None else tf.gather(value, ids)


def _device_type(variable: Any) -> str:
    return tf.DeviceSpec.from_string(_tensor(variable).device).device_type or "CPU"


@functools.lru_cache(maxsize=None)
def _xla_compiles_on(device_type: str) -> bool:
    """Whether XLA can compile for `device_type` in this process.

    Not every TensorFlow build can: `tensorflow-tpu` without `libtpu` has no
    XLA backend for the host ("could not find registered transfer manager").
    """
    with tf.init_scope(), tf.device(f"/device:{device_type}:0"):
        try:
            tf.function(tf.identity, jit_compile=True)(tf.constant(0.0))
        except tf.errors.OpError:
            return False
    return True


def constant_initializer(value: float) -> Any:
    """An initializer filling with `value` converted straight to the dtype.

    `keras.initializers.Constant` converts a Python float to float32 first, so
    a float64 slot would start from the rounded value.
    """

    def initializer(shape: Any, dtype: Any = None) -> tf.Tensor:
        return tf.fill(shape, tf.constant(value, dtype=dtype or "float32"))

    return initializer


class TensorFlowTwinBase(ShardedOptimizerMixin):
    """The TensorFlow backend's part of every twin (mixed in before Keras's
    optimizer): `tf.IndexedSlices` gradients, XLA, sharded variables."""

    _XP = TENSORFLOW

    def _apply_rule(
        self,
        gradient: Any,
        variable: Any,
        lr: Any,
        slots: Dict[str, Any],
        hypers: Dict[str, Any],
    ) -> None:
        """The rule on the looked-up rows of a `tf.IndexedSlices` gradient
        (duplicates summed), or on the whole variable."""
        # A 16-bit table's duplicate ids are summed in the dtype it steps in.
        dtype = self._step_dtype(variable)
        if isinstance(gradient, tf.IndexedSlices) and self._rows_only:

            def rows_update(ids: tf.Tensor, rows: tf.Tensor) -> None:
                current = {name: _rows_of(s, ids) for name, s in slots.items()}
                new_rows, new_slots = self._tpu_step(
                    TENSORFLOW, _rows_of(variable, ids), current, rows, lr, hypers
                )
                self._write(variable, slots, ids, new_rows, new_slots)

            values = tf.cast(gradient.values, dtype)
            if in_xla_context():
                update_distinct(gradient.indices, values, rows_update)
            else:
                rows_update(*deduplicate(gradient.indices, values, False))
            return
        rows = None
        if isinstance(gradient, tf.IndexedSlices):
            keeps = self._definition.keras.zero_gradient_keeps_weights
            if keeps is not None and keeps(self._arguments):
                # Every row's slots step, but only the looked-up rows of the
                # weights can change: write those (as Keras does).
                rows = gradient.indices
            gradient = tf.convert_to_tensor(gradient)

        def dense_update(gradient: tf.Tensor, lr: tf.Tensor) -> None:
            new_value, new_slots = self._tpu_step(
                TENSORFLOW,
                tf.convert_to_tensor(_tensor(variable)),
                {name: tf.convert_to_tensor(_tensor(s)) for name, s in slots.items()},
                gradient,
                lr,
                hypers,
            )
            for name, slot in slots.items():
                self.assign(slot, new_slots[name])
            if rows is None:
                self.assign(variable, new_value)
            else:
                self.assign(
                    variable, tf.IndexedSlices(tf.gather(new_value, rows), rows)
                )
            self._keep_factor(variable, new_slots)

        if (
            self._rule.factor is None
            and tf.inside_function()
            and not in_xla_context()
            and _tensor(variable).shape.num_elements() >= XLA_MIN_ELEMENTS
            and _xla_compiles_on(_device_type(variable))
        ):
            # The rule is a chain of element-wise ops over the whole variable.
            # As TensorFlow ops each allocates a new variable-sized tensor
            # (1.3-1.8x the time of Keras's in-place updates, issue #4);
            # compiled, it is one loop that writes the variables in place. (Not
            # a step scaled per variable: its source is TensorFlow ops, whose
            # float32 results it keeps to the bit.)
            dense_update = tf.function(dense_update, jit_compile=True, autograph=False)
        dense_update(tf.cast(gradient, dtype), lr)

    def _write(
        self,
        variable: Any,
        slots: Dict[str, Any],
        ids: Any,
        new_rows: Any,
        new_slots: Dict[str, Any],
    ) -> None:
        """Writes the rows `ids` (None: all) of `variable` and of its slots,
        and keeps the step's factor where the class exports it. Written, not
        subtracted: XLA's copies of a row rewrite the same value. Slots the
        twin does not keep (`Slot.when`) are not written."""
        for name, slot in slots.items():
            value = new_slots[name]
            self.assign(slot, value if ids is None else tf.IndexedSlices(value, ids))
        self.assign(
            variable, new_rows if ids is None else tf.IndexedSlices(new_rows, ids)
        )
        self._keep_factor(variable, new_slots)

    def _apply_shards(
        self, gradients: List[Any], shards: List[tf.Variable], learning_rate: Any
    ) -> None:
        """A step scaled per variable over its shards: one factor for all.

        Each shard's bound is computed on the server that holds it; the
        variable's is their minimum (scalars), as for the whole variable;
        then each server writes its rows. Other rules step shard by shard.
        """
        if self._rule.factor is None:
            super()._apply_shards(gradients, shards, learning_rate)
            return
        dtype = shards[0].dtype
        index = self._get_variable_index(shards[0])
        lr, hypers = self._step_arguments(learning_rate, self.iterations, dtype)
        parts = []
        for gradient, shard in zip(gradients, shards):
            with tf.device(shard.device):
                slots = {
                    name: self._slot_for(variables[index], shard)
                    for name, variables in self._slot_variables.items()
                }
                if isinstance(gradient, tf.IndexedSlices):
                    values = tf.cast(gradient.values, dtype)
                    ids, rows = deduplicate(gradient.indices, values, False)
                else:
                    ids, rows = None, tf.cast(gradient, dtype)
                bound, carry = self._active.bound(
                    TENSORFLOW,
                    _rows_of(shard, ids),
                    {name: _rows_of(slot, ids) for name, slot in slots.items()},
                    rows,
                    lr,
                    hypers,
                )
                parts.append((shard, slots, ids, bound, carry))
        bound = tf.reduce_min(tf.stack([part[3] for part in parts]))
        for shard, slots, ids, _, carry in parts:
            with tf.device(shard.device):
                new_rows, new_slots = self._active.scaled(
                    TENSORFLOW, carry, bound, hypers
                )
                self._write(shard, slots, ids, new_rows, new_slots)

    def apply(self, grads: Any, trainable_variables: Any = None) -> Any:
        if self.loss_scale_factor is not None:
            grads = [
                _DivisibleSlices(g.values, g.indices, g.dense_shape)
                if isinstance(g, tf.IndexedSlices)
                else g
                for g in grads
            ]
        return super().apply(grads, trainable_variables)

    def _clip_gradients(self, grads: List[Any]) -> List[Any]:
        # Keras clips the values of a sparse gradient one duplicate at a time;
        # clip the summed rows instead, so that sparse equals dense.
        if self.clipnorm or self.global_clipnorm or self.clipvalue:
            grads = [
                _summed_slices(g) if isinstance(g, tf.IndexedSlices) else g
                for g in grads
            ]
        return super()._clip_gradients(grads)
