"""The row-sparse lookup on Keras's JAX backend: the table steps in the backward
pass.

A `jax.custom_vjp`: the forward pass gathers rows; the backward pass sums each
looked-up id's gradient rows, steps those rows of the table and of its slots
with the table's optimizer, and returns the stepped table and slots in place of
their gradients. The layer marks those variables `overwrite_with_gradient`, so
Keras's optimizer writes them as they are. No gradient the size of the table
exists: the backward pass writes the stepped rows into the table's buffer,
which Keras's JAX trainer donates, so XLA updates it in place. It steps the
rows as the forward pass gathered them, which orders that read before the
write whatever the loss.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import keras
import numpy as np
from jax.custom_derivatives import CustomVJPPrimal, SymbolicZero
from jax.experimental import sparse as jax_sparse
from keras.src.backend.common.stateless_scope import in_stateless_scope
from keras.src.backend.common.symbolic_scope import in_symbolic_scope

from tf_tpu_embed_opt.layers import gradients, table_step
from tf_tpu_embed_opt.layers import ids as ids_module

__all__ = [
    "VARIABLE_CLASS",
    "TableVariable",
    "after",
    "checked_ids",
    "checked_tables",
    "distinct_ids",
    "flat_ids",
    "hold",
    "lookup",
    "split_rows",
    "unscaled",
    "write_rows",
]


class TableVariable(keras.Variable):
    """A Keras variable of a row-sparse table (the table, a slot, the step
    counter): Keras assigns it the whole stepped array that the backward pass
    returns. Read after Keras's JAX trainer has lost its array, it says so.

    Keras's JAX trainer gives the model's arrays to each compiled step
    (`donate_argnums`), and takes them out of the variables for the loop of
    `fit`, `evaluate` and `predict`; an error inside a step (an id outside
    a table, refused there) consumes them, and the model is left with
    deleted arrays, or none.
    JAX's own errors then name neither the cause nor the way out."""

    @property
    def value(self) -> Any:
        # In a stateless call (a traced step) the scope's values are read.
        if not in_stateless_scope():
            current = self._value
            gone = (
                current.is_deleted()
                if hasattr(current, "is_deleted")
                else current is None and self._initializer is None
            )
            if gone:
                raise ids_module.LostArrays(
                    f"{self.path}: this row-sparse table has lost its arrays, "
                    "as has the model: Keras's JAX trainer gave them to a "
                    "compiled step (fit, evaluate or predict) that failed (an "
                    "id outside a table, or any error inside the step), which "
                    "consumed them. Restore the model's weights "
                    "(model.load_weights(...), the BackupAndRestore callback, "
                    "or your last checkpoint) before you use it again."
                )
            return super().value
        # A traced step's read outside the lookup (`gradients`).
        value = super().value
        refusal = gradients.read_refusal_of(self)
        return value if refusal is None else refuse_gradient(value, refusal)


def refuse_gradient(value: Any, message: str) -> Any:
    """`value`, whose gradient, where one flows through it, is refused with
    `message` when the backward pass is traced (but for a SavedModel's
    gradient function: `gradients.saving`)."""

    @jax.custom_vjp
    def read(value):
        return value

    def backward(_, cotangent):
        if gradients.saving():
            return (cotangent,)
        raise ValueError(message)

    read.defvjp(lambda value: (value, None), backward)
    return read(value)


# What a refusal inside a compiled step adds: Keras's compiled steps on JAX
# (fit, evaluate, predict) donate the model's arrays to the step.
_DONATED = (
    "In a compiled Keras step (fit, evaluate, predict) the model's arrays "
    "went with the step: restore its weights (model.load_weights, "
    "BackupAndRestore) before you use it again."
)


VARIABLE_CLASS = TableVariable


def wide_ids() -> str:
    """The widest integer ids JAX holds: int64 only with `jax_enable_x64`
    (without it JAX makes every int64 array int32 as it takes it)."""
    return "int64" if jax.config.jax_enable_x64 else "int32"


RowsStep = Callable[[Any, Tuple[Any, ...], Any, Any, Any], Tuple[Any, Tuple[Any, ...]]]


def _step(
    rows_step: RowsStep,
    ids,
    table,
    slots,
    learning_rate,
    iterations,
    cot,
    scale,
    looked_up,
):
    flat = ids.reshape(-1)
    count = flat.shape[0]
    if not count:
        # A batch of no ids (a feature of length 0) steps no row.
        return table, tuple(slots)
    # In the dtype the rows step in: the slots' where wider than the table's
    # (float32 state of a 16-bit table, `Definition.narrow_tables`).
    dtype = jnp.result_type(table.dtype, *(s.dtype for s in slots))
    gradient = unscaled(cot.reshape(count, table.shape[1]), scale, dtype)
    if _marks_rows(count, table.shape[0]):
        return _step_every_row(
            rows_step, flat, table, slots, learning_rate, iterations, gradient
        )
    distinct, inverse = distinct_ids(flat, table.shape[0])
    # Each id's rows summed in the order they appear, as TensorFlow's segment
    # sum does for the TensorFlow backend's lazy path.
    summed = jax.ops.segment_sum(gradient, inverse, num_segments=count)

    def rows(value):
        return jnp.take(value, distinct, axis=0, mode="fill", fill_value=0)

    # Each distinct id's row as the forward pass read it (`looked_up`, at its
    # first entry): the table's row; zeros for an absent id and the padding.
    first = jax.ops.segment_min(jnp.arange(count), inverse, num_segments=count)
    current = jnp.take(
        looked_up.reshape(count, table.shape[1]),
        first,
        axis=0,
        mode="fill",
        fill_value=0,
    )
    new_rows, new_slot_rows = rows_step(
        current, tuple(rows(s) for s in slots), summed, learning_rate, iterations
    )
    new_table = table.at[distinct].set(new_rows.astype(table.dtype), mode="drop")
    new_slots = tuple(
        s.at[distinct].set(r.astype(s.dtype), mode="drop")
        for s, r in zip(slots, new_slot_rows)
    )
    return new_table, new_slots


# Up to this many table rows per looked-up id, the backward pass marks the
# looked-up rows and steps every row of the table (arrays of the table's row
# count, bounded by the batch, never by a large table) instead of sorting
# the ids and stepping the distinct ones.
MARKED_ROWS_PER_ID = 2


def _step_every_row(
    rows_step: RowsStep, flat, table, slots, learning_rate, iterations, gradient
):
    """`_step` for a table of at most `MARKED_ROWS_PER_ID` rows per id: the
    rule steps every row (as many as, or fewer than, the padded list of
    distinct ids would), and only the looked-up rows keep the result: no
    sort, no search, no gather or scatter of rows (for the 53,248 ids of 26
    stacked 1k-row tables, 1.57 ms against 8.76 ms, docs/benchmarks.md).
    Each row's gradient is summed in the order its entries appear, and the
    rule is row by row: the same values as stepping the gathered rows."""
    rows = table.shape[0]
    # An absent id (`rows`) is dropped: it marks and sums into no row.
    looked = jnp.zeros((rows,), bool).at[flat].set(True, mode="drop")
    summed = jax.ops.segment_sum(gradient, flat, num_segments=rows)
    new_rows, new_slot_rows = rows_step(
        table, tuple(slots), summed, learning_rate, iterations
    )
    looked = looked[:, None]
    new_table = jnp.where(looked, new_rows.astype(table.dtype), table)
    new_slots = tuple(
        jnp.where(looked, r.astype(s.dtype), s) for s, r in zip(slots, new_slot_rows)
    )
    return new_table, new_slots


def _marks_rows(count: int, rows: int) -> bool:
    """Whether a table of `rows` rows looked up by `count` ids is small
    enough to step every row (`MARKED_ROWS_PER_ID`; the absent id's row
    counted)."""
    return rows + 1 <= MARKED_ROWS_PER_ID * count


def distinct_ids(flat: Any, fill: int) -> Tuple[Any, Any]:
    """Each id of `flat` once, ascending, and where each entry's id is in that
    list: `jnp.unique(flat, size=len(flat), fill_value=fill,
    return_inverse=True)`, in about half its time on CPU.

    `fill` (the table's row count) pads the list: an id past the table, whose
    row gathers zeros and is dropped when written back. An entry equal to
    `fill` (an absent id) finds the list's first `fill`, as in `jnp.unique`.

    `jnp.unique` sorts the ids together with their positions; a sort of the
    ids alone is several times faster (XLA's sort of one operand against
    two), and a binary search of each id in the sorted list gives the same
    positions. Both are sorts and searches, which run as well on a GPU.
    """
    count = flat.shape[0]
    ordered = jnp.sort(flat)
    first = jnp.concatenate([jnp.ones((1,), dtype=bool), ordered[1:] != ordered[:-1]])
    # The k-th distinct id goes to place k; repeats go past the end (dropped).
    place = jnp.where(first, jnp.cumsum(first) - 1, count)
    distinct = jnp.full((count,), fill, flat.dtype).at[place].set(ordered, mode="drop")
    return distinct, jnp.searchsorted(distinct, flat)


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

    Args:
      rows_step: `(rows, slot_rows, summed_gradient_rows, learning_rate,
        iterations) -> (new_rows, new_slot_rows)`, the table optimizer's step.
      ids: Integer ids, any shape.
      table: The `[rows, dim]` table variable.
      slots: The table optimizer's slot variables, each shaped like `table`.
      learning_rate: The table optimizer's learning rate of this step.
      iterations: Steps the table optimizer took before this one: what
        `step` holds (`table_step.count`).
      step: The table's step counter variable (`table_step`).
      training: Whether differentiating steps the rows and `step`; if not,
        their "gradients" are their values.
      absent: An id equal to the table's row count is no lookup: it reads
        zeros and steps no row.
      words: The table in a refusal (`Embedding._table_words`).
      untrained: Without `training`, whether its gradient is refused
        (when the backward pass is traced, `gradients.refuse_untrained`)
        rather than the table handed back unchanged. With `training`, a
        loss scaled since this call (`optimizer.scale_loss`) that leaves out
        the probe is refused (`gradients.refuse_unprobed`).

    Returns:
      `[*ids.shape, dim]` rows, and the loss-scale probe: a zero scalar
      whose cotangent is the factor the loss was scaled by (`unscaled`),
      once the caller adds it to the loss (`Layer.add_loss`). The "gradients"
      of `table`, `slots` and `step` are their stepped values; of the other
      arguments, zero.
    """

    # The ids are an argument (of zero cotangent), not a closure: a closed
    # over tracer is a constant of the backward pass, whose size JAX cannot
    # compare with its limits where the batch is symbolic (an export).
    @jax.custom_vjp
    def gather(table, slots, learning_rate, iterations, step, ids):
        probe = jnp.zeros((), table.dtype)
        if absent:
            # The absent id is past the table: `fill` reads zeros for it.
            return jnp.take(table, ids, axis=0, mode="fill", fill_value=0), probe
        return jnp.take(table, ids, axis=0), probe

    def forward(*primals):
        # Each argument as a `CustomVJPPrimal` (`symbolic_zeros`).
        table, slots, learning_rate, iterations, step, ids = jax.tree.map(
            lambda primal: primal.value,
            primals,
            is_leaf=lambda leaf: isinstance(leaf, CustomVJPPrimal),
        )
        outputs = gather(table, slots, learning_rate, iterations, step, ids)
        # The gathered rows, kept for the backward pass: its step reads the
        # table's rows from them, not from the table, so that the step's
        # write follows the forward pass's read by data. Without it, a loss
        # whose gradient does not read the rows (linear in them: a wide
        # model's) left XLA free to order the write first, and it copied the
        # donated table twice at every step to keep the read correct.
        residuals = (table, slots, learning_rate, iterations, step, ids, outputs[0])
        return outputs, residuals

    def backward(residuals, cotangents):
        table, slots, learning_rate, iterations, step, ids, rows = residuals
        cot, scale = cotangents
        if not training:
            gradients.refuse_untrained(words if untrained else None)
        if isinstance(cot, SymbolicZero):
            # A loss of the probe alone.
            cot = jnp.zeros(cot.shape, cot.dtype)
        if isinstance(scale, SymbolicZero):
            # A loss that leaves out the probe: its gradient is unscaled,
            # unless a loss was scaled since the call.
            if training:
                gradients.refuse_unprobed(words, scaled)
            scale = jnp.zeros(scale.shape, scale.dtype)
        if training:
            table, slots = _step(
                rows_step,
                ids,
                table,
                slots,
                learning_rate,
                iterations,
                cot,
                scale,
                rows,
            )
            step = table_step.advanced(step)
        return (
            table,
            slots,
            _zero_cotangent(learning_rate),
            _zero_cotangent(iterations),
            step,
            _zero_cotangent(ids),
        )

    # Symbolic zeros tell the backward pass, as it is traced, which outputs
    # the loss uses: a probe left out comes as a `SymbolicZero`.
    gather.defvjp(forward, backward, symbolic_zeros=True)
    # Losses scaled before this call; one scaled since is the loss whose
    # backward pass finds no probe.
    scaled = gradients.losses_scaled()
    with gradients.own():
        values = (table.value, tuple(s.value for s in slots), step.value)
    return gather(values[0], values[1], learning_rate, iterations, values[2], ids)


def flat_ids(ids: Any, name: str) -> Tuple[Any, Optional[Callable[[Any], Any]]]:
    """The ids to look up, and what gives their rows the batch's structure
    again: JAX's ids are dense, and keep it (None). Sparse ids (`BCOO`) are
    refused (`ids.sparse_refusal`)."""
    if isinstance(ids, jax_sparse.JAXSparse):
        raise TypeError(ids_module.sparse_refusal(name, type(ids).__name__, False))
    return ids, None


def unscaled(cot: Any, scale: Any, dtype: Any) -> Any:
    """The gradient rows of `cot`, the cotangent of a scaled loss, in
    `dtype`: divided entry by entry by `scale`, the cotangent of the lookup's
    probe, which is the factor the loss was scaled by (a `LossScaleOptimizer`'s
    dynamic scale, an optimizer's `loss_scale_factor`, or 1). A zero `scale`
    (a loss without the layer's `add_loss`: a custom loop that leaves out
    `model.losses`) counts as 1; a scaled loss without it is refused
    (`gradients.refuse_unprobed`). In the table's dtype first: under
    `mixed_float16` the scaled float16 cotangent, unscaled in float16, would
    underflow. For a power of two (every scale `LossScaleOptimizer` sets) the
    division is exact: the rows are those of the unscaled loss, bit for bit,
    as `LossScaleOptimizer` unscales a `keras.layers.Embedding`'s gradient
    before its optimizer sums the duplicate ids."""
    scale = scale.astype(dtype)
    return cot.astype(dtype) / jnp.where(scale == 0, jnp.ones_like(scale), scale)


def after(*tensors: Any) -> Any:
    """No ordering is needed: a refused step's new state is never kept."""
    return contextlib.nullcontext()


def hold(counters: Sequence[Any]) -> None:
    """Nothing: a refused step's new state is never kept."""


def write_rows(variable: Any, start: int, rows: Any) -> None:
    """Writes `rows` into `variable` from row `start` on."""
    rows = jnp.asarray(rows, variable.dtype)
    variable.assign(variable.value.at[start : start + rows.shape[0]].set(rows))


def split_rows(rows: Any, sizes: Sequence[int]) -> list:
    """`rows` split into consecutive parts of `sizes` rows; its gradient is
    one concatenation."""
    return jnp.split(rows, np.cumsum(sizes)[:-1].tolist())


def checked_ids(
    ids: Any, rows: int, absent: bool, name: str, variables: Sequence[Any] = ()
) -> Any:
    """`ids`, refused where one is outside the table: `checked_tables` of one
    table."""
    return checked_tables([ids], [rows], [name], absent, variables)[0]


def checked_tables(
    ids: Sequence[Any],
    rows: Sequence[int],
    names: Sequence[str],
    absent: bool = False,
    variables: Sequence[Any] = (),
) -> list:
    """Each table's `ids`, refused where one is outside its table
    (`layers.ids`): with `OutOfRangeIds` at once where they are concrete; in
    a compiled step, when it runs, from a host callback given the ids (JAX
    raises it as a `JaxRuntimeError` from the call that compiles the step,
    as a `ValueError` from the C++ dispatch of later calls, with a message
    that ends with the refusal, naming the first table with such an id; the
    step's new state is not kept, and Keras's trainer, which donated the
    model's arrays to the step, is left without them: the refusal says so,
    and so does the next read of a table, `TableVariable`). In a step over
    several devices (those `variables`, the tables' Keras variables, were
    laid out on, or the distribution's) every device runs the callback
    (`_refused_on_every_device`), and JAX raises its error where the step's
    results are used. A program traced for export cannot hold the callback:
    there the tables are refused (`ValueError`, naming them and the ways
    out)."""
    ids = list(ids)

    def check(*concrete):
        for table_ids, count, name in zip(concrete, rows, names):
            ids_module.check_ids(table_ids, count, absent, name)

    def refuse(*concrete):
        try:
            check(*concrete)
        except ids_module.OutOfRangeIds as error:
            raise ids_module.OutOfRangeIds(f"{error} {_DONATED}") from None
        return np.zeros((), concrete[0].dtype)

    if not any(isinstance(i, jax.core.Tracer) for i in ids):
        check(*ids)
        return ids
    if not in_symbolic_scope() and any(
        not isinstance(size, int) for i in ids for size in i.shape
    ):
        raise ValueError(_EXPORTED.format(", ".join(f"`{n}`" for n in names)))

    # One reduction and one branch for all the tables (as unsigned, a
    # negative id is larger than any table); the host sees the ids only for
    # a batch that has such an id (a callback run in every step of every
    # table cost a 26-table model 40% of its step). A pure callback, not
    # `jax.debug.callback`: a program with an effect loses JAX's C++
    # dispatch, which cost a step about 4 ms with 120 arrays of state
    # (docs/benchmarks.md). Its result, a zero, is added to the first
    # table's ids so that XLA keeps it. Any callback, run or not, makes JAX
    # on CPU dispatch the step synchronously (a 26-table step unchecked ran
    # 4-12% faster dispatched asynchronously on 2 cores, docs/benchmarks.md,
    # "What a callback that never runs costs"); nothing else in a compiled
    # JAX step can refuse it.
    def outside(*table_ids):
        return jnp.any(
            jnp.concatenate(
                [
                    _unsigned(i).reshape(-1) >= ids_module.limit(count, absent)
                    for i, count in zip(table_ids, rows)
                ]
            )
        )

    def call_back(*all_ids):
        return jax.pure_callback(
            refuse,
            jax.ShapeDtypeStruct((), ids[0].dtype),
            *all_ids,
            vmap_method="sequential",
        )

    ids[0] = ids[0] + _refused_on_every_device(call_back, outside, ids, variables)
    return ids


# A shape of symbolic sizes outside Keras's shape inference (which traces
# with them too, `SymbolicScope`, and lowers nothing) is a program traced for
# export (`jax.export`; Keras's `model.export` on JAX, through jax2tf), which
# takes no host callback.
_EXPORTED = (
    "Embedding {}: a program exported on Keras's JAX backend cannot refuse "
    "ids outside a table (the check calls back to Python, which JAX does not "
    "export). Build the layer with out_of_range_ids='zeros' to export it "
    "from JAX (such ids then read zeros), or export the model on Keras's "
    "TensorFlow backend, whose program keeps the check: `model.save(path)`, "
    "then `keras.saving.load_model(path).export(...)` with "
    "KERAS_BACKEND=tensorflow."
)


def _refused_on_every_device(
    call_back: Callable[..., Any],
    outside: Callable[..., Any],
    ids: Sequence[Any],
    variables: Sequence[Any],
) -> Any:
    """A zero, or the refusal: `call_back(*ids)` run where `outside(*ids)`,
    on every device of the step, each given all the ids.

    JAX runs a callback in a program partitioned over several devices on one
    of them: an error there fails that device alone, and the others wait for
    it in the step's next collective until XLA aborts the process (after
    40 s; across processes, the others fail without the refusal). Raised on
    every device of every process, the refusal ends the step everywhere.
    Each device checks the ids it holds (split along the distribution's
    batch axis) and one maximum over the devices says whether any is
    outside: the ids are gathered only then. Given the whole ids, XLA
    gathered them onto every device in every step (on 4 CPU devices a
    26-table model's step took 1.10-1.14 times its step without the check,
    docs/benchmarks.md, "Ids outside a table")."""
    mesh = _step_mesh(variables)

    def zero():
        return jnp.zeros((), ids[0].dtype)

    if mesh is None:
        return jax.lax.cond(outside(*ids), lambda: call_back(*ids), zero)
    batch = _batch_axis(mesh)
    # Ids whose first dimension is not a multiple of the batch axis go in
    # whole, and so do those of symbolic size (Keras's shape inference):
    # there `size % n == 0` compares JAX's expressions, not sizes.
    split = [
        batch is not None
        and i.ndim > 0
        and isinstance(i.shape[0], int)
        and i.shape[0] % mesh.shape[batch] == 0
        for i in ids
    ]

    def on_device(*held):
        anywhere = jax.lax.pmax(outside(*held).astype(jnp.int32), mesh.axis_names)

        def gathered():
            return call_back(
                *(
                    jax.lax.all_gather(i, batch, tiled=True) if s else i
                    for i, s in zip(held, split)
                )
            )

        return jax.lax.cond(anywhere > 0, gathered, zero)

    spec = jax.sharding.PartitionSpec
    return jax.shard_map(
        on_device,
        mesh=mesh,
        in_specs=tuple(spec(batch) if s else spec() for s in split),
        out_specs=spec(),
        check_vma=False,
    )(*ids)


def _batch_axis(mesh: Any) -> Optional[str]:
    """The axis of `mesh` a Keras distribution on it splits the batch
    along, or None (no such distribution: the ids are then replicated)."""
    current = keras.distribution.distribution()
    if current is None or current.device_mesh.backend_mesh != mesh:
        return None
    return getattr(current, "batch_dim_name", None)


def _step_mesh(variables: Sequence[Any]) -> Any:
    """The mesh of several devices the traced step is partitioned over, or
    None where JAX already runs a callback on each device (inside
    `shard_map`) or the step has one device: the mesh the tables' variables
    were laid out on under `keras.distribution` (they keep it after its
    scope), else the distribution's, else the one set with `jax.set_mesh`."""
    context = jax.sharding.get_abstract_mesh()
    if context.manual_axes:
        return None
    current = keras.distribution.distribution()
    # Keras keeps a variable's layout only as `_layout` (also read to lay
    # out the slots, `layers.embedding`).
    meshes = [
        *(_mesh_of(getattr(v, "_layout", None)) for v in variables),
        None if current is None else current.device_mesh.backend_mesh,
        context,
    ]
    return next((m for m in meshes if m is not None and m.size > 1), None)


def _mesh_of(layout: Any) -> Any:
    """The JAX mesh of a Keras variable's layout (a `TensorLayout`, or a
    backend's own `NamedSharding`), or None."""
    if isinstance(layout, keras.distribution.TensorLayout):
        layout = layout.backend_layout
    return getattr(layout, "mesh", None)


def _unsigned(ids: Any) -> Any:
    if jnp.issubdtype(ids.dtype, jnp.unsignedinteger):
        return ids
    return ids.astype(jnp.uint32 if ids.dtype == jnp.int32 else jnp.uint64)


def _zero_cotangent(value: Any) -> Any:
    value = jnp.asarray(value)
    if jnp.issubdtype(value.dtype, jnp.inexact):
        return jnp.zeros_like(value)
    return jnp.zeros(value.shape, dtype=jax.dtypes.float0)
