"""Reads of a row-sparse table outside its lookup, refused where the loss's
gradient reaches them.

The table and its slots train only through the layer's lookup: their
"gradient" is their stepped rows, which the model's optimizer writes as it is
(`overwrite_with_gradient`). Any other read of them in the loss (the table
of weight tying, a penalty on the table, scores against every row) adds its
gradient to that value, and the optimizer would write the sum: the rows
nobody looked up overwritten with the read's gradient on TensorFlow, moved by
it on JAX, without a word. Such a read is given a gradient that refuses
(`lookup_jax.refuse_gradient`, `lookup_tensorflow.refuse_gradient`): the
refusal comes when the step is traced, before anything trains, and only
where a gradient flows through the read (`keras.ops.stop_gradient` of it,
or a read the loss does not use, passes). The lookup's own reads are marked
(`own`).

Runs without TensorFlow and without JAX.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator

__all__ = ["own", "owned", "refusal"]

_OWN = contextvars.ContextVar("tf_tpu_embed_opt_own_table_reads", default=False)


@contextlib.contextmanager
def own() -> Iterator[None]:
    """A context in which reads of a table are its lookup's own."""
    token = _OWN.set(True)
    try:
        yield
    finally:
        _OWN.reset(token)


def owned() -> bool:
    """Whether a read here is the lookup's own (`own`)."""
    return _OWN.get()


def refusal(path: str, layer: str) -> str:
    """The refusal of a read of the variable `path` of the row-sparse layer
    `layer` whose gradient reaches it."""
    return (
        f"Embedding {layer!r}: {path} (a row-sparse table or one of its "
        "optimizer's slots) was read outside the layer's lookup, and the "
        "loss's gradient reaches it through that read (weight tying, a "
        "penalty on the table, scores against every row). The table trains "
        "only through its lookup: its gradient is its stepped rows, which the "
        "model's optimizer writes as they are, so this read's gradient would "
        "be added to them and the table overwritten with the sum. Look rows "
        "up by calling the layer; read the values under "
        "keras.ops.stop_gradient where the loss should not train them; to "
        "train the whole table from such a read, use keras.layers.Embedding "
        "with the table optimizer's twin (tf_tpu_embed_opt.to_keras) as the "
        "model's optimizer."
    )
