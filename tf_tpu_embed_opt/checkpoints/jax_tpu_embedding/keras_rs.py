"""keras-rs's JAX `DistributedEmbedding` checkpoints: their layout, derived.

On SparseCore, keras-rs's JAX `DistributedEmbedding` keeps each stack of
tables as layer weights `var:<stack>:table` and `var:<stack>:table:slot:
<name>` in jax-tpu-embedding's stacked, mod-sharded and rotated layout, and
`keras.callbacks.OrbaxCheckpoint` saves them in the item `pytree` (under
`trainable_variables/<layer name>/`). Nothing there records the layout: the
order of the rows depends on the job's topology and on how keras-rs stacked
the tables. `embedding_spec` derives it as `DistributedEmbedding` does when
it builds on a TPU (`sparsecore_build`): keras-rs's own conversion of the
feature configs (`config_conversion.keras_to_jte_feature_configs`) of the
tables placed on SparseCore, its `table_stacking` (`"auto"`: jax-tpu-
embedding's `auto_stack_tables`; a list or lists of names: `stack_tables`),
then `prepare_feature_specs_for_training` and
`create_proto_from_feature_specs`, all run on the CPU. The result is the
`EmbeddingSpecProto` that `jax_orbax.JaxCheckpointReader(step_dir,
embedding_spec=...)` reads the checkpoint with, and that
`jax_orbax_writer.write_jax_checkpoint` writes another topology's with.

The reader checks the spec against the stored shapes. Two topologies with
the same number of SparseCores and the same padded sizes but another number
per device (2 x 4 and 4 x 2) store the same shapes with the rows rotated
differently: the arrays cannot tell them apart, so the topology given must be
the job's. Needs keras-rs and jax-tpu-embedding; no TensorFlow.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np

from tf_tpu_embed_opt import lazy
from tf_tpu_embed_opt.checkpoints import formats
from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import reader as jax_orbax
from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import spec_proto as jax_spec_proto
from tf_tpu_embed_opt.checkpoints.protocol import Evidence
from tf_tpu_embed_opt.checkpoints.shared import orbax_items
from tf_tpu_embed_opt.checkpoints.shared.paths import orbax_step

__all__ = [
    "describe",
    "describe_checkpoint",
    "describe_stacks",
    "detect",
    "embedding_spec",
    "is_keras_rs_checkpoint",
    "open_reader",
]

TableStacking = Union[None, str, Sequence[str], Sequence[Sequence[str]]]


def _sparsecore_features(feature_configs: Any) -> dict:
    """keras-rs's `{path: FeatureConfig}` of the features a TPU job places on
    SparseCore (`"auto"` or `"sparsecore"`; TensorFlow's FeatureConfigs too),
    keyed and ordered as `DistributedEmbedding` keys them."""
    import keras
    from keras_rs.src.layers.embedding.distributed_embedding_config import (
        FeatureConfig,
    )

    features = {}
    for path, feature in keras.tree.flatten_with_path(feature_configs):
        if isinstance(feature, FeatureConfig):
            if feature.table.placement == "default_device":
                continue
            if feature.table.placement not in ("auto", "sparsecore"):
                raise ValueError(
                    f"embedding_spec: feature {feature.name!r} has placement "
                    f"{feature.table.placement!r}; keras-rs allows 'auto', "
                    "'sparsecore' and 'default_device'."
                )
        features[".".join(str(e) for e in path)] = feature
    if not features:
        raise ValueError(
            "embedding_spec: `feature_configs` places no table on SparseCore "
            "(every table has placement 'default_device'); such tables are "
            "plain Keras Embedding weights."
        )
    return features


def embedding_spec(
    feature_configs: Any,
    *,
    num_devices: int,
    sparsecores_per_device: int,
    table_stacking: TableStacking = "auto",
) -> Any:
    """The `EmbeddingSpecProto` of a keras-rs `DistributedEmbedding` on a TPU job.

    Args:
      feature_configs: The nested `keras_rs.layers.FeatureConfig`s the job
        passed to `DistributedEmbedding` (not changed).
      num_devices: The job's devices (`jax.device_count()` there).
      sparsecores_per_device: SparseCores per device (4 on TPU v5p, 2 on
        v6e and 7x).
      table_stacking: The job's `DistributedEmbedding(table_stacking=...)`:
        `"auto"` (keras-rs's default), `None`, a list of table names or a list
        of such lists. Read as keras-rs reads it: anything but a string or a
        non-empty list (e.g. a tuple) stacks nothing.

    Returns:
      A `jax_spec_proto.EmbeddingSpecProto`.

    Raises:
      ValueError: A count that is not a positive int, a `table_stacking`
        keras-rs refuses, or no table on SparseCore.
    """
    import copy

    from jax_tpu_embedding.sparsecore.lib.nn import embedding
    from jax_tpu_embedding.sparsecore.lib.nn import table_stacking as stacking
    from keras_rs.src.layers.embedding.jax import config_conversion

    for name, value in (
        ("num_devices", num_devices),
        ("sparsecores_per_device", sparsecores_per_device),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(
                f"embedding_spec: argument `{name}` must be a positive int; "
                f"received {value!r}."
            )
    features = config_conversion.keras_to_jte_feature_configs(
        copy.deepcopy(_sparsecore_features(feature_configs))
    )
    # As DistributedEmbedding.sparsecore_build reads `table_stacking`.
    if isinstance(table_stacking, str):
        if table_stacking != "auto":
            raise ValueError(
                "embedding_spec: argument `table_stacking` must be None, "
                "'auto', a list of table names or a list of such lists "
                f"(keras-rs refuses other strings); received {table_stacking!r}."
            )
        stacking.auto_stack_tables(features, num_devices, sparsecores_per_device)
    elif isinstance(table_stacking, list) and table_stacking:
        if isinstance(table_stacking[0], list):
            for names in table_stacking:
                stacking.stack_tables(
                    features, names, num_devices, sparsecores_per_device
                )
        elif isinstance(table_stacking[0], str):
            stacking.stack_tables(
                features, table_stacking, num_devices, sparsecores_per_device
            )
        else:
            raise ValueError(
                "embedding_spec: argument `table_stacking` must be None, 'auto', "
                "a list of table names or a list of such lists; received "
                f"{table_stacking!r}."
            )
    embedding.prepare_feature_specs_for_training(
        features, num_devices, sparsecores_per_device
    )
    proto = embedding.create_proto_from_feature_specs(
        features, num_devices, sparsecores_per_device
    )
    result = jax_spec_proto.EmbeddingSpecProto()
    result.ParseFromString(proto.SerializeToString())
    return result


def is_keras_rs_checkpoint(step_dir: str) -> bool:
    """Whether `step_dir` is an orbax step holding keras-rs stack weights
    and no embedding spec (which a step this package rewrote holds)."""
    if not os.path.isdir(step_dir) or jax_orbax.is_jax_checkpoint(step_dir):
        return False
    return bool(orbax_items.keras_rs_weights(step_dir))


def detect(evidence: Evidence) -> bool:
    """Format `"keras-rs"`: an orbax step of keras-rs stack weights, which
    does not record its layout (its handler, with `open_reader` and
    `describe`; read as a jax-tpu-embedding step in that layout)."""
    return evidence.is_directory() and bool(orbax_items.keras_rs_weights(evidence.path))


def open_reader(
    path: str, embedding_spec: Any = None, cache_bytes: Optional[int] = None
) -> jax_orbax.JaxCheckpointReader:
    if embedding_spec is None:
        _weights(path)
        raise ValueError(
            f"open_checkpoint: {path!r} is a keras-rs step, which does not "
            "record which table is where: pass `embedding_spec` "
            "(checkpoints.jax_tpu_embedding.keras_rs.embedding_spec("
            "feature_configs, num_devices, sparsecores_per_device, "
            "table_stacking))."
        )
    reader = jax_orbax.JaxCheckpointReader(
        path, embedding_spec, cache_bytes=cache_bytes
    )
    reader.format = formats.KERAS_RS.name
    return reader


def describe(path: str, embedding_spec: Any = None) -> Dict[str, Any]:
    if embedding_spec is not None:
        return jax_orbax.describe(path, embedding_spec)
    return {
        "layout": formats.KERAS_RS.layout,
        "step": orbax_step(path),
        "stacked_tables": describe_stacks(path),
    }


def _weights(step_dir: str) -> Dict[str, Dict[str, Any]]:
    """The step's keras-rs stack weights (`orbax_items.keras_rs_weights`).

    Raises:
      ValueError: It holds none: another orbax step read as this format.
    """
    weights = orbax_items.keras_rs_weights(step_dir)
    if not weights:
        raise ValueError(
            f"{step_dir!r} holds no keras-rs stack weights "
            "(`var:<stack>:table`, `var:<stack>:table:slot:<name>`)."
        )
    return weights


def describe_stacks(step_dir: str) -> List[Dict[str, Any]]:
    """Each stack of a keras-rs checkpoint step, from orbax's metadata (no
    array is read): where its weights are, their shape, its slots and the
    algorithms they fit. Which table is where needs `embedding_spec`.

    Raises:
      ValueError: The step holds no keras-rs stack weights.
    """
    stacks = []
    for stack, entry in _weights(step_dir).items():
        slots = sorted(entry["slots"])
        table = entry["table"]
        stacks.append(
            {
                "stacked_table": stack,
                "item": entry["item"],
                "weights": "/".join(map(str, entry["container"])),
                "shape": list(table.shape),
                "slots": slots,
                "algorithms": [
                    d.name for d in jax_orbax.algorithms_for_jax_slots(slots)
                ],
                "bytes": np.dtype(table.dtype).itemsize
                * (1 + len(slots))
                * int(np.prod(table.shape)),
            }
        )
    return stacks


describe_checkpoint = lazy.deprecated(
    describe_stacks,
    f"{__name__}.describe_checkpoint",
    "tf_tpu_embed_opt.checkpoints.describe_checkpoint(step_dir)",
)
