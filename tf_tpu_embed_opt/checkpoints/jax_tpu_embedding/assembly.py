"""The stacked arrays of a jax-tpu-embedding step, assembled table by table,
and how orbax writes them (`jax_orbax_writer.write_jax_checkpoint`).

Each table is placed in its stack's arrays as it comes and let go: in
memory, or, above a size, in memory-mapped files. Orbax writes them from
where they are, in chunks of at most `CHUNK_BYTES`.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping, Optional

import numpy as np

from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import reader as jax_orbax
from tf_tpu_embed_opt.checkpoints.shared import orbax_items
from tf_tpu_embed_opt.checkpoints.shared import stacks as sparsecore_stacks
from tf_tpu_embed_opt.checkpoints.shared.table_info import PARAMETERS
from tf_tpu_embed_opt.definitions import spec

# The largest chunk of a stacked array the writer stores (zarr chunks of
# whole rows): what writing holds per array at a time, and the least that
# reading one row of it decodes.
CHUNK_BYTES = 64 << 20


class Assembly:
    """The stacked arrays of a step, assembled table by table as the tables
    come (each table is placed in its stack's arrays and let go): in memory
    while the stacks there take at most `spill_bytes` together, the next
    ones in memory-mapped files under `scratch`, so that about one block of
    a table is in memory at a time."""

    def __init__(
        self,
        by_stack: Mapping[str, List[Any]],
        definitions: Mapping[str, spec.Definition],
        pad_value: float,
        spill_bytes: Optional[int],
        scratch: str,
    ) -> None:
        self._by_stack = by_stack
        self._definitions = definitions
        self._pad_value = pad_value
        self._spill_bytes = spill_bytes
        self._scratch = scratch
        self.arrays: Dict[str, Dict[str, np.ndarray]] = {}

    @property
    def spilled(self) -> bool:
        """Whether some stack is assembled in memory-mapped files."""
        return any(
            isinstance(a, np.memmap)
            for arrays in self.arrays.values()
            for a in arrays.values()
        )

    def add(self, layout: Any, state: Mapping[str, np.ndarray]) -> None:
        # Every table is float32 (the writer refuses another dtype first), so
        # the tables of a stack agree.
        stack = layout.stacked_table_name
        if stack not in self.arrays:
            self.arrays[stack] = self._allocate(layout, state)
        arrays = self.arrays[stack]
        for key, value in state.items():
            sparsecore_stacks.place_table(
                arrays[key], value, layout, pad_value=self._pad_value
            )

    def _allocate(
        self, layout: Any, state: Mapping[str, np.ndarray]
    ) -> Dict[str, np.ndarray]:
        dtype = state[PARAMETERS].dtype
        shape = sparsecore_stacks.stacked_shape(layout)
        nbytes = len(state) * int(np.prod(shape)) * dtype.itemsize
        in_memory = sum(
            a.nbytes
            for arrays in self.arrays.values()
            for a in arrays.values()
            if not isinstance(a, np.memmap)
        )
        spill = self._spill_bytes is not None and (
            in_memory + nbytes > self._spill_bytes
        )
        arrays = {}
        for position, key in enumerate(state):
            if spill:
                path = os.path.join(self._scratch, f"{len(self.arrays)}-{position}.npy")
                arrays[key] = np.lib.format.open_memmap(
                    path, mode="w+", dtype=dtype, shape=shape
                )
            else:
                arrays[key] = _aligned_zeros(shape, dtype)
        return arrays

    def named(self, stack: str, naming: str) -> Dict[str, Any]:
        """One stack's variables, named as `naming` says (`named_arrays`)."""
        definition = self._definitions[self._by_stack[stack][0].table_name]
        return named_arrays(stack, self.arrays[stack], definition, naming)


# What JAX's CPU client needs to use a host array in place (DLPack): an
# array less aligned is copied.
_ALIGNMENT = 64


def _aligned_zeros(shape: Any, dtype: np.dtype) -> np.ndarray:
    """`np.zeros(shape, dtype)` whose data starts on a `_ALIGNMENT`-byte
    boundary (memory-mapped files start on a page)."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.zeros(nbytes + _ALIGNMENT, np.uint8)
    offset = -raw.ctypes.data % _ALIGNMENT
    return raw[offset : offset + nbytes].view(dtype).reshape(shape)


def as_jax_arrays(named: Mapping[str, Any]) -> Dict[str, Any]:
    """`named` (a stack's variables, `named_arrays`) with each array a
    `jax.Array` on the CPU that uses the array's memory in place (DLPack;
    the assembly's arrays are aligned for it, so the step is not held
    twice). Orbax records a `jax.Array` with its sharding, so that a restore
    without a target, as jax-tpu-embedding's `convert_cross_topology_checkpoint`
    makes, gives arrays that have one (a NumPy array has none)."""
    import jax

    def convert(value: Any) -> Any:
        if isinstance(value, np.ndarray):
            return jax.dlpack.from_dlpack(value)
        return value

    return jax.tree_util.tree_map(convert, dict(named))


def named_arrays(
    stack: str, arrays: Mapping[str, Any], definition: Any, naming: str
) -> Dict[str, Any]:
    """A stack's arrays (by engine name) named as `naming` says:
    jax-tpu-embedding's `{stack: {"table": ..., "slot": {...}}}` or
    keras-rs's `{"var:<stack>:table": ..., "var:<stack>:table:slot:<name>":
    ...}`."""
    names = jax_orbax.jax_slot_names(definition)
    arrays = dict(arrays)
    table = arrays.pop(PARAMETERS)
    if naming == orbax_items.KERAS_RS:
        named = {f"var:{stack}:table": table}
        named.update(
            {f"var:{stack}:table:slot:{names[k]}": v for k, v in arrays.items()}
        )
        return named
    slots = {names[k]: v for k, v in arrays.items()}
    return {stack: {"table": table, "slot": slots}}


def save_args(tree: Mapping[str, Any], stacks: Mapping[str, Any]) -> Any:
    """Orbax's save arguments for `tree`: the stacks' arrays in chunks of at
    most `CHUNK_BYTES` (orbax's default is one chunk per host array, which it
    encodes whole in memory and which a reader of some rows decodes whole);
    the other leaves as orbax's defaults."""
    import jax
    import orbax.checkpoint as ocp

    chunked = {id(leaf) for leaf in jax.tree_util.tree_leaves(stacks)}
    return jax.tree_util.tree_map(
        lambda leaf: ocp.SaveArgs(
            chunk_byte_size=CHUNK_BYTES if id(leaf) in chunked else None
        ),
        tree,
    )


# The first orbax whose NumPy handler can write an array without copying it.
WRITING_ORBAX = "0.12.5"


def check_writing_orbax(owner: str) -> None:
    """Refuses an orbax older than `WRITING_ORBAX` (it copies every host
    array it writes: a step held twice in memory, and a table larger than
    memory, given as row streams, copied into it whole).

    Raises:
      ImportError: naming `owner`, the version needed and the one installed.
    """
    import inspect
    from importlib import metadata

    import orbax.checkpoint as ocp

    handler = ocp.type_handlers.NumpyHandler
    if "deepcopy_host_arrays" in inspect.signature(handler).parameters:
        return
    raise ImportError(
        f"{owner} needs orbax-checkpoint {WRITING_ORBAX} or later (on Python "
        "3.11 or later), which writes NumPy arrays without copying them; "
        f"orbax-checkpoint {metadata.version('orbax-checkpoint')} is installed "
        "(it copies each array first, so a step would be held twice in memory)."
        " Reading steps works with it."
    )


def registry_without_copies() -> Any:
    """Orbax's type handlers, except that NumPy arrays are written from where
    they are: orbax's default copies every host array first (so that a
    training loop may change it during an asynchronous save), which would
    hold the step twice in memory; nothing changes these arrays while the
    step is saved here."""
    import orbax.checkpoint as ocp

    handlers = ocp.type_handlers
    return handlers.create_type_handler_registry(
        *[
            (
                kind,
                handlers.NumpyHandler(deepcopy_host_arrays=False)
                if kind is np.ndarray
                else handlers.get_type_handler(kind),
            )
            for kind in handlers.supported_types()
        ]
    )
