"""The Keras side of tables: variables, their optimizer and its slots.

`keras_tables` finds, for each table, the Keras variable that holds it, the
Keras optimizer that trains it and that optimizer's slot variables by engine
slot name (derived from the definitions: a twin of
`tf_tpu_embed_opt.optimizers` keeps engine slot `Slot.name` in its variable
named `Slot.keras_variable_name`, as Keras's own `Adagrad`, `Adam`, `Ftrl`,
`RMSprop` and `Adadelta` do for the same quantities; a twin that keeps
another algorithm's state, `Definition.state_of`, keeps that algorithm's
slots); `_check_against` checks
them against a table source. Keras-only slots are refused: they hold no
engine quantity (Keras SGD's momentum is −η times the engine's).

A table of the row-sparse `tf_tpu_embed_opt.layers.Embedding` is found by its
variable (or layer); its state is the layer's: its own optimizer, its slots
(`layer.slots`, by engine slot name) and its step counter. A table of a
`layers.StackedEmbedding` is its rows of the stack (`TableRows`, found by the
table's name in a model), with its rows of the stack's slots.

Runs on every Keras backend without TensorFlow; tables sharded over parameter
servers (Keras's TensorFlow backend only) are waited for through
`tf_tpu_embed_opt.sharded`, loaded when that backend is the one running.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple, Union

import keras
import numpy as np

from tf_tpu_embed_opt.checkpoints.shared.algorithms import refuse_engine_state
from tf_tpu_embed_opt.checkpoints.shared.table_info import PARAMETERS, narrows
from tf_tpu_embed_opt.conversions import faces as convert
from tf_tpu_embed_opt.definitions import registry, spec
from tf_tpu_embed_opt.layers.embedding import owner_of
from tf_tpu_embed_opt.layers.stacked import StackedEmbedding, TableRows, stack_of
from tf_tpu_embed_opt.layers.table_state import given_to_a_stack
from tf_tpu_embed_opt.optimizers import twins as optimizers

__all__ = [
    "KerasTable",
    "keras_tables",
    "keras_table_states",
    "sharded_module",
]

Target = Union[keras.Variable, keras.layers.Embedding]


def sharded_module() -> Any:
    """`tf_tpu_embed_opt.sharded` on Keras's TensorFlow backend, the only one
    whose variables can be sharded over parameter servers; `None` on others
    (which may run without TensorFlow)."""
    if keras.backend.backend() != "tensorflow":
        return None
    from tf_tpu_embed_opt.optimizers import sharded

    return sharded


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


def _definition_of(optimizer: Any, table: str, engine: bool = True) -> spec.Definition:
    """The algorithm whose state `optimizer` keeps (no build needed).

    `engine`: the state goes to or comes from an engine's checkpoint, so an
    algorithm no engine runs (state of one value per row) is refused by name;
    `False` for Keras's own formats, which hold any twin's state.
    """
    if isinstance(optimizer, optimizers.TwinOptimizer):
        rule = optimizer.rule
        definition = rule.active
        if definition.state_of is not None:
            # It keeps an engine algorithm's slots (and nothing more).
            return registry.BY_NAME[definition.state_of]
        if engine:
            refuse_engine_state(definition, f"Table {table!r}")
        extra = [
            s.keras_variable_name
            for s in rule.definition.keras.extra_slots
            if s.when is None or s.when(rule.arguments)
        ]
        if extra:
            raise ValueError(
                f"Table {table!r}: {type(optimizer).__name__} keeps Keras-only "
                f"slots {extra} that the engine's {definition.name} has no slot "
                "for (e.g. Adam's amsgrad or SGD's Keras momentum); use "
                "`tf_tpu_embed_opt.to_keras(table_optimizer)`."
            )
        return definition
    if isinstance(optimizer, keras.optimizers.Optimizer):
        try:
            return convert.keras_algorithm(optimizer)
        except TypeError:
            pass
    raise TypeError(
        f"Table {table!r}: the Keras optimizer must be one of "
        "tf_tpu_embed_opt.optimizers (e.g. from `to_keras(table_optimizer)`), "
        "keras.optimizers.{Adagrad, Adam, Ftrl, RMSprop, "
        "Adadelta, SGD}, or a keras.optimizers.MultiOptimizer of them; received "
        f"{type(optimizer).__name__}, whose slots do not hold the engine's "
        "quantities."
    )


def _optimizer_slots(
    optimizer: Any, variable: Any, table: str, engine: bool
) -> Tuple[spec.Definition, Dict[str, Optional[Any]]]:
    """The engine algorithm and engine slot -> Keras slot variable of `optimizer`."""
    definition = _definition_of(optimizer, table, engine)
    index = optimizer._get_variable_index(variable)
    if not isinstance(optimizer, optimizers.TwinOptimizer):
        return definition, _stock_slots(optimizer, variable, table, definition)
    slots = {
        slot.name: optimizer._slot_variables[slot.name][index]
        if slot.name in optimizer._slot_variables
        else None
        for slot in definition.slots
    }
    return definition, slots


def _slot_prefix(variable: Any) -> str:
    # Keras names a slot of `variable` by its path, '/' as '_', then '_'.
    return f"{variable.path.replace('/', '_')}_"


def _stock_slots(
    optimizer: Any, variable: Any, table: str, definition: spec.Definition
) -> Dict[str, Optional[Any]]:
    """Engine slot -> slot variable of one of Keras's own optimizers.

    Keras names a slot `<variable path with '_'>_<name>` and uses the names
    the definitions record as `Slot.keras_name` for the same quantities
    (Adam's `momentum`/`velocity` are the engine's `momenta`/`velocities`).
    Keras-only slots (SGD's momentum, which is −η times the engine's, Adam's
    `velocity_hat`) have no engine slot and are refused. Keras gives every
    variable it builds for the same slots, so a slot's name is the prefix
    and a suffix every variable has: `user_bias_accumulator` beside the
    table `user` is the variable `user_bias`'s, and `user_velocity_hat` is
    the table's even beside a variable `user_velocity`.
    """
    prefix = _slot_prefix(variable)
    names = [candidate.name for candidate in optimizer.variables]
    suffixes = None
    for other in map(_slot_prefix, optimizer._trainable_variables):
        own = {n[len(other) :] for n in names if n.startswith(other)}
        suffixes = own if suffixes is None else suffixes & own
    kept: Dict[str, List[Any]] = {}
    for candidate in optimizer.variables:
        suffix = candidate.name[len(prefix) :]
        if candidate.name.startswith(prefix) and suffix in (suffixes or ()):
            kept.setdefault(suffix, []).append(candidate)
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
                f"variables named {prefix + slot.keras_variable_name!r}: Keras "
                "names a slot by its variable's path with '/' as '_', which "
                "here two variables share; give one another name."
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


def _check_before_build(
    source: Any, variables: Any, optimizer: Any, engine: bool = True
) -> None:
    """`_check_against` for an optimizer not built yet, without building it."""
    optimizer = optimizers.unscaled(optimizer)
    multi = _multi_optimizer_class()
    for name, variable in _targets(variables, list(source.tables)).items():
        inner = optimizer
        layer = _row_sparse_layer(variable, optimizer, name)
        if layer is not None:
            inner = layer.optimizer
        elif multi is not None and isinstance(optimizer, multi):
            inner = optimizer._optimizer_map(variable)
        definition = _definition_of(inner, name, engine)
        _check_against(source, KerasTable(name, variable, inner, definition, {}))


def _row_sparse_layer(variable: Any, optimizer: Any, table: str) -> Any:
    """The row-sparse layer whose table `variable` is (its optimizer keeps the
    table's state), or None; `optimizer=None` only for such tables."""
    layer = owner_of(variable)
    stacked = stack_of(layer)
    if stacked is not None and not isinstance(variable, TableRows):
        raise ValueError(
            f"Table {table!r}: the variable is a whole stack of the "
            f"StackedEmbedding {stacked.name!r} (tables "
            f"{[list(s) for s in stacked.stacks]}); pass one table's rows, "
            f"`{stacked.name}.table(name)`, or the model."
        )
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
    if isinstance(target, (keras.Variable, TableRows)):
        return target
    raise TypeError(
        f"Table {table!r}: the target must be a keras.Variable, a "
        "keras.layers.Embedding or a table of a StackedEmbedding "
        f"(`layer.table(name)`); received {target!r} of type "
        f"{type(target).__name__}."
    )


def _targets(variables: Any, names: Any) -> Dict[str, Any]:
    """Table name -> Keras variable, from a mapping or a model."""
    if isinstance(variables, keras.Model):
        model = variables
        by_name: Dict[str, Any] = {}
        count: Dict[str, int] = {}
        for layer in model._flatten_layers(include_self=False):
            if given_to_a_stack(layer):
                continue  # its rows are the stack's, found below
            if isinstance(layer, keras.layers.Embedding) and layer.built:
                by_name.setdefault(layer.name, layer.embeddings)
                count[layer.name] = count.get(layer.name, 0) + 1
            if isinstance(layer, StackedEmbedding) and layer.built:
                for stack in layer.stacks:
                    for table in stack:
                        by_name.setdefault(table, layer.table(table))
                        count[table] = count.get(table, 0) + 1
        for variable in model.trainable_variables:
            by_name.setdefault(variable.path, variable)
        for name in names:
            if count.get(name, 0) > 1:
                # Keras names layers uniquely only among siblings (two
                # sub-models may each hold an Embedding "user").
                raise ValueError(
                    f"Table {name!r}: model {model.name!r} holds {count[name]} "
                    "tables of that name (Embedding layers, or tables of a "
                    "StackedEmbedding); pass a mapping {table: layer or "
                    "variable} instead."
                )
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
    unknown = sorted(set(names) - set(variables))
    if unknown:
        # They were left out without a word, and every key taken.
        raise ValueError(
            f"`names` {unknown} are not tables of `variables`, which has "
            f"{sorted(variables)}."
        )
    return {name: _variable_of(name, variables[name]) for name in names}


def keras_tables(
    variables: Any, optimizer: Any, names: Any = None, *, engine: bool = True
) -> List[KerasTable]:
    """The Keras side of each table: variable, optimizer, slot variables.

    Args:
      variables: A mapping {table: keras.layers.Embedding or keras.Variable},
        or a `keras.Model` whose Embedding layers (or variables, by path) are
        named like the tables.
      optimizer: The (built) Keras optimizer of the model: a twin (of
        `tf_tpu_embed_opt.optimizers`), Keras's own `Adagrad`, `Adam`,
        `Ftrl`, `RMSprop`, `Adadelta` or `SGD`, or a
        `keras.optimizers.MultiOptimizer` of them; any of these inside a
        `keras.optimizers.LossScaleOptimizer` (as `mixed_float16` compiles
        it), whose inner optimizer keeps the state.
      names: With a model, the table names to look up; with a mapping,
        the keys to take (default: all).
      engine: The state goes to or comes from an engine's checkpoint: an
        algorithm no engine runs is refused by name. `False` for Keras's own
        formats, which hold any twin's state.

    Raises:
      TypeError: An optimizer whose slots are not the engine's.
      ValueError: The optimizer is not built for a table's variable.

    Under `ParameterServerStrategy`, returns only once every step scheduled on
    the strategy's `ClusterCoordinator` has finished
    (`sharded.wait_for_steps_in_flight`), so that a checkpoint written from
    the tables holds one step and a load does not race with running steps.
    """
    if not isinstance(engine, bool):
        raise TypeError(
            f"keras_tables: argument `engine` must be True or False; received "
            f"{engine!r} of type {type(engine).__name__}."
        )
    if names is None:
        if isinstance(variables, keras.Model):
            raise ValueError(
                "keras_tables: argument `names` must list the tables to find "
                f"in the keras.Model {variables.name!r}; received None."
            )
        names = list(variables)
    else:
        given = names
        iterable = isinstance(given, Iterable) and not isinstance(given, (str, bytes))
        names = list(given) if iterable else []
        if not iterable or not all(isinstance(n, str) for n in names):
            raise TypeError(
                f"`names` must be a list of table names (strings); received {given!r}."
            )
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
    # Built above as given; a LossScaleOptimizer's inner one keeps the state.
    unscaled = optimizers.unscaled(optimizer)
    tables = []
    for name, variable in targets.items():
        layer = _row_sparse_layer(variable, optimizer, name)
        if layer is not None:
            definition = _definition_of(layer.optimizer, name, engine)
            slots = {s.name: layer.slots.get(s.name) for s in definition.slots}
            own = layer.optimizer
            tables.append(KerasTable(name, variable, own, definition, slots))
            continue
        inner = _inner_optimizer(unscaled, variable, name)
        try:
            definition, slots = _optimizer_slots(inner, variable, name, engine)
        except KeyError:
            raise ValueError(
                f"Table {name!r}: variable {variable.path!r} is not among the "
                f"variables optimizer {inner.name!r} was built with."
            ) from None
        tables.append(KerasTable(name, variable, inner, definition, slots))
    # Under ParameterServerStrategy, steps in flight would make what is read
    # or written next a mix of steps: wait for them first.
    parameter_servers = sharded_module()
    if parameter_servers is not None:
        parameter_servers.wait_for_steps_in_flight(
            [o.iterations for o in (optimizer,) if o is not None]
            + [
                v
                for t in tables
                for v in (t.variable, *t.slots.values())
                if v is not None
            ]
        )
    return tables


def _dtype_name(variable: Any) -> str:
    return np.dtype(keras.backend.standardize_dtype(variable.dtype)).name


def array_shape(table: KerasTable, key: str) -> Tuple[int, ...]:
    """The shape of one array of `table`: `"parameters"` or a slot (of a
    row-wise optimizer, `[rows, 1]`)."""
    shape = tuple(int(n) for n in table.variable.shape)
    per_row = any(s.per_row for s in table.definition.slots if s.name == key)
    return (shape[0], 1) if per_row else shape


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
    # A float32 checkpoint goes into a 16-bit table where each value is
    # exact, which `load_into_keras` checks before anything changes.
    if info.dtype != dtype and not narrows(info.dtype, dtype):
        raise ValueError(
            f"Table {table.name!r}: the checkpoint's table has dtype "
            f"{info.dtype}; the Keras variable {table.variable.path!r} has "
            f"{dtype}."
        )
    for slot in info.slots:
        wanted = array_shape(table, slot)
        if tuple(info.slot_shapes[slot]) != wanted:
            raise ValueError(
                f"Table {table.name!r}: slot {slot!r} has shape "
                f"{tuple(info.slot_shapes[slot])} in the checkpoint; the table "
                f"has {shape}"
                + (f" and the slot {wanted}." if wanted != shape else ".")
            )
        # A slot the optimizer keeps in float32 for a 16-bit table
        # (`Definition.narrow_tables`) has the dtype of its own variable.
        kept = target_dtype(table, slot)
        stored = info.slot_dtypes[slot]
        if kept is not None and stored != kept and not narrows(stored, kept):
            raise ValueError(
                f"Table {table.name!r}: slot {slot!r} has dtype {stored} in "
                f"the checkpoint; its Keras variable has {kept}."
            )


def target_dtype(table: KerasTable, key: str) -> Optional[str]:
    """The dtype of the variable that `key` (`"parameters"` or a slot) of
    `table` loads into; None for a slot its optimizer does not keep."""
    variable = table.variable if key == PARAMETERS else table.slots.get(key)
    return None if variable is None else _dtype_name(variable)


def narrowed_keys(source: Any, table: KerasTable) -> Tuple[str, ...]:
    """The tensors of `table` that the checkpoint holds as float32 and that
    load into a 16-bit variable (`narrows`): only once each value is found
    exact."""
    info = source.tables[table.name]
    # A slot the optimizer does not keep (no target dtype) narrows nothing.
    return tuple(
        key
        for key in (PARAMETERS, *info.slots)
        if narrows(info.dtype_of(key), target_dtype(table, key))
    )


def _step_counters(optimizer: Any, tables: List[KerasTable]) -> Tuple[list, list]:
    """(the model's optimizer and its inner ones, the row-sparse layers whose
    step counters count the tables' steps)."""
    optimizer = optimizers.unscaled(optimizer)
    found = [] if optimizer is None else [optimizer]
    multi = _multi_optimizer_class()
    if multi is not None and isinstance(optimizer, multi):
        found.extend(optimizer.optimizers)
    layers = {id(layer): layer for layer in map(table_layer, tables) if layer}
    return found, list(layers.values())


def check_step(optimizer: Any, tables: List[KerasTable], step: int) -> None:
    """Refuses, before anything is loaded, a step that a counter `_set_step`
    sets cannot hold (an int32 on Keras's JAX backend without
    `jax_enable_x64`).

    Raises:
      ValueError: Naming the step, the counter's dtype and its limit.
    """
    optimizers, layers = _step_counters(optimizer, tables)
    for counting in optimizers + [layer.optimizer for layer in layers]:
        dtype = keras.backend.standardize_dtype(counting.iterations.dtype)
        largest = int(np.iinfo(dtype).max)
        if step > largest:
            raise ValueError(
                f"The step {step} is more than Keras's step counter holds here "
                f"({dtype}: at most {largest}); nothing was loaded."
            )


def _set_step(optimizer: Any, tables: List[KerasTable], step: int) -> None:
    """Sets `step` as the step counter of the model's optimizer, of its inner
    ones, and of each row-sparse layer's table (`set_table_step`)."""
    optimizers, layers = _step_counters(optimizer, tables)
    for counting in optimizers:
        counting.iterations.assign(step)
    for layer in layers:
        layer.set_table_step(step)


def table_layer(table: KerasTable) -> Any:
    """The row-sparse layer (a stack's, for a table of a `StackedEmbedding`)
    whose step counter counts `table`'s steps, or None."""
    variable = table.variable
    if isinstance(variable, TableRows):
        variable = variable.variable
    return owner_of(variable)


def spread_over_processes(table: KerasTable) -> bool:
    """Whether the table's rows are spread over several JAX processes (this
    process holds only its rows of a global `jax.Array`)."""
    return any(
        not getattr(getattr(variable, "value", None), "is_fully_addressable", True)
        for variable in (table.variable, *table.slots.values())
    )


def keras_table_states(
    tables: List[KerasTable],
) -> Iterator[Tuple[str, Dict[str, Any]]]:
    """Yields `(name, table state)` of each Keras table, one at a time.

    A table's arrays are NumPy arrays, except for a table spread over
    several JAX processes (a `keras.distribution` layout across them): its
    global `jax.Array`s, of which each process holds its rows, which
    `write_checkpoint(..., format="jax-tpu-embedding")` writes from every
    process and the other formats refuse. An engine slot the optimizer does
    not keep (its rule does not read it, e.g. RMSProp's `mom` with momentum
    0) is written as its initial value 0.
    """
    for table in tables:
        if spread_over_processes(table):
            value, zeros = (lambda v: v.value), keras.ops.zeros_like
        else:
            value, zeros = (lambda v: np.asarray(v.numpy())), np.zeros_like
        parameters = value(table.variable)
        state = {PARAMETERS: parameters}
        for slot, variable in table.slots.items():
            state[slot] = zeros(parameters) if variable is None else value(variable)
        yield table.name, state
