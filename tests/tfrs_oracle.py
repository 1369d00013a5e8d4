"""TF Recommenders' `ClippyAdagrad` on legacy Keras 2, in a Keras 3 process.

The oracle of `tests/test_clippy_adagrad.py` and a reference of
`benchmarks/sparse_step/`. TFRS's optimizer needs legacy Keras 2
(`tf_keras`) as `tf.keras`; its single module file is executed with
`import tensorflow` bound to a view of TensorFlow whose `keras` is `tf_keras`
(`TF_USE_LEGACY_KERAS` would only work if set before anything touches
`tf.keras`, and the package `tensorflow_recommenders` itself refuses to import
under Keras 3).
"""

from __future__ import annotations

import builtins
import functools
import importlib.util
import pathlib
import types
from typing import Any, Optional, Tuple

import tensorflow as tf


@functools.lru_cache(maxsize=None)
def load_clippy_adagrad() -> Tuple[Optional[type], str]:
    """TFRS's `ClippyAdagrad` class on `tf_keras`, or `(None, why not)`.

    Loaded once per process: the suite's oracle probe and the tests share it.
    """
    try:
        import tf_keras
    except Exception as error:  # ImportError, or a TensorFlow mismatch.
        return None, f"tf_keras (legacy Keras 2) is not importable: {error}"
    spec = importlib.util.find_spec("tensorflow_recommenders")
    if spec is None or not spec.submodule_search_locations:
        return None, "tensorflow_recommenders is not installed"
    path = pathlib.Path(spec.submodule_search_locations[0]).joinpath(
        "experimental", "optimizers", "clippy_adagrad.py"
    )
    if not path.is_file():
        return None, f"tensorflow_recommenders has no {path}"

    class _TensorFlowOnTfKeras(types.ModuleType):
        """`tensorflow` whose `keras` attribute is legacy `tf_keras`."""

        def __getattr__(self, name: str) -> Any:
            return getattr(tf, name)

    view = _TensorFlowOnTfKeras("tensorflow")
    view.keras = tf_keras
    real_import = builtins.__import__

    def _import(name, globals=None, locals=None, fromlist=(), level=0):
        if name == "tensorflow" and level == 0 and not fromlist:
            return view
        return real_import(name, globals, locals, fromlist, level)

    namespace = {
        "__name__": "tfrs_clippy_adagrad_oracle",
        "__file__": str(path),
        "__builtins__": {**vars(builtins), "__import__": _import},
    }
    try:
        exec(compile(path.read_text(), str(path), "exec"), namespace)
        return namespace["ClippyAdagrad"], ""
    except Exception as error:  # pragma: no cover - depends on the install
        return None, f"TFRS's clippy_adagrad.py did not load on tf_keras: {error!r}"
