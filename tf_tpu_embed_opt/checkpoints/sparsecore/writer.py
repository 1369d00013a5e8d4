"""Writing table states as a `TPUEmbeddingV2` (SparseCore) checkpoint.

`write_checkpoint` writes the stacked, padded, sharded form `TPUEmbeddingV2`
itself saves (object graph, keys, per-device slices and the layouts proto),
one stacked table at a time, and publishes the checkpoint only once every
table is written.
"""

import os
import tempfile
from typing import (
    Any,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    Sequence,
    Tuple,
    Union,
)

import numpy as np

from tf_tpu_embed_opt import lazy
from tf_tpu_embed_opt.checkpoints.protocol import pairs_of
from tf_tpu_embed_opt.checkpoints.shared import paths
from tf_tpu_embed_opt.checkpoints.shared.algorithms import (
    OptimizerLike,
    slot_names,
    stack_definitions,
)
from tf_tpu_embed_opt.checkpoints.shared.bundles import Staging
from tf_tpu_embed_opt.checkpoints.shared.stacks import (  # noqa: F401
    _OBJECT_GRAPH_KEY,
    LAYOUTS_KEY,
    PARAMETERS,
    Layout,
    _layout_pb2,
    _layouts_key,
    checkpoint_key,
    group_layouts,
    parse_layouts,
    shard_tables,
)
from tf_tpu_embed_opt.definitions import spec

# --------------------------------------------------------------------------
# Writing


def _object_graph(object_path: str, stacks: Mapping[str, List[str]]) -> bytes:
    """The object graph `TPUEmbeddingV2` saves, made by TensorFlow itself.

    A skeleton with the same dependencies (one tiny variable per stacked
    table and slot, tracked under `<stacked>` and `<stacked>/<slot>` as
    `TPUEmbeddingV2._create_variables` does, and the layouts under
    `_sparse_core_table_layouts`) is written with `tf.train.Checkpoint`, in a
    local temporary directory; the graph does not depend on the variables'
    shapes.
    """
    import tensorflow as tf
    from tensorflow.python.trackable import autotrackable

    parts = object_path.split("/")
    embedding = autotrackable.AutoTrackable()
    expected = {_OBJECT_GRAPH_KEY, _layouts_key(object_path)}
    for stacked, slots in stacks.items():
        for slot in [PARAMETERS] + slots:
            local = stacked if slot == PARAMETERS else f"{stacked}/{slot}"
            embedding._track_trackable(tf.Variable(0.0, name=local), name=local)
            expected.add(checkpoint_key(object_path, stacked, slot))
    embedding._track_trackable(
        tf.Variable(b"", dtype=tf.string, name=LAYOUTS_KEY), name=LAYOUTS_KEY
    )
    node = embedding
    for part in reversed(parts[1:]):
        parent = autotrackable.AutoTrackable()
        parent._track_trackable(node, name=part)
        node = parent
    with tempfile.TemporaryDirectory() as workdir:
        skeleton = os.path.join(workdir, "object-graph")
        tf.train.Checkpoint(**{parts[0]: node}).write(skeleton)
        reader = tf.train.load_checkpoint(skeleton)
        written = set(reader.get_variable_to_shape_map())
        graph = reader.get_tensor(_OBJECT_GRAPH_KEY)
    if written != expected:  # a bug in this module, never the user's input
        raise RuntimeError(
            f"Checkpoint keys differ from TensorFlow's: {sorted(written ^ expected)}"
        )
    return graph


def _device_slices(
    stacked: np.ndarray, layout: Layout
) -> Iterator[Tuple[str, np.ndarray]]:
    # TPUEmbeddingShardedSaveable: one slice per device (partition), rows
    # split evenly, under the full shape of the stacked variable.
    rows, columns = stacked.shape
    per_device = rows // layout.num_partitions
    for device in range(layout.num_partitions):
        start = device * per_device
        spec_ = f"{rows} {columns} {start},{per_device}:0,{columns}"
        yield spec_, stacked[start : start + per_device]


def _write_checkpoint(
    path: str,
    layouts: Any,
    states: Union[
        Mapping[str, Mapping[str, np.ndarray]],
        Callable[[str], Mapping[str, np.ndarray]],
    ],
    optimizer: Union[OptimizerLike, Mapping[str, OptimizerLike]],
    *,
    object_path: str = "embedding",
    argument: str = "`optimizer`",
) -> str:
    """Writes per-table states as the checkpoint `TPUEmbeddingV2` saves.

    The result has `TPUEmbeddingV2`'s object graph under `object_path`, one
    stacked variable per stacked table and one per slot (saved as one slice
    per device, like `TPUEmbeddingShardedSaveable`), and the layouts proto.
    A `TPUEmbeddingV2` built with the same layouts restores it as is; with
    other layouts TensorFlow's `TpuEmbeddingV3CheckpointAdapter` reshards it
    on restore (TensorFlow 2.20's only between layouts that stack the same
    tables together: write with the job's layouts there);
    `TPUEmbeddingForServing` restores its tables on CPU.

    One stacked table is in memory at a time. The checkpoint is written under
    a temporary name next to `path` and appears (its `.index` file last) only
    when complete; on any error nothing is left behind.

    Args:
      path: The checkpoint prefix to write (`<path>.index`,
        `<path>.data-*`). An existing checkpoint there is replaced.
      layouts: The target layouts: a `SparseCoreTableLayouts` message, its
        bytes or an iterable of `SparseCoreTableLayout` (e.g.
        `TPUEmbeddingV2.embedding_layouts.values()`).
      states: Per table `{"parameters": array, <engine slot name>: array, ...}`,
        as a mapping from table name, a function of the table name (called
        once per table, when its stacked table is written) or an iterable of
        `(table name, state)` pairs in any order (e.g. what `read_tables`
        yields; tables arriving before their stack is due wait in memory).
      optimizer: As in `read_tables`: its slots are the ones written.
      object_path: The path of the embedding object from the checkpoint's root
        (`"embedding"` for `tf.train.Checkpoint(embedding=mid_level_api)`).
      argument: What the caller calls `optimizer`, in errors
        (`write_checkpoint`'s `algorithms`).

    Returns:
      `path`.

    Raises:
      ValueError: Bad layouts; a table of the layouts missing from `states` or
        a table in `states` the layouts do not have; a missing or extra slot;
        an array of the wrong shape or not float32. The message names the
        table and the slot; nothing is written.
    """
    path = paths.writable_prefix(path, "path")
    if not isinstance(object_path, str):
        raise TypeError(
            "`object_path` must be local names joined by '/', e.g. 'embedding' "
            f"or 'model/embedding'; received {object_path!r}."
        )
    if not all(object_path.split("/")):
        raise ValueError(
            "`object_path` must be local names joined by '/', e.g. 'embedding' or "
            f"'model/embedding'; received {object_path!r}."
        )
    parsed = parse_layouts(layouts)
    stacks = group_layouts(parsed)
    definitions = stack_definitions(optimizer, stacks, argument)
    tables = [layout.table_name for layout in parsed]
    get_state = _state_source(states, tables)
    # In the caller's order, as TPUEmbeddingV2 saves its `embedding_layouts`.
    layouts_bytes = (
        _layout_pb2().SparseCoreTableLayouts(tables=parsed).SerializeToString()
    )
    with Staging(path, "path") as staging:
        _save_stacks(stacks, definitions, get_state, object_path, staging)
        if isinstance(get_state, _PairSource):
            get_state.check_exhausted()
        graph = _object_graph(
            object_path,
            {stacked: slot_names(definitions[stacked]) for stacked in stacks},
        )
        staging.save(
            [_OBJECT_GRAPH_KEY, _layouts_key(object_path)],
            ["", ""],
            [np.array(graph, dtype=object), np.array(layouts_bytes, dtype=object)],
        )
        staging.publish()
    return path


def _state_source(states: Any, tables: List[str]) -> Callable[[str], Any]:
    """A function of the table name giving its state, from `states` (a
    mapping, a function, or pairs), the tables checked where it can be."""
    if isinstance(states, Mapping):
        unknown = sorted(set(states) - set(tables))
        if unknown:
            raise ValueError(
                f"The states given hold tables {unknown} that the SparseCore "
                f"layouts do not have (tables: {sorted(tables)})."
            )
        missing = sorted(set(tables) - set(states))
        if missing:
            raise ValueError(f"There is no state for tables {missing}.")
        return states.__getitem__
    if callable(states):
        return states
    if isinstance(states, Iterable) and not isinstance(states, (str, bytes)):
        return _PairSource(states, tables)
    raise TypeError(
        "`states` must be a mapping from table name to state, a function of "
        "the table name or an iterable of (table name, state) pairs; "
        f"received {type(states).__name__}."
    )


def _save_stacks(
    stacks: Mapping[str, List[Any]],
    definitions: Mapping[str, Any],
    get_state: Callable[[str], Any],
    object_path: str,
    staging: Staging,
) -> None:
    """Saves each stacked table and its slots, sharded as the layouts say,
    one bundle per variable."""
    for stacked, members in stacks.items():
        slots = slot_names(definitions[stacked])
        member_states = {
            layout.table_name: _checked_state(
                get_state(layout.table_name), layout, slots, definitions[stacked]
            )
            for layout in members
        }
        # One bundle per variable: only one stacked array exists at a time.
        for slot in [PARAMETERS] + slots:
            value = shard_tables(
                {name: state[slot] for name, state in member_states.items()},
                members,
            )
            key = checkpoint_key(object_path, stacked, slot)
            pieces = list(_device_slices(value, members[0]))
            staging.save(
                [key] * len(pieces),
                [spec_ for spec_, _ in pieces],
                [piece for _, piece in pieces],
            )
            del value, pieces
        del member_states


class _PairSource:
    """States from an iterable of `(table, state)` pairs, e.g. another reader.

    Pairs are pulled as the stacks need them; tables that arrive before their
    stack is written wait in memory.
    """

    def __init__(self, pairs: Iterable[Tuple[str, Any]], tables: Sequence[str]):
        self._pairs = pairs_of(pairs, "states")
        self._tables = set(tables)
        self._waiting: Dict[str, Any] = {}
        self._seen: set = set()

    def _pull(self) -> bool:
        try:
            item = next(self._pairs)
        except StopIteration:
            return False
        name, state = item
        if name not in self._tables:
            raise ValueError(
                f"The states given hold table {name!r}, which the SparseCore "
                f"layouts do not have (tables: {sorted(self._tables)})."
            )
        if name in self._seen:
            raise ValueError(f"The states given hold table {name!r} twice.")
        self._seen.add(name)
        self._waiting[name] = state
        return True

    def __call__(self, name: str) -> Any:
        while name not in self._waiting:
            if not self._pull():
                raise ValueError(f"There is no state for table {name!r}.")
        return self._waiting.pop(name)

    def check_exhausted(self) -> None:
        # Every table has been taken, so `_pull` raises for any further pair
        # (a repeat or an unknown table) before anything is published.
        self._pull()


def _checked_state(
    state: Any, layout: Layout, slots: List[str], definition: spec.Definition
) -> Dict[str, np.ndarray]:
    table = layout.table_name
    if not isinstance(state, Mapping):
        raise TypeError(
            f"The state of table {table!r} must be a mapping of 'parameters' and "
            f"slot names to arrays; received {type(state).__name__}."
        )
    wanted = [PARAMETERS] + slots
    extra = sorted(set(state) - set(wanted))
    if extra:
        raise ValueError(
            f"The state of table {table!r} has {extra}, which {definition.name} "
            f"does not have (it needs {wanted})."
        )
    result = {}
    for slot in wanted:
        if slot not in state:
            raise ValueError(
                f"The state of table {table!r} has no {slot!r}; "
                f"{definition.name} needs {wanted}."
            )
        value = np.asarray(state[slot])
        if value.dtype != np.float32:
            raise ValueError(
                f"{slot!r} of table {table!r} has dtype {value.dtype}; "
                "TPUEmbeddingV2 stores float32 (convert it explicitly)."
            )
        if value.shape != tuple(layout.unsharded_shape):
            raise ValueError(
                f"{slot!r} of table {table!r} has shape {value.shape}; its "
                f"SparseCore layout says {tuple(layout.unsharded_shape)}."
            )
        result[slot] = value
    return result


def write(path: str, tables: Any, **arguments: Any) -> str:
    """`write_checkpoint(path, tables, format="sparsecore", layouts=...,
    algorithms=...)`."""
    layouts = arguments.pop("layouts")
    algorithms = arguments.pop("algorithms")
    return _write_checkpoint(
        path, layouts, tables, algorithms, argument="`algorithms`", **arguments
    )


write_checkpoint = lazy.deprecated(
    _write_checkpoint,
    "tf_tpu_embed_opt.sparsecore_layout.write_checkpoint",
    "tf_tpu_embed_opt.checkpoints.write_checkpoint(path, tables, "
    "format='sparsecore', layouts=layouts, algorithms=optimizer)",
)
