"""What a gradient of a row-sparse table may come from: the lookup of a
training call, and nothing else.

The table and its slots train only through the layer's lookup: their
"gradient" is their stepped rows, which the model's optimizer writes as it is
(`overwrite_with_gradient`). Two gradients of them would be written wrong
without a word, and are refused when the backward pass is traced, before
anything trains:

- one through any other read of them in the loss (the table of weight tying,
  a penalty on the table, scores against every row), which would be added to
  the stepped rows: the rows nobody looked up overwritten with the read's
  gradient on TensorFlow, moved by it on JAX. Such a read is given a
  gradient that refuses (`lookup_jax.refuse_gradient`,
  `lookup_tensorflow.refuse_gradient`), only where a gradient flows through
  it (`keras.ops.stop_gradient` of it, or a read the loss does not use,
  passes). The layer marks its table and slots (`guard`); the lookup's own
  reads are marked too (`own`).
- one of a call whose `training` was not given (`refuse_untrained`): the lookup
  then hands the table back unchanged, and a custom loop that calls the
  model without `training=True` would leave the table untrained (Keras's
  `Embedding` trains either way). `training=False` takes such gradients on
  purpose.
- one of a training call whose loss was scaled (`optimizer.scale_loss`: a
  `LossScaleOptimizer`'s dynamic scale, an optimizer's `loss_scale_factor`)
  but left out the layer's losses (`refuse_unprobed`): the lookup's probe,
  a zero loss the layer adds, is what tells the backward pass the scale
  (`lookup_jax.unscaled`), and without it the table would step with the
  scaled gradient (32,768 times too far under a `LossScaleOptimizer`'s
  first scale). The scaled losses are counted where Keras's optimizers
  scale them (`model_optimizer.count_scaled_losses`); a scaled loss since
  the training call, whose backward pass finds no probe, is that loss.

A training call inside a rematerialized function (`refuse_rematerialized`:
a layer that `keras.RematScope` rematerializes, `jax.checkpoint`,
`tf.recompute_grad`) is refused: its forward pass runs again in the backward
pass, which the lookup's step cannot follow (on JAX it failed on a leaked
tracer, on TensorFlow the table trained wrong without a word). The row-sparse
layers are themselves never rematerialized (`Embedding.rematerialized_call`).

A SavedModel being written (`model.export`, on either backend) traces every
gradient function (`saving`): there the table is handed back, and a read's
gradient passes, so that a model that reads its table to serve (scores
against every row) exports.

Runs without TensorFlow and without JAX.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
import threading
import weakref
from typing import Any, Iterable, Iterator, Optional

__all__ = [
    "guard",
    "losses_scaled",
    "own",
    "owned",
    "read_refusal_of",
    "refuse_unprobed",
    "refuse_untrained",
    "saving",
    "scaled_a_loss",
]

_OWN = contextvars.ContextVar("tf_tpu_embed_opt_own_table_reads", default=False)

# How many losses Keras's optimizers have scaled in this thread (where a
# step is traced and its gradient taken), and the last one's scaler
# (`scaled_a_loss`).
_SCALED = threading.local()


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


def guard(variables: Iterable[Any], layer: Any) -> None:
    """Marks `variables` (a row-sparse table and its slots) as `layer`'s,
    whose gradient through any other read than the lookup's is refused
    (`read_refusal_of`)."""
    for variable in variables:
        variable._refuses_reads_of = weakref.ref(layer)


def read_refusal_of(variable: Any) -> Optional[str]:
    """The refusal of a gradient through this read of `variable`, or None
    where none is due: a variable no layer guards (`guard`), or the lookup's
    own read (`own`)."""
    owner = getattr(variable, "_refuses_reads_of", None)
    layer = None if owner is None else owner()
    if layer is None or owned():
        return None
    return _read_refusal(variable.path, layer._table_words)


def _read_refusal(path: str, table: str) -> str:
    """The refusal of a read of the variable `path` of the row-sparse table
    `table` (its words in a refusal, `Embedding._table_words`) whose
    gradient reaches it."""
    return (
        f"{table}: {path} (a row-sparse table or one of its "
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


def refuse_untrained(table: Optional[str]) -> None:
    """In the backward pass of a call that is not training: refuses the
    gradient of `table` (its words in a refusal, `Embedding._table_words`;
    None where `training` was given, or the table is frozen), but for a
    SavedModel's gradient function (`saving`)."""
    if table is not None and not saving():
        raise ValueError(_untrained(table))


def _untrained(table: str) -> str:
    """The refusal of a gradient of the table `table` taken in a call whose
    `training` was not given."""
    return (
        f"{table}: a gradient of its table was taken in a call "
        "without training=True (training was not given). The table steps in "
        "the backward pass of a training call; here its gradient would be the "
        "table itself, and the table would not train (keras.layers.Embedding "
        "trains either way). Call the model with training=True to train it "
        "(model(x, training=True), model.stateless_call(..., training=True)), "
        "or with training=False to take gradients that leave it as it is."
    )


def scaled_a_loss(by: str) -> None:
    """Counts a loss scaled by `by` (the scaling optimizer's words)."""
    _SCALED.count = losses_scaled() + 1
    _SCALED.by = by


def losses_scaled() -> int:
    """How many losses have been scaled so far (`scaled_a_loss`): asked by
    a training call, whose backward pass asks again (`refuse_unprobed`)."""
    return getattr(_SCALED, "count", 0)


def refuse_unprobed(table: str, since: int) -> None:
    """In the backward pass of a training call of `table` (its words in a
    refusal) whose loss left out the lookup's probe: refuses it where a loss
    was scaled since the call (`since`, `losses_scaled` then), but for a
    SavedModel's gradient function (`saving`). Without a scaled loss the
    probe is not needed: the cotangent is the gradient."""
    if losses_scaled() > since and not saving():
        raise ValueError(_unprobed(table, _SCALED.by))


def _unprobed(table: str, by: str) -> str:
    """The refusal of a gradient of the table `table` from a loss scaled
    by `by` without the layer's losses."""
    return (
        f"{table}: its gradient was taken of a loss scaled by {by} that "
        "leaves out the layer's losses. The layer adds a zero loss whose "
        "gradient tells its backward pass the factor the loss was scaled by; "
        "without it the table would step with the scaled gradient (32,768 "
        "times too far at a LossScaleOptimizer's first scale). Add the "
        "model's losses to the loss before scaling it, as fit does: "
        "loss + sum(model.losses), or the losses of "
        "model.stateless_call(..., return_losses=True) on JAX."
    )


def saving() -> bool:
    """Whether TensorFlow is writing a SavedModel (`model.export`, on either
    backend), which traces the gradient function of every op that has one."""
    context = sys.modules.get("tensorflow.python.saved_model.save_context")
    return context is not None and context.in_save_context()


# Where a rematerialized function runs: any function of JAX's
# `jax.checkpoint` (Keras's remat on JAX), and the functions of TensorFlow's
# `tf.recompute_grad` (Keras's on TensorFlow) that call it.
_JAX_REMAT = "jax._src.ad_checkpoint"
_TENSORFLOW_REMAT = "tensorflow.python.ops.custom_gradient"
_TENSORFLOW_REMAT_FUNCTIONS = frozenset(
    {"inner", "grad_wrapper", "inner_recompute_grad"}
)


def refuse_rematerialized(table: str) -> None:
    """Refuses a call of `table` (its words in a refusal) that runs inside
    a rematerialized function, found among the calls under way: its forward
    pass would run again in the backward pass, and the table's step cannot
    be recomputed (its backward pass steps the rows its own forward pass
    read)."""
    frame = sys._getframe(1)
    while frame is not None:
        module = frame.f_globals.get("__name__")
        if module == _JAX_REMAT or (
            module == _TENSORFLOW_REMAT
            and frame.f_code.co_name in _TENSORFLOW_REMAT_FUNCTIONS
        ):
            raise ValueError(
                f"{table}: it is called inside a rematerialized function (a "
                "model or layer that keras.RematScope rematerializes, "
                "jax.checkpoint or tf.recompute_grad), whose forward pass runs "
                "again in the backward pass. The table steps in the backward "
                "pass of its own call, from the rows that call read, which "
                "cannot be recomputed. Build the model, and the layers that "
                "call the table, outside the RematScope (or leave them out of "
                "its layer_names): the row-sparse layers themselves are never "
                "rematerialized, so the scope may hold them."
            )
        frame = frame.f_back
