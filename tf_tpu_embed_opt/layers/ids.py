"""Ids outside a table: the one refusal both backends' lookups raise.

An id below 0 or at or past the table's row count is refused before it is
looked up or stepped (on JAX `jnp.take` would read NaN for it and the scatter
drop its row, or -1 wrap to the last row; on TensorFlow the CPU gather fails
with an error that names neither the layer nor the range, and a GPU gather
reads zeros). Where the ids are concrete (eager code) the check is plain
NumPy (also in JAX's host callback); TensorFlow formats the same message in
the graph (`summary_template`).

Runs without TensorFlow and without JAX (`integer_ids` on Keras's ops).
"""

from __future__ import annotations

import warnings
from typing import Any

import keras
import numpy as np

__all__ = [
    "LostArrays",
    "OutOfRangeIds",
    "check_ids",
    "integer_dtype",
    "integer_ids",
    "limit",
    "summary_template",
]


class OutOfRangeIds(ValueError):
    """Ids of an `Embedding` lookup outside its table's rows."""


class LostArrays(RuntimeError):
    """A row-sparse table (and its model) read after a failed compiled step
    of Keras's JAX trainer (`fit`, `evaluate`, `predict`) consumed their
    arrays (`lookup_jax.TableVariable`)."""


def limit(rows: int, absent: bool) -> int:
    """One past the largest id allowed: `rows`, or `rows + 1` where the id
    `rows` means no lookup (keras-rs's padded entries)."""
    return rows + 1 if absent else rows


def integer_dtype(dtype: str, rows: int, absent: bool, name: str, wide: str) -> Any:
    """The integer dtype ids of `dtype` are looked up as, without changing
    one: `None` for int32 and int64 (kept), `wide` (the backend's widest
    index: int64, or int32 on JAX without `jax_enable_x64`) for unsigned
    32- and 64-bit ids, int32 for narrower integers, booleans and floats.
    Where `wide` is int32, unsigned ids are kept instead: JAX holds uint32
    exactly (and a 64-bit array as 32 bits before any layer sees it), so an
    id of 2**31 or more is refused as itself, not as the negative int32 it
    would wrap to.

    A float holds every integer up to `2**p` exactly (`p`: the bits of its
    significand, 24 for float32) and no more: past it an id would round to
    a neighbour, a row of the table, without a word. Floating ids are taken
    where one past the largest id the table takes (`limit`) is at most
    `2**p`: every id it takes is exact, and any larger one rounds to at
    least `limit`, outside the table, where the check finds it.

    Raises:
      ValueError: Floating ids for a table with more rows; the message
        names the layer, the dtype, the bound and how to declare the ids.
    """
    if dtype in ("int32", "int64"):
        return None
    if dtype in ("uint32", "uint64"):
        return None if wide == "int32" else wide
    if "float" not in dtype:
        return "int32"
    import ml_dtypes  # Keras's own dependency; it knows bfloat16 too

    exact = 2 ** (ml_dtypes.finfo(dtype).nmant + 1)
    if limit(rows, absent) > exact:
        raise ValueError(
            f"Embedding `{name}`: its ids come as {dtype}, which holds integers "
            f"exactly only up to {exact:,}; the table has {rows:,} rows "
            f"(input_dim), so an id past {exact:,} would read and step a "
            "neighbouring row. Give the ids as integers, e.g. "
            'keras.Input(..., dtype="int32") (Keras\'s default input dtype is '
            "float32)."
        )
    return "int32"


def integer_ids(ids: Any, rows: int, absent: bool, name: str, lookup: Any) -> Any:
    """`ids` as the integers they stand for (`integer_dtype`: floats
    whose table has rows past what they hold exactly are refused), on the
    backend of `lookup` (a lookup module).

    Ids declared 64-bit (a `keras.Input`'s dtype) where the backend holds
    32 (JAX without `jax_enable_x64` truncates every 64-bit array it takes;
    its own warning does not say what that does to ids) are warned about:
    such an id outside int32's range reaches no layer as itself, so it
    cannot be refused.
    """
    dtype = keras.backend.standardize_dtype(ids.dtype)
    wide = lookup.wide_ids()
    if dtype in ("int64", "uint64") and wide == "int32":
        warnings.warn(
            f"Embedding `{name}`: its ids are declared {dtype}, but JAX "
            "without jax_enable_x64 holds every array in 32 bits and "
            "truncates 64-bit ids as Keras hands it the batch, before any "
            "layer sees them: an id outside int32's range (a 64-bit hash, "
            "say) arrives as another id, may read another row and cannot be "
            "refused. Bring the ids into the table's range before the model, "
            "or enable 64-bit arrays: jax.config.update('jax_enable_x64', "
            "True) before the model is built.",
            stacklevel=2,
        )
    target = integer_dtype(dtype, rows, absent, name, wide)
    return ids if target is None else keras.ops.cast(ids, target)


def sparse_refusal(name: str, kind: str, ragged: bool) -> str:
    """Why a table refuses sparse ids of type `kind`: Keras's own Embedding
    reads row 0 for every entry they leave out, which training would step as
    lookups of id 0. `ragged`: the backend takes ragged ids (TensorFlow)."""
    takes = "dense or ragged ids" if ragged else "dense ids"
    instead = "ragged (tf.RaggedTensor.from_sparse), or dense" if ragged else "dense"
    return (
        f"Embedding `{name}`: the row-sparse lookup takes {takes}; received "
        f"{kind}. Keras's Embedding reads row 0 wherever sparse ids have no "
        "entry, and training would step row 0 for each such place. Give them "
        f"{instead}, padded with an id outside the table and "
        "out_of_range_ids='zeros' (such an id reads zeros and steps no row)."
    )


def summary_template(rows: int, absent: bool, name: str, more: bool) -> str:
    """The refusal, with `{}` for the first id outside the table and, with
    `more`, for how many more there are and the batch's id count. TensorFlow
    formats it in the graph, where only numbers come out as they are: the
    template is chosen, not formatted with words, and has no quotes (which
    its assertion escapes)."""
    allowed = f"[0, {rows})" + (f" or {rows} (no lookup)" if absent else "")
    others = " and {} more of the {} ids in the batch are" if more else " is"
    return (
        f"Embedding `{name}`: id {{}}{others} outside the table, whose ids are "
        f"{allowed} (input_dim={rows}). Map ids into the table (hash or clip "
        "them, or keep a row for unknown ids) before the lookup."
    )


def _error(name: str, rows: int, absent: bool, bad: int, count: int, total: int):
    template = summary_template(rows, absent, name, count > 1)
    return OutOfRangeIds(template.format(bad, count - 1, total))


def check_ids(ids: Any, rows: int, absent: bool, name: str) -> None:
    """Raises `OutOfRangeIds` if a concrete array of ids holds one outside
    the table."""
    flat = np.asarray(ids).reshape(-1)
    bad = (flat < 0) | (flat >= limit(rows, absent))
    if bad.any():
        first = int(flat[np.argmax(bad)])
        raise _error(name, rows, absent, first, int(bad.sum()), flat.size)
