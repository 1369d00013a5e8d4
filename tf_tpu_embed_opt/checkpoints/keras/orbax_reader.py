"""Steps of Keras's `OrbaxCheckpoint` callback, read table by table.

`keras.callbacks.OrbaxCheckpoint` saves a model's state (`get_state_tree`:
`trainable_variables`, `non_trainable_variables`, ...) as the orbax item
`pytree` of a step directory, and the model's config as the item
`model_config`; a job of several processes writes each process's shards.
The tables in it are those of the package's row-sparse layers: each
`layers.Embedding` is a table named by the layer, with its optimizer's slots
beside it (`<layer>/embeddings`, `<layer>/<Keras slot name>`), and each
table of a `layers.StackedEmbedding` is its rows of a stack
(`<layer>/stack_<i>/...`); so are those of keras-rs's `DistributedEmbedding`
after `layers.row_sparse_tables` (its sublayers, a table each or a stack).
The model config says which layers those are and which optimizer each table
has (so the algorithm, and the engine's slot names); the layers are rebuilt
from it unbuilt, so no table is allocated. Tables that the state holds and
the config does not list (a subclassed model's or layer's attributes) are
refused, not left out.

Rows are read through `orbax_arrays.StoredArray`: only the chunks holding
them, whichever process wrote them. A step missing a process's files (a
partial step) is refused when a table's rows are read, naming the table.
No TensorFlow is needed.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

import numpy as np

from tf_tpu_embed_opt.checkpoints import formats
from tf_tpu_embed_opt.checkpoints.protocol import Evidence, TableReader, row_bounds
from tf_tpu_embed_opt.checkpoints.shared import orbax_arrays, orbax_items, paths
from tf_tpu_embed_opt.checkpoints.shared.table_info import PARAMETERS, TableInfo

__all__ = [
    "KerasTableLayout",
    "KerasCheckpointReader",
    "describe",
    "detect",
    "is_keras_step",
    "open_reader",
]

# The groups of `Model.get_state_tree` that hold layers' variables.
_LAYER_GROUPS = ("trainable_variables", "non_trainable_variables")
_EMBEDDING = "tf_tpu_embed_opt>Embedding"
_STACKED = "tf_tpu_embed_opt>StackedEmbedding"
# keras-rs's `DistributedEmbedding` after `layers.row_sparse_tables`.
_KERAS_RS = "tf_tpu_embed_opt>RowSparseDistributedEmbedding"


def is_keras_step(path: str) -> bool:
    """Whether `path` is a step of `keras.callbacks.OrbaxCheckpoint`: its
    item `pytree` holds a model's state (told from the item's metadata file,
    without JAX)."""
    metadata = os.path.join(path, "pytree", "_METADATA")
    if not os.path.isfile(metadata):
        return False
    with open(metadata, encoding="utf-8", errors="replace") as file:
        text = file.read()
    return any(f"'{group}'" in text for group in _LAYER_GROUPS)


@dataclasses.dataclass(frozen=True)
class KerasTableLayout:
    """Where one table lives in a Keras step.

    Attributes:
      table_name: The table's name (its layer's, or in a `StackedEmbedding`
        its own).
      layer: The layer's path in the model's state (`"st"`, `"users"`).
      variables: Key path in the item `pytree` of `"parameters"` and of each
        slot, by the engine's slot name.
      row_offset: The table's first row in those arrays (0 unless stacked).
      unsharded_shape: `(rows, dim)` of the table.
    """

    table_name: str
    layer: str
    variables: Mapping[str, Tuple[str, ...]]
    row_offset: int
    unsharded_shape: Tuple[int, int]


def _model_config(step_dir: str) -> Dict[str, Any]:
    directory = os.path.join(step_dir, "model_config")
    if not os.path.isfile(os.path.join(directory, "_METADATA")):
        raise ValueError(
            f"{step_dir!r} is a Keras OrbaxCheckpoint step without the model's "
            "config (saved with save_weights_only=True), so which variables "
            "are tables, and with which optimizer, is not recorded: save with "
            "save_weights_only=False."
        )
    # One string (kept in the item's `_strings.json`), restored as saved.
    restored = (
        orbax_items._checkpointer()
        .PyTreeCheckpointer()
        .restore(os.path.abspath(directory))
    )
    return json.loads(restored["config"])


def _row_sparse_layers(config: Any) -> Iterator[Dict[str, Any]]:
    """The serialized row-sparse layers of a model config, outermost first
    (a `StackedEmbedding`'s own tables are not layers of the model)."""
    if isinstance(config, Mapping):
        if config.get("registered_name") in (_EMBEDDING, _STACKED, _KERAS_RS):
            yield dict(config)
            return
        for value in config.values():
            yield from _row_sparse_layers(value)
    elif isinstance(config, list):
        for value in config:
            yield from _row_sparse_layers(value)


def _paths_where(tree: Mapping[str, Any], holds: Any) -> List[Tuple]:
    """Key paths of every node of the state tree's layer groups for which
    `holds(path, node)`."""
    found = []

    def visit(node: Any, path: Tuple[str, ...]) -> None:
        if not isinstance(node, Mapping):
            return
        if holds(path, node):
            found.append(path)
        for key, value in node.items():
            visit(value, (*path, key))

    for group in _LAYER_GROUPS:
        visit(tree.get(group), (group,))
    return found


def _layer_paths(tree: Mapping[str, Any], name: str, child: str) -> List[Tuple]:
    """Key paths of every node named `name` holding `child` (keys joined by
    "/": a layer's table variables are in one group, its learning rate in
    the other)."""

    def holds(path: Tuple[str, ...], node: Any) -> bool:
        for key in child.split("/"):
            if not isinstance(node, Mapping) or key not in node:
                return False
            node = node[key]
        return path[-1] == name

    return _paths_where(tree, holds)


def _table_nodes(tree: Mapping[str, Any]) -> List[Tuple]:
    """Key paths of the nodes of the state that hold a row-sparse table: its
    `embeddings` beside its step counter `step`."""
    return _paths_where(tree, lambda path, node: {"embeddings", "step"} <= set(node))


def _unlisted_refusal(step_dir: str, unlisted: List[Tuple]) -> str:
    """The refusal of a step whose state holds tables its model config does
    not list, or no table at all (`unlisted` empty)."""
    if not unlisted:
        return (
            f"{step_dir!r} is a Keras OrbaxCheckpoint step whose model has "
            "no table of the package's row-sparse layers "
            "(tf_tpu_embed_opt.layers.Embedding or StackedEmbedding; a "
            "keras.layers.Embedding's table is a plain weight, with no "
            "optimizer of its own)."
        )
    return (
        f"{step_dir!r} is a Keras OrbaxCheckpoint step whose state holds "
        f"row-sparse tables (at {sorted('/'.join(p[1:]) for p in unlisted)}) "
        "that its model config does not list: the config of a subclassed "
        "model or layer holds its constructor's arguments, not the layers it "
        "keeps as attributes, so which variables are tables, and with which "
        "optimizer, is not recorded, and the step is not read here (its "
        "other tables alone would leave these out). Build the model, "
        "restore the step into it (model.load_weights(directory)) and take "
        "the tables from its layers (layer.embeddings, layer.slots; "
        "tf_tpu_embed_opt.checkpoints.keras.tables.keras_table_states("
        "keras_tables(model, None, names)) for write_checkpoint; "
        "tf_tpu_embed_opt.save_tpu_checkpoint)."
    )


class KerasCheckpointReader(TableReader):
    """The tables of a step of `keras.callbacks.OrbaxCheckpoint`.

    Args:
      step_dir: The step directory (`<directory>/<step>`).

    Attributes:
      path: The step directory.
      tables: Table name -> `TableInfo` (slots by the engine's names).
      algorithms: Table name -> the one algorithm its layer's optimizer runs.
      step: The step where the tables' step counters and the model's
        optimizers' (when saved) all agree, else `None`.
      steps: Each of those counters: a row-sparse layer's by its variables'
        path, a model optimizer's by `"model optimizer <name>"`.

    Raises:
      ValueError: A step saved without the model config or without a
        row-sparse layer, or whose state holds tables its model config does
        not list (a subclassed model's or layer's); a layer whose variables
        are not found once; two tables of one name.
    """

    format = formats.KERAS.name
    row_reads = "caller"

    def __init__(self, step_dir: str) -> None:
        import tf_tpu_embed_opt.layers  # noqa: F401 - registers the layers
        from tf_tpu_embed_opt.checkpoints.keras.tables import _definition_of

        self.path = step_dir
        self._directory = os.path.join(step_dir, "pytree")
        if not is_keras_step(step_dir):
            # Another orbax step read as this format (format="keras").
            has = (
                "holds no model state"
                if os.path.isdir(self._directory)
                else "is missing"
            )
            raise ValueError(
                f"{step_dir!r} is no step of keras.callbacks.OrbaxCheckpoint: "
                f"its `pytree` item, a model's state ({', '.join(_LAYER_GROUPS)}), "
                f"{has}."
            )
        metadata = orbax_items.item_metadata(self._directory)
        self._tree = metadata.tree
        self._use_zarr3 = bool(getattr(metadata, "use_zarr3", False))
        self.tables: Dict[str, TableInfo] = {}
        self.algorithms: Dict[str, Tuple[Any, ...]] = {}
        self._layouts: Dict[str, KerasTableLayout] = {}
        counters = set()
        for serialized in _row_sparse_layers(_model_config(step_dir)):
            for table, optimizer, place, offset in self._tables_of(serialized):
                self._add(table, optimizer, place, offset, _definition_of)
                counters.add((place, optimizer.name))
        read = {layout.variables[PARAMETERS][:-1] for layout in self._layouts.values()}
        unlisted = [path for path in _table_nodes(self._tree) if path not in read]
        if unlisted or not self.tables:
            raise ValueError(_unlisted_refusal(step_dir, unlisted))
        self.steps = {"/".join(c[0][1:]): self._counter(*c) for c in sorted(counters)}
        self.steps.update(self._model_optimizer_steps())
        distinct = set(self.steps.values())
        self._step = distinct.pop() if len(distinct) == 1 else None

    def _model_optimizer_steps(self) -> Dict[str, int]:
        """The step counters of the model's optimizers saved with the step
        (`optimizer_variables/<optimizer>/iteration`; a `MultiOptimizer`'s
        and each of its own), by `"model optimizer <name>"`. A
        `LossScaleOptimizer` (which `mixed_float16` wraps around the model's
        optimizer; told by its own variables) saves an `iteration` it never
        steps, as its `iterations` are its inner optimizer's: not a step."""
        saved = self._tree.get("optimizer_variables")
        if not isinstance(saved, Mapping):
            return {}
        return {
            f"model optimizer {name}": int(
                self._stored(("optimizer_variables", name, "iteration")).read()()
            )
            for name, node in sorted(saved.items())
            if isinstance(node, Mapping)
            and "iteration" in node
            and not {"dynamic_scale", "step_counter"} <= node.keys()
        }

    def _tables_of(self, serialized: Dict) -> Iterator[Tuple[Any, Any, Tuple, int]]:
        """`(table layer, its optimizer, variables' path, row offset)` of a
        serialized row-sparse layer, rebuilt unbuilt (nothing allocated): a
        `layers.Embedding`, a `StackedEmbedding`, or keras-rs's
        `DistributedEmbedding` after `row_sparse_tables`, whose row-sparse
        layers (one per table, or a stack of them) are its own sublayers."""
        from keras.saving import deserialize_keras_object

        # Copies: deserializing an optimizer's config edits it in place.
        layer = deserialize_keras_object(copy.deepcopy(serialized))
        if serialized["registered_name"] != _KERAS_RS:
            yield from self._tables_of_layer(layer, None)
            return
        for part in layer._flatten_layers(include_self=False, recursive=False):
            yield from self._tables_of_layer(part, layer.name)

    def _tables_of_layer(
        self, layer: Any, within: Optional[str]
    ) -> Iterator[Tuple[Any, Any, Tuple, int]]:
        from keras.saving import deserialize_keras_object

        from tf_tpu_embed_opt.layers import StackedEmbedding

        if not isinstance(layer, StackedEmbedding):
            place = self._layer_path(layer.name, "embeddings", within)
            yield layer, layer.optimizer, place, 0
            return
        root = self._layer_path(layer.name, "stack_0/embeddings", within)
        by_name = {}
        for table in layer._tables:
            built = deserialize_keras_object(copy.deepcopy(table.config))
            by_name[built.name] = built
        for names in layer.stacks:
            # A stack steps with its first table's optimizer (counter included).
            first = by_name[names[0]]
            for name in names:
                index, start, _ = layer.place(name)
                yield by_name[name], first.optimizer, (*root, f"stack_{index}"), start

    def _layer_path(
        self, name: str, child: str, within: Optional[str] = None
    ) -> Tuple[str, ...]:
        """The path of layer `name` (a sublayer of `within`, where given) by
        the variables it holds (`child`)."""
        paths = [
            path
            for path in _layer_paths(self._tree, name, child)
            if within is None or path[-2] == within
        ]
        if len(paths) != 1:
            found = ["/".join(p) for p in paths]
            raise ValueError(
                f"{self.path!r}: the model config has the row-sparse layer "
                f"{name!r}, whose variables (`{name}/{child}`) are found "
                f"{len(paths)} times in the step's state: {found}."
            )
        return paths[0]

    def _add(self, layer: Any, optimizer: Any, place: Tuple, offset: int, of) -> None:
        name = layer.name
        if name in self.tables:
            raise ValueError(
                f"{self.path!r}: two tables are named {name!r} "
                f"({self._layouts[name].layer} and {'/'.join(place)}); the "
                "engines name tables uniquely."
            )
        definition = of(optimizer, name, engine=False)
        variables = {PARAMETERS: (*place, "embeddings")}
        for engine_name, keras_name, _ in optimizer.slot_table():
            variables[engine_name] = (*place, keras_name)
        dtypes = {}
        for key, path in variables.items():
            try:
                stored = orbax_items.node_at(self._tree, path)
            except (KeyError, TypeError):
                raise ValueError(
                    f"Table {name!r}: {'/'.join(path)} is not in {self.path!r}, "
                    f"although its layer's optimizer ({definition.name}) keeps it."
                ) from None
            dtypes[key] = np.dtype(stored.dtype).name
        shape = (int(layer.input_dim), int(layer.output_dim))
        slots = tuple(sorted(k for k in variables if k != PARAMETERS))
        self.tables[name] = TableInfo(
            name=name,
            shape=shape,
            dtype=dtypes[PARAMETERS],
            slots=slots,
            keys={k: "/".join(p) for k, p in variables.items()},
            slot_shapes={
                s.name: (shape[0], 1) if s.per_row else shape
                for s in definition.slots
                if s.name in variables
            },
            slot_dtypes={k: dtypes[k] for k in slots},
        )
        self.algorithms[name] = (definition,)
        self._layouts[name] = KerasTableLayout(
            name, "/".join(place), variables, offset, shape
        )

    def _counter(self, place: Tuple[str, ...], optimizer_name: str) -> Optional[int]:
        """The steps of the layer whose variables are at `place`: its step
        counter (`layers.table_step`), or, in a step an older version saved,
        its optimizer's `iteration`."""
        from tf_tpu_embed_opt.layers import table_step

        try:
            orbax_items.node_at(self._tree, (*place, "step"))
        except (KeyError, TypeError):
            pass
        else:
            return table_step.decode(self._stored((*place, "step")).read()())
        for group in _LAYER_GROUPS:
            path = (group, optimizer_name, "iteration")
            try:
                orbax_items.node_at(self._tree, path)
            except (KeyError, TypeError):
                continue
            return int(self._stored(path).read()())
        return None

    def _stored(self, path: Tuple[str, ...]) -> orbax_arrays.StoredArray:
        return orbax_arrays.StoredArray(
            self._directory,
            path,
            self._use_zarr3,
            lambda: orbax_items.restore_leaf_at(self._directory, self._tree, path),
        )

    def layout(self, name: str) -> KerasTableLayout:
        self._info(name)
        return self._layouts[name]

    def _naming_errors(self, name: str, key: str) -> Any:
        """A failed read (a damaged or partial step) becomes a ValueError
        naming the table, the array and the step."""
        return paths.errors_named(
            f"Table {name!r}, {key}: cannot be read from {self.path!r} "
            f"({self.tables[name].keys[key]})",
            orbax_items.PARTIAL_STEP,
        )

    def read_rows(
        self, name: str, key: str, rows: Tuple[int, int], device: Any = None
    ) -> np.ndarray:
        """Rows `rows` (`start, stop`) of one array of one table: only the
        chunks holding them are read."""
        info = self._check_key(name, key)
        layout = self._layouts[name]
        # Of a stack's rows, none of another table's.
        start, stop = row_bounds(name, rows, info.shape[0])
        # A slot of one value per row is [rows, 1].
        width = info.shape_of(key)[1]
        with self._naming_errors(name, key):
            return self._stored(layout.variables[key]).rows(
                layout.row_offset + start, layout.row_offset + stop, width
            )

    def read_tensor(self, name: str, key: str) -> np.ndarray:
        return self.read_rows(name, key, (0, self._check_key(name, key).shape[0]))

    def read(self, name: str) -> Dict[str, np.ndarray]:
        """The table state: `"parameters"` and each slot, by engine name."""
        self._info(name)
        keys = self._layouts[name].variables
        return {key: self.read_tensor(name, key) for key in keys}

    def read_scalar(self, object_path: str) -> Any:
        """A scalar of the step's state by its path in `get_state_tree`
        (`"non_trainable_variables/adagrad/iteration"`)."""
        path = tuple(object_path.split("/"))
        try:
            orbax_items.node_at(self._tree, path)
        except (KeyError, TypeError):
            raise ValueError(
                f"{self.path!r} has no variable {object_path!r} (paths as in "
                "Model.get_state_tree, e.g. non_trainable_variables/<optimizer>/"
                "iteration)."
            ) from None
        return self._stored(path).read()()

    @property
    def step(self) -> Optional[int]:
        return self._step

    def describe(self) -> List[Dict[str, Any]]:
        """One JSON-ready dict per table (what `checkpoint inspect` prints)."""
        return [
            {
                "table": name,
                "shape": list(info.shape),
                "dtype": info.dtype,
                "slots": list(info.slots),
                "algorithms": [d.name for d in self.algorithms[name]],
                "layer": self._layouts[name].layer,
                "row_offset": self._layouts[name].row_offset,
                "bytes": info.nbytes,
            }
            for name, info in sorted(self.tables.items())
        ]


def detect(evidence: Evidence) -> bool:
    """Format `"keras"`: a step of Keras's `OrbaxCheckpoint` (its handler)."""
    return is_keras_step(evidence.path)


def open_reader(path: str) -> KerasCheckpointReader:
    return KerasCheckpointReader(path)


def describe(path: str) -> Dict[str, Any]:
    reader = KerasCheckpointReader(path)
    return {"step": reader.step, "tables": reader.describe()}
