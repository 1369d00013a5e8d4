"""What a checkpoint says about one table, without TensorFlow.

Every reader of table states (the `TPUEmbedding` and SparseCore layouts, the
jax-tpu-embedding orbax layout) describes its tables with `TableInfo`, which
`load_into_keras` checks against the Keras targets before reading anything.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping, Optional, Tuple

import numpy as np

from tf_tpu_embed_opt.definitions import registry, spec

__all__ = [
    "PARAMETERS",
    "TableInfo",
    "algorithms_for_slots",
    "check_narrowing",
    "engine_float32",
    "engine_state",
    "narrows",
]

# The key of the table itself in a table state (as in TensorFlow's
# `TPUEmbedding._variables[table]`).
PARAMETERS = "parameters"


def engine_float32(value: Any) -> Any:
    """`value` (a NumPy array or a TensorFlow tensor) of float16 or
    bfloat16 as float32, which holds each of its values exactly: the dtype
    of the engines' tables. Any other value as it is (the engines' writers
    refuse another dtype by name: a float64 would round; so is a sharded
    variable, whose rows stay on its servers)."""
    # float32 holds every value of these; the engines' checkpoints are
    # float32 (TPUEmbedding's and SparseCore's tables, jax-tpu-embedding's
    # stacks).
    dtype = getattr(value, "dtype", None)
    if getattr(dtype, "name", None) not in spec.NARROW_FLOATS:
        return value
    if isinstance(value, np.ndarray):
        return value.astype(np.float32)
    if type(value).__module__.split(".")[0] == "tensorflow":
        import tensorflow as tf

        # Not a sharded variable: its rows stay on its servers.
        if isinstance(value, tf.Tensor):
            return tf.cast(value, tf.float32)
    return value


def engine_state(state: Mapping[str, Any]) -> Any:
    """A table state for an engine's checkpoint: each value through
    `engine_float32` (a Keras step of a float16 or bfloat16 table)."""
    return {key: engine_float32(value) for key, value in state.items()}


def narrows(stored: str, dtype: Optional[str]) -> bool:
    """Whether an array stored as `stored` loads into a variable of `dtype`
    only through `check_narrowing`: float32 (the engines') into float16 or
    bfloat16, the way back of `engine_float32` (None: into no variable)."""
    return stored == "float32" and dtype in spec.NARROW_FLOATS


def check_narrowing(value: Any, dtype: str, what: str) -> None:
    """Refuses a float32 `value` that `dtype` (float16 or bfloat16) does not
    hold exactly: the values `engine_float32` wrote do, any other rounds.

    Raises:
      ValueError: Naming `what`, the first such value, its index and what it
        would round to.
    """
    import ml_dtypes  # Keras's own dependency; NumPy has no bfloat16

    value = np.asarray(value)
    back = value.astype(getattr(ml_dtypes, dtype, dtype)).astype(value.dtype)
    inexact = (back != value) & ~(np.isnan(back) & np.isnan(value))
    if inexact.any():
        index = tuple(int(i) for i in np.unravel_index(np.argmax(inexact), value.shape))
        raise ValueError(
            f"{what} holds {value[index]!s} at {index}, which {dtype} does not "
            f"hold exactly (it would round to {back[index]!s}): a float32 "
            f"checkpoint loads into a {dtype} table only where every value is "
            f"a {dtype} value (as `save_tpu_checkpoint` writes a {dtype} "
            "table); nothing was loaded. Load it into float32 variables (a "
            "mixed_float16 / mixed_bfloat16 policy keeps them so), and cast "
            "them if rounding is what you want."
        )


def algorithms_for_slots(slot_names: Iterable[str]) -> Tuple[spec.Definition, ...]:
    """The engine algorithms whose slots are exactly `slot_names`.

    Slots alone cannot tell apart algorithms with the same slots (Adagrad and
    ProximalAdagrad both keep `accumulators`); their hyperparameters are not
    in a checkpoint.

    Raises:
      TypeError: `slot_names` is a string or no iterable (a string would be
        read letter by letter, and fit nothing).
    """
    if isinstance(slot_names, (str, bytes)) or not isinstance(slot_names, Iterable):
        raise TypeError(
            "algorithms_for_slots: argument `slot_names` must be slot names, "
            f"e.g. ['accumulators']; received {slot_names!r}."
        )
    names = set(slot_names)
    return tuple(d for d in registry.DEFINITIONS if {s.name for s in d.slots} == names)


@dataclasses.dataclass(frozen=True)
class TableInfo:
    """What a checkpoint says about one table, without reading its values.

    Attributes:
      name: The table's name (`TableConfig.name`).
      shape: `(vocabulary_size, dim)`.
      dtype: The NumPy dtype name of the table (`"float32"`).
      slots: The engine slot names found for the table, sorted.
      keys: Checkpoint key of `"parameters"` and of each slot.
      slot_shapes: Shape of each slot as stored.
      slot_dtypes: NumPy dtype name of each slot as stored.
    """

    name: str
    shape: Tuple[int, ...]
    dtype: str
    slots: Tuple[str, ...]
    keys: Mapping[str, str]
    slot_shapes: Mapping[str, Tuple[int, ...]]
    slot_dtypes: Mapping[str, str]

    def shape_of(self, key: str) -> Tuple[int, ...]:
        """The stored shape of `"parameters"` or of a slot (a row-wise
        optimizer's is `[rows, 1]`)."""
        if key == PARAMETERS:
            return tuple(self.shape)
        return tuple(self.slot_shapes.get(key, self.shape))

    def dtype_of(self, key: str) -> str:
        """The stored dtype name of `"parameters"` or of a slot."""
        return (
            self.dtype if key == PARAMETERS else self.slot_dtypes.get(key, self.dtype)
        )

    @property
    def nbytes(self) -> int:
        """Bytes of the table and its slots (each of its stored shape and
        dtype)."""
        return sum(
            int(np.prod(self.shape_of(key))) * np.dtype(self.dtype_of(key)).itemsize
            for key in (PARAMETERS, *self.slots)
        )

    @property
    def engine_nbytes(self) -> int:
        """Bytes of the table and its slots as the engines' checkpoints
        store them: float32 (`engine_state`)."""
        return sum(
            int(np.prod(self.shape_of(key))) * 4 for key in (PARAMETERS, *self.slots)
        )

    @property
    def algorithms(self) -> Tuple[spec.Definition, ...]:
        """The engine algorithms whose slots these are."""
        return algorithms_for_slots(self.slots)
