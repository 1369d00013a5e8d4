"""Checkpoints with optimizer state, between the TPU layouts and Keras.

`open_checkpoint(path)` opens a checkpoint of any format the package reads
(TensorFlow's `TPUEmbedding` and `TPUEmbeddingV2` layouts, jax-tpu-embedding,
keras-rs and Keras `OrbaxCheckpoint` orbax steps), detecting it in one place,
as a `Checkpoint` with the same methods for each (`reader`);
`write_checkpoint(path, tables, format=...)` writes the two TensorFlow
layouts and jax-tpu-embedding's steps (keras-rs's among them), in any
topology (`writer`); `describe_checkpoint(path)` says what one holds without
reading its tensors.

The rooms, from the bottom up:

- `shared/`: what every format shares (checkpoint keys and paths, the
  `TableInfo` record, the stacking arithmetic of TensorFlow's SparseCore
  layout and jax-tpu-embedding's, orbax's arrays and items). It imports no
  format's folder.
- `formats` (the one registry: each format's name, words, arguments, handler
  and writer) and `protocol` (what every format implements: a
  `TableReader`, a `FormatHandler` module that detects, opens and describes
  it, a `FormatWriter` module).
- A folder per format family: `tpu_embedding/`, `sparsecore/` (the public
  `tf_tpu_embed_opt.sparsecore_layout`), `jax_tpu_embedding/` (also
  keras-rs's steps), each with its reader and writer.
- `reader` and `writer`: the front door over them.
- `keras/`: the Keras side (a model's tables and slots, `load_into_keras`,
  `save_tpu_checkpoint`) and steps of Keras's own `OrbaxCheckpoint` (format
  `"keras"`, read only). The per-table `MultiOptimizer`, a conversion and no
  checkpoint, is `tf_tpu_embed_opt.conversions.multi_optimizer`.

The per-format writers and describers (`write_tpu_checkpoint`,
`jax_tpu_embedding.writer.write_jax_checkpoint`, `sparsecore_layout`'s
`write_checkpoint` and `describe_checkpoint`, ...) still run, with a
`DeprecationWarning`, for one release; the modules' old flat paths
(`checkpoints.jax_orbax`, ...) import the same way.

The names below load their (TensorFlow) modules on first use, so that
the orbax formats and the Keras side run on Keras's JAX backend without
TensorFlow.
"""

from tf_tpu_embed_opt import lazy

__all__ = [
    "open_checkpoint",
    "write_checkpoint",
    "describe_checkpoint",
    "detect_format",
    "Checkpoint",
    "FORMATS",
    "PARAMETERS",
    "TableInfo",
    "TPUCheckpointReader",
    "write_tpu_checkpoint",
    "algorithms_for_slots",
    "check_table_state",
    "checkpoint_key",
]

_HOMES = {
    "open_checkpoint": "reader",
    "write_checkpoint": "writer",
    "describe_checkpoint": "reader",
    "detect_format": "reader",
    "Checkpoint": "reader",
    "FORMATS": "reader",
    "PARAMETERS": "shared.table_info",
    "TableInfo": "shared.table_info",
    "TPUCheckpointReader": "tpu_embedding.reader",
    "algorithms_for_slots": "shared.table_info",
    "check_table_state": "tpu_embedding.writer",
    "checkpoint_key": "tpu_embedding.reader",
    "write_tpu_checkpoint": "tpu_embedding.writer",
}


__getattr__ = lazy.module_getattr(__name__, _HOMES, globals())

# The flat modules of 0.1's development -> their folders (CHANGELOG, "Moved
# modules"); the old paths import, with a DeprecationWarning, for one release.
_MOVED = {
    "keys": "shared.keys",
    "paths": "shared.paths",
    "table_info": "shared.table_info",
    "sparsecore_stacks": "shared.stacks",
    "orbax_arrays": "shared.orbax_arrays",
    "orbax_items": "shared.orbax_items",
    "tpu_layout": "tpu_embedding.reader",
    "tpu_writer": "tpu_embedding.writer",
    "sparsecore_reader": "sparsecore.reader",
    "sparsecore_writer": "sparsecore.writer",
    "jax_orbax": "jax_tpu_embedding.reader",
    "jax_orbax_writer": "jax_tpu_embedding.writer",
    "jax_orbax_processes": "jax_tpu_embedding.processes",
    "jax_spec_proto": "jax_tpu_embedding.spec_proto",
    "jax_layouts": "jax_tpu_embedding.layouts",
    "jax_specs": "jax_tpu_embedding.specs",
    "stack_assembly": "jax_tpu_embedding.assembly",
    "keras_rs_orbax": "jax_tpu_embedding.keras_rs",
    "keras_orbax": "keras.orbax_reader",
    "keras_tables": "keras.tables",
    "keras_state": "keras.state",
}
# The per-table MultiOptimizer is a conversion: it left checkpoints/.
_MULTI_OPTIMIZER = "tf_tpu_embed_opt.conversions.multi_optimizer"
lazy.serve_moved_modules(
    {
        **{f"{__name__}.{old}": f"{__name__}.{new}" for old, new in _MOVED.items()},
        f"{__name__}.multi_optimizer": _MULTI_OPTIMIZER,
        f"{__name__}.keras.multi_optimizer": _MULTI_OPTIMIZER,
    }
)

# The names whose homes read TensorFlow's checkpoints (the TPUEmbedding
# layout): without TensorFlow `dir()` leaves them out, so that `help()` of
# this package works there (tests/test_packaging.py checks the set).
_NEED_TENSORFLOW = frozenset(
    {
        "TPUCheckpointReader",
        "check_table_state",
        "checkpoint_key",
        "write_tpu_checkpoint",
    }
)
__dir__ = lazy.module_dir(__all__, _NEED_TENSORFLOW)
