"""jax-tpu-embedding orbax checkpoints written for any topology.

`write_jax_checkpoint` writes tables and slots (table states, one table at a
time from the source) into the layout of an `EmbeddingSpecProto` (from
`embedding_spec_for` or `retarget_embedding_spec`, which `jax_specs` computes
for any topology and this module re-exports) as an orbax step that
jax-tpu-embedding's restore reads: `tests/test_jax_orbax_writer.py` pins the
spec and the stacked arrays (its padding NaN, as `stack_and_shard_tables`
writes it) against jax-tpu-embedding's own code. Tables spread over the
processes of a JAX job are written by every process
(`jax_orbax_processes`).

Each table is placed in its stack's arrays as it comes (an array, or a
`RowStream` block by block, as `JaxCheckpointReader.stream` reads a table
shard by shard) and let go; the stacks are held in memory (or, beyond
`spill_bytes`, in memory-mapped files) until orbax writes them, in chunks of
at most `stack_assembly.CHUNK_BYTES`, without the copy orbax makes of host
arrays by default. So a table larger than memory is converted with about one
block and one chunk in memory. No TensorFlow is needed.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from tf_tpu_embed_opt import lazy
from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import assembly as stack_assembly
from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import (
    processes as jax_orbax_processes,
)
from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import reader as jax_orbax
from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import spec_proto as jax_spec_proto
from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding.specs import (
    JAX_SPARSECORES_PER_DEVICE,
    embedding_spec_for,
    retarget_embedding_spec,
)
from tf_tpu_embed_opt.checkpoints.protocol import Tables, pairs_of
from tf_tpu_embed_opt.checkpoints.shared import orbax_items, paths
from tf_tpu_embed_opt.checkpoints.shared import stacks as sparsecore_stacks
from tf_tpu_embed_opt.checkpoints.shared.algorithms import definition_of
from tf_tpu_embed_opt.checkpoints.shared.paths import checked_int
from tf_tpu_embed_opt.checkpoints.shared.table_info import PARAMETERS
from tf_tpu_embed_opt.definitions import spec

__all__ = [
    "DEFAULT_ITEM",
    "DEFAULT_VARIABLES_PATH",
    "JAX_SPARSECORES_PER_DEVICE",
    "embedding_spec_for",
    "retarget_embedding_spec",
    "write",
    "write_jax_checkpoint",
]

# Where jax-tpu-embedding's flax NNX layer (`SparseCoreEmbed`, attribute
# `embedding_table`) keeps its stacks in `nnx.state(model)`, which its
# examples save as the item `model`.
DEFAULT_ITEM = "model"
DEFAULT_VARIABLES_PATH: Tuple[str, ...] = (
    "embedding_layer",
    "embedding_table",
    "value",
)


def _checked_state(
    name: str, state: Mapping[str, Any], definition: spec.Definition, layout: Any
) -> Dict[str, np.ndarray]:
    expected = {PARAMETERS, *(s.name for s in definition.slots)}
    if set(state) != expected:
        raise ValueError(
            f"Table {name!r}: its state holds {sorted(state)}; "
            f"{definition.name} needs {sorted(expected)}."
        )
    checked = {}
    shape = tuple(layout.unsharded_shape)
    dtype = _array(state[PARAMETERS]).dtype
    for key, value in state.items():
        value = _array(value)
        what = "table" if key == PARAMETERS else f"slot {key!r}"
        if tuple(value.shape) != shape:
            raise ValueError(
                f"Table {name!r}, {what}: shape {value.shape}; the spec says {shape}."
            )
        if value.dtype != dtype:
            raise ValueError(
                f"Table {name!r}, {what}: dtype {value.dtype}; the table's is {dtype}."
            )
        if value.dtype != np.float32:
            # jax-tpu-embedding's stacks are float32; JAX would cut a
            # float64 to it without a word, and pad an integer with NaN.
            raise ValueError(
                f"Table {name!r}, {what}: dtype {value.dtype}; "
                "jax-tpu-embedding's stacks are float32 (convert it explicitly)."
            )
        checked[key] = value
    return checked


def _array(value: Any) -> Any:
    """A `RowStream` as it is (placed block by block), or a `jax.Array`
    spread over processes (stacked by them all), else an array."""
    if isinstance(value, sparsecore_stacks.RowStream) or jax_orbax_processes.is_spread(
        value
    ):
        return value
    return np.asarray(value)


def _write_jax_checkpoint(
    directory: str,
    step: int,
    tables: Tables,
    embedding_spec: Any,
    algorithms: Mapping[str, Any],
    *,
    item: Optional[str] = None,
    variables_path: Optional[Sequence[str]] = None,
    naming: Optional[str] = None,
    pad_value: float = float("nan"),
    items_from: Optional[str] = None,
    spill_bytes: Optional[int] = None,
    _caller: Tuple[str, str] = ("write_jax_checkpoint", "directory"),
) -> str:
    """Writes tables and their slots as a jax-tpu-embedding orbax checkpoint step.

    The step holds the item `embedding_spec` (the spec, as jax-tpu-embedding
    saves it) and the item `item`, whose tree has at `variables_path` each
    stack's `{"table": ..., "slot": {name: ...}}` (jax-tpu-embedding's
    `EmbeddingVariables`, slots by its names) in the spec's layout. The step
    appears only once complete (orbax's atomic rename).

    Args:
      directory: The orbax root directory (created if needed); the step is
        written to `directory/<step>`, which must not exist.
      step: The step number.
      tables: `(name, table state)` pairs, or a mapping name -> table
        state (e.g. a reader's `read` or `streams`, or
        `keras_tables.keras_table_states`): `"parameters"` and
        each engine slot of the table's algorithm, of the table's unsharded
        shape, each an array or a `sparsecore_stacks.RowStream`.
      embedding_spec: The target layout, from `embedding_spec_for`,
        `retarget_embedding_spec`, or a job's
        `create_proto_from_feature_specs`; every table of it, and no other,
        must be written.
      algorithms: `{table: algorithm}` (a name, a `Definition`, or an
        optimizer of either face); the tables of a stack share one.
      item: The orbax item holding the model's variables. Default: where
        `items_from` holds its stacks, else `"model"`.
      variables_path: Where the stacks sit in that item's tree. Default: as
        in `items_from`, else `DEFAULT_VARIABLES_PATH` (jax-tpu-embedding's
        flax NNX layer).
      naming: `"jax-tpu-embedding"` (each stack's `EmbeddingVariables`) or
        `"keras-rs"` (keras-rs's JAX `DistributedEmbedding` weights,
        `var:<stack>:table` and `var:<stack>:table:slot:<name>`). Default: as
        in `items_from`, else `"jax-tpu-embedding"`.
      pad_value: The value of each table's padding (NaN, as
        jax-tpu-embedding's `stack_and_shard_tables` pads).
      spill_bytes: The stacks' arrays (tables and slots) are assembled in
        memory while they take at most this many bytes together, the next
        stacks in memory-mapped files next to the step (the disk holds them
        twice until the step is written); the item is then written as zarr
        chunk files rather than OCDBT (which gathers a step in memory), so
        that a table larger than memory is written (give its state as
        `RowStream`s). Orbax's, Keras's and jax-tpu-embedding's restores
        read either. `None`: every stack in memory. Either way, each table
        is placed in its stack as it comes and let go.
      items_from: A source step directory (e.g. the one the tables were read
        from): its other items (such as the dense `optimizer` state) are
        copied unchanged, and the leaves of its `item` outside the stacks are
        restored and written again with the new stacks.
      _caller: The function its refusals name, and what it calls
        `directory` (`write_checkpoint`'s `path`).

    Returns:
      The step directory written.

    Raises:
      ValueError: A table missing, unknown or given twice, a state that does
        not fit its algorithm or the spec, stacked tables with different
        algorithms, or an existing step; nothing is written then.
    """
    # Without orbax, fail before anything is checked or assembled.
    import orbax.checkpoint  # noqa: F401

    caller = _caller[0]
    checked_int(step, "step", caller, 0)
    embedding_spec = jax_spec_proto.checked(embedding_spec, caller)
    layouts = {t.table_name: t for t in jax_orbax.layouts(embedding_spec)}
    by_stack = sparsecore_stacks.group_layouts(layouts.values())
    definitions = _definitions(algorithms, by_stack, caller)
    root = paths.writable_root(directory, f"{caller}: argument `{_caller[1]}`")
    target = os.path.join(root, str(int(step)))
    if os.path.exists(target):
        raise ValueError(f"{caller}: {target!r} exists already.")
    _check_options(spill_bytes, pad_value, items_from, caller)
    # The source's own stacks too: those it is written with may be named
    # otherwise (other stacking), and the old ones must not come along.
    stacks = list(by_stack)
    if items_from is not None:
        stacks += [s for s in _source_stacks(items_from) if s not in by_stack]
    item, variables_path, naming = _placement(
        items_from, stacks, item, variables_path, naming, caller
    )
    pairs = pairs_of(tables)
    first = next(pairs, None)
    tables = itertools.chain([] if first is None else [first], pairs)
    if first is not None and any(
        jax_orbax_processes.is_spread(value) for value in first[1].values()
    ):
        # Tables spread over the job's processes: every process writes.
        jax_orbax_processes.refuse_options(
            items_from=items_from, spill_bytes=spill_bytes
        )
        states = dict(_checked_pairs(tables, layouts, definitions))
        return jax_orbax_processes.write_across_processes(
            root,
            int(step),
            states,
            embedding_spec,
            by_stack,
            definitions,
            item=item,
            variables_path=variables_path,
            naming=naming,
            pad_value=pad_value,
        )
    stack_assembly.check_writing_orbax(caller)
    return _write_in_place(
        root,
        int(step),
        tables,
        layouts,
        embedding_spec,
        definitions,
        assembly=(by_stack, pad_value, spill_bytes),
        placement=(item, variables_path, naming),
        items_from=items_from,
        stacks=stacks,
    )


def _check_options(
    spill_bytes: Any, pad_value: Any, items_from: Any, caller: str
) -> None:
    """Refuses `_write_jax_checkpoint`'s `spill_bytes`, `pad_value` or
    `items_from` unless each is what it takes."""
    checked_int(spill_bytes, "spill_bytes", caller, 0, or_none=True)
    if isinstance(pad_value, bool) or not isinstance(
        pad_value, (int, float, np.integer, np.floating)
    ):
        raise TypeError(
            f"{caller}: argument `pad_value` must be a number (NaN by default); "
            f"received {pad_value!r}."
        )
    if items_from is not None and not (
        isinstance(items_from, (str, os.PathLike)) and os.path.isdir(items_from)
    ):
        error = ValueError if isinstance(items_from, (str, os.PathLike)) else TypeError
        raise error(
            f"{caller}: argument `items_from` must be the directory of an orbax "
            f"step; received {items_from!r}."
        )


def _write_in_place(
    root: str,
    step: int,
    tables: Any,
    layouts: Dict[str, Any],
    embedding_spec: Any,
    definitions: Dict[str, spec.Definition],
    *,
    assembly: Tuple[Dict[str, Any], float, Optional[int]],
    placement: Tuple[str, Sequence[str], str],
    items_from: Optional[str],
    stacks: List[str],
) -> str:
    """Writes the step of this process's whole tables: made whole in a
    private root next to its place, then renamed into it (atomic on one
    file system); orbax finalizes its own items, the copied ones come
    after. A refusal leaves nothing behind. `assembly` is (`by_stack`,
    `pad_value`, `spill_bytes`) of `stack_assembly.Assembly`, `placement`
    (item, variables path, naming)."""
    by_stack, pad_value, spill_bytes = assembly
    item, variables_path, naming = placement
    target = os.path.join(root, str(step))
    made_root = not os.path.isdir(root)
    os.makedirs(root, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix=f".{step}.writing-", dir=root)
    try:
        scratch = os.path.join(workdir, "assembly")
        os.mkdir(scratch)
        assembly = _assembled(
            tables,
            layouts,
            definitions,
            stack_assembly.Assembly(
                by_stack, definitions, pad_value, spill_bytes, scratch
            ),
        )
        tree: Dict[str, Any] = {}
        if items_from is not None:
            tree = _other_leaves(items_from, item, stacks)
        node = tree
        for key in variables_path:
            node = node.setdefault(key, {})
        chunked: Dict[str, Any] = {}
        for stack in by_stack:
            named = assembly.named(stack, naming)
            if naming == orbax_items.JAX_TPU_EMBEDDING:
                # As jax-tpu-embedding's jobs save their stacks.
                named = stack_assembly.as_jax_arrays(named)
            node.update(named)
            chunked.update(named)
        _save(workdir, step, item, tree, chunked, embedding_spec, assembly)
        del tree, node, chunked, assembly
        written = os.path.join(workdir, str(step))
        if items_from is not None:
            _copy_other_items(items_from, written, item)
        os.rename(written, target)
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        if made_root and not os.listdir(root):
            os.rmdir(root)
        raise
    shutil.rmtree(workdir, ignore_errors=True)
    return target


def _assembled(
    tables: Any,
    layouts: Dict[str, Any],
    definitions: Dict[str, spec.Definition],
    assembly: Any,
) -> Any:
    """`assembly` with every table of `layouts` added from `tables` (one
    state held at a time), each checked (`_checked_pairs`)."""
    for name, state in _checked_pairs(tables, layouts, definitions):
        assembly.add(layouts[name], state)
        del state
    return assembly


def _checked_pairs(
    tables: Any, layouts: Dict[str, Any], definitions: Dict[str, spec.Definition]
) -> Any:
    """`(name, checked state)` of every table of `layouts`, from `tables`;
    a table missing, extra or given twice is refused by name."""
    seen = set()
    for name, state in tables:
        if name not in layouts:
            raise ValueError(
                f"Table {name!r} is not in the embedding spec, whose tables "
                f"are {sorted(layouts)}."
            )
        if name in seen:
            raise ValueError(f"Table {name!r} is given twice.")
        seen.add(name)
        yield name, _checked_state(name, state, definitions[name], layouts[name])
    missing = sorted(set(layouts) - seen)
    if missing:
        raise ValueError(f"Tables {missing} of the embedding spec are not given.")


def _save(
    workdir: str,
    step: int,
    item: str,
    tree: Dict[str, Any],
    chunked: Dict[str, Any],
    embedding_spec: Any,
    assembly: Any,
) -> None:
    """Saves `tree` as `item` of step `step` in `workdir`, with the spec, as
    jax-tpu-embedding's jobs do (`chunked`: the stacks' leaves)."""
    import orbax.checkpoint as ocp

    save_args = stack_assembly.save_args(tree, chunked)
    proto = jax_spec_proto.EmbeddingSpecProto()
    proto.ParseFromString(embedding_spec.SerializeToString())
    manager = ocp.CheckpointManager(
        os.path.abspath(workdir),  # orbax refuses a relative path
        item_handlers={
            # OCDBT (orbax's default, and jax-tpu-embedding's) gathers a
            # step's chunks in memory until it commits; zarr chunk files are
            # written as they come, so a stack larger than memory is.
            item: ocp.PyTreeCheckpointHandler(
                use_ocdbt=not assembly.spilled,
                type_handler_registry=stack_assembly.registry_without_copies(),
            ),
            jax_orbax.EMBEDDING_SPEC_ITEM: ocp.ProtoCheckpointHandler(),
        },
    )
    try:
        manager.save(
            step,
            args=ocp.args.Composite(
                **{
                    item: ocp.args.PyTreeSave(tree, save_args=save_args),
                    jax_orbax.EMBEDDING_SPEC_ITEM: ocp.args.ProtoSave(proto),
                }
            ),
        )
        manager.wait_until_finished()
    finally:
        manager.close()


def _definitions(
    algorithms: Mapping[str, Any], by_stack: Mapping[str, List[Any]], caller: str
) -> Dict[str, spec.Definition]:
    """Each table's algorithm; the tables of a stack share one."""
    if not isinstance(algorithms, Mapping):
        raise TypeError(
            f"{caller}: argument `algorithms` must map each table to its "
            f"algorithm; received {type(algorithms).__name__}."
        )
    tables = [m.table_name for members in by_stack.values() for m in members]
    differ = paths.names_differ(
        algorithms,
        tables,
        "names tables {} the spec does not have",
        "has no algorithm for tables {}",
    )
    if differ:
        raise ValueError(f"{caller}: argument `algorithms` {differ}.")
    result = {
        name: definition_of(value, f"{caller}: `algorithms[{name!r}]`")
        for name, value in algorithms.items()
    }
    for stack, members in by_stack.items():
        used = sorted({result[m.table_name].name for m in members})
        if len(used) != 1:
            raise ValueError(
                f"Tables {[m.table_name for m in members]} share stack {stack!r} "
                f"(one optimizer on the engine); `algorithms` gives them {used}."
            )
    return result


def _placement(
    items_from: Optional[str],
    stacks: List[str],
    item: Optional[str],
    variables_path: Optional[Sequence[str]],
    naming: Optional[str],
    caller: str,
) -> Tuple[str, Sequence[str], str]:
    """(item, path of the stacks' container, naming): each as given, else as
    the stacks sit in `items_from`, else jax-tpu-embedding's defaults."""
    found = (DEFAULT_ITEM, DEFAULT_VARIABLES_PATH, orbax_items.JAX_TPU_EMBEDDING)
    if items_from is not None:
        held = orbax_items.stacks_in_items(os.fspath(items_from), stacks)
        for stack in held.values():
            cut = 1 if stack.naming == orbax_items.KERAS_RS else 2
            found = (
                os.path.basename(stack.directory),
                tuple(stack.table[:-cut]),
                stack.naming,
            )
            break
    if item is not None and not isinstance(item, str):
        raise TypeError(
            f"{caller}: argument `item` must be an orbax item's name (a str "
            f"such as 'model'); received {item!r}."
        )
    if variables_path is not None and (
        isinstance(variables_path, (str, bytes))
        or not isinstance(variables_path, Sequence)
        or not all(isinstance(key, (str, int)) for key in variables_path)
    ):
        raise TypeError(
            f"{caller}: argument `variables_path` must be a sequence of keys "
            "into the item's tree, e.g. "
            f"{DEFAULT_VARIABLES_PATH!r}; received {variables_path!r}."
        )
    item = item if item is not None else found[0]
    variables_path = variables_path if variables_path is not None else found[1]
    naming = naming if naming is not None else found[2]
    if naming not in (orbax_items.JAX_TPU_EMBEDDING, orbax_items.KERAS_RS):
        raise ValueError(
            f"{caller}: argument `naming` must be "
            f"{orbax_items.JAX_TPU_EMBEDDING!r} or {orbax_items.KERAS_RS!r}; "
            f"received {naming!r}."
        )
    return item, variables_path, naming


def _source_stacks(step_dir: str) -> List[str]:
    """The stacks a source step holds: those its embedding spec names, and
    those keras-rs weights name."""
    names = list(orbax_items.keras_rs_weights(os.fspath(step_dir)))
    if jax_orbax.is_jax_checkpoint(os.fspath(step_dir)):
        proto = jax_orbax.read_embedding_spec(os.fspath(step_dir))
        names += [s.stack_name for s in proto.stacked_table_specs]
    return names


def _other_leaves(step_dir: str, item: str, stacks: List[str]) -> Dict[str, Any]:
    """The tree of `item` in `step_dir` without the stacks' variables, its
    leaves restored as NumPy arrays (an empty tree if there is no item)."""
    directory = os.path.join(step_dir, item)
    if not os.path.isdir(directory):
        raise ValueError(f"items_from: {step_dir!r} has no item {item!r}.")
    import jax
    import orbax.checkpoint as ocp

    found = orbax_items.stacks_in_items(step_dir, stacks)
    leaves = {
        path
        for stack in found.values()
        if stack.directory == directory
        for path in (stack.table, *stack.slots.values())
    }
    # The stacks' leaves are placeholders: orbax reads none of them.
    tree = jax.tree_util.tree_map_with_path(
        lambda path, leaf: (
            ocp.PLACEHOLDER if orbax_items.keys_of(path) in leaves else leaf
        ),
        orbax_items.item_tree(directory),
    )
    restored = orbax_items.restore_tree(directory, tree)
    for path in leaves:
        parent = orbax_items.node_at(restored, path[:-1])
        del parent[path[-1]]
        # jax-tpu-embedding's `<stack>/slot` and `<stack>` become empty.
        for depth in range(len(path) - 1, 0, -1):
            parent = orbax_items.node_at(restored, path[: depth - 1])
            if parent.get(path[depth - 1]) == {}:
                del parent[path[depth - 1]]
    return restored


def _copy_other_items(source: str, target: str, item: str) -> None:
    """Copies every item of `source` that `target` lacks, byte for byte."""
    for name in sorted(os.listdir(source)):
        origin = os.path.join(source, name)
        if name in (item, jax_orbax.EMBEDDING_SPEC_ITEM) or not os.path.isdir(origin):
            continue
        destination = os.path.join(target, name)
        if not os.path.exists(destination):
            shutil.copytree(origin, destination)


def write(directory: str, tables: Any, **arguments: Any) -> str:
    """`write_checkpoint(directory, tables, format="jax-tpu-embedding",
    step=..., embedding_spec=..., algorithms=...)`."""
    step = arguments.pop("step")
    spec = arguments.pop("embedding_spec")
    algorithms = arguments.pop("algorithms")
    return _write_jax_checkpoint(
        directory,
        step,
        tables,
        spec,
        algorithms,
        _caller=("write_checkpoint", "path"),
        **arguments,
    )


write_jax_checkpoint = lazy.deprecated(
    _write_jax_checkpoint,
    f"{__name__}.write_jax_checkpoint",
    "tf_tpu_embed_opt.checkpoints.write_checkpoint(directory, tables, "
    "format='jax-tpu-embedding', step=..., embedding_spec=..., algorithms=...)",
)
