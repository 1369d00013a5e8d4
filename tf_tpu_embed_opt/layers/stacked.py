"""`StackedEmbedding`: many tables looked up and stepped as the TPU engines
stack them.

TPUEmbedding and jax-tpu-embedding stack the tables that can share a step
(the same width, dtype and optimizer) into one table, with one dedup of all
their ids, one gather and one scatter of rows and slots per step. This layer
does the same on CPU/GPU: it takes the `layers.Embedding`s a model would
call one by one, groups them into stacks, and calls each stack once, with
every table's ids offset into the stack's rows. Each row still steps once
with its summed gradient, by the same rule, so the step equals that of the
separate layers bit for bit (the ids of a table keep their order within the
stack, and so do the sums).

The stack is a row-sparse `Embedding` over the stack's rows: its variables,
slots, step counter, `keras.distribution` layouts and `.keras` saving are
that layer's. Each table keeps its name: `get_table` and `set_table` read and
write its rows and slots.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import weakref
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import keras
import numpy as np
from keras import ops

from tf_tpu_embed_opt.layers.embedding import (
    Embedding,
    lookup_module,
    outside_as_absent,
)
from tf_tpu_embed_opt.layers.ids import integer_ids

__all__ = ["StackedEmbedding", "TableRows", "as_ids", "stack_of"]


@keras.saving.register_keras_serializable(package="tf_tpu_embed_opt")
class StackInitializer(keras.initializers.Initializer):
    """A stack's initial value: each table's initializer over its own rows."""

    def __init__(self, initializers: Sequence[Any], rows: Sequence[int]) -> None:
        self.initializers = [keras.initializers.get(i) for i in initializers]
        self.rows = [int(r) for r in rows]

    def __call__(self, shape: Any, dtype: Any = None) -> Any:
        width = shape[1]
        return ops.concatenate(
            [
                initializer((rows, width), dtype=dtype)
                for initializer, rows in zip(self.initializers, self.rows)
            ],
            axis=0,
        )

    def get_config(self) -> Dict[str, Any]:
        return {
            "initializers": [
                keras.initializers.serialize(i) for i in self.initializers
            ],
            "rows": list(self.rows),
        }


class _Stack(Embedding):
    """The row-sparse table of a stack: `StackedEmbedding` checks each
    table's ids against its own rows and maps those it reads as zeros to the
    stack's absent id, so this layer checks nothing itself."""

    _ids_checked_by_caller = True
    _instead_of_a_second_call = (
        "call the StackedEmbedding once per step, with the ids of every "
        "feature (features that share a table: give its Embedding under "
        "each of them)"
    )
    # The names of the tables stacked in it, set by `StackedEmbedding`.
    _members: Tuple[str, ...] = ()

    @property
    def _table_words(self) -> str:
        owner = stack_of(self)
        where = f"StackedEmbedding {owner.name!r}" if owner else "StackedEmbedding"
        tables = ", ".join(repr(name) for name in self._members)
        return f"{where}: the stack of tables {tables} ({self.name!r})"


def stack_of(layer: Any) -> Optional["StackedEmbedding"]:
    """The `StackedEmbedding` whose stack `layer` is, or None."""
    owner = getattr(layer, "_stacked_in", None)
    return owner() if owner is not None else None


class TableRows:
    """One table's rows of a stack variable (the table's or a slot's), as the
    checkpoint functions read and write a table's variable.

    Attributes:
      variable: The stack's variable.
      start, stop: The table's rows in it.
    """

    def __init__(
        self, variable: Any, start: int, stop: int, owner: Optional[Any] = None
    ) -> None:
        self.variable, self.start, self.stop = variable, start, stop
        # `layers.embedding.owner_of`: the layer whose optimizer steps it.
        self._row_sparse_layer = owner

    @property
    def shape(self) -> Tuple[int, int]:
        return (self.stop - self.start, self.variable.shape[1])

    @property
    def dtype(self) -> Any:
        return self.variable.dtype

    @property
    def path(self) -> str:
        return f"{self.variable.path}[{self.start}:{self.stop}]"

    @property
    def value(self) -> Any:
        return self.variable.value[self.start : self.stop]

    def numpy(self) -> np.ndarray:
        return ops.convert_to_numpy(self.value)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        value = self.numpy()
        return value if dtype is None else value.astype(dtype)

    def assign(self, value: Any) -> None:
        value = np.asarray(value)
        if value.shape != self.shape:
            raise ValueError(
                f"{self.path}: the value must have shape {self.shape}; "
                f"received {value.shape}."
            )
        lookup_module().write_rows(self.variable, self.start, value)

    def __repr__(self) -> str:
        return f"<TableRows {self.path} shape={self.shape}>"


class _TableView:
    """What the checkpoint functions ask of a table's row-sparse layer: its
    optimizer and its slots (a stack's, limited to the table's rows)."""

    def __init__(self, stack: "_Stack", start: int, stop: int) -> None:
        self.optimizer = stack.optimizer
        self.slots = {
            name: TableRows(variable, start, stop)
            for name, variable in stack.slots.items()
        }
        self._stacked_in = stack._stacked_in


def _step_key(table: Embedding) -> str:
    """What tables must share to be stepped as one: width, dtypes and the
    optimizer's class and settings (its name aside)."""
    optimizer = table.optimizer
    config = dict(optimizer.get_config(), name=None)
    return json.dumps(
        [
            table.output_dim,
            table.variable_dtype,
            table.compute_dtype,
            keras.saving.get_registered_name(type(optimizer)),
            _without_object_ids(config),
        ],
        sort_keys=True,
        default=str,
    )


def _without_object_ids(config: Any) -> Any:
    """`config` without the `shared_object_id`s Keras adds while it saves or
    loads a model (one per object: equal settings would differ by them)."""
    if isinstance(config, dict):
        return {
            key: _without_object_ids(value)
            for key, value in config.items()
            if key != "shared_object_id"
        }
    if isinstance(config, (list, tuple)):
        return [_without_object_ids(value) for value in config]
    return config


@dataclasses.dataclass(frozen=True)
class _Table:
    """What a stacked table keeps of the `Embedding` that described it."""

    name: str
    rows: int
    width: int
    zeros: bool
    config: Dict[str, Any]
    # The `Embedding` itself, weakly: whether another stack took it since.
    layer: Any = dataclasses.field(compare=False, repr=False)

    @classmethod
    def of(cls, spec: Embedding) -> "_Table":
        return cls(
            spec.name,
            spec.input_dim,
            spec.output_dim,
            spec.out_of_range_ids == "zeros",
            keras.saving.serialize_keras_object(spec),
            weakref.ref(spec),
        )


class _Layout:
    """Where each table sits: its stack and its first row there."""

    def __init__(self, tables: Sequence[Embedding]) -> None:
        keys: List[str] = []
        self.members: List[List[int]] = []
        self.stack_of_table: List[int] = []
        self.offsets: List[int] = []
        sizes: List[int] = []
        for index, table in enumerate(tables):
            key = _step_key(table)
            if key not in keys:
                keys.append(key)
                self.members.append([])
                sizes.append(0)
            stack = keys.index(key)
            self.members[stack].append(index)
            self.stack_of_table.append(stack)
            self.offsets.append(sizes[stack])
            sizes[stack] += table.input_dim
        self.rows = sizes


@keras.saving.register_keras_serializable(package="tf_tpu_embed_opt")
class StackedEmbedding(keras.layers.Layer):
    """Many row-sparse tables, stacked as the TPU engines stack them.

    Takes the `tf_tpu_embed_opt.layers.Embedding`s a model would call one by
    one, and looks them all up in one call: tables with the same
    `output_dim`, dtype and optimizer settings share one stack, which steps
    once per training step (one dedup of all their ids, one gather, one
    scatter), exactly as the separate layers would step them.

    Example (a model that called `tables[i](ids[:, i])` for each feature):

    ```python
    tables = [
        tf_tpu_embed_opt.layers.Embedding(
            rows, 16, optimizer=tf_tpu_embed_opt.optimizers.Adagrad(0.05),
            name=f"table_{i}")
        for i, rows in enumerate(ROWS)
    ]
    vectors = tf_tpu_embed_opt.layers.StackedEmbedding(tables)(
        [ids[:, i] for i in range(len(ROWS))])
    ```

    Each table keeps its name, its initializer and its `out_of_range_ids`
    (ids outside a table are refused naming that table, or read zeros). One
    table may stand under several features (the same `Embedding` in several
    entries of `tables`), as a `TPUEmbedding` table that several
    `FeatureConfig`s name: its features' ids are looked up together and it
    steps once, each row with the gradient of all its lookups. An
    `Embedding` is the table of the last `StackedEmbedding` given it and
    holds nothing itself (it counts as built, so a model may keep it as an
    attribute): called on its own, or in a stack it was given to before, it
    is refused (either would be a second table of its name). A
    stack steps with its first table's optimizer object, as
    `TPUEmbeddingV2` steps a stacked table with its first table's: a
    learning rate set later on another table's optimizer object does not
    reach the stack (give a stack's tables one optimizer object).
    `get_table(name)` and `set_table(name, values)` read and write a table's
    rows and slots; `stacks` lists which tables share a stack.

    Args:
      tables: A list, or a dict by feature name, of
        `tf_tpu_embed_opt.layers.Embedding`s never built on their own, one
        per feature (each table with its optimizer, which tables may share
        as one object, and a distinct `name`; the same `Embedding` for
        features that share a table; without `weights`, `mask_zero` or a
        `keras_rs` subclass).
      **kwargs: As for any Keras layer (`name`, ...).

    Call arguments:
      inputs: Integer ids for each feature, in the structure of `tables` (a
        list in the same order, or a dict with the same keys); each any
        shape.
      training: As for `layers.Embedding`: only with `training=True` does
        the backward pass step the tables.

    The call gives the rows looked up, in the structure of `inputs`: for ids
    of shape `s`, an array of shape `s + (output_dim,)`.
    """

    def __init__(self, tables: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # Ids are not cast to the compute dtype (under mixed_bfloat16, float
        # ids past 256 would round to other rows), as Keras's Embedding.
        self.autocast = False
        self._keys, specs, features = _tables_argument(tables)
        # The table each entry of `tables` (a feature) looks up.
        self._features = features
        for spec in specs:
            # Its rows are the stack's (`TableState._table_of_stack`).
            spec._table_of_stack = weakref.ref(self)
            spec.built = True
        # What the call needs of each table, not the layers themselves, which
        # as attributes would be sublayers: Keras would list and save them
        # beside the stacks that hold their rows.
        self._tables = tuple(_Table.of(spec) for spec in specs)
        self._layout = _Layout(specs)
        self._stacks = []
        for index, members in enumerate(self._layout.members):
            first = specs[members[0]]
            stack = _Stack(
                self._layout.rows[index],
                first.output_dim,
                embeddings_initializer=StackInitializer(
                    [specs[m].embeddings_initializer for m in members],
                    [specs[m].input_dim for m in members],
                ),
                optimizer=first.optimizer,
                dtype=first.dtype_policy,
                name=f"stack_{index}",
            )
            stack._absent_ids = self._absent_ids or any(
                self._tables[m].zeros for m in members
            )
            stack._stacked_in = weakref.ref(self)
            stack._members = tuple(self._tables[m].name for m in members)
            self._stacks.append(stack)
            # An attribute too: TensorFlow's checkpoints follow attributes,
            # not the lists Keras tracks (`Embedding.build`). Keras's saving
            # visits `_stacks` first, so its files keep their paths.
            setattr(self, f"_stacks_{index}", stack)

    @property
    def stacks(self) -> Tuple[Tuple[str, ...], ...]:
        """The tables' names, stack by stack, in the order of their rows."""
        return tuple(
            tuple(self._tables[m].name for m in members)
            for members in self._layout.members
        )

    def build(self, input_shape: Any = None) -> None:
        self._refuse_a_table_given_to_another_stack()
        with keras.name_scope(self.name, caller=self):
            for stack in self._stacks:
                stack.build()
        self.built = True

    # An id equal to its table's row count is no lookup: it reads zeros and
    # steps no row (keras-rs's weightless entries, `keras_rs_tables`).
    _absent_ids = False

    def call(self, inputs: Any, training: Optional[bool] = None) -> Any:
        self._refuse_a_table_given_to_another_stack()
        return self._structured(self._look_up(self._lookups(inputs), training))

    def _refuse_a_table_given_to_another_stack(self) -> None:
        """Refuses to build or look up once one of its `Embedding`s has been
        given to another `StackedEmbedding`, which holds its own copy of the
        rows: the two would train two tables of one name apart."""
        for table in self._tables:
            spec = table.layer()
            owner = spec._table_of_stack() if spec is not None else None
            if owner is not None and owner is not self:
                raise ValueError(
                    f"StackedEmbedding {self.name!r}: its table {table.name!r} "
                    f"has since been given to the StackedEmbedding "
                    f"{owner.name!r}, which holds its own copy of the rows: the "
                    "two would train two tables of that name apart. Give one "
                    f"StackedEmbedding every feature that reads {table.name!r} "
                    "(its outputs may feed several towers; the layer itself may "
                    "serve in several models), or each stack its own "
                    "`Embedding` where the tables are meant to differ."
                )

    # Never rematerialized, as its stacks (`Embedding.rematerialized_call`).
    rematerialized_call = Embedding.rematerialized_call

    def _lookups(self, inputs: Any) -> List[Tuple[int, Any]]:
        """`(table index, ids)` of each array of `inputs`: one per feature
        (entry of `tables`), in their order."""
        return list(zip(self._features, self._ids(inputs)))

    def _look_up(
        self, lookups: Sequence[Tuple[int, Any]], training: Optional[bool]
    ) -> List[Any]:
        """The rows of each `(table index, ids)` of `lookups`, in their order
        (several may read one table), each stack looked up once."""
        lookup = self._stacks[0]._lookup
        tables = [self._tables[t] for t, _ in lookups]
        # Ragged ids (TensorFlow) are looked up by their flat values.
        flat_ids = [
            lookup.flat_ids(i, table.name) for (_, i), table in zip(lookups, tables)
        ]
        structures = [structured for _, structured in flat_ids]
        lookups = [
            (t, integer_ids(i, table.rows, self._absent_ids, table.name, lookup))
            for (t, _), (i, _), table in zip(lookups, flat_ids, tables)
        ]
        checked = iter(
            lookup.checked_tables(
                [i for (_, i), t in zip(lookups, tables) if not t.zeros],
                [t.rows for t in tables if not t.zeros],
                [t.name for t in tables if not t.zeros],
                self._absent_ids,
                [stack._embeddings for stack in self._stacks],
            )
        )
        ids = [i if t.zeros else next(checked) for (_, i), t in zip(lookups, tables)]
        outputs: List[Any] = [None] * len(ids)
        for index, stack in enumerate(self._stacks):
            entries = [
                e
                for e, (t, _) in enumerate(lookups)
                if self._layout.stack_of_table[t] == index
            ]
            if not entries:
                continue
            # No stack moves before every table's ids are checked.
            with lookup.after(*ids):
                flat = ops.concatenate(
                    [self._stack_ids(ids[e], lookups[e][0], index) for e in entries],
                    axis=0,
                )
            looked = stack(flat, training=training)
            # Static sizes on JAX; on TensorFlow a dimension may be known only
            # when the step runs. A split, whose gradient is one concatenation
            # (slices would each pad their gradient to the stack's size).
            shapes = [ops.shape(ids[e]) for e in entries]
            parts = lookup.split_rows(looked, [math.prod(s) for s in shapes])
            for e, shape, part in zip(entries, shapes, parts):
                outputs[e] = ops.reshape(part, (*shape, stack.output_dim))
                if structures[e] is not None:
                    outputs[e] = structures[e](outputs[e])
        return outputs

    def _stack_ids(self, ids: Any, table: int, stack: int) -> Any:
        """Table `table`'s ids as rows of its stack; with
        `out_of_range_ids="zeros"` (or an absent id, checked already), those
        outside the table as the stack's absent id (one past its rows)."""
        ids = ops.reshape(ids, (-1,))
        offset = self._layout.offsets[table]
        if not (self._tables[table].zeros or self._absent_ids):
            return ids + offset
        return outside_as_absent(
            ids, self._tables[table].rows, offset, self._layout.rows[stack]
        )

    def compute_output_spec(self, inputs: Any, training: Any = None) -> Any:
        lookups = self._lookups(inputs)
        lookup = self._stacks[0]._lookup
        for table, ids in lookups:
            # Refused as the model is built, as `Embedding` refuses them.
            spec = self._tables[table]
            integer_ids(ids, spec.rows, self._absent_ids, spec.name, lookup)
        outputs = [
            keras.KerasTensor(
                (*ids.shape, self._tables[table].width),
                dtype=self._stacks[0].compute_dtype,
                ragged=getattr(ids, "ragged", False),
            )
            for table, ids in lookups
        ]
        return self._structured(outputs)

    def _structured(self, outputs: List[Any]) -> Any:
        """`outputs`, one per feature, in the structure of `tables`."""
        if self._keys is None:
            return outputs
        return dict(zip(self._keys, outputs))

    def _ids(self, inputs: Any) -> List[Any]:
        """The ids of each feature, in the order of `tables`, as integers."""
        if self._keys is None:
            if not isinstance(inputs, (list, tuple)) or len(inputs) != len(
                self._features
            ):
                raise ValueError(
                    f"StackedEmbedding {self.name!r}: `inputs` must be a list "
                    f"of {len(self._features)} id arrays, one per entry of "
                    f"`tables` in its order; received {_describe(inputs)}."
                )
            values = list(inputs)
        else:
            if not isinstance(inputs, Mapping) or set(inputs) != set(self._keys):
                raise ValueError(
                    f"StackedEmbedding {self.name!r}: `inputs` must be a dict "
                    f"with the keys of `tables`, {sorted(self._keys)}; "
                    f"received {_describe(inputs)}."
                )
            values = [inputs[key] for key in self._keys]
        return as_ids(values)

    def place(self, name: str) -> Tuple[int, int, int]:
        """Where table `name` sits, built or not: `(stack, start, stop)`, the
        index of its stack (variables `stack_<index>`) and its rows there."""
        names = [table.name for table in self._tables]
        if name not in names:
            raise KeyError(
                f"StackedEmbedding {self.name!r} has no table {name!r}; its "
                f"tables are {names}."
            )
        index = names.index(name)
        offset = self._layout.offsets[index]
        return (
            self._layout.stack_of_table[index],
            offset,
            offset + self._tables[index].rows,
        )

    def _where(self, name: str) -> Tuple[_Stack, int, int]:
        index, start, stop = self.place(name)
        stack = self._stacks[index]
        if not stack.built:
            raise ValueError(
                f"StackedEmbedding {self.name!r} is not built; call it once "
                "(or `build()`) first."
            )
        return stack, start, stop

    def table(self, name: str) -> TableRows:
        """Table `name`'s rows of its stack, as the checkpoint functions take
        a table (`load_into_keras`, `save_tpu_checkpoint`: a model finds
        its tables by name; in a mapping, pass this)."""
        stack, start, stop = self._where(name)
        return TableRows(
            stack.embeddings, start, stop, lambda: _TableView(stack, start, stop)
        )

    def get_table(self, name: str) -> Dict[str, np.ndarray]:
        """Table `name`'s rows (`"embeddings"`) and its optimizer's slots
        (by the engine's slot names), as NumPy arrays."""
        return {key: rows.numpy() for key, rows in self._rows(name).items()}

    def set_table(self, name: str, values: Mapping[str, Any]) -> None:
        """Writes table `name`'s rows and slots (the keys of `get_table`;
        those left out stay as they are)."""
        rows = self._rows(name)
        if not isinstance(values, Mapping):
            raise TypeError(
                f"StackedEmbedding.set_table({name!r}): `values` must be a "
                f"mapping of {sorted(rows)} to arrays (as `get_table` gives); "
                f"received {type(values).__name__}."
            )
        unknown = sorted(set(values) - set(rows))
        if unknown:
            raise ValueError(
                f"StackedEmbedding.set_table({name!r}): `values` has keys "
                f"{unknown}; allowed: {sorted(rows)}."
            )
        for key, value in values.items():
            shape = rows[key].shape
            if np.shape(value) != shape:
                raise ValueError(
                    f"StackedEmbedding.set_table({name!r}): `values[{key!r}]` "
                    f"must have shape {shape}; received {np.shape(value)}."
                )
        for key, value in values.items():
            rows[key].assign(value)

    def _rows(self, name: str) -> Dict[str, TableRows]:
        table = self.table(name)
        return {"embeddings": table, **table._row_sparse_layer().slots}

    def get_config(self) -> Dict[str, Any]:
        config = super().get_config()
        serialized = self._config_tables()
        config["tables"] = (
            serialized if self._keys is None else dict(zip(self._keys, serialized))
        )
        return config

    def _config_tables(self) -> List[Dict[str, Any]]:
        """Each entry of `tables` serialized (a shared table's config in each
        of its features' entries); copies: deserializing an optimizer's
        config edits it in place."""
        return [copy.deepcopy(self._tables[table].config) for table in self._features]

    @classmethod
    def from_config(cls, config: Dict[str, Any]) -> "StackedEmbedding":
        config = dict(config)
        tables = copy.deepcopy(config.pop("tables"))
        # Entries of one name and config were one table, shared by features.
        made: Dict[Any, Tuple[Any, Any]] = {}

        def table(entry: Any) -> Any:
            name = (
                entry.get("config", {}).get("name") if isinstance(entry, dict) else None
            )
            if name is None or name not in made or made[name][0] != entry:
                saved = copy.deepcopy(entry)
                made[name] = (saved, keras.saving.deserialize_keras_object(entry))
            return made[name][1]

        if isinstance(tables, dict):
            tables = {k: table(v) for k, v in tables.items()}
        else:
            tables = [table(v) for v in tables]
        return cls(tables, **config)


def as_ids(values: Sequence[Any]) -> List[Any]:
    """Each of `values` as a tensor of ids (made integers per table, where
    a table's row count says which dtypes hold its ids: `integer_ids`).

    Symbolic ids stay as they are: Keras 3.10's `convert_to_tensor` of one
    gives the default float dtype, and float16 ids past 2,048 would then pass
    `integer_ids`' check as the model is built.
    """
    return [
        v if isinstance(v, keras.KerasTensor) else ops.convert_to_tensor(v)
        for v in values
    ]


def _tables_argument(
    tables: Any,
) -> Tuple[Optional[List[str]], List[Embedding], List[int]]:
    """The keys of `tables` (None for a list), its distinct tables, and the
    index among those of each entry's (an object in several entries is one
    table several features read)."""
    if isinstance(tables, Mapping):
        keys: Optional[List[str]] = list(tables)
        specs = list(tables.values())
        for key in keys:
            if not isinstance(key, str):
                # The config (JSON) would hold it as a string, and the
                # reloaded layer would refuse the inputs it was trained on.
                raise TypeError(
                    "StackedEmbedding: the keys of `tables` (a dict) must be "
                    f"strings, the features' names; received {key!r} of type "
                    f"{type(key).__name__}."
                )
    elif isinstance(tables, (list, tuple)):
        keys, specs = None, list(tables)
    else:
        raise TypeError(
            "StackedEmbedding: argument `tables` must be a list or a dict of "
            "tf_tpu_embed_opt.layers.Embedding; received "
            f"{type(tables).__name__}."
        )
    if not specs:
        raise ValueError("StackedEmbedding: argument `tables` is empty.")
    index: Dict[int, int] = {}  # id(table) -> its place among the distinct
    distinct: List[Embedding] = []
    names = set()
    for spec in specs:
        if id(spec) in index:
            continue
        _check_spec(spec)
        if spec.name in names:
            raise ValueError(
                f"StackedEmbedding: two tables are named {spec.name!r}; "
                "give each table its own `name` (or, for features that "
                "share a table, the same Embedding in each entry)."
            )
        index[id(spec)] = len(distinct)
        distinct.append(spec)
        names.add(spec.name)
    return keys, distinct, [index[id(spec)] for spec in specs]


def _check_spec(spec: Any) -> None:
    if type(spec) is not Embedding:
        raise TypeError(
            "StackedEmbedding: each table must be a "
            "tf_tpu_embed_opt.layers.Embedding (not a subclass); received "
            f"{spec!r} of type {type(spec).__name__}."
        )
    why = None
    if spec.built and spec._table_of_stack is None:
        why = (
            "is built (called, or given `weights`: its variables would be "
            "left behind); pass a new one, and set a table's rows with "
            "set_table"
        )
    elif spec.mask_zero:
        why = "has mask_zero=True, which the stacked lookup does not carry"
    elif spec.embeddings_initializer is None:
        why = "has no initializer"
    if why:
        raise ValueError(f"StackedEmbedding: table {spec.name!r} {why}.")


def _describe(inputs: Any) -> str:
    if isinstance(inputs, Mapping):
        return f"a dict with keys {sorted(inputs)}"
    if isinstance(inputs, (list, tuple)):
        return f"a {type(inputs).__name__} of {len(inputs)}"
    return f"{type(inputs).__name__}"
