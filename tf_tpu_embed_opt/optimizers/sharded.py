"""Tables sharded over parameter servers (`tf.distribute` `ShardedVariable`s).

Under `tf.distribute.experimental.ParameterServerStrategy` with a
`variable_partitioner`, a Keras variable (e.g. an `Embedding` table) holds a
`ShardedVariable`: consecutive row ranges, each a `tf.Variable` on one
parameter server. Keras 3 cannot train it: a gradient tape cannot watch it
(`'ShardedVariable' object has no attribute 'handle'`), stock optimizers
create each slot as one whole variable on the coordinator, and their update
fails (`ShardedVariable doesn't support being used as a reference`).

With this module the package's optimizers (`tf_tpu_embed_opt.optimizers.*`)
train such tables:

- `lookup(table, ids)` (or the `Embedding` layer, `layers.sharded`) reads
  only the looked-up rows, each from the server that holds it;
- `gradients(tape, loss, variables)` takes the gradient with respect to the
  shards and returns one gradient per variable, as `tape.gradient` would for
  an unsharded table (`tf.IndexedSlices` with global row ids for a lookup);
- the optimizers (through `ShardedOptimizerMixin`) keep one slot variable
  per shard, created on the shard's server, split each gradient by row range
  (a row-sparse one without densifying it) and run each shard's update on
  the server that holds its rows; a factor that couples the rows of a
  variable (`spec.VariableFactor`) is reduced across its shards, so the
  result equals the unsharded one.

A slot of a sharded table is a Keras variable holding a `ShardedVariable`
with the table's row ranges, so `tf.train.Checkpoint` saves a table and its
slots as whole tensors and restores them into any number of shards, or into
one process.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import keras
import tensorflow as tf
from tensorflow.python.distribute import sharded_variable

__all__ = [
    "CheckpointedShards",
    "ShardedOptimizerMixin",
    "checkpointable",
    "gradients",
    "lookup",
    "shards_of",
    "split_gradient",
    "wait_for_steps_in_flight",
]

Gradient = Union[tf.Tensor, tf.IndexedSlices]


def shards_of(variable: Any) -> Optional[List[tf.Variable]]:
    """The shards of a sharded variable, in row order; None if not sharded.

    Args:
      variable: A `keras.Variable`, a `ShardedVariable` or any variable.

    Returns:
      The list of `tf.Variable` shards, or None for an unsharded variable.
    """
    if isinstance(variable, keras.Variable):
        variable = variable.value
    if isinstance(variable, sharded_variable.ShardedVariableMixin):
        return list(variable.variables)
    return None


def _variables(variables: Any, function: str) -> Iterable[Any]:
    """`variables`, checked to be a collection of variables: one variable
    would be iterated row by row (and left alone without a word)."""
    if hasattr(variables, "shape") or not isinstance(variables, Iterable):
        raise TypeError(
            f"{function}: argument `variables` must be a list of variables "
            f"(e.g. model.variables); received {type(variables).__name__}."
        )
    return variables


def wait_for_steps_in_flight(variables: Sequence[Any]) -> None:
    """Waits until no scheduled step can still change `variables`.

    Under `ParameterServerStrategy` a `ClusterCoordinator` runs scheduled
    steps asynchronously on the workers: a table read while steps are in
    flight mixes rows, slots and step counters of different steps (each
    parameter server applies its updates on its own time). For every
    coordinator of a strategy holding one of `variables` this calls
    `ClusterCoordinator.join()`, which returns once every step scheduled so
    far has finished (and raises the error of one that failed), so that the
    values read next all belong to one step. Variables of no such strategy
    are left alone.

    Raises:
      TypeError: `variables` is one variable, or no collection.
    """
    joined = set()
    for variable in _variables(variables, "wait_for_steps_in_flight"):
        if isinstance(variable, keras.Variable):
            variable = variable.value
        strategy = getattr(variable, "_distribute_strategy", None)
        coordinator = getattr(strategy, "_cluster_coordinator", None)
        if coordinator is not None and id(coordinator) not in joined:
            joined.add(id(coordinator))
            coordinator.join()


def _row_starts(shards: Sequence[tf.Variable]) -> List[int]:
    starts, row = [], 0
    for shard in shards:
        starts.append(row)
        row += int(shard.shape[0])
    return starts


def _row_ranges(shards: Sequence[tf.Variable]) -> List[Tuple[int, int]]:
    """`(start, stop)` of each shard's rows in the whole variable."""
    return [
        (start, start + int(shard.shape[0]))
        for start, shard in zip(_row_starts(shards), shards)
    ]


def _assign_rows(shards: Sequence[tf.Variable], value: Any) -> List[Any]:
    """Assigns `value` (every row of the variable) shard by shard.

    The value is cut by row range where it is (the calling process), and each
    shard is assigned its rows on its own device (its parameter server).

    Args:
      shards: The variable's shards, in row order.
      value: A tensor or array with as many rows as the shards together.

    Returns:
      The assign operations, one per shard.
    """
    ranges = _row_ranges(shards)
    rows = ranges[-1][1] if ranges else 0
    # A restored tensor may not know its rows while a function is traced.
    if value.shape[0] is not None and value.shape[0] != rows:
        raise ValueError(
            f"A value for a variable sharded into rows {ranges} must have "
            f"{rows} rows; received one of shape {tuple(value.shape)}."
        )
    parts = [value[start:stop] for start, stop in ranges]
    ops = []
    for part, shard in zip(parts, shards):
        with tf.device(shard.device):
            ops.append(shard.assign(part, read_value=False))
    return ops


def split_gradient(
    gradient: Gradient, shards: Sequence[tf.Variable]
) -> List[Optional[Gradient]]:
    """Splits a whole-table gradient into one gradient per shard.

    A `tf.IndexedSlices` is split by row range without densifying it: each
    shard gets the entries of its rows (in their order), with row ids local
    to the shard. A dense gradient is split along its first axis.

    Args:
      gradient: The gradient of the whole table.
      shards: The table's shards, in row order.

    Returns:
      One gradient per shard.
    """
    shards = list(shards)
    if not shards or any(shard.shape.rank in (None, 0) for shard in shards):
        raise ValueError(
            "split_gradient: `shards` must be a non-empty list of variables of "
            f"rank >= 1 (the row ranges of one table); received shards={shards!r}."
        )
    sizes = [int(shard.shape[0]) for shard in shards]
    if not isinstance(gradient, tf.IndexedSlices):
        gradient = tf.convert_to_tensor(gradient)
        rows = gradient.shape[0] if gradient.shape.rank else None
        if rows is not None and rows != sum(sizes):
            raise ValueError(
                "split_gradient: a dense `gradient` must have as many rows as the "
                f"shards together ({sum(sizes)}: {sizes}); received a gradient "
                f"of shape {gradient.shape}."
            )
        return list(tf.split(gradient, sizes, axis=0))
    ids = gradient.indices
    starts = tf.constant(_row_starts(shards), dtype=ids.dtype)
    # The shard of a row is the number of shard starts after the first that
    # are <= the row.
    owner = tf.searchsorted(starts[1:], ids, side="right", out_type=tf.int32)
    local_ids = tf.dynamic_partition(ids - tf.gather(starts, owner), owner, len(sizes))
    values = tf.dynamic_partition(gradient.values, owner, len(sizes))
    tail = gradient.values.shape[1:]
    return [
        tf.IndexedSlices(v, i, tf.constant([size, *tail], dtype=tf.int64))
        for v, i, size in zip(values, local_ids, sizes)
    ]


def _join_gradients(
    parts: Sequence[Optional[Gradient]], shards: Sequence[tf.Variable]
) -> Optional[Gradient]:
    """The whole-table gradient from one gradient per shard."""
    if all(part is None for part in parts):
        return None
    shape = [sum(int(s.shape[0]) for s in shards), *shards[0].shape[1:]]
    if all(part is None or isinstance(part, tf.IndexedSlices) for part in parts):
        values, ids = [], []
        for part, start in zip(parts, _row_starts(shards)):
            if part is not None:
                values.append(part.values)
                ids.append(part.indices + tf.cast(start, part.indices.dtype))
        return tf.IndexedSlices(
            tf.concat(values, 0), tf.concat(ids, 0), tf.constant(shape, tf.int64)
        )
    dense = [
        tf.zeros(shard.shape, shard.dtype)
        if part is None
        else tf.convert_to_tensor(part)
        for part, shard in zip(parts, shards)
    ]
    return tf.concat(dense, 0)


def gradients(
    tape: tf.GradientTape, target: Any, variables: Sequence[Any]
) -> List[Any]:
    """`tape.gradient(target, variables)` that also works for sharded tables.

    A `GradientTape` cannot watch a `ShardedVariable` as one variable, so the
    gradient is taken with respect to each shard and the shards' gradients are
    joined into one per variable: a `tf.IndexedSlices` with global row ids
    when every shard's gradient is row-sparse (only the looked-up rows), else
    a dense tensor. Pass the result to `optimizer.apply_gradients(zip(grads,
    variables))` as in a one-machine loop.

    Args:
      tape: The tape that recorded the computation of `target`.
      target: The loss (a tensor or a nested structure of tensors).
      variables: The variables to differentiate for (Keras variables, tf
        variables or `ShardedVariable`s).

    Returns:
      One gradient (or None) per variable, in order.
    """
    if not isinstance(tape, tf.GradientTape):
        raise TypeError(
            "gradients: `tape` must be the tf.GradientTape that recorded `target`; "
            f"received tape={tape!r} of type {type(tape).__name__}."
        )
    variables = list(variables)
    sources: List[Any] = []
    spans: List[Tuple[int, int]] = []
    for variable in variables:
        shards = shards_of(variable)
        start = len(sources)
        sources.extend(shards if shards is not None else [variable])
        spans.append((start, len(sources)))
    flat = tape.gradient(target, sources)
    result = []
    for variable, (start, stop) in zip(variables, spans):
        shards = shards_of(variable)
        if shards is None:
            result.append(flat[start])
        else:
            result.append(_join_gradients(flat[start:stop], shards))
    return result


def lookup(table: Any, ids: Any) -> tf.Tensor:
    """The rows `ids` of `table`, each read from the shard that holds it.

    Keras's `ops.take` (used by `keras.layers.Embedding`) converts a sharded
    table to one tensor, which copies every shard to the reader at each step.
    This reads each distinct looked-up row once, so its gradient holds one
    row per distinct id: the servers send and receive each row once per
    step, however often the batch repeats it.

    Args:
      table: A `keras.Variable`, `ShardedVariable` or `tf.Variable`.
      ids: Integer row ids, any shape.

    Returns:
      A tensor of shape `ids.shape + table.shape[1:]`.
    """
    if isinstance(table, keras.Variable):
        table = table.value
    ids = tf.convert_to_tensor(ids)
    distinct, positions = tf.unique(tf.reshape(ids, [-1]))
    rows = tf.gather(tf.nn.embedding_lookup(table, distinct), positions)
    result = tf.reshape(rows, tf.concat([tf.shape(ids), tf.shape(rows)[1:]], 0))
    result.set_shape(ids.shape.concatenate(table.shape[1:]))
    return result


class CheckpointedShards(sharded_variable.ShardedVariable):
    """A `ShardedVariable` that a `keras.Variable` can checkpoint.

    A Keras variable checkpoints its value through `_serialize_to_tensors`,
    which TensorFlow's `ShardedVariable` does not implement (it has legacy
    saveables): Keras then hands the saver the `ShardedVariable` itself, and
    `tf.train.Checkpoint.write` fails (`'ShardedVariable' object has no
    attribute 'device'`). This class saves the whole variable as one tensor
    under the key an unsharded variable has, and restores by splitting the
    saved tensor by its own row ranges, so that a checkpoint moves between
    shard counts and to or from one process.

    Saving and restoring read the whole variable into the process that calls
    `write` or `read` (one variable at a time). Slices per server, as
    TensorFlow writes for its own sharded variables, cannot be restored
    through `_restore_from_tensors` in TensorFlow 2.21: its
    `TrackableSaveable.restore` passes only the first slice of a key.
    """

    def _serialize_to_tensors(self) -> Dict[str, Any]:
        return {"VARIABLE_VALUE": tf.convert_to_tensor(self)}

    def _restore_from_tensors(self, restored_tensors: Dict[str, Any]) -> Any:
        return tf.group(
            _assign_rows(self._variables, restored_tensors["VARIABLE_VALUE"])
        )


def checkpointable(variables: Sequence[Any]) -> None:
    """Lets `tf.train.Checkpoint` save and restore sharded Keras variables.

    Each Keras variable in `variables` that holds a plain `ShardedVariable`
    gets a `CheckpointedShards` over the same shard variables instead (no
    value is copied). The package's optimizers do this for the variables they
    are built with, and `Embedding` for its table; call it for other sharded
    Keras variables that a checkpoint holds without an optimizer.

    Args:
      variables: Keras variables (others are left alone).

    Raises:
      TypeError: `variables` is one variable, or no collection.
    """
    for variable in _variables(variables, "checkpointable"):
        if (
            isinstance(variable, keras.Variable)
            and type(variable.value) is sharded_variable.ShardedVariable
        ):
            # Keras keeps the backend variable in `_value` (its `value`
            # property returns it); the shards stay the same objects.
            variable._value = CheckpointedShards(
                variable.value.variables, name=variable.value.name
            )


_CREATING = threading.local()


def _shard_creator(reference_shards: Sequence[tf.Variable], initializer: Any):
    """A variable creator that makes a sharded twin of `reference_shards`.

    The variable Keras asks for becomes a `ShardedVariable` whose shards have
    the reference's row ranges and are each created on (colocated with) the
    reference's shard, with their own initial value: the whole-shape initial
    value is never computed.
    """

    def creator(next_creator, **kwargs):
        if getattr(_CREATING, "active", False):
            return next_creator(**kwargs)
        name = kwargs.get("name") or "slot"
        dtype = kwargs.get("dtype")
        strategy = tf.distribute.get_strategy()
        _CREATING.active = True
        try:
            parts = []
            for position, shard in enumerate(reference_shards):
                shape = shard.shape
                # The strategy's colocation places it under a
                # ParameterServerStrategy; the device, where no strategy
                # places variables (an optimizer made outside its scope).
                with (
                    strategy.extended.colocate_vars_with(shard),
                    tf.device(shard.device),
                ):
                    parts.append(
                        tf.Variable(
                            initial_value=lambda shape=shape: initializer(
                                shape, dtype=dtype
                            ),
                            dtype=dtype,
                            trainable=False,
                            name=f"{name}/part_{position}",
                        )
                    )
        finally:
            _CREATING.active = False
        return CheckpointedShards(parts, name=name)

    return creator


class ShardedOptimizerMixin:
    """Lets a Keras 3 optimizer train sharded variables (see module doc).

    Mixed in before `keras.optimizers.Optimizer`. The optimizer's own code
    stays per variable: it is called once per shard with the shard and the
    shard's gradient, and `_slot_for(slot, variable)` turns a slot of the
    whole table into the slot shard of `variable`. An optimizer whose state
    couples the rows of a variable overrides `_apply_shards`.
    """

    _shard_positions: Dict[Any, Tuple[int, int]]

    def build(self, var_list: List[Any]) -> None:
        sharded = [v for v in var_list if shards_of(v) is not None]
        if sharded:
            for option in ("use_ema", "gradient_accumulation_steps"):
                if getattr(self, option):
                    raise ValueError(
                        f"{type(self).__name__}: `{option}` is not supported for "
                        f"sharded variables; received {option}="
                        f"{getattr(self, option)!r} with sharded variable "
                        f"{sharded[0].name!r}. Leave it at its default."
                    )
        checkpointable(var_list)
        self._shard_positions = {}
        super().build(var_list)
        for index, variable in enumerate(var_list):
            for position, shard in enumerate(shards_of(variable) or ()):
                self._shard_positions[self._var_key(shard)] = (index, position)

    def add_variable_from_reference(
        self,
        reference_variable: Any,
        name: Optional[str] = None,
        initializer: Any = "zeros",
    ) -> Any:
        shards = shards_of(reference_variable)
        if shards is None:
            return super().add_variable_from_reference(
                reference_variable, name=name, initializer=initializer
            )
        # Keras colocates the slot with the ShardedVariable, which makes one
        # whole variable; here each shard of the slot is colocated with its
        # shard of the table.
        name = name or "var"
        prefix = getattr(reference_variable, "path", None) or reference_variable.name
        name = f"{str(prefix).replace('/', '_').replace(':', '_')}_{name}"
        initializer = keras.initializers.get(initializer)
        strategy = getattr(self, "_distribution_strategy", None)
        creator = _shard_creator(shards, initializer)
        # `apply_gradients` builds an unbuilt optimizer inside the step's
        # function, in the replica context, where the strategy's variable
        # placement does not apply; slots are created eagerly, in the
        # strategy's scope, as `optimizer.build` outside the step does.
        with tf.init_scope(), _scope_of(strategy), tf.variable_creator_scope(creator):
            return self.add_variable(
                shape=reference_variable.shape,
                initializer=initializer,
                dtype=reference_variable.dtype,
                name=name,
            )

    def _get_variable_index(self, variable: Any) -> int:
        positions = getattr(self, "_shard_positions", {})
        position = positions.get(self._var_key(variable))
        if position is not None:
            return position[0]
        return super()._get_variable_index(variable)

    def _sharded(self, variable: Any) -> bool:
        """Whether `variable` is a table sharded over parameter servers."""
        return shards_of(variable) is not None

    def _slot_for(self, slot: Any, variable: Any) -> Any:
        """`slot`, or its shard for `variable` when `variable` is a shard."""
        position = getattr(self, "_shard_positions", {}).get(self._var_key(variable))
        if position is None:
            return slot
        return shards_of(slot)[position[1]]

    def _apply_weight_decay(self, variables: List[Any]) -> None:
        if self.weight_decay is None:
            return
        plain = []
        for variable in variables:
            shards = shards_of(variable)
            if shards is None:
                plain.append(variable)
            elif self._use_weight_decay(variable):
                rate = tf.cast(self.learning_rate, variable.dtype)
                decay = tf.cast(self.weight_decay, variable.dtype)
                for shard in shards:
                    with tf.device(shard.device):
                        shard.assign_sub(shard * decay * rate)
        super()._apply_weight_decay(plain)

    def _distributed_tf_update_step(
        self, distribution: Any, grads_and_vars: List[Any], learning_rate: Any
    ) -> None:
        plain = []
        for gradient, variable in grads_and_vars:
            shards = shards_of(variable)
            if shards is None:
                plain.append((gradient, variable))
            else:
                self._apply_shards(
                    split_gradient(gradient, shards), shards, learning_rate
                )
        if plain:
            super()._distributed_tf_update_step(distribution, plain, learning_rate)

    def _apply_shards(
        self,
        gradients: Sequence[Gradient],
        shards: Sequence[tf.Variable],
        learning_rate: Any,
    ) -> None:
        """Applies one step to each shard, on the server that holds it."""
        for gradient, shard in zip(gradients, shards):
            with tf.device(shard.device):
                self.update_step(gradient, shard, learning_rate)


def _scope_of(strategy: Any) -> Any:
    """`strategy.scope()`, unless a strategy scope is already entered."""
    if strategy is None or tf.distribute.has_strategy():
        return contextlib.nullcontext()
    return strategy.scope()
