"""jax-tpu-embedding's `EmbeddingSpecProto` as layout records, checked.

Each table of a stack becomes a `JaxTableLayout`, with the field names of
TensorFlow's `SparseCoreTableLayout`, so that `sparsecore_stacks` computes
both layouts' indices alike. A spec whose sizes contradict each other, or
whose stacks are not laid out as jax-tpu-embedding lays a stack out, is
refused naming the stack and the table. `jax_orbax` re-exports both names.
"""

from __future__ import annotations

import dataclasses
from typing import Any, List, Tuple

from tf_tpu_embed_opt.checkpoints.shared import stacks as sparsecore_stacks

__all__ = ["JaxTableLayout", "layouts"]


@dataclasses.dataclass(frozen=True)
class JaxTableLayout:
    """Where one table lives in its stack, with the field names of TensorFlow's
    `SparseCoreTableLayout`, so that `sparsecore_stacks` reads both alike."""

    table_name: str
    stacked_table_name: str
    num_sparse_cores: int
    unsharded_shape: Tuple[int, int]
    unsharded_padded_shape: Tuple[int, int]
    sparse_core_shard_row_offset: int
    sparse_core_shard_rotation: int
    total_rows_per_sparse_core_shard: int
    # jax-tpu-embedding shards each stack over all its SparseCores as one.
    num_partitions: int = 1


def layouts(proto: Any) -> List[JaxTableLayout]:
    """The layout of every table of an `EmbeddingSpecProto`, checked.

    Raises:
      ValueError: A stack or table whose sizes contradict each other, naming
        it.
    """
    result = []
    for stack in proto.stacked_table_specs:
        n = stack.num_sparsecores
        where = f"stack {stack.stack_name!r}"
        if n < 1 or stack.stack_vocab_size % n:
            raise ValueError(
                f"{where}: stack_vocab_size {stack.stack_vocab_size} is not a "
                f"multiple of num_sparsecores {n}."
            )
        if not stack.table_specs:
            raise ValueError(f"{where} holds no table.")
        for table in stack.table_specs:
            layout = JaxTableLayout(
                table_name=table.table_name,
                stacked_table_name=stack.stack_name,
                num_sparse_cores=n,
                unsharded_shape=(table.vocab_size, table.embedding_dim),
                unsharded_padded_shape=(
                    table.padded_vocab_size,
                    table.padded_embedding_dim,
                ),
                sparse_core_shard_row_offset=table.row_offset_in_shard,
                sparse_core_shard_rotation=table.shard_rotation,
                total_rows_per_sparse_core_shard=stack.stack_vocab_size // n,
            )
            if table.padded_embedding_dim != stack.stack_embedding_dim:
                raise ValueError(
                    f"{where}: table {table.table_name!r} has padded_embedding_dim "
                    f"{table.padded_embedding_dim}, the stack "
                    f"{stack.stack_embedding_dim}."
                )
            try:
                sparsecore_stacks.check_layout(layout)
            except ValueError as error:
                raise ValueError(f"{where}: {error}") from None
            result.append(layout)
        _check_stacking(where, result[-len(stack.table_specs) :])
    return result


def _check_stacking(where: str, members: List[JaxTableLayout]) -> None:
    """Refuses a stack not laid out as jax-tpu-embedding lays one out
    (`table_stacking.compute_table_to_setting_in_stack`): its tables one
    after another from row 0 of each shard, the k-th rotated by k x the
    stack's rotation modulo the SparseCores. (A spec edited so that a table
    starts elsewhere, or rotates otherwise, would read other rows.)"""
    ordered = sorted(members, key=lambda t: t.sparse_core_shard_row_offset)
    n = ordered[0].num_sparse_cores
    step = ordered[1].sparse_core_shard_rotation if len(ordered) > 1 else 0
    offset = 0
    for position, table in enumerate(ordered):
        expected = (offset, position * step % n)
        found = (table.sparse_core_shard_row_offset, table.sparse_core_shard_rotation)
        if found != expected:
            raise ValueError(
                f"{where}: table {table.table_name!r} has row_offset_in_shard "
                f"{found[0]} and shard_rotation {found[1]}; jax-tpu-embedding "
                f"stacks it at {expected[0]}, rotated by {expected[1]} (after "
                f"{[t.table_name for t in ordered[:position]]}, rotation step "
                f"{step}). Was the embedding spec edited or damaged?"
            )
        offset += table.unsharded_padded_shape[0] // n
