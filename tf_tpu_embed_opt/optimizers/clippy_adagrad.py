"""Clippy Adagrad: Adagrad with adaptive, per-variable update clipping, on Keras 3.

The algorithm is the one of TensorFlow Recommenders'
`tfrs.experimental.optimizers.ClippyAdagrad` (Anil et al., 2023,
https://arxiv.org/abs/2302.09178), which only runs on legacy Keras 2
(`tf_keras`). `ClippyAdagrad` here is a `keras.optimizers.Optimizer` for
Keras 3 that gives the same numbers, float32 op for float32 op, for dense
gradients and, on the TensorFlow backend, for row-sparse `tf.IndexedSlices`
ones. The math is written once with `keras.ops` and runs on every Keras
backend; on JAX and PyTorch gradients are dense, and the minimum in the
clipping factor over every element is the same as over the looked-up rows
(a row without gradient moves nothing and bounds nothing).
"""

from __future__ import annotations

import inspect
import math
import numbers
from typing import Any, Callable, Dict, List, Mapping, Optional, Union

import keras
import numpy as np
from keras import ops

from tf_tpu_embed_opt.optimizers import backend

if backend.BACKEND == "tensorflow":
    import tensorflow as tf

    from tf_tpu_embed_opt.optimizers.sparse import (
        deduplicate,
        in_xla_context,
        update_distinct,
    )

__all__ = ["ClippyAdagrad"]

LearningRate = Union[
    float, keras.optimizers.schedules.LearningRateSchedule, Callable[[], Any]
]


def _real(name: str, value: Any, allowed: str) -> float:
    """Returns `value` as a finite float, or raises an error naming `name`.

    Raises:
      TypeError: If `value` is not a real number (bools are not).
      ValueError: If `value` is infinite or NaN.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"ClippyAdagrad: `{name}` must be {allowed}; received "
            f"{name}={value!r} of type {type(value).__name__}."
        )
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(
            f"ClippyAdagrad: `{name}` must be {allowed}; received {name}={value!r}."
        )
    return value


def _non_negative(name: str, value: Any) -> float:
    allowed = "a finite real number >= 0"
    value = _real(name, value, allowed)
    if value < 0:
        raise ValueError(
            f"ClippyAdagrad: `{name}` must be {allowed}; received {name}={value!r}."
        )
    return value


def _flag(name: str, value: Any) -> bool:
    # `np.bool_` is not a `bool` subclass but is what NumPy code hands around.
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(
            f"ClippyAdagrad: `{name}` must be a bool (True or False); received "
            f"{name}={value!r} of type {type(value).__name__}."
        )
    return bool(value)


def _learning_rate(value: Any) -> Any:
    """Validates a numeric learning rate; schedules and callables pass through."""
    if isinstance(value, keras.optimizers.schedules.LearningRateSchedule) or (
        callable(value)
    ):
        return value
    allowed = (
        "a finite float >= 0, a keras.optimizers.schedules.LearningRateSchedule "
        "or a callable returning the learning rate"
    )
    rate = _real("learning_rate", value, allowed)
    if rate < 0:
        raise ValueError(
            f"ClippyAdagrad: `learning_rate` must be {allowed}; received "
            f"learning_rate={rate!r}."
        )
    return rate


def _clip_bound(
    delta: Any,
    variable_values: Any,
    precondition: Any,
    variable_relative_threshold: float,
    accumulator_relative_threshold: float,
    absolute_threshold: float,
) -> Any:
    """The largest factor that keeps each element of `delta` within its threshold.

    `min over i with delta_i != 0 of threshold_i / |delta_i|` (1 when no
    element moves), where `threshold_i = absolute_threshold +
    variable_relative_threshold * |variable_values_i| +
    accumulator_relative_threshold * |precondition_i|`. The clipping factor is
    `min(1, bound)`; for a variable in shards it is the minimum over the
    shards' bounds, which is the bound of the whole variable. The threshold is
    summed in this order, and every term is computed even when its factor is
    zero, as TFRS does, so that float32 results agree bit for bit.
    """
    threshold = (
        absolute_threshold + ops.absolute(variable_values) * variable_relative_threshold
    ) + ops.absolute(precondition) * accumulator_relative_threshold
    one = ops.ones((), dtype=delta.dtype)
    per_element = ops.where(
        delta == 0.0, one, ops.divide_no_nan(threshold, ops.absolute(delta))
    )
    # Over no element (a shard without looked-up rows) the minimum is +inf.
    return ops.min(per_element, initial=float("inf"))


@keras.saving.register_keras_serializable(package="tf_tpu_embed_opt")
class ClippyAdagrad(backend.ShardedBase, keras.optimizers.Optimizer):
    """Adagrad whose step is shrunk, per variable, to a relative threshold.

    For each model variable `w` with gradient `g` and Adagrad accumulator `a`
    (all element-wise, except the scalar `s`), one step is:

        a <- a + g^2                   (only if use_standard_accumulator_update)
        p  = 1 / sqrt(a + epsilon)
        d  = lr * g * p
        t  = absolute_threshold + variable_relative_threshold * |w|
             + accumulator_relative_threshold * |p|
        s  = min(1, min over i with d_i != 0 of t_i / |d_i|)
        w <- w - s * d
        a <- a + (s * g)^2             (if clip_accumulator_update)
        a <- a + g^2                   (if neither clip_accumulator_update
                                        nor use_standard_accumulator_update)

    where:

    - `lr` is the learning rate of the step;
    - `p` is the Adagrad preconditioner, read from the accumulator *before* the
      step's own gradient is added to it unless
      `use_standard_accumulator_update=True` (classical Adagrad order);
    - `t` is the largest change each element of `w` may take in one step;
    - `s` is the variable's clipping factor: one scalar in [0, 1] per model
      variable, the largest that keeps every element of the step within `t`.
      It is positive whenever `absolute_threshold > 0` (up to float32
      underflow) and is what `clipping_factors` exports.

    Row-sparse gradients (`tf.IndexedSlices`, e.g. from an `Embedding` layer)
    are applied to the looked-up rows only: rows that share an index are first
    summed, so each looked-up row gets exactly one update per step (as
    `tf_keras`'s `apply_gradients` does before TFRS's update step), and the
    other rows of the variable and of its accumulator are not written. The
    minimum in `s` is taken over the looked-up rows, as TFRS does; since a row
    with no gradient has `d = 0` and bounds nothing, this is the same factor,
    and the same step, as for the gradient made dense.

    This is the optimizer of TensorFlow Recommenders'
    `tfrs.experimental.optimizers.ClippyAdagrad` on Keras 3, on every Keras
    backend, with the same float32 results. Beyond TFRS, arguments are
    validated, `get_config` also holds `use_standard_accumulator_update`, and
    the exported clipping factors start at 1.0 (no clipping yet) rather than 0.

    Reference: Anil et al., "Improving Training Stability for Multitask Ranking
    Models in Recommender Systems" (2023), https://arxiv.org/abs/2302.09178.

    Attributes:
      iterations: The number of training steps this optimizer has run.
      learning_rate: The current learning rate (a variable, or the value of the
        schedule or callable at the current step).
      variables: Every variable of the optimizer: iterations, learning rate,
        accumulators and, when exported, clipping factors.
      clipping_factors: With `export_clipping_factors=True`, once built, one
        scalar variable per model variable holding the factor `s` of its
        latest step (1.0 before any step); otherwise an empty list.
    """

    def __init__(
        self,
        learning_rate: LearningRate = 0.001,
        initial_accumulator_value: float = 0.1,
        variable_relative_threshold: float = 0.1,
        accumulator_relative_threshold: float = 0.0,
        absolute_threshold: float = 1e-7,
        epsilon: float = 1e-7,
        export_clipping_factors: bool = False,
        clip_accumulator_update: bool = False,
        use_standard_accumulator_update: bool = False,
        weight_decay: Optional[float] = None,
        clipnorm: Optional[float] = None,
        clipvalue: Optional[float] = None,
        global_clipnorm: Optional[float] = None,
        use_ema: bool = False,
        ema_momentum: float = 0.99,
        ema_overwrite_frequency: Optional[int] = None,
        loss_scale_factor: Optional[float] = None,
        gradient_accumulation_steps: Optional[int] = None,
        name: str = "ClippyAdagrad",
        **kwargs: Any,
    ) -> None:
        """Creates the optimizer.

        Args:
          learning_rate: A float >= 0, a
            `keras.optimizers.schedules.LearningRateSchedule`, or a callable
            taking no argument and returning the learning rate. Adagrad tends
            to like larger values than other optimizers; the paper uses 1.0.
          initial_accumulator_value: Float >= 0. Starting value of every
            Adagrad accumulator element.
          variable_relative_threshold: Float >= 0. Threshold factor relative to
            the magnitude of the variable being updated.
          accumulator_relative_threshold: Float >= 0. Threshold factor relative
            to `1 / sqrt(accumulator + epsilon)`; a positive value (e.g. 1e-3)
            tightens the threshold as training goes on.
          absolute_threshold: Float >= 0. Constant part of the threshold. With
            0, a variable whose elements are all zero (and
            `accumulator_relative_threshold=0`) can never move.
          epsilon: Float >= 0 added to the accumulator under the square root.
            `epsilon` and `initial_accumulator_value` may not both be 0.
          export_clipping_factors: Bool. Keep each variable's latest clipping
            factor in `clipping_factors`.
          clip_accumulator_update: Bool. Add the clipped gradient `(s * g)^2`
            to the accumulator instead of `g^2`, which helps when gradients
            have outliers. Not together with `use_standard_accumulator_update`.
          use_standard_accumulator_update: Bool. Add `g^2` to the accumulator
            before computing the step, as classical Adagrad does. Not together
            with `clip_accumulator_update`.
          weight_decay: See `keras.optimizers.Optimizer`.
          clipnorm: See `keras.optimizers.Optimizer`.
          clipvalue: See `keras.optimizers.Optimizer`.
          global_clipnorm: See `keras.optimizers.Optimizer`.
          use_ema: See `keras.optimizers.Optimizer`.
          ema_momentum: See `keras.optimizers.Optimizer`.
          ema_overwrite_frequency: See `keras.optimizers.Optimizer`.
          loss_scale_factor: See `keras.optimizers.Optimizer`.
          gradient_accumulation_steps: See `keras.optimizers.Optimizer`.
          name: Name of the optimizer, prefix of its variables' names.
          **kwargs: Further `keras.optimizers.Optimizer` arguments.

        Raises:
          TypeError: If a numeric argument is not a real number, or a flag is
            not a bool.
          ValueError: If a numeric argument is negative or not finite, if
            `epsilon` and `initial_accumulator_value` are both 0, if both
            `clip_accumulator_update` and `use_standard_accumulator_update` are
            True, or if Keras rejects one of its own arguments.
        """
        learning_rate = _learning_rate(learning_rate)
        initial_accumulator_value = _non_negative(
            "initial_accumulator_value", initial_accumulator_value
        )
        variable_relative_threshold = _non_negative(
            "variable_relative_threshold", variable_relative_threshold
        )
        accumulator_relative_threshold = _non_negative(
            "accumulator_relative_threshold", accumulator_relative_threshold
        )
        absolute_threshold = _non_negative("absolute_threshold", absolute_threshold)
        epsilon = _non_negative("epsilon", epsilon)
        if epsilon == 0 and initial_accumulator_value == 0:
            raise ValueError(
                "ClippyAdagrad: `epsilon` and `initial_accumulator_value` cannot "
                "both be 0 (the first step would divide by sqrt(0)); received "
                f"epsilon={epsilon!r}, initial_accumulator_value="
                f"{initial_accumulator_value!r}. Make at least one positive."
            )
        export_clipping_factors = _flag(
            "export_clipping_factors", export_clipping_factors
        )
        clip_accumulator_update = _flag(
            "clip_accumulator_update", clip_accumulator_update
        )
        use_standard_accumulator_update = _flag(
            "use_standard_accumulator_update", use_standard_accumulator_update
        )
        if clip_accumulator_update and use_standard_accumulator_update:
            raise ValueError(
                "ClippyAdagrad: `clip_accumulator_update` and "
                "`use_standard_accumulator_update` cannot both be True (the "
                "standard update adds the unclipped gradient before the step); "
                "received clip_accumulator_update=True, "
                "use_standard_accumulator_update=True. Set at most one."
            )
        super().__init__(
            learning_rate=learning_rate,
            weight_decay=weight_decay,
            clipnorm=clipnorm,
            clipvalue=clipvalue,
            global_clipnorm=global_clipnorm,
            use_ema=use_ema,
            ema_momentum=ema_momentum,
            ema_overwrite_frequency=ema_overwrite_frequency,
            loss_scale_factor=loss_scale_factor,
            gradient_accumulation_steps=gradient_accumulation_steps,
            name=name,
            **kwargs,
        )
        self.initial_accumulator_value = initial_accumulator_value
        self.variable_relative_threshold = variable_relative_threshold
        self.accumulator_relative_threshold = accumulator_relative_threshold
        self.absolute_threshold = absolute_threshold
        self.epsilon = epsilon
        self.export_clipping_factors = export_clipping_factors
        self.clip_accumulator_update = clip_accumulator_update
        self.use_standard_accumulator_update = use_standard_accumulator_update
        self._accumulators: List[Any] = []
        self._clipping_factors: List[Any] = []

    @property
    def clipping_factors(self) -> List[keras.Variable]:
        """The latest clipping factor of each model variable (see class doc)."""
        return list(self._clipping_factors)

    def build(self, variables: List[Any]) -> None:
        """Creates the accumulators (and clipping factors) for `variables`.

        Args:
          variables: The model variables this optimizer will update.
        """
        if self.built:
            return
        super().build(variables)
        # Filled in the variable's dtype: `keras.initializers.Constant` would
        # round the value to float32 first (float64 accumulators would start
        # from 0.10000000149011612).
        initializer = backend.constant_initializer(self.initial_accumulator_value)

        accumulators, factors = [], []
        for variable in variables:
            # Keras overwrites such (float8 scaling) variables with their
            # "gradient" and never calls `update_step` for them.
            if getattr(variable, "overwrite_with_gradient", False):
                accumulators.append(None)
                if self.export_clipping_factors:
                    factors.append(None)
                continue
            accumulators.append(
                self.add_variable_from_reference(
                    variable, name="accumulator", initializer=initializer
                )
            )
            if self.export_clipping_factors:
                prefix = getattr(variable, "path", None) or variable.name
                prefix = str(prefix).replace("/", "_").replace(":", "_")
                factors.append(
                    self.add_variable(
                        shape=(),
                        initializer="ones",
                        dtype=variable.dtype,
                        name=f"{prefix}_clipping_factor",
                    )
                )
        self._accumulators = accumulators
        self._clipping_factors = factors

    def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
        """Applies one step of the update rule to `variable`.

        Args:
          gradient: Dense gradient, or row-sparse `tf.IndexedSlices` (rows with
            the same index are summed first).
          variable: The model variable to update.
          learning_rate: The learning rate of this step.
        """
        dtype = variable.dtype
        index = self._get_variable_index(variable)
        lr = ops.cast(learning_rate, dtype)
        if backend.BACKEND != "tensorflow" or not isinstance(
            gradient, tf.IndexedSlices
        ):
            self._apply(index, variable, ops.cast(gradient, dtype), lr)
            return
        # Outside XLA: each distinct id once, in order of first appearance
        # (the ops tf_keras sums duplicates with before TFRS's step). Under
        # XLA: static shapes, the distinct ids then copies of the first.
        values = tf.cast(gradient.values, dtype)
        if in_xla_context():
            update_distinct(
                gradient.indices,
                values,
                lambda ids, rows: self._apply(index, variable, rows, lr, ids),
            )
        else:
            ids, rows = deduplicate(gradient.indices, values, static_shape=False)
            self._apply(index, variable, rows, lr, ids)

    def _apply(
        self,
        index: int,
        variable: Any,
        grad: Any,
        lr: Any,
        indices: Any = None,
    ) -> None:
        """The step on the whole variable, or on the rows `indices` of it."""
        step = self._step(index, variable, grad, lr, indices)
        factor = ops.minimum(ops.ones((), dtype=grad.dtype), step["bound"])
        self._write(index, variable, grad, step, factor, indices)

    def _step(
        self,
        index: int,
        variable: Any,
        grad: Any,
        lr: Any,
        indices: Any,
    ) -> Dict[str, Any]:
        """The unclipped step and its clipping bound (see `_clip_bound`)."""
        accumulator = self._slot_for(self._accumulators[index], variable)
        epsilon = ops.cast(self.epsilon, grad.dtype)
        if indices is None:
            accumulator_values = ops.convert_to_tensor(accumulator)
            variable_values = ops.convert_to_tensor(variable)
        else:
            accumulator_values = tf.gather(_tf_variable(accumulator), indices)
            variable_values = tf.gather(_tf_variable(variable), indices)

        # Added before the step (standard Adagrad) or after it, when the
        # clipping factor that the clipped variant needs is known.
        if self.use_standard_accumulator_update:
            accumulator_values = accumulator_values + ops.square(grad)
        precondition = ops.rsqrt(accumulator_values + epsilon)
        delta = lr * grad * precondition
        bound = _clip_bound(
            delta,
            variable_values,
            precondition,
            self.variable_relative_threshold,
            self.accumulator_relative_threshold,
            self.absolute_threshold,
        )
        return {
            "accumulator": accumulator_values,
            "variable": variable_values,
            "delta": delta,
            "bound": bound,
        }

    def _write(
        self,
        index: int,
        variable: Any,
        grad: Any,
        step: Dict[str, Any],
        clipping_factor: Any,
        indices: Any,
    ) -> None:
        """Writes the step clipped by `clipping_factor`, and the accumulator."""
        accumulator = self._slot_for(self._accumulators[index], variable)
        clipped_delta = step["delta"] * clipping_factor
        accumulator_values = step["accumulator"]
        if not self.use_standard_accumulator_update:
            accumulated = grad
            if self.clip_accumulator_update:
                accumulated = grad * clipping_factor
            accumulator_values = accumulator_values + ops.square(accumulated)

        if self.export_clipping_factors:
            self.assign(self._clipping_factors[index], clipping_factor)
        if indices is None:
            self.assign(accumulator, accumulator_values)
            self.assign_sub(variable, clipped_delta)
        else:
            self.assign(accumulator, tf.IndexedSlices(accumulator_values, indices))
            # Written, not subtracted: copies of a row (XLA) rewrite the same
            # value instead of subtracting its step again.
            self.assign(
                variable, tf.IndexedSlices(step["variable"] - clipped_delta, indices)
            )

    def _apply_shards(
        self,
        gradients: List[Union[tf.Tensor, tf.IndexedSlices]],
        shards: List[tf.Variable],
        learning_rate: Any,
    ) -> None:
        """One step of a sharded variable: one clipping factor for all shards.

        Each shard's step and bound are computed on the server that holds it;
        the factor is the minimum of the bounds (scalars), as for the whole
        variable; then each server writes its rows.
        """
        index = self._get_variable_index(shards[0])
        dtype = shards[0].dtype
        lr = tf.cast(learning_rate, dtype)
        steps = []
        for gradient, shard in zip(gradients, shards):
            with tf.device(shard.device):
                if isinstance(gradient, tf.IndexedSlices):
                    ids, rows = deduplicate(
                        gradient.indices,
                        tf.cast(gradient.values, dtype),
                        static_shape=False,
                    )
                else:
                    ids, rows = None, tf.cast(gradient, dtype)
                steps.append((ids, rows, self._step(index, shard, rows, lr, ids)))
        factor = tf.minimum(
            tf.constant(1.0, dtype=dtype),
            tf.reduce_min(tf.stack([step["bound"] for _, _, step in steps])),
        )
        for (ids, rows, step), shard in zip(steps, shards):
            with tf.device(shard.device):
                self._write(index, shard, rows, step, factor, ids)

    @classmethod
    def from_config(cls, config: Dict[str, Any], custom_objects: Any = None) -> Any:
        """Builds the optimizer from a config, as Keras does.

        Keys that `config` lacks take the constructor's defaults; an unknown
        key is refused by Keras's "Argument(s) not recognized".
        """
        if isinstance(config, Mapping):
            config = dict(config)  # Keras's from_config writes into it.
        return super().from_config(config, custom_objects=custom_objects)

    def get_config(self) -> Dict[str, Any]:
        """Returns every constructor argument, for `from_config`."""
        config = super().get_config()
        config.update(
            {
                "initial_accumulator_value": self.initial_accumulator_value,
                "variable_relative_threshold": self.variable_relative_threshold,
                "accumulator_relative_threshold": (self.accumulator_relative_threshold),
                "absolute_threshold": self.absolute_threshold,
                "epsilon": self.epsilon,
                "export_clipping_factors": self.export_clipping_factors,
                "clip_accumulator_update": self.clip_accumulator_update,
                "use_standard_accumulator_update": (
                    self.use_standard_accumulator_update
                ),
            }
        )
        return config

    def __repr__(self) -> str:
        """The class name and the arguments that differ from the defaults."""
        config = self.get_config()
        rate = self._learning_rate
        if isinstance(rate, keras.Variable):
            # Kept in float32; the shortest decimal with that value is what
            # was written (0.05, not 0.05000000074505806).
            config["learning_rate"] = float(str(np.float32(rate.numpy())))
        else:
            config["learning_rate"] = rate
        shown = []
        parameters = inspect.signature(type(self).__init__).parameters
        for name, parameter in parameters.items():
            if name not in config:
                continue
            value = config[name]
            if value != parameter.default or type(value) is not type(parameter.default):
                shown.append(f"{name}={value!r}")
        return f"{type(self).__name__}({', '.join(shown)})"


def _tf_variable(variable: Any) -> Any:
    """The `tf.Variable` behind a Keras variable (or `variable` itself)."""
    return variable.value if isinstance(variable, keras.Variable) else variable
