"""The model optimizer a table meets: judged when it is built, and held to a
refused step.

A row-sparse table steps in the backward pass and hands Keras its stepped
rows as "gradients", which the optimizer the model trains with writes as
they are (`overwrite_with_gradient`). That optimizer's own training features
then meet the table:

- loss scaling (`LossScaleOptimizer`, which `mixed_float16` adds, or
  `loss_scale_factor`) works: the lookup's probe (`lookup_jax.unscaled`)
  gives the backward pass the scale, and a step the wrapper skips writes
  nothing; a loss scaled without the probe (a custom loop that leaves out
  `model.losses`) is refused (`count_scaled_losses`,
  `gradients.refuse_unprobed`);
- clipping (`clipnorm`, `global_clipnorm`, `clipvalue`) and `weight_decay`
  work: Keras leaves the variables it overwrites out of both, so they apply
  to the dense weights alone, as on a TPU, where the tables are no Keras
  variables;
- `use_ema` works on JAX (the dense weights are averaged, the table is not:
  Keras keeps no average of a variable it overwrites), except with
  `ema_overwrite_frequency`, and is refused on TensorFlow; and
  `gradient_accumulation_steps` is refused (`refusal`);
- a table's own optimizer as the model's optimizer (the same object) is
  refused (`sharing_refusal`).

A refusal must come before anything trains, and on JAX before `fit` starts
its loop: Keras's JAX trainer takes the model's arrays out of its variables
for the loop, and an error raised inside the first step leaves the model
without them. Keras gives a layer no hook there, and no reference to the
model's optimizer; the one place every training path builds that optimizer
on the table's variables is `keras.optimizers.Optimizer.build` (on JAX
`fit` before its loop, on TensorFlow while it traces its first step, before
that runs; a custom loop before or at its first `apply`). `judge_builds`
wraps it,
once, when the first row-sparse table is built: the wrapper refuses an
optimizer built on such a table whose features the table cannot meet, and
otherwise leaves the build as it was.
"""

from __future__ import annotations

import functools
from typing import Any, List, Optional

import keras

from tf_tpu_embed_opt.layers import gradients

__all__ = [
    "count_scaled_losses",
    "counters",
    "judge_builds",
    "refusal",
    "sharing_refusal",
    "table_of",
]


def refusal(optimizer: Any, layer: str, backend: str) -> Optional[str]:
    """Why the table of `layer` cannot train under `optimizer` on
    `backend`, in one message naming the setting and the way out; None
    where it can."""
    owner = f"Embedding {layer!r}: the model's optimizer {type(optimizer).__name__}"
    steps = getattr(optimizer, "gradient_accumulation_steps", None)
    if steps:
        return (
            f"{owner} has gradient_accumulation_steps={steps!r}. The table "
            "steps in the backward pass of every batch; Keras would keep a "
            "table-sized accumulator for it and for each of its slots, and "
            "write the element-wise largest of the stepped tables once every "
            f"{steps} batches (on TensorFlow it fails inside the step). Leave "
            f"gradient_accumulation_steps unset: a batch {steps} times larger "
            "steps the table and the dense layers with the mean gradient of "
            "the batches it would accumulate."
        )
    if not getattr(optimizer, "use_ema", False):
        return None
    if backend == "tensorflow":
        return (
            f"{owner} has use_ema=True. On TensorFlow, Keras's optimizer "
            "assigns every variable it trains its moving average (at the end "
            "of fit, and every ema_overwrite_frequency steps) and keeps none "
            "for a table it writes as the backward pass stepped it, so fit "
            "would fail once the table has trained. Leave use_ema off, or "
            "train on Keras's JAX backend, where the dense weights are "
            "averaged and the table is not."
        )
    frequency = getattr(optimizer, "ema_overwrite_frequency", None)
    if frequency:
        return (
            f"{owner} has use_ema=True with ema_overwrite_frequency="
            f"{frequency!r}. Keras overwrites every variable it trains with "
            "its moving average every so many steps and keeps none for a "
            "table it writes as the backward pass stepped it, so the step "
            "would fail. Leave ema_overwrite_frequency unset: the dense "
            "weights' averages are then assigned at the end of fit, and the "
            "table trains as without use_ema."
        )
    return None


def judge_builds(owner_of: Any, backend: str) -> None:
    """Wraps `keras.optimizers.Optimizer.build` (once) so that an optimizer
    built on a row-sparse table's variables (`owner_of(variable)` is its
    layer) is refused, before it creates a variable, where `refusal` says
    so, or the layer's own `step_refusal` (a table that cannot step as
    configured)."""
    base = _defining_build(keras.optimizers.Optimizer)
    build = base.build
    if getattr(build, "_judges_tables", False):
        return

    @functools.wraps(build)
    def judged_build(self: Any, variables: Any) -> Any:
        if not self.built:
            table = table_of(self)
            if table is not None:
                raise ValueError(sharing_refusal(self, table._table_words))
            for variable in variables:
                layer = owner_of(variable)
                why = None
                if layer is not None:
                    why = refusal(self, layer.name, backend) or layer.step_refusal()
                if why is not None:
                    raise ValueError(why)
        return build(self, variables)

    judged_build._judges_tables = True
    base.build = judged_build


def table_of(optimizer: Any) -> Any:
    """The row-sparse layer that `optimizer` steps the table of (the last
    one built, where it steps several), or None."""
    owner = getattr(optimizer, "_table_step_of", None)
    return owner() if owner is not None else None


def sharing_refusal(optimizer: Any, table: str) -> str:
    """The refusal of `optimizer`, the optimizer of the row-sparse table
    `table` (its words in a refusal), built as a model's optimizer too:
    its `iterations` are the table's steps, and its learning rate is state
    of the layer."""
    name = type(optimizer).__name__
    return (
        f"{table}: its optimizer {name} {optimizer.name!r} is also a model's "
        "optimizer (the same object, built on the model's variables). A "
        "table's optimizer reports the table's steps as its iterations and "
        "keeps its learning rate with the layer's state: the dense layers "
        "would step at the table's step count, one ahead (Adam's bias "
        "correction, a schedule), and on JAX the step would be given the "
        "learning rate twice. Give the table an optimizer of its own with the "
        f"same definition, Embedding(..., optimizer={name}.from_config("
        "optimizer.get_config())), and compile the model with the other."
    )


def count_scaled_losses() -> None:
    """Wraps `scale_loss` of Keras's optimizers (once: the base optimizer's,
    and `LossScaleOptimizer`'s, which overrides it) so that each loss it
    scales is counted (`gradients.scaled_a_loss`); a loss it hands back
    unchanged (no `loss_scale_factor`) is not."""
    for owner in (keras.optimizers.Optimizer, keras.optimizers.LossScaleOptimizer):
        defining = [k for k in owner.__mro__ if "scale_loss" in vars(k)][0]
        scale_loss = defining.scale_loss
        if getattr(scale_loss, "_counts_scaled_losses", False):
            continue
        defining.scale_loss = _counted(scale_loss)


def _counted(scale_loss: Any) -> Any:
    """`scale_loss` that counts each loss it scales."""

    @functools.wraps(scale_loss)
    def counted(self: Any, loss: Any) -> Any:
        scaled = scale_loss(self, loss)
        if scaled is not loss:
            factor = getattr(self, "loss_scale_factor", None)
            by = type(self).__name__
            gradients.scaled_a_loss(
                by if factor is None else f"{by}(loss_scale_factor={factor!r})"
            )
        return scaled

    counted._counts_scaled_losses = True
    return counted


def _defining_build(optimizer_class: type) -> type:
    """The class whose `build` every Keras optimizer's `build` reaches last
    (`BaseOptimizer`)."""
    defining = [k for k in optimizer_class.__mro__ if "build" in vars(k)]
    return defining[-1]


def counters(model: Any) -> List[Any]:
    """The step counters the optimizer of `model` (a `keras.Model` with a
    compiled optimizer, or anything else: none) increments when it applies a
    step: Keras's `_iterations` of it, of a `LossScaleOptimizer`'s inner
    optimizer and of a `MultiOptimizer`'s optimizers."""
    optimizer = (
        getattr(model, "optimizer", None) if isinstance(model, keras.Model) else None
    )
    found = []
    pending = [optimizer]
    while pending:
        current = pending.pop()
        if not isinstance(current, keras.optimizers.Optimizer):
            continue
        if isinstance(getattr(current, "_iterations", None), keras.Variable):
            found.append(current._iterations)
        pending.append(getattr(current, "inner_optimizer", None))
        pending.extend(getattr(current, "_inner_optimizers", None) or ())
    return found
