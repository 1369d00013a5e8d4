"""Learning rates across the faces: constants, Keras schedules, step functions.

The embedding engines and Keras take a learning rate of the step differently:
`TPUEmbedding` calls a function of no arguments at every step,
jax-tpu-embedding calls its spec's function with the step keras-rs gives it,
and Keras evaluates a `LearningRateSchedule` at the optimizer's `iterations`.
The conversions (`tf_tpu_embed_opt.conversions.faces`) hand a learning rate across with
these bridges, which keep the value at every step.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, Mapping, Optional

import keras

from tf_tpu_embed_opt.optimizers import twins
from tf_tpu_embed_opt.optimizers.backend import KERAS_OPS as _KERAS_OPS

__all__ = [
    "KerasStepLearningRate",
    "StepLearningRate",
    "for_engine",
    "of_spec",
]


def _arguments_of(function: Any) -> int:
    """How many arguments a learning-rate callable takes, as jax-tpu-embedding
    counts them (`OptimizerSpec.get_learning_rate`)."""
    names = inspect.getfullargspec(function).args
    return len(names) if inspect.isfunction(function) else len(names) - 1


@keras.saving.register_keras_serializable(package="tf_tpu_embed_opt")
class StepLearningRate(keras.optimizers.schedules.LearningRateSchedule):
    """A jax-tpu-embedding learning rate of the step, as a Keras schedule.

    Keras evaluates a schedule at the optimizer's `iterations` (0 at the first
    step), the step keras-rs gives jax-tpu-embedding, which calls the function
    with it.
    """

    def __init__(self, function: Any) -> None:
        self.function = function

    def __call__(self, step: Any) -> Any:
        return self.function(step)

    def get_config(self) -> Dict[str, Any]:
        raise NotImplementedError(
            "StepLearningRate wraps a Python function, which Keras cannot "
            "serialize; save the model with a Keras LearningRateSchedule."
        )

    def __repr__(self) -> str:
        return f"StepLearningRate({self.function!r})"


def of_spec(rate: Any) -> Any:
    """A jax-tpu-embedding spec's learning rate as the twin takes it."""
    if isinstance(rate, keras.optimizers.schedules.LearningRateSchedule):
        return rate  # keras-rs hands a Keras schedule through unchanged
    if callable(rate):
        if _arguments_of(rate) == 0:
            return rate
        return StepLearningRate(rate)
    if hasattr(rate, "item"):
        rate = rate.item()
    return float(rate)


class KerasStepLearningRate:
    """A zero-argument learning rate that follows a Keras optimizer's steps.

    `TPUEmbedding` evaluates it at every `apply_gradients`. It returns the
    schedule's (or constant's) value at the Keras optimizer's `iterations`;
    given a definition's `KerasFace.learning_rate_factor` and the Keras
    arguments, that value times the factor of step t = `iterations + 1`
    (Keras Adam's bias correction η·√(1 − β₂ᵗ)/(1 − β₁ᵗ), in Keras's order).
    """

    def __init__(
        self,
        optimizer: Any,
        rate: Any,
        factor: Optional[Callable[..., Any]] = None,
        arguments: Optional[Mapping[str, Any]] = None,
    ) -> None:
        self.optimizer = optimizer
        self.rate = rate
        self.factor = factor
        self.arguments = dict(arguments or {})

    def __call__(self) -> Any:
        rate = self.rate
        if isinstance(rate, keras.optimizers.schedules.LearningRateSchedule):
            value = rate(self.optimizer.iterations)
        elif callable(rate):
            value = rate()
        else:
            value = rate
        if self.factor is None:
            return value
        step = keras.ops.cast(self.optimizer.iterations + 1, "float32")
        return self.factor(_KERAS_OPS, step, self.arguments, value)

    def __repr__(self) -> str:
        rate = twins.rate_repr(self.rate)
        factor = "" if self.factor is None else f", times {self.factor.__name__}"
        return (
            f"KerasStepLearningRate({rate}{factor}, "
            f"iterations of {self.optimizer.name!r})"
        )


def for_engine(
    keras_opt: Any,
    rate: Any,
    tensorflow: bool,
    factor: Optional[Callable[..., Any]] = None,
    arguments: Optional[Mapping[str, Any]] = None,
) -> Any:
    """A Keras optimizer's learning rate as an engine takes it.

    A TensorFlow engine calls a function of no argument at every step: a
    Keras schedule (and, where `factor` is given, any rate times `factor` of
    the step with the Keras `arguments`: Adam's bias correction) becomes a
    `KerasStepLearningRate` following the optimizer's `iterations`.
    jax-tpu-embedding takes a schedule as it is: it calls it with the step
    keras-rs gives it (its iteration count, 0 at the first step), where Keras
    calls it with `iterations` (0 at the first step). A spec's own function
    that `of_spec` wrapped comes back itself (an optax schedule, so that
    jax-tpu-embedding's `==` finds the specs equal).

    Args:
      keras_opt: The Keras optimizer.
      rate: Its learning rate as read (`keras_reading.learning_rate`: a
        float Keras keeps in a variable is the shortest decimal with its
        float32 value, what the user wrote).
      tensorflow: For a TensorFlow engine (else jax-tpu-embedding).
      factor: The definition's `KerasFace.learning_rate_factor`, if any.
      arguments: The Keras arguments the factor reads.
    """
    if not tensorflow and isinstance(rate, StepLearningRate):
        return rate.function
    schedule = isinstance(rate, keras.optimizers.schedules.LearningRateSchedule)
    if tensorflow and (schedule or factor is not None):
        arguments = arguments if factor is not None else None
        return KerasStepLearningRate(keras_opt, rate, factor, arguments)
    return rate
