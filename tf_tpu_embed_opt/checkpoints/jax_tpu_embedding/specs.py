"""The geometry of jax-tpu-embedding's stacks for any topology.

A TPU job of jax-tpu-embedding shards each stack of tables over all its
SparseCores (devices x SparseCores per device); the stacked variables and the
`EmbeddingSpecProto` that describes them change with that number. This module
computes the spec a job of a given topology uses, with jax-tpu-embedding's
own arithmetic (`table_stacking.stack_tables`, `round_up_dim_and_vocab_size`,
`_compute_table_to_setting_in_stack`):

- a table's rows are padded to a multiple of 8 x the SparseCores, its
  columns to a multiple of 8, and a stack's to its widest table's;
- the tables of a stack follow one another in each SparseCore's shard
  (`row_offset_in_shard`), the i-th rotated by i x `rotation` SparseCores
  modulo their number (`rotation` defaults to the SparseCores per device);
- a table alone is its own stack, with its own name.

`retarget_embedding_spec` keeps a checkpoint's stacks, their order and every
other field (optimizer records, limits, features), and recomputes the
geometry for another topology; `embedding_spec_for` makes a spec from table
shapes. `jax_orbax_writer` writes steps in such a layout and re-exports
these names; `tests/test_jax_orbax_writer.py` pins them against
jax-tpu-embedding's own code. No TensorFlow is needed.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import reader as jax_orbax
from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import spec_proto as jax_spec_proto

__all__ = [
    "JAX_SPARSECORES_PER_DEVICE",
    "embedding_spec_for",
    "retarget_embedding_spec",
]


def _multiple(value: int, of: int) -> int:
    return -(-value // of) * of


def _positive(value: Any, name: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(
            f"{where}: argument `{name}` must be a positive int; received {value!r}."
        )
    return int(value)


# The SparseCores per device jax-tpu-embedding lays tables out for: the
# values of its `utils.NUM_SC_PER_DEVICE_MAP` (TPU v5p and v5e: 4; v6e and
# TPU7x: 2), the only ones its `embedding.get_num_sc_per_device` accepts
# ("Invalid num_sc_per_device"), in 0.1.0 and at its HEAD alike.
JAX_SPARSECORES_PER_DEVICE: Tuple[int, ...] = (2, 4)


def _topology(
    num_devices: Any, sparsecores_per_device: Any, rotation: Any, where: str
) -> Tuple[int, int]:
    devices = _positive(num_devices, "num_devices", where)
    per_device = _positive(sparsecores_per_device, "sparsecores_per_device", where)
    if per_device not in JAX_SPARSECORES_PER_DEVICE:
        raise ValueError(
            f"{where}: argument `sparsecores_per_device` must be one of "
            f"{list(JAX_SPARSECORES_PER_DEVICE)} (jax-tpu-embedding's: TPU v5p "
            f"and v5e have 4, v6e and TPU7x 2); received {per_device}."
        )
    if rotation is None:
        return devices * per_device, per_device
    if isinstance(rotation, bool) or not isinstance(rotation, (int, np.integer)):
        raise ValueError(
            f"{where}: argument `rotation` must be an int >= 0 or None "
            f"(jax-tpu-embedding's default, the SparseCores per device); "
            f"received {rotation!r}."
        )
    if rotation < 0:
        raise ValueError(
            f"{where}: argument `rotation` must be >= 0; received {rotation!r}."
        )
    return devices * per_device, int(rotation)


def _lay_out_stack(stack: Any, num_sparsecores: int, rotation: int) -> None:
    """Sets the geometry of one `StackedTableSpecProto` (its tables in order)
    for `num_sparsecores`, as jax-tpu-embedding's `stack_tables` does."""
    dim = max(_multiple(t.embedding_dim, 8) for t in stack.table_specs)
    offset = 0
    for position, table in enumerate(stack.table_specs):
        table.padded_vocab_size = _multiple(table.vocab_size, 8 * num_sparsecores)
        table.padded_embedding_dim = dim
        table.row_offset_in_shard = offset
        table.shard_rotation = (position * rotation) % num_sparsecores
        for feature in table.feature_specs:
            feature.col_offset = table.row_offset_in_shard * num_sparsecores
            feature.col_shift = table.shard_rotation
        offset += table.padded_vocab_size // num_sparsecores
    stack.num_sparsecores = num_sparsecores
    stack.stack_embedding_dim = dim
    stack.stack_vocab_size = offset * num_sparsecores


def retarget_embedding_spec(
    proto: Any,
    *,
    num_devices: int,
    sparsecores_per_device: int,
    rotation: Optional[int] = None,
) -> Any:
    """The spec of the same stacks for a job of another topology.

    Args:
      proto: An `EmbeddingSpecProto` (jax-tpu-embedding's or
        `jax_spec_proto`'s), e.g. `jax_orbax.read_embedding_spec(step_dir)`;
        not changed.
      num_devices: The target job's devices (chips).
      sparsecores_per_device: SparseCores per device of the target job.
      rotation: The target job's `stack_tables(rotation=...)`; `None` is
        jax-tpu-embedding's default, `sparsecores_per_device`.

    Returns:
      A new `jax_spec_proto.EmbeddingSpecProto`: each stack's padded sizes,
      row offsets, rotations, `num_sparsecores` and each feature's
      `col_offset`/`col_shift` for the target; everything else as in `proto`.

    Raises:
      ValueError: A count that is not a positive int, or a spec whose tables
        contradict each other (as `jax_orbax.layouts` checks).
    """
    where = "retarget_embedding_spec"
    shards, rotation = _topology(num_devices, sparsecores_per_device, rotation, where)
    jax_orbax.layouts(proto)
    result = jax_spec_proto.EmbeddingSpecProto()
    result.ParseFromString(proto.SerializeToString())
    for stack in result.stacked_table_specs:
        _lay_out_stack(stack, shards, rotation)
    return result


def embedding_spec_for(
    tables: Mapping[str, Tuple[int, int]],
    *,
    num_devices: int,
    sparsecores_per_device: int,
    stacks: Optional[Mapping[str, Sequence[str]]] = None,
    rotation: Optional[int] = None,
) -> Any:
    """The spec of a job of the given topology for tables of these shapes.

    What jax-tpu-embedding's `stack_tables` and
    `prepare_feature_specs_for_training` give, without its feature specs: the
    spec records no features, batch sizes, limits, combiners or optimizers
    (the layout needs none of them; a job restoring the checkpoint brings its
    own).

    Args:
      tables: `{table name: (vocabulary size, embedding dim)}`.
      num_devices: The job's devices (chips).
      sparsecores_per_device: SparseCores per device.
      stacks: `{stack name: [table names, in the stack's order]}` for the
        tables the job stacks; every other table is a stack of its own named
        like it.
      rotation: As for `retarget_embedding_spec`.

    Returns:
      A `jax_spec_proto.EmbeddingSpecProto`, stacks in the order of `stacks`,
      then the other tables in the order of `tables`.

    Raises:
      ValueError: A shape or count that is not a positive int, a stack naming
        an unknown table, a table in two stacks or a stack name taken twice.
    """
    where = "embedding_spec_for"
    shards, rotation = _topology(num_devices, sparsecores_per_device, rotation, where)
    stacks = dict(stacks or {})
    for name, shape in tables.items():
        if not isinstance(shape, (tuple, list)) or len(shape) != 2:
            raise ValueError(
                f"{where}: argument `tables` maps {name!r} to {shape!r}; "
                "expected (vocabulary size, embedding dim)."
            )
        for value, what in zip(shape, ("vocabulary size", "embedding dim")):
            _positive(value, f"tables[{name!r}] {what}", where)
    seen: Dict[str, str] = {}
    for stack, members in stacks.items():
        if not members:
            raise ValueError(f"{where}: stack {stack!r} lists no table.")
        for member in members:
            if member not in tables:
                raise ValueError(
                    f"{where}: stack {stack!r} lists {member!r}, which is not "
                    f"in `tables` ({sorted(tables)})."
                )
            if member in seen:
                raise ValueError(
                    f"{where}: table {member!r} is in stacks {seen[member]!r} "
                    f"and {stack!r}."
                )
            seen[member] = stack
    groups = list(stacks.items()) + [(n, [n]) for n in tables if n not in seen]
    names = [stack for stack, _ in groups]
    clashes = sorted({n for n in names if names.count(n) > 1})
    if clashes:
        raise ValueError(
            f"{where}: stack names {clashes} are taken twice (a table alone "
            "is a stack named like it)."
        )
    proto = jax_spec_proto.EmbeddingSpecProto()
    for stack_name, members in groups:
        stack = proto.stacked_table_specs.add(stack_name=stack_name)
        for member in members:
            vocabulary, dim = tables[member]
            stack.table_specs.add(
                table_name=member, vocab_size=int(vocabulary), embedding_dim=int(dim)
            )
        _lay_out_stack(stack, shards, rotation)
    return proto
