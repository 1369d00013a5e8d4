"""Learning rates across the faces: constants, Keras schedules, step functions.

The embedding engines and Keras take a learning rate of the step differently:
`TPUEmbedding` calls a function of no arguments at every step,
jax-tpu-embedding calls its spec's function with the step keras-rs gives it,
and Keras evaluates a `LearningRateSchedule` at the optimizer's `iterations`.
The conversions (`tf_tpu_embed_opt.conversions.faces`) hand a learning rate across with
these bridges, which keep the value at every step. A `KerasStepLearningRate`
that a twin of `to_keras` holds is saved with it as a `KerasStepSchedule` of
the twin's own steps (a saved config cannot hold the optimizer it follows).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, Mapping, Optional

import keras

from tf_tpu_embed_opt.definitions import registry
from tf_tpu_embed_opt.definitions.values import is_real
from tf_tpu_embed_opt.optimizers import twins
from tf_tpu_embed_opt.optimizers.backend import KERAS_OPS as _KERAS_OPS

__all__ = [
    "KerasStepLearningRate",
    "KerasStepSchedule",
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
    if not is_real(rate):
        # float() would take `True` as 1.0, or fail on a string without
        # saying whose value it was.
        raise TypeError(
            "to_keras: a jax-tpu-embedding spec's `learning_rate` must be a "
            "real number, a callable of the step or a Keras "
            f"LearningRateSchedule; received {rate!r} of type "
            f"{type(rate).__name__}."
        )
    return float(rate)


def _at(rate: Any, factor: Any, arguments: Mapping[str, Any], iterations: Any) -> Any:
    """The learning rate `rate` (a constant, a Keras schedule or a function of
    no argument) after `iterations` steps, times `factor` of step
    t = `iterations + 1` where given."""
    if isinstance(rate, keras.optimizers.schedules.LearningRateSchedule):
        value = rate(iterations)
    elif callable(rate):
        value = rate()
    else:
        value = rate
    if factor is None:
        return value
    step = keras.ops.cast(iterations + 1, "float32")
    return factor(_KERAS_OPS, step, arguments, value)


def _factors() -> Dict[str, Callable[..., Any]]:
    """Algorithm name -> its `KerasFace.learning_rate_factor`, for the
    definitions that have one."""
    return {
        d.name: d.keras.learning_rate_factor
        for d in registry.ALL
        if d.keras and d.keras.learning_rate_factor
    }


def _factor_of(algorithm: Any) -> Any:
    """The learning-rate factor of the algorithm named `algorithm` (`None`:
    no factor)."""
    if algorithm is None:
        return None
    factors = _factors()
    if algorithm not in factors:
        raise ValueError(
            f"KerasStepSchedule: argument `algorithm` must name an algorithm "
            f"whose learning rate has a factor of the step ({list(factors)}) or "
            f"be None; received {algorithm!r}."
        )
    return factors[algorithm]


@keras.saving.register_keras_serializable(package="tf_tpu_embed_opt")
class KerasStepLearningRate:
    """A zero-argument learning rate that follows a Keras optimizer's steps.

    `TPUEmbedding` evaluates it at every `apply_gradients`. It returns the
    schedule's (or constant's) value at the Keras optimizer's `iterations`;
    given a definition's `KerasFace.learning_rate_factor` and the Keras
    arguments, that value times the factor of step t = `iterations + 1`
    (Keras Adam's bias correction η·√(1 − β₂ᵗ)/(1 − β₁ᵗ), in Keras's order).

    A Keras optimizer holding one (the twin `to_keras` makes) is saved with it
    as a `KerasStepSchedule`, the same values at its own steps: a saved
    config cannot hold the optimizer followed. A twin is saved only while it
    has stepped as often as that optimizer (`keras_optimizer`'s
    `MultiOptimizer` steps both together), so that it goes on with the same
    values once loaded.
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
        return _at(self.rate, self.factor, self.arguments, self.optimizer.iterations)

    def _algorithm(self) -> Optional[str]:
        if self.factor is None:
            return None
        for name, factor in _factors().items():
            if factor is self.factor:
                return name
        raise TypeError(
            f"Cannot serialize {self!r}: its factor {self.factor.__name__} is "
            "no algorithm's learning-rate factor (KerasFace.learning_rate_factor)."
        )

    def get_config(self) -> Dict[str, Any]:
        """The config of the `KerasStepSchedule` it is saved as."""
        return KerasStepSchedule(
            self.rate, self._algorithm(), self.arguments
        ).get_config()

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "KerasStepSchedule":
        """A saved one, as a `KerasStepSchedule` (of the steps of the
        optimizer that loads it)."""
        return KerasStepSchedule.from_config(config)

    def check_saved_by(self, optimizer: Any) -> None:
        """Refuses to save `optimizer` with this learning rate unless it has
        stepped as often as the optimizer followed (so that the
        `KerasStepSchedule` it is saved as, of its own steps, goes on with
        the same values).

        Raises:
          ValueError: Their step counts differ; the message names both.
        """
        if optimizer is self.optimizer:
            return
        own, followed = (
            int(keras.ops.convert_to_numpy(o.iterations))
            for o in (optimizer, self.optimizer)
        )
        if own != followed:
            raise ValueError(
                f"{type(optimizer).__name__} {optimizer.name!r} cannot be saved: "
                f"its learning rate follows the steps of optimizer "
                f"{self.optimizer.name!r} ({self!r}), which a saved config "
                "cannot hold, so it is saved as a schedule of its own steps; "
                "that keeps its values only when the two have stepped alike, "
                f"and {optimizer.name!r} has taken {own} step{'s' * (own != 1)}, "
                f"{self.optimizer.name!r} {followed}. Step them together "
                "(keras_optimizer's MultiOptimizer does), or give it a "
                "learning rate of its own."
            )

    def __repr__(self) -> str:
        rate = twins.rate_repr(self.rate)
        factor = "" if self.factor is None else f", times {self.factor.__name__}"
        return (
            f"KerasStepLearningRate({rate}{factor}, "
            f"iterations of {self.optimizer.name!r})"
        )


@keras.saving.register_keras_serializable(package="tf_tpu_embed_opt")
class KerasStepSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """A `KerasStepLearningRate` of the steps of the optimizer applying it.

    Keras evaluates a schedule at the `iterations` of the optimizer that
    holds it: the learning rate `rate` there, times the factor of step
    t = `iterations + 1` of the algorithm named `algorithm`
    (`KerasFace.learning_rate_factor`, with the Keras `arguments`), as
    `KerasStepLearningRate` computes it at the steps of the optimizer it
    follows.

    Args:
      rate: A float, a Keras `LearningRateSchedule` or a function of no
        argument.
      algorithm: The name of the algorithm whose factor applies, or `None`.
      arguments: The Keras arguments the factor reads.
    """

    def __init__(
        self,
        rate: Any,
        algorithm: Optional[str] = None,
        arguments: Optional[Mapping[str, Any]] = None,
    ) -> None:
        self.rate = rate
        self.algorithm = algorithm
        self.factor = _factor_of(algorithm)
        self.arguments = dict(arguments or {})

    def __call__(self, step: Any) -> Any:
        return _at(self.rate, self.factor, self.arguments, step)

    def get_config(self) -> Dict[str, Any]:
        return {
            "rate": keras.saving.serialize_keras_object(self.rate),
            "algorithm": self.algorithm,
            "arguments": dict(self.arguments),
        }

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "KerasStepSchedule":
        config = dict(config)
        config["rate"] = keras.saving.deserialize_keras_object(config["rate"])
        return cls(**config)

    def __repr__(self) -> str:
        factor = "" if self.factor is None else f", times {self.factor.__name__}"
        return f"KerasStepSchedule({twins.rate_repr(self.rate)}{factor})"


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
