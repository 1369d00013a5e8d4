"""Reading `TPUEmbeddingV2` (SparseCore) checkpoints into unsharded tables.

`read_tables` and `SparseCoreCheckpointReader` unshard each stacked table of a
checkpoint into table states (`{"parameters": ..., <slot>: ...}`, the slots
named as the algorithm's engine slots); `describe_stacks` says what a
checkpoint holds without reading its tensors. `detect`, `open_reader` and
`describe` are the format's handler (`checkpoints.protocol.FormatHandler`).
"""

import os
from typing import (
    Any,
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Tuple,
    Union,
)

import numpy as np

from tf_tpu_embed_opt import lazy
from tf_tpu_embed_opt.checkpoints import formats
from tf_tpu_embed_opt.checkpoints.protocol import Evidence, TableReader
from tf_tpu_embed_opt.checkpoints.shared import keys as checkpoint_keys
from tf_tpu_embed_opt.checkpoints.shared import paths
from tf_tpu_embed_opt.checkpoints.shared.algorithms import (
    OptimizerLike,
    slot_names,
    stack_definitions,
)
from tf_tpu_embed_opt.checkpoints.shared.bundles import (
    bytes_present_and_needed,
    open_bundle,
)
from tf_tpu_embed_opt.checkpoints.shared.stacks import (  # noqa: F401
    _VALUE_SUFFIX,
    LAYOUTS_KEY,
    PARAMETERS,
    Layout,
    _layouts_key,
    checkpoint_key,
    group_layouts,
    parse_layouts,
    stacked_shape,
    unshard_table,
)
from tf_tpu_embed_opt.definitions import registry

# --------------------------------------------------------------------------
# Reading


class _Reader:
    """TensorFlow's checkpoint reader, with its errors as ValueError naming the
    path and the key, and a check that the data files are not truncated."""

    def __init__(self, path: Any):
        prefix, self._reader = open_bundle(path)
        self.path = os.fspath(path)
        self.shapes = self._reader.get_variable_to_shape_map()
        self.dtypes = self._reader.get_variable_to_dtype_map()
        # Found before anything is converted.
        present, needed = bytes_present_and_needed(self._reader, prefix)
        if present < needed:
            raise ValueError(
                f"The checkpoint {self.path!r} is truncated: its data files hold "
                f"{present} bytes, its tensors need at least {needed}."
            )

    def get(self, key: str) -> Any:
        try:
            return self._reader.get_tensor(key)
        except Exception as error:  # TensorFlow raises its own error classes
            raise ValueError(
                f"Cannot read {key!r} from the checkpoint {self.path!r} (corrupted "
                f"or truncated?): {paths.first_line(error)}"
            ) from None


def _find_object_path(keys: Iterable[str], object_path: Optional[str]) -> str:
    suffix = f"/{LAYOUTS_KEY}{_VALUE_SUFFIX}"
    found = sorted(key[: -len(suffix)] for key in keys if key.endswith(suffix))
    if object_path is not None:
        if not isinstance(object_path, str):
            raise TypeError(
                "`object_path` must be a '/'-separated string such as "
                f"'embedding'; received {object_path!r}."
            )
        wanted = _layouts_key(object_path)[: -len(suffix)]
        if wanted not in found:
            raise ValueError(
                f"The checkpoint has no SparseCore layouts under object path "
                f"{object_path!r} (found them under {found})."
            )
        return object_path
    if not found:
        raise ValueError(
            "The checkpoint has no SparseCore layouts (no key ending in "
            f"{suffix!r}): it was not written by TPUEmbeddingV2."
        )
    if len(found) > 1:
        raise ValueError(
            f"The checkpoint holds several SparseCore embeddings ({found}); "
            "pass `object_path` to choose one."
        )
    # Keys hold escaped local names; undo the escaping for the caller.
    return "/".join(checkpoint_keys.unescape(part) for part in found[0].split("/"))


def _open_stacks(
    path: str, object_path: Optional[str]
) -> Tuple[Any, str, Dict[str, List[Layout]]]:
    """The index reader, the object path and the stacked tables (name ->
    member layouts) of a SparseCore checkpoint (see `read_layouts`)."""
    reader = _Reader(path)
    object_path = _find_object_path(reader.shapes, object_path)
    stacks = group_layouts(parse_layouts(reader.get(_layouts_key(object_path))))
    return reader, object_path, stacks


def _refuse_a_serving_copy(
    shapes: Mapping[str, Any], object_path: str, stacks: Mapping[str, List[Layout]]
) -> None:
    """Refuses what a `TPUEmbeddingForServing` saves after restoring a
    SparseCore checkpoint (TensorFlow 2.21's
    `_create_variables_from_stacked_tables`): the layouts, each stack
    tracked as a scalar, and the tables unstacked under
    `<object>/_variables/<table>/parameters`, without the optimizer's slots.
    Read as SparseCore, it failed on the scalar's shape."""
    for stacked, members in stacks.items():
        if list(shapes.get(checkpoint_key(object_path, stacked), [0])):
            continue
        names = [m.table_name for m in members]
        copies = [
            checkpoint_keys.checkpoint_key(
                [*object_path.split("/"), "_variables", name], PARAMETERS
            )
            for name in names
        ]
        if all(key in shapes for key in copies):
            raise ValueError(
                f"The checkpoint holds stacked table {stacked!r} as a scalar and "
                f"its tables {names} unstacked, under "
                f"'{object_path}/_variables/<table>/parameters', without "
                "optimizer slots: a TPUEmbeddingForServing saves so after "
                "restoring a SparseCore checkpoint. It is no TPUEmbeddingV2 "
                "checkpoint; read the SparseCore checkpoint it restored."
            )


def read_layouts(
    path: str, *, object_path: Optional[str] = None
) -> Tuple[str, List[Layout]]:
    """The object path and the table layouts stored in a SparseCore checkpoint.

    Args:
      path: The checkpoint prefix (or a directory with a `checkpoint` file).
      object_path: The path of the embedding object from the checkpoint's
        root (e.g. `"embedding"`); needed only when the checkpoint holds more
        than one SparseCore embedding.

    Raises:
      ValueError: Not a readable checkpoint, no layouts in it, or corrupted
        layouts.
    """
    reader = _Reader(path)
    object_path = _find_object_path(reader.shapes, object_path)
    return object_path, parse_layouts(reader.get(_layouts_key(object_path)))


def read_tables(
    path: str,
    optimizer: Union[OptimizerLike, Mapping[str, OptimizerLike]],
    *,
    object_path: Optional[str] = None,
) -> Iterator[Tuple[str, Dict[str, np.ndarray]]]:
    """Unshards a `TPUEmbeddingV2` checkpoint into per-table states.

    Every check (layouts, keys, slots, shapes, dtypes) runs before the first
    table is yielded; then one stacked table with its slots is read at a time.

    Args:
      path: The checkpoint prefix.
      optimizer: The tables' embedding optimizer (an instance of
        `tf_tpu_embed_opt.embedding` or `tf.tpu.experimental.embedding`, an
        algorithm definition or its name such as `"Adam"`), or a mapping from
        every table name to one. The checkpoint must hold exactly its slots.
      object_path: See `read_layouts`.

    Yields:
      `(table_name, {"parameters": array, <engine slot name>: array, ...})`,
      stacked tables in name order, their tables in row-offset order.

    Raises:
      ValueError: The checkpoint is unreadable, has no or corrupted layouts, a
        variable of a stacked table is missing or has another shape or dtype
        than the layouts imply, it holds slots of another algorithm, or
        `optimizer` does not fit the tables; the message names the table
        and the slot.
    """
    reader, object_path, plan = _read_plan(path, optimizer, object_path)
    return _unshard_stacks(reader, object_path, plan)


def _read_plan(
    path: str,
    optimizer: Union[OptimizerLike, Mapping[str, OptimizerLike]],
    object_path: Optional[str],
    argument: str = "`optimizer`",
) -> Tuple[Any, str, List[Tuple[str, List[Layout], List[str], Any]]]:
    """Checks a checkpoint against its layouts and `optimizer` (see
    `read_tables`; `argument` is what the caller calls `optimizer`).

    Returns:
      The reader, the object path and, per stacked table, its name, its
      member layouts, its slot names and its algorithm's definition.
    """
    reader, object_path, stacks = _open_stacks(path, object_path)
    shapes, dtypes = reader.shapes, reader.dtypes
    _refuse_a_serving_copy(shapes, object_path, stacks)
    definitions = stack_definitions(optimizer, stacks, argument)
    plan = []
    for stacked, members in stacks.items():
        slots = slot_names(definitions[stacked])
        names = [layout.table_name for layout in members]
        expected_shape = list(stacked_shape(members[0]))
        for slot in [PARAMETERS] + slots:
            key = checkpoint_key(object_path, stacked, slot)
            what = (
                f"stacked table {stacked!r} (tables {names})"
                if slot == PARAMETERS
                else f"slot {slot!r} of stacked table {stacked!r} (tables {names})"
            )
            if key not in shapes:
                raise ValueError(
                    f"The checkpoint has no {what} for {definitions[stacked].name}: "
                    f"key {key!r} is missing."
                )
            if list(shapes[key]) != expected_shape:
                raise ValueError(
                    f"The {what} has shape {list(shapes[key])} in the checkpoint; "
                    f"its SparseCore layouts need {expected_shape}."
                )
            if dtypes[key].name != "float32":
                raise ValueError(
                    f"The {what} has dtype {dtypes[key].name} in the checkpoint; "
                    "TPUEmbeddingV2 stores float32."
                )
        present = _slots_in_checkpoint(shapes, object_path, stacked)
        extra = sorted(present - set(slots))
        if extra:
            raise ValueError(
                f"Stacked table {stacked!r} (tables {names}) has slots {extra} "
                f"in the checkpoint, which {definitions[stacked].name} does not "
                f"have (its slots: {slots}): the optimizer does not match."
            )
        plan.append((stacked, members, slots, definitions[stacked]))
    return reader, object_path, plan


class SparseCoreCheckpointReader(TableReader):
    """A `TPUEmbeddingV2` checkpoint as a table source of `checkpoints`.

    `tf_tpu_embed_opt.load_into_keras` (and anything else that takes a table
    source: an object with `tables` and `read(name)`) reads SparseCore
    checkpoints through it, so that a table trained on SparseCore continues on
    CPU/GPU with its optimizer state::

        source = sparsecore_layout.SparseCoreCheckpointReader(path, optimizer)
        teo.load_into_keras(source, model, keras_optimizer)

    Every check of `read_tables` runs when it is made. `read(name)` unshards
    the table's stacked variable and slots; the last stack read is kept, so
    reading the tables of one stack in turn reads it once, and no more than one
    stack is held.

    Args:
      path: The checkpoint prefix (or a directory: its latest checkpoint).
      optimizer: As in `read_tables`.
      object_path: As in `read_tables`.
      step_path: Where `step` reads the training step, '/'-separated from the
        root (`"global_step"`); `None`: at `"step"` (`None` where no
        variable is there).

    Attributes:
      tables: Table name -> `checkpoints.TableInfo` (unpadded shape, float32,
        the optimizer's engine slots; `keys` are those of the stacked
        variables the table lives in).
      algorithms: Table name -> its algorithm's definition (in a tuple, as
        the other readers give the algorithms a checkpoint allows).
    """

    format = formats.SPARSECORE.name

    def __init__(
        self,
        path: str,
        optimizer: Union[OptimizerLike, Mapping[str, OptimizerLike]],
        *,
        object_path: Optional[str] = None,
        step_path: Optional[str] = None,
    ) -> None:
        self._open(path, optimizer, object_path, step_path, "`optimizer`")

    def _open(
        self,
        path: str,
        optimizer: Any,
        object_path: Optional[str],
        step_path: Optional[str],
        argument: str,
    ) -> None:
        from tf_tpu_embed_opt import checkpoints

        self.step_path = checkpoint_keys.checked_step_path(
            step_path, "SparseCoreCheckpointReader"
        )
        self._reader, self._object_path, plan = _read_plan(
            path, optimizer, object_path, argument
        )
        self.prefix = self.path = self._reader.path
        self._stacks: Dict[str, Tuple[str, Layout, List[str]]] = {}
        tables = {}
        self.algorithms: Dict[str, Tuple[Any, ...]] = {}
        for stacked, members, slots, definition in plan:
            keys = {
                slot: checkpoint_key(self._object_path, stacked, slot)
                for slot in [PARAMETERS] + slots
            }
            for layout in members:
                shape = tuple(int(n) for n in layout.unsharded_shape)
                self._stacks[layout.table_name] = (stacked, layout, slots)
                self.algorithms[layout.table_name] = (definition,)
                tables[layout.table_name] = checkpoints.TableInfo(
                    name=layout.table_name,
                    shape=shape,
                    dtype="float32",
                    slots=tuple(sorted(slots)),
                    keys=keys,
                    slot_shapes={slot: shape for slot in slots},
                    slot_dtypes={slot: "float32" for slot in slots},
                )
        self.tables = tables
        self._cached: Tuple[Optional[str], Dict[str, np.ndarray]] = (None, {})

    def read(self, name: str) -> Dict[str, np.ndarray]:
        """The state of table `name`: `{"parameters": ..., <slot>: ...}`."""
        layout, stacked = self._stack_of(name)
        return {slot: unshard_table(value, layout) for slot, value in stacked.items()}

    def read_tensor(self, name: str, key: str) -> np.ndarray:
        """One array of table `name`, the others of its stack left sharded."""
        self._check_key(name, key)
        layout, stacked = self._stack_of(name)
        return unshard_table(stacked[key], layout)

    def _stack_of(self, name: str) -> Tuple[Layout, Dict[str, np.ndarray]]:
        """Table `name`'s layout and its stack's arrays as stored (the last
        stack read is kept: the tables of one stack in turn read it once)."""
        self._info(name)
        stacked, layout, slots = self._stacks[name]
        if self._cached[0] != stacked:
            self._cached = (None, {})  # free the last stack before the next
            values = {
                slot: self._reader.get(checkpoint_key(self._object_path, stacked, slot))
                for slot in [PARAMETERS] + slots
            }
            self._cached = (stacked, values)
        return layout, self._cached[1]

    def layout(self, name: str) -> Layout:
        """Table `name`'s `SparseCoreTableLayout` (its stack, offsets, shards)."""
        self._info(name)
        return self._stacks[name][1]

    def read_scalar(self, object_path: str) -> Any:
        """The value of a variable at `object_path` (e.g. a step counter).

        Raises:
          ValueError: No variable there.
        """
        return _variable(self._reader, self.prefix, object_path)

    def __repr__(self) -> str:
        return (
            f"SparseCoreCheckpointReader({self.prefix!r}, tables={sorted(self.tables)})"
        )


def _slots_in_checkpoint(shapes: Iterable[str], object_path: str, stacked: str) -> set:
    head = checkpoint_key(object_path, stacked, "\0").split("\0")[0]
    return {
        checkpoint_keys.unescape(key[len(head) : -len(_VALUE_SUFFIX)])
        for key in shapes
        if key.startswith(head)
        and key.endswith(_VALUE_SUFFIX)
        and "/" not in key[len(head) : -len(_VALUE_SUFFIX)]
    }


def detect(evidence: Evidence) -> bool:
    """Format `"sparsecore"`: a TensorFlow checkpoint holding
    `TPUEmbeddingV2`'s layouts (its handler, with `open_reader` and
    `describe`)."""
    return any(LAYOUTS_KEY in name for name in evidence.variable_names)


def open_reader(
    path: str,
    object_path: Optional[str] = None,
    algorithms: Any = None,
    step_path: Optional[str] = None,
) -> SparseCoreCheckpointReader:
    if algorithms is None:
        reader, object_path, stacks = _open_stacks(path, object_path)
        _refuse_a_serving_copy(reader.shapes, object_path, stacks)
        raise ValueError(
            f"open_checkpoint: {path!r} is a SparseCore (TPUEmbeddingV2) "
            "checkpoint, whose slots do not name the algorithm (Adagrad and "
            "ProximalAdagrad both keep `accumulators`): pass `algorithms` "
            "to tf_tpu_embed_opt.checkpoints.open_checkpoint (one, or a "
            "mapping table -> one)."
        )
    # Opened as `open_checkpoint` names the algorithms: `algorithms`.
    reader = SparseCoreCheckpointReader.__new__(SparseCoreCheckpointReader)
    reader._open(path, algorithms, object_path, step_path, "`algorithms`")
    return reader


def _variable(reader: Any, prefix: str, object_path: str) -> Any:
    """The value of the variable at `object_path`, read from the index reader.

    Raises:
      ValueError: No variable there.
    """
    return checkpoint_keys.variable_at(
        prefix, object_path, reader.shapes.__contains__, reader.get
    )


def describe(
    path: str, object_path: Optional[str] = None, step_path: Optional[str] = None
) -> Dict[str, Any]:
    reader, object_path, stacks = _open_stacks(path, object_path)
    return {
        "layout": formats.SPARSECORE.layout,
        "step": checkpoint_keys.recorded_step(
            lambda at: _variable(reader, path, at), path, step_path
        ),
        "stacked_tables": _stacks_described(reader, object_path, stacks),
    }


def describe_stacks(
    path: str, *, object_path: Optional[str] = None
) -> List[Dict[str, Any]]:
    """What a SparseCore checkpoint holds, per stacked table, without reading it.

    Only the layouts proto is read; shapes, slots and sizes come from the
    checkpoint's index.

    Args:
      path: The checkpoint prefix.
      object_path: See `read_layouts`.

    Returns:
      One dict per stacked table, in name order: `stacked_table`, `shape` (of
      the stacked variable in the checkpoint, `None` if it is missing),
      `tables` (name -> unpadded `[rows, columns]`, in row-offset order),
      `slots` (the slot variables present, sorted), `algorithms` (the names
      of the algorithms whose engine slots are exactly those) and `bytes` (of
      the stacked variable and its slots).

    Raises:
      ValueError: As `read_layouts`.
    """
    return _stacks_described(*_open_stacks(path, object_path))


def _stacks_described(
    reader: Any, object_path: str, stacks: Mapping[str, List[Layout]]
) -> List[Dict[str, Any]]:
    """`describe_stacks` of an opened checkpoint (`_open_stacks`)."""
    result = []
    for stacked, members in stacks.items():
        slots = sorted(_slots_in_checkpoint(reader.shapes, object_path, stacked))
        keys = [checkpoint_key(object_path, stacked, s) for s in [PARAMETERS] + slots]
        present = [key for key in keys if key in reader.shapes]
        result.append(
            {
                "stacked_table": stacked,
                "shape": (
                    list(reader.shapes[keys[0]]) if keys[0] in reader.shapes else None
                ),
                "tables": {t.table_name: list(t.unsharded_shape) for t in members},
                "slots": slots,
                "algorithms": [
                    d.name
                    for d in registry.DEFINITIONS
                    if sorted(slot_names(d)) == slots
                ],
                "bytes": sum(
                    int(np.prod(reader.shapes[key], dtype=np.int64))
                    * reader.dtypes[key].size
                    for key in present
                ),
            }
        )
    return result


describe_checkpoint = lazy.deprecated(
    describe_stacks,
    "tf_tpu_embed_opt.sparsecore_layout.describe_checkpoint",
    "tf_tpu_embed_opt.checkpoints.describe_checkpoint(path)",
)


def _unshard_stacks(
    reader: Any, object_path: str, plan: List[Tuple[str, List[Layout], List[str]]]
) -> Iterator[Tuple[str, Dict[str, np.ndarray]]]:
    for stacked, members, slots, _ in plan:
        values = {
            slot: reader.get(checkpoint_key(object_path, stacked, slot))
            for slot in [PARAMETERS] + slots
        }
        for layout in members:
            yield (
                layout.table_name,
                {slot: unshard_table(value, layout) for slot, value in values.items()},
            )
        del values
