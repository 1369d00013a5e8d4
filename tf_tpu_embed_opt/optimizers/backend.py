"""The backend Keras runs on, and what the Keras face takes from it.

Every twin applies its definition's rule (`definitions/rules.py`), written
once against an array namespace. On Keras's TensorFlow backend the twins
take their base from `tensorflow_twin` (row-sparse `tf.IndexedSlices`
gradients, XLA, sharded variables); on every other backend (JAX, PyTorch)
from `DenseTwinBase` here, which runs the same rule with `keras.ops` on the
whole variable. Nothing here imports TensorFlow unless Keras runs on it, so
the Keras face works where TensorFlow is not installed.

On JAX a sparse gradient (`jax.experimental.sparse.BCOO`, from sparse
inputs) says which rows were looked up: its duplicate entries are summed and,
with `lazy=True`, only those rows and their slots step, as on the TensorFlow
backend with `tf.IndexedSlices`. A dense gradient, which is what
`keras.layers.Embedding` gives on JAX and PyTorch, does not: where that
matters (a twin with `lazy=True` whose step with a zero gradient is not a
no-op: the engine would leave the rows that were not looked up alone) the
twin warns once, when it is built, and a dense gradient steps every element,
as on the TensorFlow backend; it never guesses the looked-up rows from the
gradient's values (a looked-up row can have a zero gradient).
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Dict, List

from tf_tpu_embed_opt.definitions import rules
from tf_tpu_embed_opt.errors import (
    TensorFlowNotInstalled,
    is_tensorflow_missing,
    keras_backend_missing,
)

try:
    import keras
except ModuleNotFoundError as error:  # Keras set to a backend not installed
    if not is_tensorflow_missing(error):
        raise
    raise TensorFlowNotInstalled(
        "tf_tpu_embed_opt.optimizers", keras_backend=keras_backend_missing(error)
    ) from error
from keras import ops  # noqa: E402 - after Keras's own import, checked above

__all__ = [
    "BACKEND",
    "KERAS_OPS",
    "DenseTwinBase",
    "ShardedBase",
    "TwinBase",
    "WholeVariables",
    "constant_initializer",
]

BACKEND: str = keras.backend.backend()


def _power(base: Any, exponent: Any) -> Any:
    # ops.power, as Keras's optimizers call it (Ftrl's a^0.5 included: a
    # square root would round differently from Keras's Ftrl).
    if isinstance(base, (int, float)) and not isinstance(exponent, (int, float)):
        # A Python base with a tensor exponent takes the exponent's dtype.
        base = ops.cast(base, ops.dtype(exponent))
    return ops.power(base, exponent)


KERAS_OPS = rules.ArrayNamespace(
    sqrt=ops.sqrt,
    square=ops.square,
    abs=ops.absolute,
    sign=ops.sign,
    maximum=ops.maximum,
    minimum=ops.minimum,
    where=ops.where,
    power=_power,
    rsqrt=ops.rsqrt,
    divide_no_nan=ops.divide_no_nan,
    min=lambda x: ops.min(x, initial=float("inf")),
    sum_in_order=lambda terms: functools.reduce(ops.add, terms),
    split=lambda x, parts: ops.split(x, parts, axis=-1),
)


class _Full(keras.initializers.Initializer):
    """An initializer filling with `value` converted straight to the dtype.

    A class, not a function: on JAX, Keras creates a variable large enough
    under a `keras.distribution` layout with `jax.jit(initializer.__call__)`
    (each device makes only its part), and JAX cannot jit a plain function's
    `__call__`."""

    def __init__(self, value: float) -> None:
        self.value = value

    def __call__(self, shape: Any, dtype: Any = None) -> Any:
        return ops.full(shape, self.value, dtype=dtype or "float32")

    def get_config(self) -> Dict[str, Any]:
        return {"value": self.value}


class WholeVariables:
    """Where no variable is sharded (every backend but TensorFlow's)."""

    def _slot_for(self, slot: Any, variable: Any) -> Any:
        return slot

    def _sharded(self, variable: Any) -> bool:
        return False


class DenseTwinBase(WholeVariables):
    """A twin's backend part where gradients are dense (JAX, PyTorch).

    Mixed in before `keras.optimizers.Optimizer`: the definition's rule on the
    whole variable and its slots, with `keras.ops`.
    """

    _XP = KERAS_OPS

    def build(self, var_list: List[Any]) -> None:
        if not self.built and self._lazy_differs:
            warnings.warn(
                f"{type(self).__name__}(lazy=True) on Keras's {BACKEND!r} "
                "backend: a dense gradient (what keras.layers.Embedding gives "
                "there) does not say which rows were looked up, so every "
                "element steps, as for a dense gradient on the TensorFlow "
                "backend; the TPU engine steps only the looked-up rows and "
                "their slots. For the engine's lazy math on this backend, "
                "give the table to tf_tpu_embed_opt.layers.Embedding(..., "
                "optimizer=...), which steps only the looked-up rows in the "
                "backward pass (on TensorFlow, tf.IndexedSlices gradients do "
                "it too); lazy=False gives Keras's.",
                UserWarning,
                stacklevel=2,
            )
        super().build(var_list)

    def _apply_rule(
        self,
        gradient: Any,
        variable: Any,
        lr: Any,
        slots: Dict[str, Any],
        hypers: Dict[str, Any],
    ) -> None:
        sparse = _bcoo(gradient)
        if sparse is not None and self._rows_only:
            self._apply_to_rows(sparse, variable, lr, slots, hypers)
            return
        if sparse is not None:
            gradient = sparse.todense()  # sums duplicate entries
        new_value, new_slots = self._tpu_step(
            KERAS_OPS,
            ops.convert_to_tensor(variable),
            {name: ops.convert_to_tensor(s) for name, s in slots.items()},
            ops.cast(gradient, self._step_dtype(variable)),
            lr,
            hypers,
        )
        for name, slot in slots.items():
            self.assign(slot, new_slots[name])
        self.assign(variable, new_value)
        self._keep_factor(variable, new_slots)

    def _apply_to_rows(
        self,
        gradient: Any,
        variable: Any,
        lr: Any,
        slots: Dict[str, Any],
        hypers: Dict[str, Any],
    ) -> None:
        """The rule on the rows a JAX `BCOO` gradient holds (the looked-up
        rows), duplicates summed; the other rows and their slots are kept."""
        import jax.numpy as jnp

        count = variable.shape[0]
        # Each looked-up row once; padding ids (== count) are dropped below.
        ids = gradient.indices[..., 0].reshape(-1)
        ids = jnp.unique(ids, size=ids.shape[0], fill_value=count)

        def rows(value: Any) -> Any:
            return jnp.take(value, ids, axis=0, mode="fill", fill_value=0)

        values = {name: ops.convert_to_tensor(s) for name, s in slots.items()}
        weights = ops.convert_to_tensor(variable)
        # Duplicates summed in the dtype the table steps in.
        data = gradient.data.astype(self._step_dtype(variable))
        summed = type(gradient)((data, gradient.indices), shape=gradient.shape)
        new_rows, new_slots = self._tpu_step(
            KERAS_OPS,
            rows(weights),
            {name: rows(value) for name, value in values.items()},
            rows(summed.todense()),
            lr,
            hypers,
        )
        for name, slot in slots.items():
            self.assign(slot, values[name].at[ids].set(new_slots[name], mode="drop"))
        self.assign(variable, weights.at[ids].set(new_rows, mode="drop"))
        self._keep_factor(variable, new_slots)

    def _clip_gradients(self, grads: List[Any]) -> List[Any]:
        # Keras clips a sparse gradient's entries one duplicate at a time;
        # clip the summed rows instead, so that sparse equals dense.
        if not (self.clipnorm or self.global_clipnorm or self.clipvalue):
            return super()._clip_gradients(grads)
        summed = [_summed(g) for g in grads]
        # Keras's clipping of a summed BCOO's entries is its clipping of the
        # dense gradient (the entries hold every nonzero, each once), so
        # Keras clips the entries and the BCOO keeps its rows.
        clipped = super()._clip_gradients(
            [g if _bcoo(g) is None else g.data for g in summed]
        )
        return [
            c if _bcoo(g) is None else type(g)((c, g.indices), shape=g.shape)
            for g, c in zip(summed, clipped)
        ]


def _bcoo(gradient: Any) -> Any:
    """A JAX sparse gradient as a row-sparse `BCOO`; None for a dense one.

    Keras's JAX backend passes `jax.experimental.sparse` gradients through
    (from sparse inputs); its `Embedding` gives dense ones.
    """
    if BACKEND != "jax":
        return None
    from jax.experimental import sparse as jax_sparse

    if not isinstance(gradient, jax_sparse.JAXSparse):
        return None
    bcoo = gradient if isinstance(gradient, jax_sparse.BCOO) else gradient.to_bcoo()
    if bcoo.n_batch or not bcoo.n_sparse:
        return jax_sparse.BCOO.fromdense(bcoo.todense(), n_dense=bcoo.ndim - 1)
    return bcoo


def _summed(gradient: Any) -> Any:
    bcoo = _bcoo(gradient)
    if bcoo is None:
        return gradient
    return bcoo.sum_duplicates(nse=bcoo.nse)


if BACKEND == "tensorflow":
    from tf_tpu_embed_opt.optimizers.sharded import (
        ShardedOptimizerMixin as ShardedBase,
    )
    from tf_tpu_embed_opt.optimizers.tensorflow_twin import (
        TensorFlowTwinBase as TwinBase,
    )
    from tf_tpu_embed_opt.optimizers.tensorflow_twin import constant_initializer
else:
    ShardedBase = WholeVariables
    TwinBase = DenseTwinBase
    constant_initializer = _Full
