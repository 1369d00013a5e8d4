"""A Keras optimizer read once, at the edge of `to_embedding`.

`read(keras_opt, engine)` takes everything `to_embedding` needs from a
Keras optimizer (this package's twin or a stock `keras.optimizers` class) in
one pass, into a `KerasReading`: the algorithm it runs and the engine
algorithm it converts to, its Keras arguments and engine options, the
learning rate as the engine takes it, the gradient clip, and every setting
the engine cannot reproduce (Keras's base arguments, a Keras-only argument
unless its definition says the value is negligible, what jax-tpu-embedding's
own spec cannot hold, which that engine says), each named. The conversion
refuses those (or, with `strict=False`, warns) before anything is built, then
builds from the reading alone.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Tuple

import keras

from tf_tpu_embed_opt import errors
from tf_tpu_embed_opt.conversions import learning_rates
from tf_tpu_embed_opt.definitions import registry, rules, spec
from tf_tpu_embed_opt.engines import jax_tpu_embedding as jax_engine
from tf_tpu_embed_opt.optimizers import twins as optimizers

__all__ = [
    "KerasReading",
    "base_differences",
    "gradient_clip",
    "keras_algorithm",
    "keras_only_differences",
    "learning_rate",
    "negligible",
    "negligible_settings",
    "read",
]

# keras.optimizers class name -> the definition whose Keras face mirrors it.
_STOCK = {
    d.keras.stock: d.name
    for d in registry.DEFINITIONS
    if d.keras is not None and d.keras.stock
}


def base_differences(keras_opt: Any, engine: spec.Engine) -> List[str]:
    differences = []
    if keras_opt.weight_decay and not engine.tensorflow:
        differences.append(
            f"weight_decay={keras_opt.weight_decay!r}: "
            + jax_engine.option_reason("weight_decay_factor")
        )
    elif keras_opt.weight_decay:
        differences.append(
            f"weight_decay={keras_opt.weight_decay!r}: Keras decays every "
            "element each step; the engine's weight_decay_factor decays only "
            "looked-up rows (use the weight_decay_factor keyword of this "
            "package's optimizers)"
        )
    if keras_opt.clipnorm:
        differences.append(
            f"clipnorm={keras_opt.clipnorm!r}: the engine has no norm clipping"
        )
    if keras_opt.global_clipnorm:
        differences.append(
            f"global_clipnorm={keras_opt.global_clipnorm!r}: the engine has no "
            "norm clipping"
        )
    if keras_opt.use_ema:
        differences.append(
            "use_ema=True: the engine keeps no moving average of the weights"
        )
    if keras_opt.loss_scale_factor:
        differences.append(
            f"loss_scale_factor={keras_opt.loss_scale_factor!r}: Keras divides "
            "the gradients by it; the engine applies them as they come"
        )
    if keras_opt.gradient_accumulation_steps:
        differences.append(
            "gradient_accumulation_steps="
            f"{keras_opt.gradient_accumulation_steps!r}: the engine applies "
            "every step"
        )
    return differences


def keras_only_differences(
    definition: spec.Definition, arguments: Dict[str, Any]
) -> List[str]:
    """Each Keras-only argument whose value the engine cannot reproduce."""
    differences = []
    remap = definition.keras.remap
    for argument in definition.keras_arguments:
        value = arguments[argument.name]
        if argument.hyper is not None or value == argument.engine:
            continue
        if argument.name in definition.keras.variants or argument.in_learning_rate:
            continue
        if remap is not None and argument.name in remap.arguments:
            continue
        if not negligible(definition, argument, value, arguments):
            differences.append(_keras_only_difference(argument, value))
    return differences


def negligible(
    definition: spec.Definition,
    argument: spec.KerasArg,
    value: Any,
    arguments: Dict[str, Any],
) -> bool:
    """Whether a Keras-only argument's `value` changes nothing the engine
    computes (its definition's bound, or `lazy` where a zero-gradient step is
    a no-op)."""
    if argument.negligible is not None:
        return argument.negligible(value, arguments)
    if argument.name == "lazy":
        # Both rules agree where a zero-gradient step is a no-op.
        return not definition.keras.zero_gradient_steps(arguments)
    return False


def _keras_only_difference(argument: spec.KerasArg, value: Any) -> str:
    reason = argument.engine_lacks
    if argument.name == "lazy":
        reason = (
            "on a sparse gradient Keras steps every row here, the engine only "
            "the looked-up rows (lazy=True on this package's optimizer computes "
            "the engine's result)"
        )
    return f"{argument.name}={value!r}: {reason}"


def gradient_clip(keras_opt: Any, options: Dict[str, Any]) -> Tuple[Any, Any]:
    """The engine's gradient clip for Keras `clipvalue` plus the engine keywords.

    The engine clips each row's summed gradient element-wise, as Keras clips a
    dense gradient (and this package's optimizers a de-duplicated sparse one;
    stock Keras clips each duplicate of a sparse gradient, part of what this
    package fixes). Clipping to [-c, c] and then to [lo, hi] is one clip to
    their intersection.
    """
    low, high = options["clip_gradient_min"], options["clip_gradient_max"]
    if keras_opt.clipvalue:
        clip = keras_opt.clipvalue
        low = -clip if low is None else max(low, -clip)
        high = clip if high is None else min(high, clip)
        if low > high:
            raise ValueError(
                f"to_embedding: clipvalue={clip!r} and the gradient clip "
                f"[{options['clip_gradient_min']!r}, "
                f"{options['clip_gradient_max']!r}] do not intersect; the "
                "composition clips every gradient to one value, which the "
                "engine's single clip cannot express."
            )
    return low, high


@dataclasses.dataclass(frozen=True)
class KerasReading:
    """What `to_embedding` takes from a Keras optimizer, for one engine.

    Attributes:
      optimizer: The Keras optimizer read (its class names it in refusals).
      engine: The engine converted for.
      definition: The algorithm its Keras class runs.
      arguments: Its Keras arguments, by name.
      options: Its engine options (this package's keywords; stock Keras: none).
      target: The engine algorithm it converts to (a variant, or a remap).
      values: That algorithm's hyperparameters (of jax-tpu-embedding's own
        spec: its fields).
      rate: The learning rate as the engine takes it (with the definition's
        learning-rate factor where the Keras arguments turn it on).
      clip: The engine's gradient clip, `(low, high)` (`None` each: none).
      differences: Every setting the engine cannot reproduce, each named
        (the conversion refuses them, or warns with `strict=False`).
      custom: Of jax-tpu-embedding: what its own spec cannot hold (then the
        custom spec runs the twin's rule); empty elsewhere.
    """

    optimizer: Any
    engine: spec.Engine
    definition: spec.Definition
    arguments: Dict[str, Any]
    options: Dict[str, Any]
    target: spec.Definition
    values: Dict[str, Any]
    rate: Any
    clip: Tuple[Any, Any]
    differences: Tuple[str, ...] = ()
    custom: Tuple[str, ...] = ()

    @property
    def embedding_arguments(self) -> Dict[str, Any]:
        """The embedding class's arguments: the learning rate, the target's
        hyperparameters, and the engine options as TensorFlow's arguments."""
        options = self.options
        kwargs = {"learning_rate": self.rate}
        for hyper in self.target.hypers:
            if hyper.name in self.values:
                kwargs[hyper.name] = self.values[hyper.name]
        low, high = self.clip
        kwargs.update(
            clip_weight_min=options["clip_weight_min"],
            clip_weight_max=options["clip_weight_max"],
            weight_decay_factor=options["weight_decay_factor"],
            multiply_weight_decay_factor_by_learning_rate=(
                True
                if options["weight_decay_factor"]
                and options["multiply_weight_decay_factor_by_learning_rate"]
                else None
            ),
            clipvalue=None if low is None and high is None else (low, high),
        )
        return kwargs


def read(
    keras_opt: Any, engine: spec.Engine, algorithms: Tuple[str, ...]
) -> KerasReading:
    """`keras_opt` read for `engine`, in one pass.

    Args:
      keras_opt: The Keras optimizer.
      engine: The engine converted for.
      algorithms: The algorithms it runs (`EngineBehaviour.algorithms`).

    Raises:
      TypeError: An optimizer `to_embedding` does not convert.
      ValueError: The target algorithm exists on jax-tpu-embedding only, or
        `engine` does not run it; a `clipvalue` that does not meet the engine
        options' gradient clip.
    """
    definition = _source_definition(keras_opt)
    arguments = _keras_arguments(keras_opt, definition)
    options = (
        dict(keras_opt._options)
        if isinstance(keras_opt, optimizers.TwinOptimizer)
        else dict(optimizers.ENGINE_OPTIONS)
    )
    # A factor of 0 decays nothing (the rules and TensorFlow's classes take it
    # for none): read as None, which every engine's own optimizer takes
    # (TPUEmbeddingV2 refuses any other value, 0.0 included).
    options["weight_decay_factor"] = options["weight_decay_factor"] or None
    differences = base_differences(keras_opt, engine)
    if engine.tensorflow:
        target, values, more = _tensorflow_target(
            keras_opt, definition, arguments, engine, algorithms
        )
        differences += more
    else:
        target = _variant(definition, arguments)
    clip = gradient_clip(keras_opt, options)
    factor = _learning_rate_factor(definition, arguments)
    unchanged = [] if engine.tensorflow else _negligible(definition, arguments)
    rate = learning_rate(keras_opt)
    rate = learning_rates.for_engine(
        keras_opt, rate, engine.tensorflow, factor, arguments
    )
    custom: List[str] = []
    if not engine.tensorflow:
        refused, custom, values = jax_engine.keras_settings(
            definition, target, arguments, options, keras_opt.clipvalue, unchanged
        )
        differences += refused
    return KerasReading(
        keras_opt,
        engine,
        definition,
        arguments,
        options,
        target,
        values,
        rate,
        clip,
        tuple(differences),
        tuple(custom),
    )


def learning_rate(keras_opt: Any) -> Any:
    """A Keras optimizer's learning rate as the user gave it: a schedule or
    callable as it is; a float, which Keras keeps in a float32 variable, as
    the shortest decimal with that float32 value (0.01)."""
    rate = keras_opt._learning_rate
    if isinstance(rate, keras.Variable):
        return rules.shortest_float(float(rate.numpy()))
    return rate if callable(rate) else float(rate)


def _tensorflow_target(
    keras_opt: Any,
    definition: spec.Definition,
    arguments: Dict[str, Any],
    engine: spec.Engine,
    algorithms: Tuple[str, ...],
) -> Tuple[spec.Definition, Dict[str, Any], List[str]]:
    """The TensorFlow engine algorithm, its hyperparameters, and what keeps
    the conversion from being exact beyond Keras's base arguments."""
    scheduled = callable(keras_opt._learning_rate)
    target, values, remap_differences = _engine_target(definition, arguments, scheduled)
    differences = keras_only_differences(definition, arguments)
    differences += remap_differences
    if not target.tensorflow_engines:
        raise ValueError(
            f"to_embedding: {target.name} exists only on jax-tpu-embedding; "
            f"the TensorFlow engines have no {target.name} (convert with "
            "engine='jax-tpu-embedding')."
        )
    if target.name not in algorithms:
        # Not a setting that strict=False may leave out: the engine refuses
        # the algorithm itself, at its first step.
        raise ValueError(
            f"to_embedding: {type(keras_opt).__name__} converts to "
            f"{target.name}, which {engine} cannot run (it runs "
            f"{', '.join(algorithms)}); strict=False would not change that. "
            "Convert with engine='TPUEmbedding', or train the table with one "
            "of those."
        )
    return target, values, differences


def _negligible(definition: spec.Definition, arguments: Dict[str, Any]) -> List[str]:
    """The Keras arguments whose values change nothing an engine computes."""
    return [
        argument.name
        for argument in definition.keras_arguments
        if negligible(definition, argument, arguments[argument.name], arguments)
    ]


def negligible_settings(keras_opt: Any) -> List[Tuple[spec.KerasArg, Any]]:
    """The Keras-only arguments of `keras_opt` whose values differ from the
    engine's by what their definition proves negligible, with the values
    (Adagrad's epsilon far below the initial accumulator).

    Raises:
      TypeError: An optimizer `to_embedding` does not convert.
    """
    definition = _source_definition(keras_opt)
    arguments = _keras_arguments(keras_opt, definition)
    return [
        (argument, arguments[argument.name])
        for argument in definition.keras_arguments
        if argument.negligible is not None
        and arguments[argument.name] != argument.engine
        and argument.negligible(arguments[argument.name], arguments)
    ]


def keras_algorithm(keras_opt: Any) -> spec.Definition:
    """The engine algorithm whose rule a Keras optimizer runs.

    For one of this package's twins or a stock `keras.optimizers` class a
    twin mirrors: its definition, or the variant its arguments select
    (RMSprop with `centered=True` runs CenteredRMSProp).

    Raises:
      TypeError: Another optimizer.
    """
    definition = _source_definition(keras_opt)
    return _variant(definition, _keras_arguments(keras_opt, definition))


def _keras_arguments(keras_opt: Any, definition: spec.Definition) -> Dict[str, Any]:
    if isinstance(keras_opt, optimizers.TwinOptimizer):
        return dict(keras_opt.rule.arguments)
    arguments = {}
    for argument in definition.keras_arguments:
        if argument.keyword:
            arguments[argument.name] = argument.default
        else:
            arguments[argument.name] = getattr(keras_opt, argument.name)
    return arguments


def _source_definition(keras_opt: Any) -> spec.Definition:
    if isinstance(keras_opt, optimizers.TwinOptimizer):
        definition = keras_opt._definition
        if definition.engine_refusal is not None:
            what = definition.summary.rstrip(".")
            raise TypeError(
                f"to_embedding: {definition.name} ({what}) has no embedding "
                f"engine equivalent: {definition.engine_refusal}. Train "
                "the tables with it on CPU/GPU, or use "
                f"{definition.state_of or 'another optimizer'} on the engine."
            )
        return definition
    for keras_name, definition_name in _STOCK.items():
        if type(keras_opt) is getattr(keras.optimizers, keras_name):
            return registry.BY_NAME[definition_name]
    for keras_name in _STOCK:
        if isinstance(keras_opt, getattr(keras.optimizers, keras_name)):
            name = type(keras_opt).__name__
            stock = getattr(keras.optimizers, name, None) is type(keras_opt)
            what = f"keras.optimizers.{name}" if stock else name
            # Keras's AdamW is Adam with its weight_decay set by default.
            hint = " with weight decay on every element" if name == "AdamW" else ""
            raise TypeError(
                f"to_embedding: argument `keras_opt` is a {what}, a subclass "
                f"of keras.optimizers.{keras_name}{hint}, whose math is not "
                f"taken for {keras_name}'s. Pass keras.optimizers.{keras_name} "
                "with the same settings (converted exactly, or refused naming "
                "what the engine cannot compute, such as weight_decay), or an "
                "optimizer of tf_tpu_embed_opt.optimizers."
            )
    supported = ", ".join(k for k in _STOCK)
    name = type(keras_opt).__name__
    where = f"{type(keras_opt).__module__}.{name}"
    keras_2 = errors.tf_keras_note(keras_opt)
    if keras_2:
        given = f"a {where}{keras_2}"
    elif not isinstance(keras_opt, keras.optimizers.Optimizer):
        given = f"a {where}, which is no Keras optimizer"
    elif getattr(keras.optimizers, name, None) is type(keras_opt):
        why = _NO_ENGINE.get(name, "no TPU embedding engine runs its update")
        given = f"keras.optimizers.{name} ({why})"
    else:
        # A subclass of a Keras class with a reason (keras_optimizer's
        # MultiOptimizer) has that reason.
        bases = [
            k.__name__
            for k in type(keras_opt).__mro__
            if k.__name__ in _NO_ENGINE
            and getattr(keras.optimizers, k.__name__, None) is k
        ]
        given = (
            f"{where}, a keras.optimizers.{bases[0]} ({_NO_ENGINE[bases[0]]})"
            if bases
            else f"{where}, a Keras optimizer this package does not know"
        )
    raise TypeError(
        f"to_embedding: argument `keras_opt` is {given}. It converts "
        f"keras.optimizers {supported} and this package's twins "
        "(tf_tpu_embed_opt.optimizers)."
    )


# Why the stock Keras optimizers that `to_embedding` does not convert have
# no engine counterpart, where one reason says it.
_NO_ENGINE = {
    "LossScaleOptimizer": (
        "a wrapper that scales the loss: convert its inner_optimizer, and "
        "step the tables with unscaled gradients"
    ),
    "MultiOptimizer": (
        "an optimizer per variable: convert the one of each table, for "
        "TableConfig(optimizer=...)"
    ),
    "ScheduleFreeAdamW": (
        "it keeps two sequences of every weight and trains an interpolation "
        "of them; the engines keep one table"
    ),
    "Adafactor": "its second moments are factored over a table's rows and columns",
    "Lamb": "its trust ratio is a norm over the whole table",
    "Muon": "it orthogonalizes the whole matrix",
    "Lion": "no TPU embedding engine runs its sign update",
    "Nadam": "no TPU embedding engine runs Nesterov-accelerated Adam",
    "Adamax": "no TPU embedding engine runs Adam's infinity-norm variant",
}


def _variant(definition: spec.Definition, arguments: Dict[str, Any]) -> Any:
    """The algorithm a Keras class runs with `arguments`: a Keras flag may
    switch to a variant (RMSprop's `centered`)."""
    for flag, variant in definition.keras.variants.items():
        if arguments.get(flag):
            return registry.BY_NAME[variant]
    return definition


def _learning_rate_factor(
    definition: spec.Definition, arguments: Dict[str, Any]
) -> Any:
    """The definition's learning-rate factor of the step (Keras Adam's bias
    correction) where the Keras arguments turn it on; else `None`."""
    if not any(
        argument.in_learning_rate and arguments[argument.name] != argument.engine
        for argument in definition.keras_arguments
    ):
        return None
    return definition.keras.learning_rate_factor


def _engine_target(
    definition: spec.Definition, arguments: Dict[str, Any], scheduled: bool
) -> Tuple[spec.Definition, Dict[str, Any], List[str]]:
    """The engine algorithm a Keras class with `arguments` computes, its
    hyperparameters, and what keeps that from being exact (a `Remap` that
    needs a constant learning rate, given a schedule)."""
    remap = definition.keras.remap
    if remap is not None and remap.applies(arguments):
        differences = []
        if scheduled and remap.needs_constant_learning_rate:
            name = remap.arguments[0]
            differences.append(
                f"{name}={arguments[name]!r} with a learning-rate schedule: "
                f"{remap.needs_constant_learning_rate}"
            )
        target = registry.BY_NAME[remap.algorithm]
        return target, dict(remap.hypers(arguments)), differences
    target = _variant(definition, arguments)
    values = {
        argument.hyper: arguments[argument.name]
        for argument in definition.keras_arguments
        if argument.hyper is not None
    }
    return target, values, []
