"""What steps an `Embedding`'s rows: its `optimizer` argument made a twin
with a row-sparse rule, exactly, or refused naming why."""

from __future__ import annotations

from typing import Any

import keras

from tf_tpu_embed_opt import errors
from tf_tpu_embed_opt.optimizers import twins

__all__ = ["ALLOWED", "table_optimizer"]

# Keras base-optimizer settings that are applied outside `update_step`
# (`apply`'s clipping, weight decay, EMA, accumulation, loss scaling): the
# backward pass runs the rule alone, so a table optimizer must leave them off.
_BASE_SETTINGS = (
    "weight_decay",
    "clipnorm",
    "clipvalue",
    "global_clipnorm",
    "use_ema",
    "gradient_accumulation_steps",
    "loss_scale_factor",
)

# What `Embedding(optimizer=...)` takes, as the layer's errors say it.
ALLOWED = (
    "one of this package's twins with a row-sparse rule "
    "(tf_tpu_embed_opt.optimizers.*, lazy=True where it has `lazy`), a stock "
    "keras.optimizers SGD (without momentum) or Adagrad (converted to its "
    "twin), the name of one, or an embedding-face optimizer or "
    "jax-tpu-embedding spec (converted with tf_tpu_embed_opt.to_keras)"
)


def table_optimizer(optimizer: Any) -> twins.TwinOptimizer:
    """The twin that steps an `Embedding`'s rows, from its `optimizer` argument.

    Exact or refused: the layer steps only the looked-up rows (the engine's
    lazy rule), so an optimizer whose step with a zero gradient moves the
    other rows (Keras's `Adam`, `Ftrl`, `RMSprop`, `Adadelta`, `SGD` with
    momentum: `lazy=False`) is refused, naming `lazy=True`.

    Args:
      optimizer: See `Embedding`.

    Returns:
      A twin (a new one unless `optimizer` is already a twin).

    Raises:
      TypeError: Not an optimizer the layer takes.
      ValueError: Its math cannot run row by row.
    """
    given = optimizer
    if isinstance(optimizer, dict):
        optimizer = keras.optimizers.deserialize(optimizer)
    elif isinstance(optimizer, str):
        try:
            optimizer = keras.optimizers.get(optimizer)
        except ValueError:
            raise ValueError(
                "Embedding: argument `optimizer` names no Keras optimizer; "
                f"received {given!r}. It must be {ALLOWED}."
            ) from None
    rule = getattr(optimizer, "rule", None)
    factor = getattr(rule, "factor", None)
    if isinstance(optimizer, twins.TwinOptimizer) and factor is not None:
        raise ValueError(
            f"Embedding: {type(optimizer).__name__} scales each step by a "
            f"{factor.name.replace('_', ' ')} computed over the whole table "
            "each step, which no row-by-row step can reproduce; received it "
            "as argument `optimizer`. Use it on a keras.layers.Embedding, or "
            "pass another optimizer."
        )
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        optimizer = _converted(optimizer, given)
    elif not isinstance(optimizer, twins.TwinOptimizer):
        twin = twins.twin_of_stock(optimizer)
        if twin is None:
            raise TypeError(
                f"Embedding: argument `optimizer` must be {ALLOWED}; received "
                f"{given!r} of type {errors.type_path(given)}."
            )
        optimizer = twin
    owner = type(optimizer).__name__
    for name in _BASE_SETTINGS:
        if getattr(optimizer, name, None):
            raise ValueError(
                f"Embedding: the table optimizer's `{name}` is applied by "
                "Keras outside the optimizer's step, which the backward pass "
                f"does not run; received {owner} with {name}="
                f"{getattr(optimizer, name)!r}. Use the engine's options "
                "instead (clip_gradient_min/max, weight_decay_factor) or "
                "leave it unset."
            )
    if not optimizer._rows_only:
        raise ValueError(
            f"Embedding: {owner} with lazy=False steps every row of the "
            "table, also those the batch did not look up; the layer steps "
            "only the looked-up rows (the engine's rule). Pass "
            f"tf_tpu_embed_opt.optimizers.{owner}(..., lazy=True), or train a "
            "keras.layers.Embedding with it."
        )
    return optimizer


def _converted(optimizer: Any, given: Any) -> twins.TwinOptimizer:
    """`to_keras` of an embedding-face optimizer or a jax-tpu-embedding spec."""
    module = type(optimizer).__module__.split(".")[0]
    if module not in ("tensorflow", "tf_tpu_embed_opt", "jax_tpu_embedding"):
        raise TypeError(
            f"Embedding: argument `optimizer` must be {ALLOWED}; received "
            f"{given!r} of type {errors.type_path(given)}{errors.tf_keras_note(given)}."
        )
    from tf_tpu_embed_opt.conversions import faces as convert

    try:
        return convert.to_keras(optimizer)
    except TypeError as error:
        raise TypeError(
            f"Embedding: argument `optimizer` must be {ALLOWED}; received "
            f"{given!r} of type {type(given).__name__} ({error})"
        ) from None
    except ValueError as error:
        # An optimizer of the right kind whose settings have no Keras twin.
        raise ValueError(
            f"Embedding: argument `optimizer` {given!r} has no Keras twin the "
            f"layer can step with: {error}"
        ) from None
