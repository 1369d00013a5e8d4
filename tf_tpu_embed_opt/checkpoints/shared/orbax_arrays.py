"""Row slices of one array of an orbax checkpoint, read without the rest.

Orbax stores each array of a pytree item as a zarr array (zarr v2 or v3, as
the item's metadata says) in TensorStore, inside one OCDBT database per item
(`manifest.ocdbt`) or as files of their own; the array's name in the store
is its key path joined with `.` (orbax's `param_name_from_keypath`). Reading
one table's rows of a stacked array is one TensorStore read with an index
array: each chunk holding such rows is read and decoded once (orbax chunks an
array saved from a sharded `jax.Array` by its shards, one saved from the host
not at all), and nothing else is read. Where TensorStore
cannot open the array (an orbax release that stores it otherwise), the array
is restored whole through orbax and cut, which gives the same values.

Used by `jax_orbax` (reading a table is reading its rows of every shard) and
by `load_into_keras` through `JaxCheckpointReader.read_rows` (a table
sharded over parameter servers, shard by shard). No TensorFlow is needed.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Tuple

import numpy as np

__all__ = ["StoredArray"]


class StoredArray:
    """One array of an orbax item, read by row slices.

    Args:
      directory: The item's directory (it holds `_METADATA`).
      path: The array's key path in the item's tree.
      use_zarr3: Whether the item stores zarr v3 arrays (its metadata says).
      restore_whole: Restores the whole array through orbax (the fallback).
    """

    def __init__(
        self,
        directory: str,
        path: Tuple[Any, ...],
        use_zarr3: bool,
        restore_whole: Callable[[], np.ndarray],
    ) -> None:
        self._directory = directory
        self._path = path
        self._use_zarr3 = use_zarr3
        self._restore_whole = restore_whole
        self._store: Any = None

    def _open(self) -> Any:
        if self._store is None:
            try:
                import tensorstore as ts
            except ImportError:  # pragma: no cover - orbax depends on it
                self._store = False
                return self._store
            name = ".".join(str(key) for key in self._path)
            base = f"file://{os.path.abspath(self._directory)}/"
            if os.path.isfile(os.path.join(self._directory, "manifest.ocdbt")):
                kvstore = {"driver": "ocdbt", "base": base, "path": name}
            else:
                kvstore = {"driver": "file", "path": base[len("file://") :] + name}
            spec = {
                "driver": "zarr3" if self._use_zarr3 else "zarr",
                "kvstore": kvstore,
            }
            try:
                self._store = ts.open(spec, open=True, read=True).result()
            except (ValueError, RuntimeError):
                # Not where this orbax release puts it: orbax restores it.
                self._store = False
        return self._store

    def read(self) -> Callable[[], np.ndarray]:
        """Starts reading the whole array; returns what gives it (as a NumPy
        array) once read, so that several arrays are read concurrently."""
        store = self._open()
        if store is False:
            return lambda: np.asarray(self._restore_whole())
        future = store.read()
        return lambda: np.asarray(future.result())

    def take(self, rows: np.ndarray, columns: int) -> np.ndarray:
        """`array[rows, :columns]` (`rows` an integer index array), as a new
        NumPy array, in one read: each chunk of the array that holds such a
        row is read and decoded once."""
        store = self._open()
        if store is False:
            return np.asarray(self._restore_whole())[rows, :columns]
        return np.asarray(store[rows, :columns].read().result())

    def rows(self, start: int, stop: int, columns: int) -> np.ndarray:
        """`array[start:stop, :columns]`, as a new NumPy array: only the
        chunks holding those rows are read."""
        store = self._open()
        if store is False:
            return np.asarray(self._restore_whole())[start:stop, :columns]
        return np.asarray(store[start:stop, :columns].read().result())
