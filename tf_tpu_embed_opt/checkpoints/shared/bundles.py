"""TensorFlow checkpoint files, read and written the same way by both
TensorFlow layouts (`tpu_embedding/`, `sparsecore/`).

`open_bundle` opens one, its errors said in one line naming the path;
`bytes_present_and_needed` tells a truncated one from its index; `Staging`
writes one under a temporary name beside its prefix, a bundle per `save`, and
`publish` merges them and moves the result into place, its index last, so
that no reader ever pairs an index with data that is not complete. Paths go
through `tf.io.gfile`, so remote ones (`gs://...`) work as local ones.
TensorFlow is imported when they are called.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from tf_tpu_embed_opt.checkpoints.shared.paths import (
    checkpoint_prefix,
    first_line,
    make_directory,
)

__all__ = ["Staging", "bytes_present_and_needed", "open_bundle"]


def open_bundle(path: Any, argument: str = "path") -> Tuple[str, Any]:
    """The checkpoint prefix `path` stands for and TensorFlow's reader of it.

    Raises:
      TypeError: `path` is not a path.
      ValueError: No readable TensorFlow checkpoint is there.
    """
    import tensorflow as tf

    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(
            f"`{argument}` must be a checkpoint prefix or directory (str); "
            f"received {path!r} of type {type(path).__name__}."
        )
    path = os.fspath(path)
    prefix = checkpoint_prefix(path, argument)
    try:
        return prefix, tf.train.load_checkpoint(prefix)
    except Exception as error:  # noqa: BLE001 - TensorFlow's own, many kinds
        raise ValueError(
            f"`{argument}` {path!r} is not a readable TensorFlow checkpoint: "
            f"{first_line(error)}"
        ) from None


def bytes_present_and_needed(reader: Any, prefix: str) -> Tuple[int, int]:
    """The bytes of the data files at `prefix`, and those its tensors need
    at least (the files hold them uncompressed: fewer means truncated)."""
    import tensorflow as tf

    dtypes = reader.get_variable_to_dtype_map()
    needed = sum(
        int(np.prod(shape, dtype=np.int64)) * dtypes[key].size
        for key, shape in reader.get_variable_to_shape_map().items()
        if dtypes[key] not in (tf.string, tf.variant, tf.resource)
    )
    files = tf.io.gfile.glob(prefix + ".data-*")
    return sum(tf.io.gfile.stat(name).length for name in files), needed


class Staging:
    """A checkpoint written under a temporary directory beside `prefix`.

    Use it as a context manager: the directory is made on entry and removed
    on exit, whatever happened; `save` writes a bundle there, `publish`
    merges every bundle saved and moves the checkpoint to `prefix`.

    Args:
      prefix: The checkpoint prefix to write (checked by the caller).
      argument: The caller's argument naming it, for errors.
    """

    def __init__(self, prefix: str, argument: str) -> None:
        self.prefix = prefix
        self._argument = argument
        parent = os.path.dirname(prefix) or "."
        self.directory = os.path.join(
            parent, f".{os.path.basename(prefix)}.tmp-{uuid.uuid4().hex}"
        )
        self._parts: List[str] = []

    def __enter__(self) -> "Staging":
        make_directory(os.path.dirname(self.directory), self._argument, self.prefix)
        make_directory(self.directory, self._argument, self.prefix)
        return self

    def __exit__(self, *exception: Any) -> None:
        import tensorflow as tf

        if tf.io.gfile.exists(self.directory):
            tf.io.gfile.rmtree(self.directory)

    def save(
        self,
        names: Sequence[str],
        slices: Sequence[str],
        tensors: Sequence[Any],
        device: Optional[str] = None,
    ) -> None:
        """One `SaveV2` bundle of `tensors` under `names` (`slices`: their
        `shape_and_slices`, `""` for whole ones), on `device` if given."""
        import tensorflow as tf

        part = os.path.join(self.directory, f"part-{len(self._parts):05d}")
        with contextlib.nullcontext() if device is None else tf.device(device):
            tf.raw_ops.SaveV2(
                prefix=part,
                tensor_names=list(names),
                shape_and_slices=list(slices),
                tensors=[_to_tensor(value) for value in tensors],
            )
        self._parts.append(part)

    def publish(self) -> None:
        """Merges the bundles and moves the checkpoint to the prefix: the old
        one stops being discoverable first (its index goes), then the data
        files move, then the index."""
        import tensorflow as tf

        merged = os.path.join(self.directory, "merged")
        tf.raw_ops.MergeV2Checkpoints(
            checkpoint_prefixes=self._parts,
            destination_prefix=merged,
            delete_old_dirs=False,
        )
        prefix = self.prefix
        if tf.io.gfile.exists(prefix + ".index"):
            tf.io.gfile.remove(prefix + ".index")
        for old in tf.io.gfile.glob(prefix + ".data-*"):
            tf.io.gfile.remove(old)
        for data in tf.io.gfile.glob(merged + ".data-*"):
            tf.io.gfile.rename(data, prefix + data[len(merged) :], overwrite=True)
        tf.io.gfile.rename(merged + ".index", prefix + ".index", overwrite=True)


def _to_tensor(value: Any) -> Any:
    import tensorflow as tf

    if not isinstance(value, np.ndarray):
        return value  # a tensor, or a shard saved on its own device
    # `tf.constant` copies a large float array several times slower than
    # memcpy; DLPack hands TensorFlow the array's memory (it keeps the array
    # alive). Strings and any array DLPack refuses take the copy.
    if value.dtype == np.float32:
        try:
            return tf.experimental.dlpack.from_dlpack(value.__dlpack__())
        except Exception:  # noqa: BLE001 - any refusal means "copy instead"
            pass
    return tf.constant(value)
