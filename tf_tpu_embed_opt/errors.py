"""The package's own exceptions: a part that needs TensorFlow (or the `[jax]`
extra's packages), without it.

Runs without TensorFlow (it is what says TensorFlow is missing).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import sys
from types import ModuleType
from typing import Iterator, Tuple

__all__ = [
    "TensorFlowNotInstalled",
    "keras_backend_setting",
    "JaxNotInstalled",
    "is_jax_missing",
    "import_from_jax_extra",
    "needs_tensorflow",
    "needs_keras_backend",
    "keras_backend_missing",
    "is_tensorflow_missing",
    "require_tensorflow",
    "tensorflow_installed",
    "tensorflow_needed_by",
    "tensorflow_op_errors",
    "keras_optimizer_note",
    "tf_keras_note",
    "type_path",
]


class TensorFlowNotInstalled(ModuleNotFoundError):
    """Raised by a part of the package that needs TensorFlow, which is not
    installed (the embedding face, the TensorFlow engines, checkpoints in the
    TensorFlow layouts). A `ModuleNotFoundError` for `tensorflow`, whose
    message says which extra installs it and what runs without it; with
    `keras_backend=True` (Keras itself failed to import its TensorFlow
    backend), that Keras is set to it, and to set `KERAS_BACKEND=jax` where
    JAX is installed."""

    def __init__(self, what: str, keras_backend: bool = False) -> None:
        if keras_backend and importlib.util.find_spec("jax") is not None:
            message = needs_keras_backend(what)
        else:
            message = needs_tensorflow(what)
        super().__init__(message, name="tensorflow")


def keras_backend_setting() -> str:
    """The backend Keras will run on, read as Keras reads it but without
    importing Keras: `KERAS_BACKEND`, else the `backend` of
    `$KERAS_HOME/keras.json` (`~/.keras/keras.json`), else `"tensorflow"`."""
    if os.environ.get("KERAS_BACKEND"):
        return os.environ["KERAS_BACKEND"]
    home = os.environ.get("KERAS_HOME") or os.path.join(
        os.path.expanduser("~"), ".keras"
    )
    try:
        with open(os.path.join(home, "keras.json"), encoding="utf-8") as handle:
            backend = json.load(handle).get("backend")
    except (OSError, ValueError, AttributeError):
        backend = None
    return backend if isinstance(backend, str) and backend else "tensorflow"


def needs_keras_backend(what: str) -> str:
    """The message where Keras could not import its TensorFlow backend and
    JAX is installed (a `[jax]` install without `KERAS_BACKEND=jax`)."""
    return (
        f"{what} needs Keras, which is set to its '{keras_backend_setting()}' "
        "backend here (KERAS_BACKEND is unset, or keras.json names it), and "
        "TensorFlow is not installed; JAX is: set KERAS_BACKEND=jax (the "
        "Keras face, layers and engine='jax-tpu-embedding' run there without "
        "TensorFlow), or install TensorFlow (the `[cpu]` extra)."
    )


def keras_backend_missing(error: BaseException) -> bool:
    """Whether `error` (or an error it was raised from) is Keras failing to
    import its TensorFlow backend (TensorFlow not installed): a missing
    `tensorflow` raised from inside Keras's own modules."""
    while error is not None:
        frame = error.__traceback__ if is_tensorflow_missing(error) else None
        while frame is not None:
            module = frame.tb_frame.f_globals.get("__name__") or ""
            if module.split(".")[0] == "keras":
                return True
            frame = frame.tb_next
        error = error.__cause__
    return False


def needs_tensorflow(what: str) -> str:
    """The message: `what` needs TensorFlow, how to install it, what does not."""
    return (
        f"{what} needs TensorFlow 2.16-2.21, which is not installed here (this "
        "package does not install it by default, so that a TPU VM keeps its "
        "own build). Install one extra, e.g. from a checkout `pip install "
        "'.[cpu]'`: `[cpu]` (tensorflow-cpu), `[tensorflow]` (tensorflow) or "
        "`[tpu]` (tensorflow-tpu). The Keras face (tf_tpu_embed_opt.optimizers, "
        "layers) and engine='jax-tpu-embedding' run without TensorFlow on "
        "Keras's JAX backend (`[jax]`)."
    )


class JaxNotInstalled(ModuleNotFoundError):
    """Raised where a part needs the `[jax]` extra's packages (JAX,
    orbax-checkpoint, jax-tpu-embedding), which are not installed: orbax
    checkpoints, jax-tpu-embedding's custom specs."""

    def __init__(self, what: str, missing: str) -> None:
        super().__init__(
            f"{what} needs the package's `[jax]` extra (JAX, orbax-checkpoint, "
            "jax-tpu-embedding, on Python 3.11 and later; from a checkout: "
            f"pip install '.[jax]'); {missing!r} is not installed here.",
            name=missing,
        )


def is_jax_missing(error: BaseException) -> bool:
    """Whether `error` is an import of the `[jax]` extra's packages (JAX,
    orbax, TensorStore, jax-tpu-embedding) that failed for their absence."""
    return isinstance(error, ModuleNotFoundError) and (
        (error.name or "").split(".")[0]
        in ("jax", "jaxlib", "orbax", "tensorstore", "jax_tpu_embedding")
    )


def import_from_jax_extra(module: str, what: str) -> ModuleType:
    """`importlib.import_module(module)`, for a module that needs the `[jax]`
    extra's packages.

    Raises:
      JaxNotInstalled: One of those packages is missing; the message says
        `what` needs the extra. Any other import error is raised as it is (an
        installed but broken package is not reported as missing).
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        if not is_jax_missing(error):
            raise
        raise JaxNotInstalled(what, error.name) from error


def is_tensorflow_missing(error: BaseException) -> bool:
    """Whether `error` is an import of TensorFlow that failed for its absence."""
    return isinstance(error, ModuleNotFoundError) and (
        (error.name or "").split(".")[0] == "tensorflow"
    )


@contextlib.contextmanager
def tensorflow_needed_by(what: str) -> Iterator[None]:
    """Turns a failed import of TensorFlow inside the block into
    `TensorFlowNotInstalled` naming `what` (a public name), as every lazy
    name of the package raises it; any other error passes through."""
    try:
        yield
    except ModuleNotFoundError as error:
        if isinstance(error, TensorFlowNotInstalled) or not is_tensorflow_missing(
            error
        ):
            raise
        raise TensorFlowNotInstalled(
            what, keras_backend=keras_backend_missing(error)
        ) from error


def require_tensorflow(what: str) -> None:
    """Raises `TensorFlowNotInstalled` naming `what` (the call, and what
    runs without TensorFlow) where TensorFlow is not installed: for a part
    that needs it before it imports it."""
    if not tensorflow_installed():
        raise TensorFlowNotInstalled(what)


def tensorflow_installed() -> bool:
    """Whether TensorFlow imports (importing it: the answer is then certain)."""
    try:
        import tensorflow  # noqa: F401
    except ModuleNotFoundError as error:
        if not is_tensorflow_missing(error):
            raise
        return False
    return True


def tensorflow_op_errors() -> Tuple[type, ...]:
    """`(tf.errors.OpError,)` where TensorFlow is loaded, else `()`: for an
    `except` that must not import TensorFlow to name its errors."""
    tensorflow = sys.modules.get("tensorflow")
    return (tensorflow.errors.OpError,) if tensorflow is not None else ()


def tf_keras_note(value: object) -> str:
    """What a refusal of `value` adds where it is an object of tf_keras
    (Keras 2), read from its class's module without importing tf_keras:
    `tf.keras` is tf_keras under TF_USE_LEGACY_KERAS=1, where a user's
    `tf.keras.optimizers.Adagrad` looks like a Keras optimizer but is Keras
    2's. `""` for any other value."""
    if type(value).__module__.split(".")[0] != "tf_keras":
        return ""
    return (
        ", an optimizer of tf_keras (Keras 2, which `tf.keras` is under "
        "TF_USE_LEGACY_KERAS=1), not of Keras 3; build the same optimizer "
        "from keras.optimizers"
    )


def type_path(value: object) -> str:
    """Where the class of `value` is found, for an error: a Keras class by
    its public path (`keras.optimizers.Adam`, not this package's `Adam`;
    `keras.layers.Dense`), a builtin by its name, anything else by module
    and qualified name (a user's subclass of a Keras class too)."""
    cls = type(value)
    parts = cls.__module__.split(".")
    keras = sys.modules.get("keras")
    if keras is not None and parts[:2] == ["keras", "src"]:
        # The longest public namespace that holds the class itself:
        # keras.src.layers.core.dense -> keras.layers.
        for end in range(len(parts), 2, -1):
            namespace = keras
            for part in parts[2:end]:
                namespace = getattr(namespace, part, None)
            if namespace is not None and getattr(namespace, cls.__name__, None) is cls:
                return ".".join(["keras", *parts[2:end], cls.__name__])
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


def keras_optimizer_note(value: object) -> str:
    """What a refusal of `value` where an embedding optimizer belongs adds
    where `value` is a Keras optimizer: which function converts one. `""`
    for any other value (a Keras layer or schedule too). Keras is not
    imported: where it is not loaded, no value is of its classes."""
    keras = sys.modules.get("keras")
    if keras is None or not isinstance(value, keras.optimizers.Optimizer):
        return ""
    return (
        " (a Keras optimizer; tf_tpu_embed_opt.to_embedding converts one, "
        "exactly or refused)"
    )
