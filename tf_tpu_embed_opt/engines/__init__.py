"""Which TPU embedding engine runs a table, and what it does with the optimizer.

Three engines train embedding tables on TPUs, named as users know them:

- `"TPUEmbedding"` (the default): `tf.tpu.experimental.embedding.TPUEmbedding`,
  the TensorCore-era engine; it receives the whole `OptimizationParameters`
  proto of every optimizer of this package (`engines.tensorcore`).
- `"TPUEmbeddingV2"`: SparseCore minibatching (TPU v5p, v6e and later),
  `tf.tpu.experimental.embedding.TPUEmbeddingV2` and keras-rs's
  `DistributedEmbedding` on TensorFlow. It hands the SparseCore op only some of
  the optimizer's settings and runs five algorithms (`engines.sparsecore`).
- `"jax-tpu-embedding"`: SparseCore through JAX (jax-tpu-embedding, and
  keras-rs's `DistributedEmbedding` on Keras's JAX backend). Its optimizers are
  jax-tpu-embedding's `OptimizerSpec`s, whose lowerings are the per-row rules
  (`engines.jax_tpu_embedding`); it needs no TensorFlow.

Each engine is one object of the registry `ENGINES` (`spec.Engine`), and
what it does is its module here: `behaviour_of(engine)` gives it, an
`EngineBehaviour` (which algorithms it runs and as what, its verdict on a
table's optimizer, what it computes for an optimizer that a Keras twin
reproduces). The conversions and the preflight ask it.

The engines judge embedding-face objects only: embedding optimizers (this
package's or TensorFlow's), `TableConfig`s and nests of TensorFlow
`FeatureConfig`s (`engines.check_configuration`), and jax-tpu-embedding's
specs.
`tf_tpu_embed_opt.check_engine` (`tf_tpu_embed_opt.conversions.preflight`)
also reads Keras optimizers and keras-rs configurations: it converts them
first, then asks the engine.

Importing this package needs no TensorFlow; the names that read TensorFlow's
configurations load `engines.checks` and `engines.sparsecore` on first use.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

from tf_tpu_embed_opt import lazy
from tf_tpu_embed_opt.engines.base import (
    ENGINES,
    EngineBehaviour,
    EngineReport,
    Setting,
    TableReport,
    check_engine_name,
)

__all__ = [
    "ENGINES",
    "EngineBehaviour",
    "SPARSECORE_OPTIMIZERS",
    "SparseCoreOptimizer",
    "Setting",
    "TableReport",
    "EngineReport",
    "behaviour_of",
    "check_configuration",
    "check_engine_name",
    "sparsecore_equivalent",
]

# Names of the TensorFlow engines' modules, loaded on first use.
_LAZY = {
    "check_configuration": "checks",
    "check_optimizer": "checks",
    "check_arguments": "checks",
    "finish": "checks",
    "flatten": "checks",
    "table_report": "checks",
    "name_refusals": "checks",
    "named_tables": "checks",
    "tables_of": "checks",
    "with_stacks": "checks",
    "SPARSECORE_OPTIMIZERS": "sparsecore",
    "SparseCoreOptimizer": "sparsecore",
    "sparsecore_equivalent": "sparsecore",
}


_lazy_getattr = lazy.module_getattr(__name__, _LAZY, globals())


def behaviour_of(engine: Any) -> EngineBehaviour:
    """What the engine `engine` (an `Engine`, or its name) does: its module
    here (`Engine.module`), loaded on first use (`TPUEmbeddingV2`'s reads
    TensorFlow's classes)."""
    engine = check_engine_name(engine, "behaviour_of")
    return importlib.import_module(f"{__name__}.{engine.module}")


def __getattr__(name: str) -> Any:
    if name == "check_engine":
        warnings.warn(
            "tf_tpu_embed_opt.engines.check_engine is deprecated (one "
            "check_engine: tf_tpu_embed_opt.check_engine, which reads every "
            "configuration); tf_tpu_embed_opt.engines.check_configuration is "
            "what it was (embedding-face configurations only).",
            DeprecationWarning,
            stacklevel=2,
        )
        return _lazy_getattr("check_configuration")
    return _lazy_getattr(name)


# Every lazy name reads TensorFlow's classes: without TensorFlow `dir()`
# leaves them out, so that `help()` of this package works there.
_NEED_TENSORFLOW = frozenset(_LAZY)
__dir__ = lazy.module_dir({*__all__, *_LAZY}, _NEED_TENSORFLOW)
