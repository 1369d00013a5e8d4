"""Checkpoint keys of variables tracked in an object graph, without TensorFlow.

`tf.train.Checkpoint` names a variable's tensor by the path of local names
from the root to the variable, each escaped (`trackable_utils.escape_local_name`:
"." doubles, "/" becomes ".S"), joined by "/" and followed by
`/.ATTRIBUTES/VARIABLE_VALUE`. Both checkpoint layouts of the package
(`checkpoints`, TensorFlow-backed, and `sparsecore_layout`, which loads without
TensorFlow) build their keys here.
"""

from typing import Any, Callable, Optional, Sequence

import numpy as np

__all__ = [
    "STEP_PATH",
    "VALUE_SUFFIX",
    "escape",
    "unescape",
    "checked_step_path",
    "checkpoint_key",
    "recorded_step",
    "step_value",
    "variable_at",
]

# What follows a variable's path in its key.
VALUE_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"

# Where the package writes the training step in a TensorFlow checkpoint (an
# int64 scalar at the root), and where its readers look for it.
STEP_PATH = "step"


def escape(local_name: str) -> str:
    """`local_name` as a checkpoint key spells it ("." -> "..", "/" -> ".S")."""
    return local_name.replace(".", "..").replace("/", ".S")


def unescape(escaped: str) -> str:
    """The local name that `escape` turned into `escaped`."""
    out, i = [], 0
    while i < len(escaped):
        pair = escaped[i : i + 2]
        if pair in ("..", ".S"):
            out.append("." if pair == ".." else "/")
            i += 2
        else:
            out.append(escaped[i])
            i += 1
    return "".join(out)


def checkpoint_key(object_path: Sequence[str], local_name: str) -> str:
    """The checkpoint key of a variable tracked as `local_name` under `object_path`.

    Args:
      object_path: Local names from the checkpoint's root to the object that
        tracks the variable, e.g. `("embedding",)`.
      local_name: The variable's local name, e.g. `"user"` or
        `"user/accumulators"`.

    Returns:
      E.g. `"embedding/user.Saccumulators/.ATTRIBUTES/VARIABLE_VALUE"`.

    Raises:
      TypeError: `object_path` is a string (it would be read letter by
        letter) or no sequence.
    """
    if isinstance(object_path, str) or not isinstance(object_path, Sequence):
        raise TypeError(
            "checkpoint_key: argument `object_path` must be a sequence of local "
            f"names, e.g. ('embedding',); received {object_path!r}."
        )
    return "/".join(escape(name) for name in (*object_path, local_name)) + VALUE_SUFFIX


def variable_at(
    prefix: str, object_path: str, has: Callable[[str], bool], get: Callable[[str], Any]
) -> Any:
    """The value of the variable at `object_path` (`"a/b/step"`) of the
    TensorFlow checkpoint `prefix`, read with `has(key)` and `get(key)`.

    Raises:
      ValueError: No variable there.
    """
    parts = object_path.split("/")
    key = checkpoint_key(parts[:-1], parts[-1])
    if not has(key):
        raise ValueError(
            f"Checkpoint {prefix!r} has no variable at {object_path!r} (key {key!r})."
        )
    return get(key)


def step_value(value: Any, object_path: str, path: str) -> int:
    """`value`, the variable at `object_path` of checkpoint `path`, as a step.

    Raises:
      ValueError: It is no integer scalar >= 0 (a float step is not rounded,
        nor an array taken for one).
    """
    array = np.asarray(value)
    if array.shape != () or array.dtype.kind not in "iu" or array < 0:
        shown = str(array[()]) if array.shape == () else f"of shape {array.shape}"
        raise ValueError(
            f"Checkpoint {path!r}: the variable at {object_path!r} is no step "
            f"(an integer >= 0): it holds {array.dtype.name} {shown}."
        )
    return int(array)


def recorded_step(
    read_scalar: Callable[[str], Any], path: str, at: Optional[str] = None
) -> Optional[int]:
    """The step the TensorFlow checkpoint at `path` records, read with
    `read_scalar` (which raises `ValueError` where no variable is): at `at`,
    or where `None` at `STEP_PATH` (`None` where no variable is there).

    Raises:
      ValueError: No variable at `at`, or the variable read is no step
        (`step_value`).
    """
    if at is not None:
        return step_value(read_scalar(at), at, path)
    try:
        value = read_scalar(STEP_PATH)
    except ValueError:
        return None
    return step_value(value, STEP_PATH, path)


def checked_step_path(step_path: Any, function: str) -> Optional[str]:
    """`step_path`, where `function` reads a TensorFlow checkpoint's step,
    once it is `None` (at `STEP_PATH`) or names a variable.

    Raises:
      TypeError: It is neither `None` nor a string.
      ValueError: It is a string naming no path (`""`, `"/"`).
    """
    if step_path is None or (isinstance(step_path, str) and step_path.strip("/")):
        return step_path
    error = ValueError if isinstance(step_path, str) else TypeError
    raise error(
        f"{function}: argument `step_path` must be a '/'-separated string such "
        f"as 'global_step', or None (the step at '{STEP_PATH}'); received "
        f"{step_path!r}."
    )
