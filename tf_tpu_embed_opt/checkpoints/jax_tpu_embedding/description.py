"""Each stack of a jax-tpu-embedding orbax step, described without reading an array.

`describe_checkpoint` of format `"jax-tpu-embedding"` (and of `"keras-rs"`
given a spec) lists each stack from the step's `EmbeddingSpecProto` and
orbax's metadata: where its variables are, their stored shape, the slots and
the algorithms they fit, and each table's place in the stack.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List

import numpy as np

from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import spec_proto
from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding.layouts import (
    JaxTableLayout,
    layouts,
)
from tf_tpu_embed_opt.checkpoints.shared import orbax_items

__all__ = ["describe_stacks"]


def describe_stacks(step_dir: str, embedding_spec: Any = None) -> List[Dict[str, Any]]:
    """Each stack of a checkpoint step, from its spec and orbax's metadata
    (no array is read): where its variables are, their stored shape, the
    slots and the algorithms they fit, the SparseCores and each table's place.

    Args:
      step_dir: The orbax step directory.
      embedding_spec: The layout, for a step that records none (keras-rs's);
        `None`: the step's own.

    Raises:
      ValueError: The spec is missing or damaged; a stack whose
        variables are missing is described with `"item": None`, no shape,
        slots or algorithms, and 0 bytes.
    """
    if embedding_spec is None:
        proto = spec_proto.read_embedding_spec(step_dir)
    else:
        proto = spec_proto.checked(embedding_spec, "describe_checkpoint")
    by_stack: Dict[str, List[JaxTableLayout]] = {}
    for layout in layouts(proto):
        by_stack.setdefault(layout.stacked_table_name, []).append(layout)
    where = orbax_items.stacks_in_items(step_dir, sorted(by_stack))
    records_by_table = spec_proto.optimizer_records(proto)
    stacks = []
    for stack, members in by_stack.items():
        found = where.get(stack)
        slots = sorted(found.slots) if found is not None else []
        table = found.metadata(found.table) if found is not None else None
        shape = list(table.shape) if table is not None else None
        records = [records_by_table.get(m.table_name) for m in members]
        # A stack whose variables are missing has no slots to tell (none
        # would read as SGD's).
        algorithms = [
            d.name
            for d in (
                spec_proto.algorithms_for_jax_slots(slots) if found is not None else ()
            )
            if all(
                allowed is None or d in allowed
                for allowed in map(spec_proto.definitions_for_record, records)
            )
        ]
        stacks.append(
            {
                "stacked_table": stack,
                "item": (
                    os.path.basename(found.directory) if found is not None else None
                ),
                "shape": shape,
                "slots": slots,
                "algorithms": algorithms,
                "optimizer_records": sorted(
                    {spec_proto.record_type(r) for r in records if r is not None}
                ),
                "num_sparsecores": members[0].num_sparse_cores,
                "tables": {
                    m.table_name: {
                        "shape": list(m.unsharded_shape),
                        "row_offset_in_shard": m.sparse_core_shard_row_offset,
                        "shard_rotation": m.sparse_core_shard_rotation,
                    }
                    for m in members
                },
                "bytes": (
                    np.dtype(table.dtype).itemsize
                    * (1 + len(slots))
                    * int(np.prod(shape))
                    if shape
                    else 0
                ),
            }
        )
    return stacks
