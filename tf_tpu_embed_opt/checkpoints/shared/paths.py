"""Checkpoint paths: the prefix a directory stands for, where one can be
written and the step an orbax step directory's name says; and the one check
of the checkpoint functions' count arguments (`checked_int`: steps, byte
budgets, block sizes).

Both sides answer in one `ValueError` naming the argument, where TensorFlow
would log `Couldn't match files` and go on, or fail half-way with its own
`NotFoundError`, `FailedPreconditionError` or `PermissionDeniedError`.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator, Optional

import numpy as np

__all__ = [
    "checkpoint_prefix",
    "orbax_step",
    "checked_int",
    "writable_prefix",
    "writable_root",
    "make_directory",
    "first_line",
    "names_differ",
]


def orbax_step(step_dir: str) -> Optional[int]:
    """The step of an orbax step directory: its name's number (`None` for
    another name)."""
    name = os.path.basename(os.path.normpath(step_dir))
    return int(name) if name.isdigit() else None


def checked_int(
    value: Any, argument: str, where: str, minimum: int, *, or_none: bool = False
) -> Any:
    """`value` if it is an int (not a bool) of at least `minimum` (or None,
    with `or_none`), else a ValueError naming `where`, the argument, what is
    allowed and what was received."""
    if value is None and or_none:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, np.integer))
        or value < minimum
    ):
        raise ValueError(
            f"{where}: argument `{argument}` must be an int >= {minimum}"
            + (" or None" if or_none else "")
            + f"; received {value!r}."
        )
    return value


def first_line(error: BaseException) -> str:
    """`Class: first line` of an error (TensorFlow's run on for pages)."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"


def checkpoint_prefix(path: str, argument: str = "path") -> str:
    """The checkpoint prefix `path` stands for.

    A directory stands for the checkpoint its `checkpoint` state file names
    (as `tf.train.latest_checkpoint` reads it); anything else is a prefix.

    Raises:
      ValueError: A directory without a state file, or whose state file names
        a checkpoint that does not exist (a stale state file).
    """
    import tensorflow as tf

    if not tf.io.gfile.isdir(path):
        return path
    state = tf.train.get_checkpoint_state(path)
    if state is None or not state.model_checkpoint_path:
        raise ValueError(
            f"`{argument}` {path!r} is a directory without a `checkpoint` state "
            "file; pass the checkpoint prefix (e.g. 'dir/ckpt-1')."
        )
    prefix = state.model_checkpoint_path
    if not os.path.isabs(prefix) and "://" not in prefix:
        prefix = os.path.join(path, prefix)
    if not tf.io.gfile.exists(prefix + ".index"):
        raise ValueError(
            f"`{argument}` {path!r}: its `checkpoint` state file names "
            f"{state.model_checkpoint_path!r}, and {prefix + '.index'!r} does "
            "not exist (a stale state file, or the checkpoint was moved); pass "
            "the checkpoint prefix."
        )
    return prefix


def writable_root(root: Any, where: str) -> str:
    """`root`, an orbax root directory, as a path, checked to be a directory
    this process can write or one it can make (nothing is made here).

    Args:
      root: The path given.
      where: How the refusals name it (e.g. "write_checkpoint: argument
        `path`", or the command line's "`DST`").

    Raises:
      TypeError: Not a path.
      ValueError: Empty, a file, or under a file or a directory this process
        cannot write.
    """
    if not isinstance(root, (str, os.PathLike)):
        raise TypeError(
            f"{where} must be a path; received {root!r} of type {type(root).__name__}."
        )
    root = os.fspath(root)
    if not root.strip():
        raise ValueError(f"{where} is empty.")
    if os.path.exists(root) and not os.path.isdir(root):
        raise ValueError(
            f"{where} {root!r} is a file; it must be the orbax root directory "
            "the step goes into."
        )
    existing = os.path.abspath(root)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing) or not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(
            f"{where} {root!r} cannot be written: {existing!r} is "
            + ("a file." if not os.path.isdir(existing) else "not writable here.")
        )
    return root


def writable_prefix(prefix: Any, argument: str = "prefix") -> str:
    """`prefix` as a string, checked to name a checkpoint that can be written.

    Raises:
      TypeError: Not a path.
      ValueError: Empty, a directory (or ending with a separator), under a
        file, or in a directory this process cannot write.
    """
    if not isinstance(prefix, (str, os.PathLike)):
        raise TypeError(
            f"`{argument}` must be a checkpoint prefix (str); received "
            f"{prefix!r} of type {type(prefix).__name__}."
        )
    prefix = os.fspath(prefix)
    example = os.path.join(prefix.rstrip("/" + os.sep) or ".", "ckpt")
    if not prefix.strip():
        raise ValueError(
            f"`{argument}` must name a checkpoint prefix such as 'out/ckpt' "
            f"(files out/ckpt.index, out/ckpt.data-*); received {prefix!r}."
        )
    if "://" in prefix:  # a file system of TensorFlow's (gs://, ...)
        return prefix
    if prefix.endswith(("/", os.sep)) or os.path.isdir(prefix):
        raise ValueError(
            f"`{argument}` {prefix!r} names a directory; a checkpoint prefix "
            f"names files in one: pass e.g. {example!r}."
        )
    parent = os.path.dirname(os.path.abspath(prefix))
    existing = parent
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise ValueError(
            f"`{argument}` {prefix!r}: {existing!r} is a file, so no directory "
            "can be made under it."
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(
            f"`{argument}` {prefix!r}: this process may not write into {existing!r}."
        )
    return prefix


def make_directory(directory: str, argument: str, prefix: str) -> None:
    """Makes `directory` for the checkpoint `prefix`, or says why it cannot."""
    import tensorflow as tf

    try:
        tf.io.gfile.makedirs(directory)
    except (tf.errors.OpError, OSError) as error:
        raise ValueError(
            f"`{argument}` {prefix!r}: cannot make the directory {directory!r}: "
            f"{first_line(error)}"
        ) from None


def names_differ(first: Any, second: Any, only_first: str, only_second: str) -> str:
    """`""` where the names in `first` and `second` are the same, else the
    clauses of an error saying which are in one only: `only_first` and
    `only_second` with `{}` for the sorted names, joined by "; "."""
    clauses = [
        text.format(names)
        for text, names in (
            (only_first, sorted(set(first) - set(second))),
            (only_second, sorted(set(second) - set(first))),
        )
        if names
    ]
    return "; ".join(clauses)


@contextlib.contextmanager
def errors_named(what: str, after: str = "") -> Iterator[None]:
    """A failed read becomes one `ValueError`: `what`, the error's first
    line, then `after` (a reader names the table and the array it read)."""
    try:
        yield
    except Exception as error:  # noqa: BLE001 - named by the reader
        raise ValueError(f"{what}: {first_line(error)}{after}") from error
