"""The Keras face: Keras 3 optimizers sharing the embedding optimizers' definitions.

One class per algorithm, generated from its definition
(`tf_tpu_embed_opt.definitions`): where Keras has the algorithm (`SGD`,
`Adagrad`, `Adam`, `Ftrl`, `RMSprop`, `Adadelta`) the class has Keras's name,
signature and defaults and matches Keras on dense gradients; TPU-engine
behaviour is opt-in through keyword arguments, and `tf_tpu_embed_opt.to_keras`
sets them so that the optimizer computes what the TPU embedding engine
computes. `LaProp` and `F2A` are the algorithms only jax-tpu-embedding has
(engine `"jax-tpu-embedding"`); a definition that no engine runs (a step
scaled per variable) has its class here too.

Modules: `twins` (the generated classes), `sparse` (summing
a sparse gradient's duplicate ids, inside and outside XLA) and `sharded`
(the twins' updates of tables sharded over parameter servers; their layer is
`tf_tpu_embed_opt.layers.sharded`).
"""

from tf_tpu_embed_opt import lazy
from tf_tpu_embed_opt.optimizers import backend, twins
from tf_tpu_embed_opt.optimizers.twins import (  # noqa: F401 - module attributes
    ENGINE_OPTIONS,
    TwinOptimizer,
    class_for,
)

# One class per algorithm of the registry, by its Keras name (`SGD`, `Ftrl`,
# `RMSprop`, `LaProp`, ...): derived from the definitions, so that a new
# algorithm's module and registry line are all it takes.
globals().update(twins.twin_classes())

__all__ = [*twins.twin_classes(), "TwinOptimizer"]

# The public path, as `keras_export` would set it (help(), pydoc, reprs).
TwinOptimizer.__module__ = __name__

# A hand-written class had a module of its own before issue #55; it is
# generated from its definition now, here like every other, and the old path
# imports this package, with a DeprecationWarning, for one release.
lazy.serve_moved_modules({f"{__name__}.clippy_adagrad": __name__})

if backend.BACKEND == "tensorflow":
    # Tools of the TensorFlow backend: summing a sparse gradient's duplicate
    # ids, and the size from which whole-variable updates compile with XLA.
    from tf_tpu_embed_opt.optimizers.sparse import deduplicate  # noqa: F401
    from tf_tpu_embed_opt.optimizers.tensorflow_twin import (  # noqa: F401
        XLA_MIN_ELEMENTS,
    )

    __all__.append("deduplicate")
