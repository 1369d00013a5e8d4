"""One optimizer definition for Keras layers and TPU embedding tables.

Large recommendation models train their dense layers with a Keras optimizer and
their embedding tables on the TPU embedding engine. This package defines each
optimizer once and gives it two faces with the same math:

Embedding face, `tf_tpu_embed_opt.embedding`:
    TPUEmbedding parameter classes. `SGD`, `Adagrad`, `AdagradMomentum`,
    `Adam` and `FTRL` are drop-in for `tf.tpu.experimental.embedding.*`;
    `Momentum`, `RMSProp`, `CenteredRMSProp`, `Adadelta`, `ProximalAdagrad`
    and `ProximalYogi` are engine optimizers TensorFlow has no class for.

Keras face, `tf_tpu_embed_opt.optimizers`:
    Keras 3 optimizers, one twin per embedding optimizer, with Keras's
    signatures and results on dense gradients, row-sparse and duplicate-aware
    on embedding gradients, able to compute exactly what the engine computes;
    plus the algorithms of the definitions that no engine runs.

Conversions:
    `to_keras(embedding_opt)` (the engine's math on CPU/GPU),
    `to_embedding(keras_opt)` (exact, or refused saying why), `to_proto` /
    `from_proto` (`tensorflow.tpu.OptimizationParameters`) and
    `tpu_embedding_configuration` (the `TPUEmbeddingConfiguration` a
    `TPUEmbedding` would send to the TPU, built on CPU).

Specs:
    `to_spec` / `from_spec` record any optimizer of either face in an
    `OptimizerSpec` message (the package's own proto), losslessly; a damaged
    or inconsistent spec is refused.

Checkpoints, `tf_tpu_embed_opt.checkpoints`:
    `open_checkpoint(path)` reads the tables and optimizer state of every
    TPU layout (TensorFlow's `TPUEmbedding` and SparseCore, jax-tpu-embedding
    and keras-rs steps) and of Keras, `write_checkpoint` writes them in any
    topology; `load_into_keras` and `save_tpu_checkpoint` move a Keras
    model's tables and slots to and from the TPU layout.

Command line (`tf-tpu-embed-opt`, or `python -m tf_tpu_embed_opt`):
    `describe ALGORITHM [--OPTION VALUE ...]` prints what the engine receives,
    the slots and the memory per table; `describe --from FILE` reads an
    `OptimizerSpec`; `demo` trains a small ranking model on CPU with stock
    Keras and with the package's twin and shows the difference;
    `checkpoint inspect|convert` says what a checkpoint holds and converts it
    between the layouts.

Example:
    >>> import tf_tpu_embed_opt as teo
    >>> table_opt = teo.embedding.Adagrad(learning_rate=0.1)
    >>> twin = teo.to_keras(table_opt)  # the engine's Adagrad on CPU/GPU

The public names are loaded on first use, so that the command line's `--help`
does not wait for TensorFlow. The Keras face runs on every Keras backend and
needs no TensorFlow (the `[jax]` extra: `pip install ".[jax]"` from a
checkout); the names that do need it (the embedding face, protos, engines,
checkpoints) raise an `ImportError` saying so when TensorFlow is not
installed.
"""

import importlib
import importlib.abc
import sys
import warnings
from typing import TYPE_CHECKING, Any, Optional, Sequence

from tf_tpu_embed_opt import lazy
from tf_tpu_embed_opt.errors import TensorFlowNotInstalled, tensorflow_needed_by

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs
    import tf_tpu_embed_opt.checkpoints as checkpoints
    from tf_tpu_embed_opt import embedding, engines, layers, optimizers
    from tf_tpu_embed_opt.checkpoints import sparsecore as sparsecore_layout
    from tf_tpu_embed_opt.checkpoints.keras import state as keras_state
    from tf_tpu_embed_opt.checkpoints.keras.save import save_tpu_checkpoint
    from tf_tpu_embed_opt.checkpoints.keras.state import load_into_keras
    from tf_tpu_embed_opt.conversions import multi_optimizer
    from tf_tpu_embed_opt.conversions.faces import to_embedding, to_keras
    from tf_tpu_embed_opt.conversions.multi_optimizer import (
        embedding_optimizers,
        keras_optimizer,
    )
    from tf_tpu_embed_opt.conversions.preflight import check_engine
    from tf_tpu_embed_opt.embedding.configuration import tpu_embedding_configuration
    from tf_tpu_embed_opt.embedding.proto import from_proto, to_proto
    from tf_tpu_embed_opt.engines import EngineReport
    from tf_tpu_embed_opt.layers import sharded
    from tf_tpu_embed_opt.optimizer_spec import OptimizerSpec, from_spec, to_spec

__version__ = "0.1.0"

__all__ = [
    "embedding",
    "optimizers",
    "layers",
    "from_proto",
    "to_proto",
    "to_embedding",
    "to_keras",
    "OptimizerSpec",
    "to_spec",
    "from_spec",
    "tpu_embedding_configuration",
    "engines",
    "check_engine",
    "EngineReport",
    "checkpoints",
    "keras_state",
    "multi_optimizer",
    "sparsecore_layout",
    "sharded",
    "load_into_keras",
    "save_tpu_checkpoint",
    "keras_optimizer",
    "embedding_optimizers",
    "TensorFlowNotInstalled",
    "__version__",
]

# Public name -> (the module that defines it, the attribute; None: the module).
_HOMES = {
    "embedding": ("tf_tpu_embed_opt.embedding", None),
    "optimizers": ("tf_tpu_embed_opt.optimizers", None),
    "layers": ("tf_tpu_embed_opt.layers", None),
    "from_proto": ("tf_tpu_embed_opt.embedding.proto", "from_proto"),
    "to_proto": ("tf_tpu_embed_opt.embedding.proto", "to_proto"),
    "to_embedding": ("tf_tpu_embed_opt.conversions.faces", "to_embedding"),
    "to_keras": ("tf_tpu_embed_opt.conversions.faces", "to_keras"),
    "OptimizerSpec": ("tf_tpu_embed_opt.optimizer_spec", "OptimizerSpec"),
    "to_spec": ("tf_tpu_embed_opt.optimizer_spec", "to_spec"),
    "from_spec": ("tf_tpu_embed_opt.optimizer_spec", "from_spec"),
    "tpu_embedding_configuration": (
        "tf_tpu_embed_opt.embedding.configuration",
        "tpu_embedding_configuration",
    ),
    "engines": ("tf_tpu_embed_opt.engines", None),
    "check_engine": ("tf_tpu_embed_opt.conversions.preflight", "check_engine"),
    "EngineReport": ("tf_tpu_embed_opt.engines", "EngineReport"),
    "checkpoints": ("tf_tpu_embed_opt.checkpoints", None),
    "keras_state": ("tf_tpu_embed_opt.checkpoints.keras.state", None),
    "multi_optimizer": ("tf_tpu_embed_opt.conversions.multi_optimizer", None),
    "sparsecore_layout": ("tf_tpu_embed_opt.checkpoints.sparsecore", None),
    "sharded": ("tf_tpu_embed_opt.layers.sharded", None),
    "load_into_keras": ("tf_tpu_embed_opt.checkpoints.keras.state", "load_into_keras"),
    "save_tpu_checkpoint": (
        "tf_tpu_embed_opt.checkpoints.keras.save",
        "save_tpu_checkpoint",
    ),
    "keras_optimizer": (
        "tf_tpu_embed_opt.conversions.multi_optimizer",
        "keras_optimizer",
    ),
    "embedding_optimizers": (
        "tf_tpu_embed_opt.conversions.multi_optimizer",
        "embedding_optimizers",
    ),
}

# Names that leave the top level (CHANGELOG, issue #56): they duplicated
# `checkpoints`, whose front door replaces them, and made `help()` document a
# per-format reader and a deprecated writer in full. Each access warns
# (`DeprecationWarning`) for one release: name -> (its home, what to use).
_LEAVING = {
    "TPUCheckpointReader": (
        "tf_tpu_embed_opt.checkpoints",
        "tf_tpu_embed_opt.checkpoints.open_checkpoint(path) (or "
        "tf_tpu_embed_opt.checkpoints.TPUCheckpointReader)",
    ),
    "write_tpu_checkpoint": (
        "tf_tpu_embed_opt.checkpoints",
        "tf_tpu_embed_opt.checkpoints.write_checkpoint(prefix, tables)",
    ),
}

# Modules of the flat layout before 0.2 -> their new homes (CHANGELOG, "Moved
# modules"). `from tf_tpu_embed_opt import registry` keeps working, with a
# DeprecationWarning naming the new path; they are not public names.
_MOVED = {
    "spec": "tf_tpu_embed_opt.definitions.spec",
    "registry": "tf_tpu_embed_opt.definitions.registry",
    "rules": "tf_tpu_embed_opt.definitions.rules",
    "tables": "tf_tpu_embed_opt.definitions.tables",
    "algorithms": "tf_tpu_embed_opt.definitions.algorithms",
    "proto": "tf_tpu_embed_opt.embedding.proto",
    "configuration": "tf_tpu_embed_opt.embedding.configuration",
    "clippy_adagrad": "tf_tpu_embed_opt.optimizers",
    "sparse": "tf_tpu_embed_opt.optimizers.sparse",
    "checkpoint_keys": "tf_tpu_embed_opt.checkpoints.shared.keys",
    "optimizer_spec_descriptor": "tf_tpu_embed_opt.optimizer_spec.descriptor",
    # Issue #55: the conversions and preflights gather in one folder.
    "convert": "tf_tpu_embed_opt.conversions.faces",
    "keras_differences": "tf_tpu_embed_opt.conversions.keras_reading",
    "learning_rates": "tf_tpu_embed_opt.conversions.learning_rates",
    "preflight": "tf_tpu_embed_opt.conversions.preflight",
    "preflight_jax": "tf_tpu_embed_opt.conversions.preflight_jax",
}
# `import tf_tpu_embed_opt.registry` and `from tf_tpu_embed_opt.registry
# import X` as well (the attribute form warns in `__getattr__` below).
lazy.serve_moved_modules({f"{__name__}.{old}": new for old, new in _MOVED.items()})


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        warnings.warn(
            f"tf_tpu_embed_opt.{name} moved to {_MOVED[name]}; import it from "
            "there (the old path will be removed).",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(_MOVED[name])
    if name in _LEAVING:
        home, instead = _LEAVING[name]
        warnings.warn(
            f"tf_tpu_embed_opt.{name} leaves the top level in the next release; "
            f"use {instead}.",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(home), name)
    if name not in _HOMES:
        raise AttributeError(f"module 'tf_tpu_embed_opt' has no attribute {name!r}")
    home, attribute = _HOMES[name]
    with tensorflow_needed_by(f"tf_tpu_embed_opt.{name}"):
        module = importlib.import_module(home)
        # A package may load the attribute's own module on first use.
        value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value  # later lookups skip __getattr__
    return value


# The public names whose homes import TensorFlow (tests/test_packaging.py
# checks this against what loads without it).
_NEED_TENSORFLOW = frozenset(
    {
        "embedding",
        "from_proto",
        "to_proto",
        "OptimizerSpec",
        "to_spec",
        "from_spec",
        "tpu_embedding_configuration",
        "sharded",
    }
)


__dir__ = lazy.module_dir(__all__, _NEED_TENSORFLOW)


# The modules whose import registers every Keras class of the package with
# Keras's serialization, each under its own name: the twins (and, on
# TensorFlow, `sharded.Embedding`), and the row-sparse layer.
_KERAS_MODULES = (
    "tf_tpu_embed_opt.optimizers",
    "tf_tpu_embed_opt.layers",
    # keras_optimizer's MultiOptimizer (TableMultiOptimizer).
    "tf_tpu_embed_opt.conversions.multi_optimizer",
)
_SUBMODULES = __name__ + "."


class _KerasRegistration(importlib.abc.MetaPathFinder):
    """Imports the Keras face and the layers once Keras has loaded.

    Importing them (`_KERAS_MODULES`) registers the Keras classes with Keras's
    serialization, so that `keras.saving.load_model` finds them after a plain
    `import tf_tpu_embed_opt` (which stays light: the `--help` of the command
    line does not wait for Keras or TensorFlow). Keras's loader reads the
    registered names only, and imports no module of a package that is not
    Keras's, so the classes must be registered before a model is loaded.

    The finder wraps the loader of `keras` so that the registration runs when
    Keras has finished executing, on every backend. With Keras's TensorFlow
    backend, TensorFlow may itself be the one importing Keras (as `tf.keras`);
    the Keras face then waits for TensorFlow to finish as well, since it uses
    TensorFlow. When a module of this package is the one importing Keras
    (`import tf_tpu_embed_opt.optimizers` before Keras), the registration
    waits until that module has finished too: the layers import the Keras
    face whole. So the finder also wraps the loaders of this package's
    modules while it waits. Then it leaves `sys.meta_path`. See
    docs/architecture.md, "Keras serialization".
    """

    def find_spec(
        self, fullname: str, path: Optional[Sequence[str]] = None, target: Any = None
    ) -> Any:
        if fullname not in ("keras", "tensorflow") and not fullname.startswith(
            _SUBMODULES
        ):
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        exec_module = getattr(spec.loader, "exec_module", None)
        if exec_module is not None:

            def exec_then_register(module: Any) -> None:
                exec_module(module)
                self._executed.add(fullname)
                self.register()

            spec.loader.exec_module = exec_then_register
        return spec

    def __init__(self) -> None:
        self._executed: set = set()

    def _loading(self, name: str) -> bool:
        """Whether module `name` is still being executed."""
        module = sys.modules.get(name)
        spec = getattr(module, "__spec__", None)
        return (
            module is not None
            and name not in self._executed
            and bool(getattr(spec, "_initializing", False))
        )

    def register(self) -> None:
        if "keras" not in sys.modules or self._loading("keras"):
            return
        if self._loading("tensorflow"):
            return  # registered when TensorFlow has finished
        if any(
            self._loading(name)
            for name in list(sys.modules)
            if name.startswith(_SUBMODULES)
        ):
            return  # registered when this package's module has finished
        if self in sys.meta_path:
            sys.meta_path.remove(self)
            for module in _KERAS_MODULES:
                importlib.import_module(module)


_registration = _KerasRegistration()
sys.meta_path.insert(0, _registration)
_registration.register()  # at once when Keras is already loaded
del _registration
