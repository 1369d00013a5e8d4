"""Tables and optimizer state between Keras and the TPU embedding layouts.

`load_into_keras` puts the tables of a table source (a `TPUEmbedding`
checkpoint through `checkpoints.TPUCheckpointReader`, or any reader keeping
the contract of `tf_tpu_embed_opt.checkpoints`) into Keras variables and into
the slot variables of their Keras optimizer, so that training continues on
CPU/GPU from exactly the engine's state. `keras_table_states` reads them back
as table states, and `save_tpu_checkpoint` writes those in the `TPUEmbedding`
layout, to warm-start a TPU job.

Which Keras slot holds which engine slot is derived from the definitions: a
twin of `tf_tpu_embed_opt.optimizers` keeps engine slot `Slot.name` in its
variable named `Slot.keras_variable_name`, as Keras's own `Adagrad`, `Adam`,
`Ftrl`, `RMSprop` and `Adadelta` do for the same quantities;
`ClippyAdagrad`'s accumulator is the engine Adagrad's `accumulators`.
Keras-only slots are refused: they hold no engine quantity (Keras SGD's
momentum is −η times the engine's).

Tables sharded over parameter servers (`tf_tpu_embed_opt.sharded`) move shard
by shard, each on its server: see `save_tpu_checkpoint` and `load_into_keras`.

A table of the row-sparse `tf_tpu_embed_opt.layers.Embedding` is found by its
variable (or layer); its state is the layer's: its own optimizer, its slots
(`layer.slots`, by engine slot name) and its step counter.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple, Union

import keras
import numpy as np
import tensorflow as tf

from tf_tpu_embed_opt import checkpoints, convert
from tf_tpu_embed_opt.definitions import registry, spec
from tf_tpu_embed_opt.layers.embedding import owner_of
from tf_tpu_embed_opt.optimizers import sharded
from tf_tpu_embed_opt.optimizers import twins as optimizers
from tf_tpu_embed_opt.optimizers.clippy_adagrad import ClippyAdagrad

__all__ = [
    "KerasTable",
    "keras_tables",
    "load_into_keras",
    "keras_table_states",
    "save_tpu_checkpoint",
]

Target = Union[keras.Variable, keras.layers.Embedding]


@dataclasses.dataclass(frozen=True)
class KerasTable:
    """One table on the Keras side: its variable, optimizer and slots.

    Attributes:
      name: The table's name.
      variable: The Keras variable holding the table.
      optimizer: The Keras optimizer updating it (inside a `MultiOptimizer`,
        the inner one).
      definition: The engine algorithm whose state the optimizer keeps.
      slots: Engine slot name -> the optimizer's slot variable, or `None` for
        an engine slot the optimizer does not keep because its rule then does
        not read it (RMSProp's `mom` with momentum 0).
    """

    name: str
    variable: Any
    optimizer: Any
    definition: spec.Definition
    slots: Mapping[str, Optional[Any]]


def _multi_optimizer_class() -> Optional[type]:
    return getattr(keras.optimizers, "MultiOptimizer", None)


def _inner_optimizer(optimizer: Any, variable: Any, table: str) -> Any:
    multi = _multi_optimizer_class()
    if multi is not None and isinstance(optimizer, multi):
        index = optimizer._var_to_optimizer_idx.get(optimizer._var_key(variable))
        if index is None:
            raise ValueError(
                f"Table {table!r}: variable {variable.path!r} is not among the "
                f"variables `optimizer` {optimizer.name!r} was built with."
            )
        return optimizer.optimizers[index]
    return optimizer


def _definition_of(optimizer: Any, table: str) -> spec.Definition:
    """The engine algorithm whose state `optimizer` keeps (no build needed)."""
    if isinstance(optimizer, optimizers.TwinOptimizer):
        definition = optimizer._active
        extra = [
            s.keras_variable_name
            for s in optimizer._definition.keras.extra_slots
            if s.when is None or s.when(optimizer._arguments)
        ]
        if extra:
            raise ValueError(
                f"Table {table!r}: {type(optimizer).__name__} keeps Keras-only "
                f"slots {extra} that the engine's {definition.name} has no slot "
                "for (e.g. Adam's amsgrad or SGD's Keras momentum); use "
                "`tf_tpu_embed_opt.to_keras(table_optimizer)`."
            )
        return definition
    if isinstance(optimizer, ClippyAdagrad):
        return registry.BY_NAME["Adagrad"]
    if isinstance(optimizer, keras.optimizers.Optimizer):
        try:
            definition = convert._source_definition(optimizer)
        except TypeError:
            definition = None
        if definition is not None:
            for flag, variant in definition.keras.variants.items():
                if getattr(optimizer, flag, False):
                    definition = registry.BY_NAME[variant]
            return definition
    raise TypeError(
        f"Table {table!r}: the Keras optimizer must be one of "
        "tf_tpu_embed_opt.optimizers (e.g. from `to_keras(table_optimizer)`), "
        "ClippyAdagrad, keras.optimizers.{Adagrad, Adam, Ftrl, RMSprop, "
        "Adadelta, SGD}, or a keras.optimizers.MultiOptimizer of them; received "
        f"{type(optimizer).__name__}, whose slots do not hold the engine's "
        "quantities."
    )


def _optimizer_slots(
    optimizer: Any, variable: Any, table: str
) -> Tuple[spec.Definition, Dict[str, Optional[Any]]]:
    """The engine algorithm and engine slot -> Keras slot variable of `optimizer`."""
    definition = _definition_of(optimizer, table)
    index = optimizer._get_variable_index(variable)
    if isinstance(optimizer, ClippyAdagrad):
        (slot,) = definition.slots
        return definition, {slot.name: optimizer._accumulators[index]}
    if not isinstance(optimizer, optimizers.TwinOptimizer):
        return definition, _stock_slots(optimizer, variable, table, definition)
    slots = {
        slot.name: optimizer._slot_variables[slot.name][index]
        if slot.name in optimizer._slot_variables
        else None
        for slot in definition.slots
    }
    return definition, slots


def _stock_slots(
    optimizer: Any, variable: Any, table: str, definition: spec.Definition
) -> Dict[str, Optional[Any]]:
    """Engine slot -> slot variable of one of Keras's own optimizers.

    Keras names a slot `<variable path with '_'>_<name>` and uses the names
    the definitions record as `Slot.keras_name` for the same quantities
    (Adam's `momentum`/`velocity` are the engine's `momenta`/`velocities`).
    Keras-only slots (SGD's momentum, which is −η times the engine's, Adam's
    `velocity_hat`) have no engine slot and are refused.
    """
    prefix = f"{variable.path.replace('/', '_')}_"
    kept: Dict[str, List[Any]] = {}
    for candidate in optimizer.variables:
        if candidate.name.startswith(prefix):
            kept.setdefault(candidate.name[len(prefix) :], []).append(candidate)
    arguments = {
        a.name: getattr(optimizer, a.name, a.default)
        for a in definition.keras_arguments
    }
    slots: Dict[str, Optional[Any]] = {}
    for slot in definition.slots:
        found = kept.pop(slot.keras_variable_name, [])
        if len(found) > 1:
            raise ValueError(
                f"Table {table!r}: {type(optimizer).__name__} has several slot "
                f"variables named {prefix + slot.keras_variable_name!r}."
            )
        if not found and (slot.when is None or slot.when(arguments)):
            raise ValueError(
                f"Table {table!r}: {type(optimizer).__name__} has no slot "
                f"{slot.keras_variable_name!r} for the engine's {slot.name!r}."
            )
        slots[slot.name] = found[0] if found else None
    if kept:
        raise ValueError(
            f"Table {table!r}: {type(optimizer).__name__} keeps slots "
            f"{sorted(kept)} that the engine's {definition.name} has no slot "
            "for (e.g. SGD's Keras momentum, Adam's amsgrad); use "
            "`tf_tpu_embed_opt.to_keras(table_optimizer)`."
        )
    return slots


def _check_before_build(source: Any, variables: Any, optimizer: Any) -> None:
    """`_check_against` for an optimizer not built yet, without building it."""
    multi = _multi_optimizer_class()
    for name, variable in _targets(variables, list(source.tables)).items():
        inner = optimizer
        layer = _row_sparse_layer(variable, optimizer, name)
        if layer is not None:
            inner = layer.optimizer
        elif multi is not None and isinstance(optimizer, multi):
            inner = optimizer._optimizer_map(variable)
        definition = _definition_of(inner, name)
        _check_against(source, KerasTable(name, variable, inner, definition, {}))


def _row_sparse_layer(variable: Any, optimizer: Any, table: str) -> Any:
    """The row-sparse layer whose table `variable` is (its optimizer keeps the
    table's state), or None; `optimizer=None` only for such tables."""
    layer = owner_of(variable)
    if layer is None and optimizer is None:
        raise TypeError(
            f"Table {table!r}: `optimizer` is None, which only tables of "
            "tf_tpu_embed_opt.layers.Embedding (which carry their own) allow; "
            "pass the Keras optimizer that trains this table."
        )
    return layer


def _variable_of(table: str, target: Any) -> Any:
    if isinstance(target, keras.layers.Embedding):
        if not target.built:
            raise ValueError(
                f"Table {table!r}: the Embedding layer {target.name!r} is not "
                "built; call the model once (or `layer.build()`) first."
            )
        return target.embeddings
    if isinstance(target, keras.Variable):
        return target
    raise TypeError(
        f"Table {table!r}: the target must be a keras.Variable or a "
        f"keras.layers.Embedding; received {target!r} of type "
        f"{type(target).__name__}."
    )


def _targets(variables: Any, names: Any) -> Dict[str, Any]:
    """Table name -> Keras variable, from a mapping or a model."""
    if isinstance(variables, keras.Model):
        model = variables
        by_name: Dict[str, Any] = {}
        for layer in model._flatten_layers(include_self=False):
            if isinstance(layer, keras.layers.Embedding) and layer.built:
                by_name.setdefault(layer.name, layer.embeddings)
        for variable in model.trainable_variables:
            by_name.setdefault(variable.path, variable)
        missing = sorted(set(names) - set(by_name))
        if missing:
            raise ValueError(
                f"Tables {missing} have no Embedding layer or variable (path) of "
                f"that name in model {model.name!r}; pass a mapping "
                "{table: layer or variable} instead."
            )
        return {name: by_name[name] for name in names}
    if not isinstance(variables, Mapping):
        raise TypeError(
            "`variables` must be a keras.Model or a mapping {table name: "
            f"keras.layers.Embedding or keras.Variable}}; received "
            f"{type(variables).__name__}."
        )
    return {name: _variable_of(name, target) for name, target in variables.items()}


def keras_tables(variables: Any, optimizer: Any, names: Any = None) -> List[KerasTable]:
    """The Keras side of each table: variable, optimizer, slot variables.

    Args:
      variables: A mapping {table: keras.layers.Embedding or keras.Variable},
        or a `keras.Model` whose Embedding layers (or variables, by path) are
        named like the tables.
      optimizer: The (built) Keras optimizer of the model: a twin, a
        `ClippyAdagrad`, Keras's own `Adagrad`, `Adam`, `Ftrl`, `RMSprop`,
        `Adadelta` or `SGD`, or a `keras.optimizers.MultiOptimizer` of them.
      names: With a model, the table names to look up.

    Raises:
      TypeError: An optimizer whose slots are not the engine's.
      ValueError: The optimizer is not built for a table's variable.

    Under `ParameterServerStrategy`, returns only once every step scheduled on
    the strategy's `ClusterCoordinator` has finished
    (`sharded.wait_for_steps_in_flight`), so that a checkpoint written from
    the tables holds one step and a load does not race with running steps.
    """
    if names is None:
        if isinstance(variables, keras.Model):
            raise ValueError("With a keras.Model, `names` lists the tables.")
        names = list(variables)
    targets = _targets(variables, names)
    if optimizer is not None and not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            f"`optimizer` must be a keras.optimizers.Optimizer (or None when "
            "every table is a tf_tpu_embed_opt.layers.Embedding's); received "
            f"{optimizer!r} of type {type(optimizer).__name__}."
        )
    if optimizer is not None and not optimizer.built:
        if isinstance(variables, keras.Model):
            optimizer.build(variables.trainable_variables)
        else:
            raise ValueError(
                f"`optimizer` {optimizer.name!r} is not built; call "
                "`optimizer.build(model.trainable_variables)` first (or pass "
                "the model as `variables`)."
            )
    tables = []
    for name, variable in targets.items():
        layer = _row_sparse_layer(variable, optimizer, name)
        if layer is not None:
            definition = _definition_of(layer.optimizer, name)
            slots = {s.name: layer.slots.get(s.name) for s in definition.slots}
            own = layer.optimizer
            tables.append(KerasTable(name, variable, own, definition, slots))
            continue
        inner = _inner_optimizer(optimizer, variable, name)
        try:
            definition, slots = _optimizer_slots(inner, variable, name)
        except KeyError:
            raise ValueError(
                f"Table {name!r}: variable {variable.path!r} is not among the "
                f"variables optimizer {inner.name!r} was built with."
            ) from None
        tables.append(KerasTable(name, variable, inner, definition, slots))
    # Under ParameterServerStrategy, steps in flight would make what is read
    # or written next a mix of steps: wait for them first.
    sharded.wait_for_steps_in_flight(
        [o.iterations for o in (optimizer,) if o is not None]
        + [v for t in tables for v in (t.variable, *t.slots.values()) if v is not None]
    )
    return tables


def _dtype_name(variable: Any) -> str:
    return np.dtype(keras.backend.standardize_dtype(variable.dtype)).name


def _check_against(source: Any, table: KerasTable) -> None:
    info = source.tables[table.name]
    expected = {s.name for s in table.definition.slots}
    found = set(info.slots)
    if found != expected:
        fits = ", ".join(d.name for d in info.algorithms) or "no engine algorithm"
        raise ValueError(
            f"Table {table.name!r}: the checkpoint holds slots {sorted(found)} "
            f"({fits}), but its Keras optimizer {type(table.optimizer).__name__} "
            f"keeps the state of {table.definition.name} ({sorted(expected)}); "
            f"missing {sorted(expected - found)}, unexpected "
            f"{sorted(found - expected)}."
        )
    shape = tuple(table.variable.shape)
    dtype = _dtype_name(table.variable)
    if tuple(info.shape) != shape:
        raise ValueError(
            f"Table {table.name!r}: the checkpoint's table has shape "
            f"{tuple(info.shape)}; the Keras variable {table.variable.path!r} "
            f"has {shape}."
        )
    if info.dtype != dtype:
        raise ValueError(
            f"Table {table.name!r}: the checkpoint's table has dtype "
            f"{info.dtype}; the Keras variable {table.variable.path!r} has "
            f"{dtype}."
        )
    for slot in info.slots:
        if tuple(info.slot_shapes[slot]) != shape:
            raise ValueError(
                f"Table {table.name!r}: slot {slot!r} has shape "
                f"{tuple(info.slot_shapes[slot])} in the checkpoint; the table "
                f"has {shape}."
            )
        if info.slot_dtypes[slot] != dtype:
            raise ValueError(
                f"Table {table.name!r}: slot {slot!r} has dtype "
                f"{info.slot_dtypes[slot]} in the checkpoint; the table has "
                f"{dtype}."
            )


def _optimizers_with_steps(optimizer: Any, tables: List[KerasTable]) -> List[Any]:
    """The model's optimizer, its inner ones, and the row-sparse layers' own."""
    found = [] if optimizer is None else [optimizer]
    multi = _multi_optimizer_class()
    if multi is not None and isinstance(optimizer, multi):
        found.extend(optimizer.optimizers)
    for table in tables:
        if owner_of(table.variable) is not None:
            found.append(table.optimizer)
    return found


def load_into_keras(
    source: Any,
    variables: Any,
    optimizer: Any,
    *,
    object_path: Optional[str] = None,
    step: Optional[int] = None,
    step_path: Optional[str] = None,
    verify: bool = True,
) -> Dict[str, spec.Definition]:
    """Loads every table and its optimizer state into Keras variables and slots.

    Nothing changes unless everything fits: every table of the source has a
    target and vice versa, the optimizer of each table keeps exactly the slots
    the source holds, shapes and dtypes agree, and (with `verify=True`) every
    tensor reads back intact. Tables are read one at a time.

    Tables sharded over parameter servers (`ShardedVariable`s under
    `ParameterServerStrategy`, see `tf_tpu_embed_opt.sharded`) and their slot
    shards are loaded shard by shard, each assigned on its server, into any
    number of shards; no whole-table variable is created. From a
    `TPUEmbedding` checkpoint (a source with `read_rows`, such as
    `TPUCheckpointReader`) each server reads its shards' rows from the
    checkpoint's files itself, which it must reach (with `verify=True`, twice):
    no row passes through the calling process. From other sources (e.g. a
    SparseCore checkpoint, unsharded on the host) the calling process holds
    one tensor of one table at a time, as for any table, and sends each shard
    only its rows.

    Args:
      source: A checkpoint path (prefix or directory), or a table source such
        as a `checkpoints.TPUCheckpointReader`.
      variables: A mapping {table: keras.layers.Embedding or keras.Variable},
        or a `keras.Model` whose Embedding layers (or variable paths) are named
        like the tables.
      optimizer: The Keras optimizer of those variables: a twin from
        `tf_tpu_embed_opt.to_keras(table_optimizer)`, a `ClippyAdagrad`, one
        of Keras's own optimizers listed in the module docstring, or a
        `keras.optimizers.MultiOptimizer` of them (see
        `tf_tpu_embed_opt.multi_optimizer.keras_optimizer`). Built, unless
        `variables` is a model (then it is built on its trainable variables).
        A table of a `tf_tpu_embed_opt.layers.Embedding` (or of
        `layers.row_sparse_tables`) keeps its state in the layer's own
        optimizer and `layer.slots`, whatever `optimizer` is; `None` when
        every table is such a layer's.
      object_path: With a path: the embedding object's path in the checkpoint
        (see `TPUCheckpointReader`).
      step: The training step to set as the optimizer's `iterations` (and each
        inner optimizer's); `None` keeps them, unless `step_path` is given.
      step_path: Read the step from this variable of the checkpoint (e.g.
        `"step"` as `save_tpu_checkpoint` writes it).
      verify: Read every tensor once before changing anything, so that a
        corrupted file leaves the targets unchanged (costs one extra read).

    Returns:
      The engine algorithm of each table's state.

    Raises:
      TypeError: An unsupported optimizer or target.
      ValueError: A refusal above; the message names the table and the slot.
    """
    if not (hasattr(source, "tables") and hasattr(source, "read")):
        source = checkpoints.TPUCheckpointReader(source, object_path)
    names = list(source.tables)
    if not isinstance(variables, keras.Model):
        if not isinstance(variables, Mapping):
            _targets(variables, names)  # raises the TypeError
        extra = sorted(set(names) - set(variables))
        missing = sorted(set(variables) - set(names))
        if extra or missing:
            raise ValueError(
                "The tables do not match: "
                + (f"the source has tables {extra} without a target" if extra else "")
                + ("; " if extra and missing else "")
                + (
                    f"targets {missing} have no table in the source "
                    f"(which has {sorted(names)})"
                    if missing
                    else ""
                )
                + "."
            )
    if isinstance(variables, keras.Model) and (
        optimizer is None or not optimizer.built
    ):
        # Refuse before `keras_tables` builds the optimizer.
        _check_before_build(source, variables, optimizer)
    tables = keras_tables(variables, optimizer, names)
    for table in tables:
        _check_against(source, table)
    if step is None and step_path is not None:
        step = int(source.read_scalar(step_path))
    if step is not None and (
        isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0
    ):
        raise ValueError(f"`step` must be an integer >= 0; received {step!r}.")
    read_tensor = getattr(source, "read_tensor", None)

    def tensors(table: KerasTable) -> Iterator[Tuple[str, np.ndarray]]:
        # One tensor at a time where the source can (its table state
        # otherwise), so that about one table's tensor is in memory.
        if read_tensor is None:
            yield from source.read(table.name).items()
            return
        for key in (checkpoints.PARAMETERS, *table.slots):
            yield key, read_tensor(table.name, key)

    read_rows = getattr(source, "read_rows", None)

    def shard_reads(
        table: KerasTable, every_key: bool
    ) -> Iterator[Tuple[str, Any, Any]]:
        # `(key, shard, rows)` of a sharded table, each shard's rows read by
        # its server, where the source can read rows there.
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
                yield key, shard, read_rows(table.name, key, rows, shard.device)

    def on_servers(table: KerasTable) -> bool:
        targets = [table.variable, *(v for v in table.slots.values() if v is not None)]
        return read_rows is not None and all(
            sharded.shards_of(target) is not None for target in targets
        )

    if verify:
        shape = None
        for table in tables:
            if on_servers(table):
                for key, shard, rows in shard_reads(table, every_key=True):
                    if tuple(rows.shape) != tuple(shard.shape):
                        raise ValueError(
                            f"Table {table.name!r}: {key!r} reads with shape "
                            f"{tuple(rows.shape)} for a shard of shape "
                            f"{tuple(shard.shape)}."
                        )
                    del rows
                continue
            shape = tuple(table.variable.shape)
            for key, value in tensors(table):
                if tuple(np.shape(value)) != shape:
                    raise ValueError(
                        f"Table {table.name!r}: {key!r} reads with shape "
                        f"{tuple(np.shape(value))}; expected {shape}."
                    )
                del value
    for table in tables:
        if on_servers(table):
            for _, shard, rows in shard_reads(table, every_key=False):
                with tf.device(shard.device):
                    shard.assign(rows, read_value=False)
                del rows
            continue
        for key, value in tensors(table):
            if key == checkpoints.PARAMETERS:
                _assign(table.variable, value)
            elif table.slots.get(key) is not None:
                _assign(table.slots[key], value)
            del value
    if step is not None:
        for opt in _optimizers_with_steps(optimizer, tables):
            opt.iterations.assign(int(step))
    return {table.name: table.definition for table in tables}


def _assign(variable: Any, value: np.ndarray) -> None:
    """`variable.assign(value)`; a sharded variable shard by shard.

    Each shard of a sharded table (or slot) is sent only its rows and assigned
    on its own device (its parameter server); no whole-table tensor or
    variable is made outside the calling process's `value`.
    """
    shards = sharded.shards_of(variable)
    if shards is None:
        variable.assign(value)
    else:
        sharded._assign_rows(shards, value)


def keras_table_states(
    tables: List[KerasTable],
) -> Iterator[Tuple[str, Dict[str, np.ndarray]]]:
    """Yields `(name, table state)` of each Keras table, one at a time.

    An engine slot the optimizer does not keep (its rule does not read it,
    e.g. RMSProp's `mom` with momentum 0) is written as its initial value 0.
    """
    for table in tables:
        parameters = np.asarray(table.variable.numpy())
        state = {checkpoints.PARAMETERS: parameters}
        for slot, variable in table.slots.items():
            state[slot] = (
                np.asarray(variable.numpy())
                if variable is not None
                else np.zeros_like(parameters)
            )
        yield table.name, state


def _saved_value(variable: Any) -> Any:
    # A sharded variable goes to the writer as its `ShardedVariable`, which
    # the writer saves shard by shard on the shards' servers; any other as a
    # tensor read from it.
    value = variable.value if isinstance(variable, keras.Variable) else variable
    if sharded.shards_of(value) is not None:
        return value
    return tf.convert_to_tensor(variable)


def _tensor_states(tables: List[KerasTable]) -> Iterator[Tuple[str, Dict[str, Any]]]:
    # As `keras_table_states`, but as tensors read from the variables: no
    # NumPy copy of each table and slot on the way to the writer.
    for table in tables:
        parameters = _saved_value(table.variable)
        state = {checkpoints.PARAMETERS: parameters}
        for slot, variable in table.slots.items():
            state[slot] = (
                _saved_value(variable)
                if variable is not None
                else tf.zeros(parameters.shape, parameters.dtype)
            )
        yield table.name, state
        del state, parameters


def save_tpu_checkpoint(
    prefix: str,
    variables: Any,
    optimizer: Any,
    *,
    names: Any = None,
    object_path: str = "embedding",
    step: Optional[int] = None,
    step_path: str = "step",
) -> str:
    """Writes Keras tables and their optimizer state in the `TPUEmbedding` layout.

    `TPUEmbeddingForServing` and `TPUEmbedding` with the same tables and
    engine optimizers restore the result with
    `tf.train.Checkpoint(**{object_path: embedding}).restore(prefix)`; call
    `.expect_partial()` on the returned status (after
    `assert_existing_objects_matched()` if you want that check), since the
    checkpoint also holds the step at `step_path`, which the embedding's object
    graph has no place for (TensorFlow would otherwise warn about an
    unrestored value). Tables are read and written one at a time; the
    checkpoint is discoverable only once complete (see
    `checkpoints.write_tpu_checkpoint`).

    A table sharded over parameter servers (see `tf_tpu_embed_opt.sharded`)
    and its slots are written by the servers that hold them, each shard as a
    slice of the table's key (as TensorFlow's own saver writes sharded
    variables): none of their rows pass through the calling process, and
    `prefix` must be on a file system that every such server reaches. The
    calling process writes the object graph and the step, and an engine slot
    the optimizer does not keep (written as zeros) as one tensor.

    Args:
      prefix: The checkpoint prefix to write.
      variables: As for `load_into_keras`.
      optimizer: As for `load_into_keras`.
      names: With a model as `variables`, the tables to write.
      object_path: Where the embedding object sits in the checkpoint.
      step: The step to store at `step_path`; `None`: the optimizer's
        `iterations` (with `optimizer=None`, the first table's own
        optimizer's: a row-sparse layer counts its table's steps).
      step_path: Where to store the step.

    Returns:
      `prefix`.
    """
    tables = keras_tables(variables, optimizer, names)
    if not tables:
        raise ValueError(
            "`variables` holds no table; a checkpoint needs at least one. "
            f"Received {variables!r}."
        )
    if step is None:
        # The model's step; without a model optimizer, the tables' own.
        counting = optimizer if optimizer is not None else tables[0].optimizer
        step = int(counting.iterations.numpy())
    return checkpoints.write_tpu_checkpoint(
        prefix,
        _tensor_states(tables),
        object_path=object_path,
        algorithms={t.name: t.definition for t in tables},
        step=step,
        step_path=step_path,
    )
