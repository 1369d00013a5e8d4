"""jax-tpu-embedding orbax steps written by a job of several JAX processes.

In a job of several processes (`jax.distributed`, through
`keras.distribution.initialize`) a table split by rows is a global
`jax.Array` of which each process holds its rows. The jax-tpu-embedding
layout scatters every contiguous block of a table's rows over all the
SparseCore shards of its stack (row `r` in shard `(r mod n + rotation) mod
n`), so no process can place its rows alone. Here every process calls the
same function on the same global arrays: one jitted computation per stacked
array builds it from the tables' arrays (padding, then the sharding and
rotation as reshapes, transposes and a roll, then the stacking as a
concatenation), with its rows split over every device of the job; XLA
moves the rows between the processes with all-to-all exchanges (its
compiled stacking holds no all-gather: no device holds a stack whole).
Orbax then saves it, each process writing the rows its devices hold, and
the step appears once every process has written (orbax's own
finalization).

The stacked arrays equal, bit for bit (padding included), what
`jax_orbax_writer.write_jax_checkpoint` assembles on the host from the same
tables (tested with 2 processes). Every stacked array of the step is
built, then orbax writes them: a process holds its rows of each until
then. No TensorFlow is needed.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np

from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import assembly as stack_assembly
from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import reader as jax_orbax
from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import spec_proto as jax_spec_proto
from tf_tpu_embed_opt.checkpoints.shared import stacks as sparsecore_stacks
from tf_tpu_embed_opt.checkpoints.shared.table_info import PARAMETERS
from tf_tpu_embed_opt.definitions import spec

__all__ = ["is_spread", "refuse_options", "write_across_processes"]


def is_spread(value: Any) -> bool:
    """Whether `value` is a `jax.Array` this process holds only part of."""
    return not getattr(value, "is_fully_addressable", True)


def _stacked(
    arrays: List[Any], members: Sequence[Any], pad_value: float, sharding: Any
) -> Any:
    """One stacked array from the tables' global arrays (in `members`'
    order), split over the job's devices by `sharding`.

    A table padded to its padded shape, viewed as `(rows / n, n, width)`,
    holds in `[i, j]` its row `i * n + j`, which goes to shard `(j +
    rotation) mod n` at its offset plus `i` (`sparsecore_stacks.
    stacked_index`): so a transpose and a roll by the rotation give each
    shard's part, and the parts follow one another in each shard by their
    offsets (rows of no table are zeros, as on the host). Reshapes,
    transposes and concatenations: XLA moves the rows between devices with
    all-to-all exchanges, never gathering a stack whole on one."""
    import jax
    import jax.numpy as jnp

    first = members[0]
    n = first.num_sparse_cores
    shard_rows = first.total_rows_per_sparse_core_shard
    width = first.unsharded_padded_shape[1]
    order = sorted(
        range(len(members)), key=lambda i: members[i].sparse_core_shard_row_offset
    )

    def build(*tables: Any) -> Any:
        dtype = tables[0].dtype
        blocks, cursor = [], 0
        for i in order:
            layout, table = members[i], tables[i]
            offset = layout.sparse_core_shard_row_offset
            padded_rows = layout.unsharded_padded_shape[0]
            if offset < cursor:
                raise ValueError(
                    f"Table {layout.table_name!r}: its rows at offset {offset} "
                    "of each shard overlap the previous table's in stack "
                    f"{layout.stacked_table_name!r}."
                )
            if offset > cursor:
                blocks.append(jnp.zeros((n, offset - cursor, width), dtype))
            part = jnp.pad(
                table,
                ((0, padded_rows - table.shape[0]), (0, width - table.shape[1])),
                constant_values=jnp.asarray(pad_value, dtype),
            )
            part = part.reshape(padded_rows // n, n, width).transpose(1, 0, 2)
            blocks.append(jnp.roll(part, layout.sparse_core_shard_rotation, axis=0))
            cursor = offset + padded_rows // n
        if cursor < shard_rows:
            blocks.append(jnp.zeros((n, shard_rows - cursor, width), dtype))
        return jnp.concatenate(blocks, axis=1).reshape(n * shard_rows, width)

    return jax.jit(build, out_shardings=sharding)(*arrays)


def _job_devices(states: Mapping[str, Mapping[str, Any]]) -> List[Any]:
    """The job's devices in the order of the tables' own mesh (a jitted
    computation takes its arguments' devices in one order)."""
    import jax

    for state in states.values():
        for value in state.values():
            mesh = getattr(getattr(value, "sharding", None), "mesh", None)
            if is_spread(value) and mesh is not None:
                return list(np.asarray(mesh.devices).flat)
    return sorted(jax.devices(), key=lambda device: device.id)


def _row_sharding(stacks: Mapping[str, Sequence[Any]], devices: List[Any]) -> Any:
    """Stacked rows split over every device of the job.

    Raises:
      ValueError: A stack whose rows the devices do not divide, naming it.
    """
    import jax

    for stack, members in stacks.items():
        rows = sparsecore_stacks.stacked_shape(members[0])[0]
        if rows % len(devices):
            raise ValueError(
                f"Writing across processes: stack {stack!r} has {rows} rows, which "
                f"the job's {len(devices)} devices do not divide; a job of "
                "several processes writes each stack split over its devices. "
                "Save with keras.callbacks.OrbaxCheckpoint and convert that "
                "step in one process instead."
            )
    mesh = jax.sharding.Mesh(np.array(devices), ("rows",))
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("rows"))


def write_across_processes(
    root: str,
    step: int,
    states: Dict[str, Mapping[str, Any]],
    embedding_spec: Any,
    by_stack: Mapping[str, Sequence[Any]],
    definitions: Mapping[str, spec.Definition],
    *,
    item: str,
    variables_path: Sequence[str],
    naming: str,
    pad_value: float,
) -> str:
    """Writes the step from every process of the job (see the module).

    Args:
      root: The orbax root directory (the same path in every process).
      step: The step number.
      states: Table name -> its state (global `jax.Array`s, each process
        holding its rows, or arrays every process holds whole).
      embedding_spec, by_stack, definitions: As `write_jax_checkpoint`
        checked them.
      item, variables_path, naming, pad_value: As for
        `write_jax_checkpoint`.

    Returns:
      The step directory.
    """
    import orbax.checkpoint as ocp

    sharding = _row_sharding(by_stack, _job_devices(states))
    tree: Dict[str, Any] = {}
    node = tree
    for key in variables_path:
        node = node.setdefault(key, {})
    for stack, members in by_stack.items():
        definition = definitions[members[0].table_name]
        keys = [PARAMETERS, *(slot.name for slot in definition.slots)]
        stacked = {
            key: _stacked(
                [states[m.table_name][key] for m in members],
                members,
                pad_value,
                sharding,
            )
            for key in keys
        }
        node.update(stack_assembly.named_arrays(stack, stacked, definition, naming))
    proto = jax_spec_proto.EmbeddingSpecProto()
    proto.ParseFromString(embedding_spec.SerializeToString())
    manager = ocp.CheckpointManager(
        os.path.abspath(root),  # orbax refuses a relative path
        item_handlers={
            item: ocp.PyTreeCheckpointHandler(),
            jax_orbax.EMBEDDING_SPEC_ITEM: ocp.ProtoCheckpointHandler(),
        },
    )
    try:
        manager.save(
            step,
            args=ocp.args.Composite(
                **{
                    item: ocp.args.PyTreeSave(tree),
                    jax_orbax.EMBEDDING_SPEC_ITEM: ocp.args.ProtoSave(proto),
                }
            ),
        )
        manager.wait_until_finished()
    finally:
        manager.close()
    return os.path.join(root, str(int(step)))


def refuse_options(**given: Optional[Any]) -> None:
    """Options of the host writer that a job of several processes does not
    take, refused by name."""
    for name, value in given.items():
        if value is not None:
            raise ValueError(
                f"Argument `{name}` does not apply to "
                "tables spread over several JAX processes (each process "
                "writes its rows of the stacks, in memory, with no other item)."
            )
