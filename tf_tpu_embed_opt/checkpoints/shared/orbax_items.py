"""Orbax checkpoint items: where a stack's variables are, and restoring leaves.

An orbax step directory holds one directory per item; a pytree item (it has
`_METADATA`) describes its tree without reading an array. `stacks_in_items`
finds each stack of tables by its name over the items, named as
jax-tpu-embedding names them (`<stack>/table`, `<stack>/slot/<name>`) or as
keras-rs's JAX `DistributedEmbedding` names its weights (`var:<stack>:table`,
`var:<stack>:table:slot:<name>`); `restore_tree` and `restore_leaf` restore
leaves as NumPy arrays, nothing else. Used by `jax_orbax` (reading),
`jax_orbax_writer` (what a rewritten step keeps) and `keras_rs_orbax`. No
TensorFlow is needed.
"""

from __future__ import annotations

import os
import re
from typing import Any, Dict, Mapping, NamedTuple, Sequence, Tuple

import numpy as np

__all__ = [
    "JAX_TPU_EMBEDDING",
    "KERAS_RS",
    "KERAS_RS_WEIGHT",
    "PARTIAL_STEP",
    "Stack",
    "item_metadata",
    "item_tree",
    "keras_rs_weights",
    "keys_of",
    "node_at",
    "restore_leaf",
    "restore_leaf_at",
    "restore_tree",
    "stacks_in_items",
]


def _checkpointer() -> Any:
    import orbax.checkpoint as ocp

    return ocp


class Stack(NamedTuple):
    """Where a stack's variables are: the orbax item, the key paths (from the
    item's root) of its table and of each slot by jax-tpu-embedding's name,
    how they are named there, and the item's whole metadata tree (read once;
    restoring a leaf needs it)."""

    directory: str
    table: Tuple[Any, ...]
    slots: Mapping[str, Tuple[Any, ...]]
    naming: str
    tree: Mapping[str, Any]
    use_zarr3: bool

    def metadata(self, path: Tuple[Any, ...]) -> Any:
        return node_at(self.tree, path)


# How a stack's variables are named: jax-tpu-embedding's `EmbeddingVariables`
# (`<stack>/table`, `<stack>/slot/<name>`), or keras-rs's JAX
# `DistributedEmbedding` weights (`var:<stack>:table`,
# `var:<stack>:table:slot:<name>`).
JAX_TPU_EMBEDDING = "jax-tpu-embedding"
KERAS_RS = "keras-rs"
# A keras-rs weight's name: its stack, and its slot (None: the table).
KERAS_RS_WEIGHT = re.compile(r"var:(.+?):table(?::slot:(.+))?")


# What a failed read of a step's array may mean, said after the error.
PARTIAL_STEP = (
    " (a step missing a process's files, ocdbt.process_<i> of a job of "
    "several processes, is partial)"
)


def keys_of(path: Sequence[Any]) -> Tuple[Any, ...]:
    """A JAX key path as the plain keys of the nested mappings."""
    return tuple(getattr(k, "key", getattr(k, "name", k)) for k in path)


def _stack_leaf(keys: Tuple[Any, ...], stack_names: Any) -> Any:
    """`(stack, slot or None, naming, container)` if `keys` is a stack's
    table or slot, else None; `container` is the path of what holds it."""
    match = KERAS_RS_WEIGHT.fullmatch(str(keys[-1]))
    if match is not None and match.group(1) in stack_names:
        return match.group(1), match.group(2), KERAS_RS, keys[:-1]
    if len(keys) >= 2 and keys[-1] == "table" and keys[-2] in stack_names:
        return keys[-2], None, JAX_TPU_EMBEDDING, keys[:-2]
    if len(keys) >= 3 and keys[-2] == "slot" and keys[-3] in stack_names:
        return keys[-3], keys[-1], JAX_TPU_EMBEDDING, keys[:-3]
    return None


def keras_rs_weights(step_dir: str) -> Dict[str, Dict[str, Any]]:
    """`{stack: {"item", "container", "table": metadata, "slots": {name:
    metadata}}}` of every keras-rs stack weight in the step's items (none,
    without loading JAX, where no item is an orbax pytree)."""
    items = [
        item
        for item in sorted(os.listdir(step_dir))
        if os.path.isfile(os.path.join(step_dir, item, "_METADATA"))
    ]
    if not items:
        return {}
    import jax

    found: Dict[str, Dict[str, Any]] = {}
    for item in items:
        directory = os.path.join(step_dir, item)
        tree = item_tree(directory)
        leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
        for path, leaf in leaves:
            keys = keys_of(path)
            match = KERAS_RS_WEIGHT.fullmatch(str(keys[-1]))
            if match is None:
                continue
            stack, slot = match.group(1), match.group(2)
            entry = found.setdefault(
                stack,
                {"item": item, "container": keys[:-1], "table": None, "slots": {}},
            )
            if (entry["item"], entry["container"]) != (item, keys[:-1]):
                continue
            if slot is None:
                entry["table"] = leaf
            else:
                entry["slots"][slot] = leaf
    return {k: v for k, v in found.items() if v["table"] is not None}


def stacks_in_items(step_dir: str, stack_names: Sequence[str]) -> Dict[str, Stack]:
    """Each stack's `Stack`, found by its name over the step's orbax items
    (the first place that holds it, items in name order)."""
    import jax

    names = set(stack_names)
    found: Dict[str, Stack] = {}
    for item in sorted(os.listdir(step_dir)):
        directory = os.path.join(step_dir, item)
        if not os.path.isfile(os.path.join(directory, "_METADATA")):
            continue
        metadata = item_metadata(directory)
        tree = metadata.tree
        places: Dict[str, Tuple[Any, ...]] = {}
        parts: Dict[str, Dict[str, Any]] = {}
        for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]:
            keys = keys_of(path)
            leaf = _stack_leaf(keys, names)
            if leaf is None or leaf[0] in found:
                continue
            stack, slot, naming, container = leaf
            if places.setdefault(stack, (naming, container)) != (naming, container):
                continue
            part = parts.setdefault(stack, {"table": None, "slots": {}})
            if slot is None:
                part["table"] = keys
            else:
                part["slots"][slot] = keys
        for stack, part in parts.items():
            if part["table"] is not None:
                found[stack] = Stack(
                    directory,
                    part["table"],
                    part["slots"],
                    places[stack][0],
                    tree,
                    bool(getattr(metadata, "use_zarr3", False)),
                )
    return found


def item_metadata(directory: str) -> Any:
    """The metadata of one orbax (pytree) item (`.tree`, `.use_zarr3`).

    Raises:
      ValueError: Orbax reads none (a damaged or partial item).
    """
    ocp = _checkpointer()
    from etils import epath

    # Orbax reads no metadata at a relative path (and says nothing). The
    # item's handler reads it: a `Checkpointer` would also look for the
    # step's metadata file in the item's directory, which holds none, and
    # log that it is missing.
    handler = ocp.PyTreeCheckpointHandler()
    try:
        metadata = handler.metadata(epath.Path(os.path.abspath(directory)))
    except (ValueError, OSError, KeyError):  # a damaged metadata file
        metadata = None
    finally:
        handler.close()
    if metadata is None or getattr(metadata, "tree", None) is None:
        raise ValueError(
            f"{directory!r}: orbax reads no metadata of this item's arrays: a "
            "damaged or partial checkpoint."
        )
    return metadata


def item_tree(directory: str) -> Mapping[str, Any]:
    """The metadata tree of one orbax (pytree) item."""
    return item_metadata(directory).tree


def restore_tree(directory: str, tree: Any) -> Any:
    """The leaves of `tree` (metadata of the item at `directory`, or part of
    it with `ocp.PLACEHOLDER` leaves) restored as NumPy arrays; placeholders
    are not read."""
    import jax

    ocp = _checkpointer()
    restore_args = jax.tree_util.tree_map(
        lambda v: (
            ocp.RestoreArgs(restore_type=np.ndarray)
            if v is not ocp.PLACEHOLDER
            else ocp.PLACEHOLDER
        ),
        tree,
    )
    return ocp.PyTreeCheckpointer().restore(
        os.path.abspath(directory),
        args=ocp.args.PyTreeRestore(item=tree, restore_args=restore_args),
    )


def restore_leaf(stack: Stack, path: Tuple[Any, ...]) -> np.ndarray:
    """One array of a stack's orbax item, as a NumPy array; nothing else is
    read."""
    return restore_leaf_at(stack.directory, stack.tree, path)


def restore_leaf_at(
    directory: str, tree: Mapping[str, Any], path: Tuple[Any, ...]
) -> np.ndarray:
    """The array at `path` of the item at `directory` (metadata `tree`), as
    a NumPy array; nothing else is read."""
    import jax

    ocp = _checkpointer()
    item = jax.tree_util.tree_map_with_path(
        lambda p, v: v if keys_of(p) == path else ocp.PLACEHOLDER, tree
    )
    return np.asarray(node_at(restore_tree(directory, item), path))


def node_at(node: Mapping[str, Any], path: Sequence[Any]) -> Any:
    for key in path:
        node = node[key]
    return node
