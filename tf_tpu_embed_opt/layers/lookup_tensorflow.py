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

import warnings
from typing import Any, Callable, Optional, Sequence, Tuple

import keras
import numpy as np
import tensorflow as tf
from tensorflow.python.eager import record

from tf_tpu_embed_opt.layers import gradients, table_step
from tf_tpu_embed_opt.layers import ids as ids_module
from tf_tpu_embed_opt.optimizers.sparse import deduplicate, in_xla_context

__all__ = [
    "VARIABLE_CLASS",
    "RowWritableVariable",
    "after",
    "checked_ids",
    "checked_tables",
    "flat_ids",
    "hold",
    "lookup",
    "split_rows",
    "unscaled",
    "write_rows",
]

RowsStep = Callable[[Any, Tuple[Any, ...], Any, Any, Any], Tuple[Any, Tuple[Any, ...]]]


class RowWritableVariable(keras.Variable):
    """A Keras variable whose `assign` of a `tf.IndexedSlices` writes only its
    rows (Keras's own `assign` would make it dense, zeros elsewhere)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Created in a strategy's scope: refused when the layer is built.
        _check_no_strategy()
        super().__init__(*args, **kwargs)

    def assign(self, value: Any) -> Any:
        if isinstance(value, tf.IndexedSlices):
            rows = tf.cast(value.values, self._value.dtype)
            self._value.scatter_update(tf.IndexedSlices(rows, value.indices))
            return value
        return super().assign(value)

    @property
    def value(self) -> Any:
        value = super().value
        # A read outside the lookup (which reads through the handle) that a
        # gradient tape may differentiate (`gradients`).
        if not record.could_possibly_record():
            return value
        refusal = gradients.read_refusal_of(self)
        return value if refusal is None else refuse_gradient(value, refusal)


def refuse_gradient(value: Any, message: str) -> Any:
    """`value` (a variable's read), whose gradient, where one flows through
    it, is refused with `message` when the backward pass is traced (but for
    a SavedModel's gradient function: `gradients.saving`)."""

    @tf.custom_gradient
    def read(value):
        def backward(cotangent):
            if gradients.saving():
                return cotangent
            raise ValueError(message)

        return tf.identity(value), backward

    return read(tf.convert_to_tensor(value))


VARIABLE_CLASS = RowWritableVariable


def lookup(
    rows_step: RowsStep,
    ids: Any,
    table: Any,
    slots: Sequence[Any],
    learning_rate: Any,
    iterations: Any,
    step: Any,
    training: bool,
    absent: bool = False,
    words: str = "Embedding",
    untrained: bool = False,
) -> Any:
    """`table[ids]`; differentiating it steps the looked-up rows.

    The arguments and the results (the rows and the loss-scale probe) are
    `lookup_jax.lookup`'s. The "gradients" of `table` and `slots` are their
    stepped rows, as `tf.IndexedSlices` (none without `training`), and of
    `step` its next value. Under XLA an id outside the table (which
    `checked_ids` cannot refuse there) reads zeros and steps no row.
    """

    # The function takes the variables' resource handles, not the variables:
    # `tf.custom_gradient` reads a captured variable whole (a dense read), and
    # a dense read of a table that the step then scatters into makes
    # TensorFlow copy the whole table (copy-on-write): measured 24 ms per
    # 1M x 64 table per step, the bulk of a step. Reading rows through the
    # handle copies nothing, and the gradient of a handle is its variable's.
    _check_no_strategy()
    rows_count, width = table.shape
    if _handle(table) is None:
        return _shaped_rows(ids, table)
    xla = in_xla_context()
    variables = [_handle(v) for v in (table, *slots)]
    # No rows (of the flat ids: a scalar id has no rows to slice).
    no_rows = tf.reshape(ids, [-1])[:0]
    for variable in variables:
        # A read of no rows, so that the caller's tape watches the variable.
        tf.gather(variable, no_rows)
    # A slot is the table's shape or, for a row-wise optimizer, one value per
    # row; of the table's dtype, or float32 where a 16-bit table steps in
    # float32 (`Definition.narrow_tables`): its gradient is summed in that.
    dtypes = [tf.as_dtype(v.dtype) for v in (table, *slots)]
    dtype, step_dtype = dtypes[0], max(dtypes, key=lambda d: d.size)
    shapes = [
        tf.constant([int(d) for d in v.shape], ids.dtype) for v in (table, *slots)
    ]

    # Losses scaled before this call; one scaled since is the loss whose
    # backward pass finds no probe (`gradients.refuse_unprobed`).
    scaled = gradients.losses_scaled()

    def read(handle, indices, dtype=dtype):
        return tf.raw_ops.ResourceGather(resource=handle, indices=indices, dtype=dtype)

    def stepped(ids, cot, scale, handles):
        flat = tf.reshape(ids, [-1])
        gradient = unscaled(tf.reshape(cot, [-1, width]), scale, step_dtype)
        xla = in_xla_context()
        if absent and not xla:
            # Under XLA the absent id's rows gather zeros and its writes
            # are dropped (XLA's out-of-bounds rules); here, leave it out.
            present = tf.not_equal(flat, rows_count)
            flat = tf.boolean_mask(flat, present)
            gradient = tf.boolean_mask(gradient, present)
        distinct, summed = deduplicate(flat, gradient, xla)
        new_rows, new_slot_rows = rows_step(
            read(handles[0], distinct),
            tuple(read(h, distinct, d) for h, d in zip(handles[1:], dtypes[1:])),
            summed,
            learning_rate,
            iterations,
        )
        return distinct, (new_rows, *new_slot_rows)

    @tf.custom_gradient
    def gather(ids, step, *handles):
        if absent or xla:
            # Under XLA an id outside the table would read a clamped row.
            present = (ids >= 0) & (ids < rows_count)
            outputs = read(handles[0], tf.where(present, ids, 0))
            outputs = tf.where(present[..., None], outputs, 0.0)
        else:
            outputs = read(handles[0], ids)

        def backward(cot, scale):
            if not training:
                gradients.refuse_untrained(words if untrained else None)
                return _handed_back(ids, step, (table, *slots), dtypes, shapes)
            if _no_probe(scale):
                gradients.refuse_unprobed(words, scaled)
            distinct, rows = stepped(ids, cot, scale, handles)
            # The next step waits for the ids' check, as the rows do.
            with tf.control_dependencies([distinct]):
                new_step = table_step.advanced(step)
            return (
                None,
                new_step,
                *(tf.IndexedSlices(r, distinct, d) for r, d in zip(rows, shapes)),
            )

        return (outputs, tf.zeros((), dtype)), backward

    return gather(
        ids, tf.convert_to_tensor(_handle(step)), *(v.handle for v in variables)
    )


def _shaped_rows(ids: Any, table: Any) -> tuple:
    """Zero rows of the lookup's shape and dtype, and a zero probe: the
    lookup in Keras's shape inference (of a layer that calls this one, built
    by tracing its call), whose variables Keras makes only afterwards."""
    dtype = tf.as_dtype(table.dtype)
    shape = tf.concat([tf.shape(ids), [int(table.shape[1])]], axis=0)
    return tf.zeros(shape, dtype), tf.zeros((), dtype)


def _handed_back(
    ids: Any, step: Any, variables: Sequence[Any], dtypes: Sequence[Any], shapes: Any
) -> tuple:
    """The "gradients" of a backward pass that is not training: none of the
    ids, the step counter as it is, and no rows of `variables` (the table
    and its slots, of `dtypes` and the dense `shapes`)."""
    none = tf.zeros([0], ids.dtype)
    rows = [tf.zeros([0, int(v.shape[1])], d) for v, d in zip(variables, dtypes)]
    return (
        None,
        step,
        *(tf.IndexedSlices(r, none, d) for r, d in zip(rows, shapes)),
    )


def flat_ids(ids: Any, name: str) -> Tuple[Any, Optional[Callable[[Any], Any]]]:
    """The ids to look up, and what gives their rows the batch's structure
    again (None where they have it): a `tf.RaggedTensor`'s flat values, their
    rows ragged again, as Keras's Embedding looks one up. A `tf.SparseTensor`
    is refused (`ids.sparse_refusal`)."""
    if isinstance(ids, tf.RaggedTensor):
        return ids.flat_values, ids.with_flat_values
    if isinstance(ids, tf.SparseTensor):
        raise TypeError(ids_module.sparse_refusal(name, "SparseTensor", True))
    return ids, None


def unscaled(cot: Any, scale: Any, dtype: Any) -> Any:
    """`lookup_jax.unscaled` (the cotangent of a scaled loss divided by the
    probe's, 0 counting as 1) in TensorFlow; a probe left out of the loss may
    also come as None."""
    cot = tf.cast(cot, dtype)
    if scale is None:
        return cot
    scale = tf.cast(scale, dtype)
    return cot / tf.where(tf.equal(scale, 0), tf.ones_like(scale), scale)


def _no_probe(scale: Any) -> bool:
    """Whether `scale`, the probe's cotangent, says the loss left the probe
    out: None, or the zero TensorFlow gives an output the loss does not use
    (a constant; `tf.gradients`' `zeros_like`)."""
    if scale is None:
        return True
    if not tf.executing_eagerly() and scale.op.type == "ZerosLike":
        return True
    value = tf.get_static_value(scale)
    return value is not None and not np.any(value)


def after(*tensors: Any) -> Any:
    """A context in which the ops created run after `tensors` (the layer's
    step counter after the ids' check, which a refusal must leave alone)."""
    return tf.control_dependencies(list(tensors))


def hold(counters: Sequence[Any]) -> None:
    """Reads each of `counters` (Keras variables) here, so that a later
    write of one (a model optimizer's step) waits for what this read waits
    for (`after`): in a `tf.function`, TensorFlow runs the reads and writes
    of one variable in program order, and runs no op after an input it
    waits for has failed."""
    if tf.executing_eagerly():
        return
    for counter in counters:
        _handle(counter).read_value()


def write_rows(variable: Any, start: int, rows: Any) -> None:
    """Writes `rows` into `variable` from row `start` on: a scatter of those
    rows (`RowWritableVariable`; a slice update needs XLA, which
    tensorflow-tpu cannot run without a TPU)."""
    rows = tf.convert_to_tensor(rows, variable.dtype)
    indices = tf.range(start, start + tf.shape(rows)[0])
    variable.assign(tf.IndexedSlices(rows, indices))


def wide_ids() -> str:
    """The widest integer ids TensorFlow looks up: int64."""
    return "int64"


def split_rows(rows: Any, sizes: Sequence[Any]) -> list:
    """`rows` split into consecutive parts of `sizes` rows (numbers, or
    scalars known when the step runs); its gradient is one concatenation."""
    return tf.split(rows, tf.stack([tf.cast(s, tf.int32) for s in sizes]))


def checked_tables(
    ids: Sequence[Any],
    rows: Sequence[int],
    names: Sequence[str],
    absent: bool = False,
    variables: Sequence[Any] = (),
) -> list:
    """Each table's `ids`, refused where one is outside its table: a
    `checked_ids` each (TensorFlow branches cheaply per table). `variables`
    (the tables', from which JAX learns a step's devices) are not needed."""
    return [
        checked_ids(table_ids, count, absent, name)
        for table_ids, count, name in zip(ids, rows, names)
    ]


def checked_ids(
    ids: Any, rows: int, absent: bool, name: str, variables: Sequence[Any] = ()
) -> Any:
    """`ids`, refused where one is outside the table (`layers.ids`);
    `variables` as for `checked_tables`.

    Eagerly, `OutOfRangeIds` at once. In a `tf.function`, an assertion that
    what follows waits for (TensorFlow runs side effects in program order):
    it raises `InvalidArgumentError`, whose message ends with the refusal;
    state the caller changes must wait for the result (`after`).
    XLA compiles assertions away, so under XLA (`jit_compile=True`) nothing
    is refused: `lookup` reads zeros for such ids and steps no row, and this
    warns when the step is traced.
    """
    if tf.executing_eagerly():
        ids_module.check_ids(ids.numpy(), rows, absent, name)
        return ids
    if in_xla_context():
        # One warning for every layer: the message names none.
        warnings.warn(
            "tf_tpu_embed_opt.layers.Embedding: under XLA "
            "(jit_compile=True: Keras's default on a GPU, and what a model "
            "compiled on JAX keeps when it is loaded here) TensorFlow cannot "
            "stop a step, so ids outside the table are not refused there: "
            "they read zeros and step no row. Compile with jit_compile=False "
            "(or set model.jit_compile = False) to have them refused, or "
            "check the ids before the model.",
            stacklevel=2,
        )
        return ids
    flat = tf.reshape(ids, [-1])
    bad = (flat < 0) | (flat >= ids_module.limit(rows, absent))
    count = tf.reduce_sum(tf.cast(bad, tf.int32))

    def refuse():
        # Formatted only when an id is outside (string ops run on the host);
        # only then is there a first one (`argmax` of no ids fails).
        first = tf.gather(flat, tf.argmax(tf.cast(bad, tf.int32), output_type=tf.int32))
        many, one = (ids_module.summary_template(rows, absent, name, m) for m in (1, 0))
        message = tf.where(
            count > 1,
            tf.strings.format(many, (first, count - 1, tf.size(flat))),
            tf.strings.format(one, first),
        )
        with tf.control_dependencies([tf.debugging.Assert(False, [message])]):
            return tf.identity(count)

    checked = tf.cond(tf.equal(count, 0), lambda: count, refuse)
    with tf.control_dependencies([checked]):
        return tf.identity(ids)


def _check_no_strategy() -> None:
    """Refuses a `tf.distribute` strategy that mirrors or shards variables."""
    if not tf.distribute.has_strategy():
        return
    strategy = tf.distribute.get_strategy()
    if isinstance(strategy, tf.distribute.OneDeviceStrategy):
        return
    raise ValueError(
        "tf_tpu_embed_opt.layers.Embedding does not run under "
        f"{type(strategy).__name__}: each replica would step the table with "
        "its own part of the batch, not with the batch's summed rows "
        "(TPUEmbedding's rule). Train it without a tf.distribute strategy (or with "
        "OneDeviceStrategy), or on Keras's JAX backend with "
        "keras.distribution (DataParallel, or a LayoutMap that shards the "
        "table), where it steps exactly as on one device."
    )


def _handle(variable: Any) -> Any:
    """The `tf.Variable` behind a Keras variable."""
    return getattr(variable, "_value", variable)
