"""Tables and optimizer state between Keras and the TPU embedding layouts.

`load_into_keras` puts the tables of a table source (a `TPUEmbedding`
checkpoint through `checkpoints.TPUCheckpointReader`, a jax-tpu-embedding
orbax step through `checkpoints.jax_tpu_embedding.reader.JaxCheckpointReader`,
or any reader
keeping the contract of `tf_tpu_embed_opt.checkpoints`) into Keras variables
and into the slot variables of their Keras optimizer, so that training
continues on CPU/GPU from exactly the engine's state. `keras_table_states`
reads them back as table states, and `save_tpu_checkpoint`
(`checkpoints.keras.save`, also importable from here) writes those in the
`TPUEmbedding` layout, to warm-start a TPU job.

Which Keras slot holds which engine slot is derived from the definitions (see
`checkpoints.keras.tables`, which finds them). Loading needs TensorFlow only
for a TensorFlow checkpoint or a table sharded over parameter servers: from a
jax-tpu-embedding checkpoint it runs on Keras's JAX backend without it.

Tables sharded over parameter servers (`tf_tpu_embed_opt.sharded`) move shard
by shard, each on its server: see `save_tpu_checkpoint` and `load_into_keras`.

A table of the row-sparse `tf_tpu_embed_opt.layers.Embedding` is found by its
variable (or layer); its state is the layer's: its own optimizer, its slots
(`layer.slots`, by engine slot name) and its step counter.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

import keras
import numpy as np

from tf_tpu_embed_opt import checkpoints
from tf_tpu_embed_opt.checkpoints import formats
from tf_tpu_embed_opt.checkpoints.keras.save import save_tpu_checkpoint
from tf_tpu_embed_opt.checkpoints.keras.tables import (
    KerasTable,
    _check_against,
    _check_before_build,
    _set_step,
    _targets,
    array_shape,
    check_step,
    keras_table_states,
    keras_tables,
    narrowed_keys,
    sharded_module,
    target_dtype,
)
from tf_tpu_embed_opt.checkpoints.shared import paths
from tf_tpu_embed_opt.checkpoints.shared.keys import checked_step_path, recorded_step
from tf_tpu_embed_opt.checkpoints.shared.table_info import (
    check_narrowing,
)
from tf_tpu_embed_opt.definitions import spec
from tf_tpu_embed_opt.layers.stacked import TableRows

__all__ = [
    "KerasTable",
    "keras_tables",
    "load_into_keras",
    "keras_table_states",
    "save_tpu_checkpoint",
]


def load_into_keras(
    source: Any,
    variables: Any,
    optimizer: Any,
    *,
    object_path: Optional[str] = None,
    step: Optional[int] = None,
    step_path: Optional[str] = None,
    verify: bool = True,
    keep_step: bool = False,
) -> Dict[str, spec.Definition]:
    """Loads every table and its optimizer state into Keras variables and slots.

    Nothing changes unless everything fits: every table of the source has a
    target and vice versa, the optimizer of each table keeps exactly the slots
    the source holds, shapes and dtypes agree, and (with `verify=True`) every
    tensor reads back intact. Tables are read one at a time. A float32
    checkpoint (the engines' dtype) goes into float16 or bfloat16 variables
    where each value is one of theirs, as `save_tpu_checkpoint` writes such a
    table; `verify=True` checks it before anything changes, and is needed
    for it (as is a table not split over several JAX processes or read on
    parameter servers).

    Tables sharded over parameter servers (`ShardedVariable`s under
    `ParameterServerStrategy`, see `tf_tpu_embed_opt.sharded`) and their slot
    shards are loaded shard by shard, each assigned on its server, into any
    number of shards; no whole-table variable is created. From a source with
    `read_rows`, each shard's rows are read on their own (with
    `verify=True`, twice): from a `TPUEmbedding` checkpoint
    (`TPUCheckpointReader`) each server reads its shards' rows from the
    checkpoint's files itself, which it must reach, and no row passes through
    the calling process; from a jax-tpu-embedding step (`JaxCheckpointReader`,
    best with `cache_bytes=0`) the calling process reads one shard's rows at
    a time and sends them. From other sources (e.g. a SparseCore checkpoint,
    unsharded on the host) the calling process holds one tensor of one table
    at a time, as for any table, and sends each shard only its rows.

    Args:
      source: A checkpoint path of any format the package reads (opened with
        `checkpoints.open_checkpoint`, which detects it), a checkpoint it
        opened (for the options of a format: a SparseCore checkpoint's
        algorithms, a keras-rs step's layout), or a table source such as a
        `checkpoints.TPUCheckpointReader`.
      variables: A mapping {table: keras.layers.Embedding or keras.Variable},
        or a `keras.Model` whose Embedding layers (or variable paths) are named
        like the tables.
      optimizer: The Keras optimizer of those variables: a twin from
        `tf_tpu_embed_opt.to_keras(table_optimizer)` (or another twin whose
        state is an engine algorithm's, `Definition.state_of`), one of
        Keras's own optimizers listed in the module docstring, or a
        `keras.optimizers.MultiOptimizer` of them (see
        `tf_tpu_embed_opt.multi_optimizer.keras_optimizer`), also inside a
        `keras.optimizers.LossScaleOptimizer` (as `mixed_float16` compiles
        the model's optimizer; its inner optimizer keeps the state and the
        step). Built, unless
        `variables` is a model (then it is built on its trainable variables).
        A table of a `tf_tpu_embed_opt.layers.Embedding` (or of
        `layers.row_sparse_tables`) keeps its state in the layer's own
        optimizer and `layer.slots`, whatever `optimizer` is; `None` when
        every table is such a layer's.
      object_path: With a path to a TensorFlow checkpoint: the embedding
        object's path in it (see `TPUCheckpointReader`).
      step: The training step to set as the optimizer's `iterations` (each
        inner optimizer's, and each row-sparse table's step counter).
        `None`: the step the checkpoint records (`Checkpoint.step`: an orbax
        step's number, a Keras step's tables' counters, a TensorFlow
        checkpoint's `step` variable, as `save_tpu_checkpoint` writes it);
        where it records none, the steps stay as they are.
      step_path: Read the step from this variable of the checkpoint instead
        (not with `step`).
      verify: Read every tensor once before changing anything, so that a
        corrupted file leaves the targets unchanged (costs one extra read;
        from a jax-tpu-embedding step, the stacks that fit the reader's
        cache are read into it, and the tables cut from it once).
      keep_step: Deprecated: leave every step as it is, whatever the
        checkpoint records (what `step=None` did before version 0.2; it warns
        with a `DeprecationWarning` and goes in the release after).

    Returns:
      The engine algorithm of each table's state.

    Raises:
      TypeError: An unsupported optimizer or target.
      ValueError: A refusal above (a value a 16-bit table would round
        included); the message names the table and the slot.
    """
    for argument, value in (("keep_step", keep_step), ("verify", verify)):
        if not isinstance(value, bool):
            raise TypeError(
                f"load_into_keras: argument `{argument}` must be True or False; "
                f"received {value!r} of type {type(value).__name__}."
            )
    checked_step_path(step_path, "load_into_keras")
    if step is not None and step_path is not None:
        raise ValueError(
            "load_into_keras: `step` sets the step and `step_path` reads it "
            f"from the checkpoint; give one of them (received step={step!r}, "
            f"step_path={step_path!r})."
        )
    source = _opened(source, object_path)
    names = list(source.tables)
    # A row-wise optimizer's state is refused by name from an engine's
    # checkpoint, which cannot hold it; Keras's own steps do.
    engine = formats.holds_engine_state(source.format)
    if not isinstance(variables, keras.Model):
        _check_targets(variables, names)
    if isinstance(variables, keras.Model) and (
        optimizer is None or not optimizer.built
    ):
        # Refuse before `keras_tables` builds the optimizer.
        _check_before_build(source, variables, optimizer, engine)
    tables = keras_tables(variables, optimizer, names, engine=engine)
    for table in tables:
        _check_against(source, table)
        _check_narrowing_reads(source, table, verify)
    if keep_step:
        _keep_step(step, step_path)
    elif step is None and step_path is not None:
        step = recorded_step(source.read_scalar, source.path, step_path)
    elif step is None:
        step = _recorded_step(source)
    if step is not None and (
        isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0
    ):
        raise ValueError(f"`step` must be an integer >= 0; received {step!r}.")
    if step is not None:
        check_step(optimizer, tables, int(step))
    if verify:
        for table in tables:
            _verify(source, table)
    for table in tables:
        _load(source, table)
    if step is not None:
        _set_step(optimizer, tables, int(step))
    return {table.name: table.definition for table in tables}


def _check_narrowing_reads(source: Any, table: KerasTable, verify: bool) -> None:
    """A float32 checkpoint loads into a 16-bit table (`narrowed_keys`)
    only where `_verify` finds each value exact, before anything changes:
    refused where it cannot read them so, naming why."""
    keys = narrowed_keys(source, table)
    if not keys:
        return
    dtype = target_dtype(table, keys[0])
    if not verify:
        why = "`verify=False` reads each value only as it loads it"
    elif _on_servers(source, table):
        why = "its shards' rows are read on their parameter servers"
    elif _split_by_rows(table.variable) is not None and _processes() > 1:
        why = "each JAX process reads only the rows it holds"
    else:
        return
    raise ValueError(
        f"Table {table.name!r}: the checkpoint holds it as float32, which "
        f"loads into its {dtype} variables only once every value is found to "
        f"be a {dtype} value, before anything changes; that cannot be done "
        f"here: {why}. Load it with verify=True into a table in one process, "
        "or into float32 variables (a mixed_float16 / mixed_bfloat16 policy "
        "keeps them so)."
    )


def _processes() -> int:
    import jax

    return jax.process_count()


def _keep_step(step: Any, step_path: Any) -> None:
    """`keep_step=True`: refused beside a step to set, else a warning."""
    if step is not None or step_path is not None:
        given = "step" if step is not None else "step_path"
        raise ValueError(
            f"load_into_keras: `keep_step=True` keeps the steps as they are, "
            f"and `{given}` sets one; give one of them."
        )
    warnings.warn(
        "load_into_keras(keep_step=True) leaves the optimizers' and tables' "
        "step counters as they were, whatever the checkpoint records; it goes "
        "in the release after 0.2. Pass `step=` to set a step, or leave both "
        "out to take the checkpoint's.",
        DeprecationWarning,
        stacklevel=3,
    )


def _recorded_step(source: Any) -> Optional[int]:
    """The step `source` records (`Checkpoint.step`); refused where the step
    counters it holds disagree (a Keras step whose tables, or whose tables
    and model optimizer, counted apart), naming each."""
    steps = getattr(getattr(source, "reader", None), "steps", None)
    if isinstance(steps, Mapping) and len(set(steps.values())) > 1:
        listed = ", ".join(f"{path}: {n}" for path, n in steps.items())
        raise ValueError(
            f"load_into_keras: {source.path!r} records no one step: the step "
            f"counters of its tables and of its model's optimizer differ "
            f"({listed}). Pass `step=` to set one."
        )
    return getattr(source, "step", None)


def _check_targets(variables: Any, names: List[str]) -> None:
    """A mapping of targets names exactly the source's tables."""
    if not isinstance(variables, Mapping):
        _targets(variables, names)  # raises the TypeError
    differ = paths.names_differ(
        names,
        variables,
        "the source has tables {} without a target",
        f"targets {{}} have no table in the source (which has {sorted(names)})",
    )
    if differ:
        raise ValueError(f"The tables do not match: {differ}.")


def _tensors(source: Any, table: KerasTable) -> Iterator[Tuple[str, np.ndarray]]:
    """`(key, array)` of a table: one tensor at a time where the source reads
    rows (its table state, read once, where it reads whole stacks), so that
    about one table's tensor is in memory."""
    if source.row_reads is None:
        yield from source.read(table.name).items()
        return
    for key in (checkpoints.PARAMETERS, *table.slots):
        yield key, source.read_tensor(table.name, key)


def _on_servers(source: Any, table: KerasTable) -> bool:
    """Whether the table and its slots are sharded over parameter servers and
    the source reads rows: then each shard's rows are read on their own."""
    sharded = sharded_module()
    targets = [table.variable, *(v for v in table.slots.values() if v is not None)]
    return (
        source.row_reads is not None
        and sharded is not None
        and all(sharded.shards_of(target) is not None for target in targets)
    )


def _shard_reads(
    source: Any, table: KerasTable, every_key: bool
) -> Iterator[Tuple[str, Any, Any]]:
    """`(key, shard, rows)` of a sharded table, each shard's rows read by its
    server where the source reads them there (`row_reads == "device"`)."""
    sharded = sharded_module()
    for key in (checkpoints.PARAMETERS, *table.slots):
        if key == checkpoints.PARAMETERS:
            target = table.variable
        else:
            target = table.slots.get(key)
        if target is None:
            if not every_key:
                continue
            # A slot the optimizer does not keep is read (checked) only.
            target = table.variable
        shards = sharded.shards_of(target)
        for shard, rows in zip(shards, sharded._row_ranges(shards)):
            yield key, shard, source.read_rows(table.name, key, rows, shard.device)


def _targets_of(table: KerasTable, every_key: bool) -> Iterator[Tuple[str, Any]]:
    """`(key, variable)` of the tensors of `table` it keeps; with
    `every_key`, also a slot the optimizer does not keep (read and checked,
    never loaded), with the table's variable."""
    yield checkpoints.PARAMETERS, table.variable
    for key, variable in table.slots.items():
        if variable is not None:
            yield key, variable
        elif every_key:
            yield key, table.variable


def _split_by_rows(target: Any) -> Optional[Tuple[Any, int, int]]:
    """`(variable, first row, rows)` where `target` is held in a JAX array
    split over devices (a `keras.distribution` layout: a table sharded by
    rows, its slots alike, possibly over several processes): the variable,
    or for a stacked table (`TableRows`) its stack's; `None` otherwise.

    The answer is the same on every process of a job, so that all take the
    same way to load (the other way's `assign` is a collective)."""
    if keras.backend.backend() != "jax":
        return None
    variable, first = target, 0
    if isinstance(target, TableRows):
        variable, first = target.variable, target.start
    if not isinstance(variable, keras.Variable):
        return None
    sharding = getattr(variable.value, "sharding", None)
    if sharding is None or sharding.is_fully_replicated:
        return None
    return variable, first, int(target.shape[0])


def _local_rows(target: Any) -> List[Tuple[int, int]]:
    """The ranges of `target`'s rows this process's devices hold, each once
    (none where it holds none of them)."""
    variable, first, count = _split_by_rows(target)
    value = variable.value
    ranges = set()
    for shard in value.addressable_shards:
        start, stop, _ = shard.index[0].indices(value.shape[0])
        start, stop = max(start - first, 0), min(stop - first, count)
        if start < stop:
            ranges.add((start, stop))
    return sorted(ranges)


def _read_local_rows(
    source: Any, table: KerasTable, key: str, target: Any
) -> Dict[Tuple[int, int], np.ndarray]:
    """This process's rows of one tensor (`target`'s), range by range, shapes
    checked."""
    columns = array_shape(table, key)[1]
    read = {}
    for start, stop in _local_rows(target):
        rows = np.asarray(source.read_rows(table.name, key, (start, stop)))
        if rows.shape != (stop - start, columns):
            raise ValueError(
                f"Table {table.name!r}: {key!r} rows {start}:{stop} read with "
                f"shape {rows.shape}; expected {(stop - start, columns)}."
            )
        read[(start, stop)] = rows
    return read


def _assign_local_rows(source: Any, table: KerasTable, key: str, target: Any) -> None:
    """Assigns a target held split over devices (`_split_by_rows`) from its
    rows alone: each process reads the rows its devices hold and builds its
    part of the array (a stack's other rows as they are); no process reads
    or holds another's rows."""
    import jax

    variable, first, count = _split_by_rows(target)
    value = variable.value
    shape = tuple(value.shape)
    read = _read_local_rows(source, table, key, target)
    dtype = np.dtype(variable.dtype)
    # Each device's part as it is now, by its index, for the rows of a stack
    # that are not the table's.
    current = {
        tuple(i.indices(n) for i, n in zip(shard.index, shape)): shard.data
        for shard in value.addressable_shards
    }

    def part(index: Tuple[slice, ...]) -> np.ndarray:
        bounds = tuple(i.indices(n) for i, n in zip(index, shape))
        start, stop, _ = bounds[0]
        if first <= start and stop <= first + count:
            columns = (len(range(*b)) for b in bounds[1:])
            block = np.empty((stop - start, *columns), dtype)
        else:
            block = np.array(current[bounds], dtype=dtype)
        for (low, high), rows in read.items():
            # The read range's rows within this part, in the stack's rows.
            top, end = max(low + first, start), min(high + first, stop)
            if top < end:
                taken = rows[top - first - low : end - first - low]
                block[top - start : end - start] = taken[(slice(None), *index[1:])]
        return block

    variable.assign(jax.make_array_from_callback(shape, value.sharding, part))


def _verify(source: Any, table: KerasTable) -> None:
    """Reads every tensor of `table` once, checking its shape and, where a
    16-bit variable takes float32 values (`narrowed_keys`), that each is one
    of its values, before anything is changed."""
    narrowed = set(narrowed_keys(source, table))

    def check(key: str, value: Any, rows: str = "") -> None:
        if key in narrowed:
            what = f"Table {table.name!r}: {key!r}{rows}"
            check_narrowing(value, target_dtype(table, key), what)

    def whole(key: str, value: Any) -> None:
        wanted = array_shape(table, key)
        if tuple(np.shape(value)) != wanted:
            raise ValueError(
                f"Table {table.name!r}: {key!r} reads with shape "
                f"{tuple(np.shape(value))}; expected {wanted}."
            )
        check(key, value)

    def read(key: str) -> None:
        if key in narrowed:
            whole(key, source.read_tensor(table.name, key))
        else:
            source.verify(table.name, key)

    if _split_by_rows(table.variable) is not None:
        for key, target in _targets_of(table, every_key=True):
            if _split_by_rows(target) is None:
                read(key)
                continue
            for (start, stop), rows in _read_local_rows(
                source, table, key, target
            ).items():
                check(key, rows, f" (rows {start}:{stop})")
        return
    if _on_servers(source, table):
        for key, shard, rows in _shard_reads(source, table, every_key=True):
            if tuple(rows.shape) != tuple(shard.shape):
                raise ValueError(
                    f"Table {table.name!r}: {key!r} reads with shape "
                    f"{tuple(rows.shape)} for a shard of shape "
                    f"{tuple(shard.shape)}."
                )
            del rows
        return
    if source.row_reads is not None:
        for key in (checkpoints.PARAMETERS, *table.slots):
            read(key)
        return
    for key, value in _tensors(source, table):
        whole(key, value)
        del value


def _load(source: Any, table: KerasTable) -> None:
    """Assigns `table`'s state from the source: shard by shard on their
    servers, a JAX table split by rows from this process's rows only, or one
    tensor at a time."""
    if _on_servers(source, table):
        import tensorflow as tf  # sharded variables are TensorFlow's

        for _, shard, rows in _shard_reads(source, table, every_key=False):
            with tf.device(shard.device):
                shard.assign(rows, read_value=False)
            del rows
        return
    if _split_by_rows(table.variable) is not None:
        for key, target in _targets_of(table, every_key=False):
            if _split_by_rows(target) is not None:
                _assign_local_rows(source, table, key, target)
            else:
                _assign(target, source.read_tensor(table.name, key))
        return
    for key, value in _tensors(source, table):
        if key == checkpoints.PARAMETERS:
            _assign(table.variable, value)
        elif table.slots.get(key) is not None:
            _assign(table.slots[key], value)
        del value


def _opened(source: Any, object_path: Optional[str]) -> Any:
    """`source` as a `checkpoints.reader.Checkpoint`: a path opened with
    `open_checkpoint`, a format's reader or another table source wrapped."""
    from tf_tpu_embed_opt.checkpoints.reader import Checkpoint, open_checkpoint

    if isinstance(source, Checkpoint):
        checkpoint = source
    elif isinstance(source, (str, os.PathLike)):
        return open_checkpoint(source, object_path=object_path)
    elif hasattr(source, "tables") and hasattr(source, "read"):
        checkpoint = Checkpoint.wrapping(source)
    else:
        raise TypeError(
            "load_into_keras: argument `source` must be a checkpoint path, a "
            "checkpoint opened with tf_tpu_embed_opt.checkpoints."
            "open_checkpoint, or a table source (with `tables` and "
            f"`read(name)`); received {source!r} of type {type(source).__name__}."
        )
    if object_path is not None:
        raise ValueError(
            f"load_into_keras: argument `object_path` {object_path!r} applies to "
            "a checkpoint path; the source given is open already."
        )
    return checkpoint


def _assign(variable: Any, value: np.ndarray) -> None:
    """`variable.assign(value)`; a sharded variable shard by shard.

    Each shard of a sharded table (or slot) is sent only its rows and assigned
    on its own device (its parameter server); no whole-table tensor or
    variable is made outside the calling process's `value`.
    """
    sharded = sharded_module()
    shards = None if sharded is None else sharded.shards_of(variable)
    if shards is None:
        variable.assign(value)
    else:
        sharded._assign_rows(shards, value)
