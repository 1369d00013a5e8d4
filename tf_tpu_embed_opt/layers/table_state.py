"""A row-sparse table's state as Keras saves and sets it: `TableState`.

The table, the optimizer's slots, its step counter (`table_step`) and, unless
it is a schedule, its learning rate are the layer's variables, in that order
in Keras's files (`.keras`, `model.save_weights`). A `keras.layers.Embedding`
holds the table alone: its file, or its `get_weights()`, starts this layer's
table with the optimizer's state anew, as `weights=` does, so a model moves
from Keras's layer to this one by its weights.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from keras import ops

from tf_tpu_embed_opt.layers import table_step

__all__ = ["TableState", "given_to_a_stack"]


def given_to_a_stack(layer: Any) -> bool:
    """Whether `layer` is an `Embedding` given to a `StackedEmbedding`, which
    holds its rows (the layer holds nothing)."""
    return getattr(layer, "_table_of_stack", None) is not None


class TableState:
    """The saving, loading and setting of `layers.Embedding`'s state (a
    mixin before `keras.layers.Embedding`)."""

    # The `StackedEmbedding` this layer was given to as a table (a weakref):
    # its rows are the stack's, and the layer, built as it was given (Keras
    # would otherwise see unbuilt state in a model that holds it), holds no
    # state of its own.
    _table_of_stack: Any = None

    def _refuse_a_table_of_a_stack(self) -> None:
        """Refuses to build, call, read or set a layer given to a
        `StackedEmbedding`, which holds its rows: on its own it would be a
        second table of its name, trained apart."""
        if self._table_of_stack is None:
            return
        owner = self._table_of_stack()
        if owner is None:
            raise ValueError(
                f"Embedding {self.name!r} was given to a StackedEmbedding, "
                "which held its rows and is gone: the layer holds nothing. "
                "Make a new Embedding to use a table on its own."
            )
        raise ValueError(
            f"Embedding {self.name!r} is a table of the StackedEmbedding "
            f"{owner.name!r}, which holds its rows: built or called on its own "
            "it would be a second table of that name, trained apart. Look its "
            f"ids up through {owner.name!r} (a table that several features "
            "read stands under each of them in `tables`) and read its rows "
            f"with {owner.name!r}.get_table({self.name!r})."
        )

    @property
    def table_step(self) -> Any:
        """The steps the table optimizer has applied to the table, an integer
        tensor (`layer.optimizer.iterations` reads it; `set_table_step`
        writes it)."""
        self._refuse_a_table_of_a_stack()
        return table_step.count(self._table_step.value, self._step_dtype)

    def set_table_step(self, step: int) -> None:
        """Sets the steps the table optimizer has applied (what a checkpoint
        restores).

        Raises:
          TypeError: `step` is no integer.
          ValueError: Below 0, or above what the backend's step counter
            holds (2**31 - 1 on JAX without `jax_enable_x64`).
        """
        self._refuse_a_table_of_a_stack()
        pair = table_step.encode(step)
        largest = int(np.iinfo(self._step_dtype).max)
        if step > largest:
            # Read back it would wrap around (to 0 for 2**40 in int32).
            raise ValueError(
                f"Layer {self.name!r}: a table's step must be at most {largest} "
                f"here, where Keras counts steps in {self._step_dtype}; "
                f"received {step}."
            )
        self._table_step.assign(pair)

    def _own_learning_rate(self) -> None:
        """Names the table optimizer's learning-rate variable as the layer's
        (`<layer>/learning_rate`, beside `<layer>/step`), and tracks it.

        Keras named it by the optimizer's generated name
        (`adagrad_3/learning_rate`), which counts the optimizers a process
        has made: a restore keyed by path (`Model.set_state_tree`, so
        `load_weights` of an `OrbaxCheckpoint` step) in a process that made
        one more gave a table another table's rate (measured). The variable
        stays the optimizer's (only its path changes: TensorFlow's
        checkpoints track the optimizer's list of variables, which must not
        change); tables that share an optimizer keep the first one's name.
        """
        rate = self.optimizer._learning_rate
        if not getattr(rate, "_named_by_table", False):
            scope = self._table_step.path.rpartition("/")[0]
            rate._path = f"{scope}/learning_rate"
            rate._named_by_table = True
        self._table_learning_rate = rate

    def _state(self) -> list:
        state = [self._embeddings, *self._slot_variables, self._table_step]
        if hasattr(self, "_table_learning_rate"):
            state.append(self._table_learning_rate)
        return state

    def save_own_variables(self, store: Any) -> None:
        """The table, each slot, the optimizer's step and learning rate."""
        if not self.built or self._table_of_stack is not None:
            return
        for index, variable in enumerate(self._state()):
            store[str(index)] = ops.convert_to_numpy(variable.value)

    def load_own_variables(self, store: Any) -> None:
        """What `save_own_variables` wrote; or a `keras.layers.Embedding`'s
        table alone (its only variable), whose optimizer then starts anew, as
        with `weights=`: the slots at their initial values, the step at 0."""
        if not self.built or self._table_of_stack is not None:
            return
        if len(store.keys()) == 1:
            table = np.asarray(store["0"])
            if table.shape != tuple(self._embeddings.shape):
                raise ValueError(
                    f"Layer {self.name!r}: the file holds a table of shape "
                    f"{table.shape}; this table is {tuple(self._embeddings.shape)}."
                )
            self._start_from(table)
            return
        state = self._state()
        if len(store.keys()) != len(state):
            raise ValueError(
                f"Layer {self.name!r} expects {len(state)} variables (the "
                f"table, its slots {list(self._slot_names)}, the optimizer's "
                f"step and, unless it is a schedule, its learning rate), or a "
                f"keras.layers.Embedding's table alone; the file holds "
                f"{len(store.keys())}."
            )
        for index, variable in enumerate(state):
            value = store[str(index)]
            if variable is self._table_step and np.ndim(value) == 0:
                # A file of version 0.1.0: the table optimizer's integer
                # step counter.
                value = table_step.encode(int(value))
            variable.assign(value)

    def set_weights(self, weights: Any) -> None:
        """Keras's `set_weights`: every weight (`self.weights`), or, as a
        `keras.layers.Embedding`'s `get_weights()` gives it, the table alone,
        whose optimizer then starts anew (as with `weights=`, and checked as
        `weights=` is: `_initial_table`)."""
        self._refuse_a_table_of_a_stack()
        if self.built and isinstance(weights, (list, tuple)) and len(weights) == 1:
            self._start_from(self._initial_table(weights[0]))
            return
        super().set_weights(weights)

    def _start_from(self, table: Any) -> None:
        """The table is `table` (of the table's shape); the slots start at
        their initial values and the optimizer's step at 0."""
        self._embeddings.assign(table)
        for (_, _, initial), slot in zip(
            self.optimizer.slot_table(), self._slot_variables
        ):
            slot.assign(ops.full(slot.shape, initial, slot.dtype))
        self.set_table_step(0)
