"""The backend Keras runs on, and what the Keras face takes from it.

Every twin applies its definition's rule (`definitions/rules.py`), written
once against an array namespace. On Keras's TensorFlow backend the twins
take their base from `tensorflow_twin` (row-sparse `tf.IndexedSlices`
gradients, XLA, sharded variables); on every other backend (JAX, PyTorch)
from `DenseTwinBase` here, which runs the same rule with `keras.ops` on the
whole variable. Nothing here imports TensorFlow unless Keras runs on it, so
the Keras face works where TensorFlow is not installed.

On those backends an embedding's gradient is dense: which rows were looked
up is not known to the optimizer. Where that matters (a twin with
`lazy=True` whose step with a zero gradient is not a no-op: the engine would
leave the rows that were not looked up alone) the twin warns once, when it is
built, and steps every element, as it does for a dense gradient on the
TensorFlow backend; it never guesses the looked-up rows from the gradient's
values (a looked-up row can have a zero gradient).
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, List

import keras
from keras import ops

from tf_tpu_embed_opt.definitions import rules

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
    # As on TensorFlow (and in its ApplyFtrl kernel): a^±0.5 as a correctly
    # rounded square root, not exp(p·log a).
    if type(exponent) in (int, float) and abs(exponent) == 0.5:
        root = ops.sqrt(base)
        return root if exponent > 0 else 1 / root
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
)


def _dense_constant_initializer(value: float) -> Any:
    """An initializer filling with `value` converted straight to the dtype."""

    def initializer(shape: Any, dtype: Any = None) -> Any:
        return ops.full(shape, value, dtype=dtype or "float32")

    return initializer


class WholeVariables:
    """Where no variable is sharded (every backend but TensorFlow's)."""

    def _slot_for(self, slot: Any, variable: Any) -> Any:
        return slot


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
                "backend: gradients are dense there, so the optimizer does not "
                "know which rows were looked up, and every element steps, as "
                "for a dense gradient on the TensorFlow backend. The TPU "
                "engine steps only the looked-up rows (and their slots); rows "
                "that were not looked up differ. Train on the TensorFlow "
                "backend (row-sparse gradients) for the engine's lazy math, or "
                "pass lazy=False for Keras's.",
                UserWarning,
                stacklevel=2,
            )
        super().build(var_list)

    def _apply_rule(
        self, gradient: Any, variable: Any, lr: Any, slots: Dict[str, Any]
    ) -> None:
        new_value, new_slots = rules.tpu_step(
            self._active,
            KERAS_OPS,
            ops.convert_to_tensor(variable),
            {name: ops.convert_to_tensor(s) for name, s in slots.items()},
            ops.cast(gradient, variable.dtype),
            lr,
            self._hypers,
            **self._options,
        )
        for name, slot in slots.items():
            self.assign(slot, new_slots[name])
        self.assign(variable, new_value)


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
    constant_initializer = _dense_constant_initializer
