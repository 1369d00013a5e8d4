"""The demo's training steps on Keras's JAX backend (TensorFlow not needed).

The loop a JAX user writes: `stateless_call` under `jax.value_and_grad`, then
`stateless_apply` of each optimizer, compiled with `jax.jit`. In the twin's
run the tables are `tf_tpu_embed_opt.layers.Embedding`s that step their looked
up rows in the backward pass; in the stock run they are
`keras.layers.Embedding`s, whose gradient JAX gives whole (duplicate ids
summed, every row touched), stepped by the stock optimizer.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import jax
import numpy as np

__all__ = ["steps"]


def steps(
    model: Any,
    tables: Sequence[Any],
    table_optimizer: Optional[Any],
    dense_optimizer: Any,
    loss_function: Callable[[Any, Any], Any],
) -> Tuple[
    Callable[[Dict[str, Any], Any], float],
    Callable[[Dict[str, Any], Any], float],
    Callable[[], List[np.ndarray]],
]:
    """The demo's `train_step`, `evaluate` and `table_values` on JAX.

    Args:
      model: The built model.
      tables: The tables' variables, whose values `table_values` returns.
      table_optimizer: Steps `tables`; None where the tables step themselves
        (row-sparse layers: `dense_optimizer` then writes them as they are).
      dense_optimizer: Steps the other trainable variables.
      loss_function: `(labels, logits) -> loss`.

    Returns:
      `train_step(batch, labels) -> loss`, `evaluate(batch, labels) -> loss`
      and `table_values() -> [table, ...]`, over state kept between calls.
    """
    trainable = list(model.trainable_variables)
    position = {id(v): i for i, v in enumerate(trainable)}
    table_index = [position[id(v)] for v in tables] if table_optimizer else []
    dense_index = [i for i in range(len(trainable)) if i not in table_index]
    dense_optimizer.build([trainable[i] for i in dense_index])
    if table_optimizer is not None:
        table_optimizer.build([trainable[i] for i in table_index])
    state = {
        "trainable": [v.value for v in trainable],
        "non_trainable": [v.value for v in model.non_trainable_variables],
        "dense": [v.value for v in dense_optimizer.variables],
        "tables": [v.value for v in table_optimizer.variables]
        if table_optimizer is not None
        else [],
    }

    def loss(values, non_trainable, batch, labels):
        logits, non_trainable = model.stateless_call(
            values, non_trainable, batch, training=True
        )
        return loss_function(labels, logits), non_trainable

    def apply(optimizer, slots, index, grads, values):
        new, slots = optimizer.stateless_apply(
            slots, [grads[i] for i in index], [values[i] for i in index]
        )
        for i, value in zip(index, new):
            values[i] = value
        return slots

    @jax.jit
    def step(state, batch, labels):
        (value, non_trainable), grads = jax.value_and_grad(loss, has_aux=True)(
            state["trainable"], state["non_trainable"], batch, labels
        )
        values = list(state["trainable"])
        dense = apply(dense_optimizer, state["dense"], dense_index, grads, values)
        tables = state["tables"]
        if table_optimizer is not None:
            tables = apply(table_optimizer, tables, table_index, grads, values)
        return value, {
            "trainable": values,
            "non_trainable": non_trainable,
            "dense": dense,
            "tables": tables,
        }

    @jax.jit
    def held_out(state, batch, labels):
        logits, _ = model.stateless_call(
            state["trainable"], state["non_trainable"], batch, training=False
        )
        return loss_function(labels, logits)

    def train_step(batch: Dict[str, Any], labels: Any) -> float:
        value, new_state = step(state, batch, labels)
        state.update(new_state)
        return float(value)

    def evaluate(batch: Dict[str, Any], labels: Any) -> float:
        return float(held_out(state, batch, labels))

    def table_values() -> List[np.ndarray]:
        return [np.asarray(state["trainable"][position[id(v)]]).copy() for v in tables]

    return train_step, evaluate, table_values
