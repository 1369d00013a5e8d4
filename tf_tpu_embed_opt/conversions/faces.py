"""Exact conversions between the embedding face and the Keras face, per engine.

`to_keras` returns the Keras twin computing what the engine computes, for an
embedding optimizer of the TensorFlow engines or a jax-tpu-embedding spec.
`to_embedding` accepts this package's Keras optimizers and stock
`keras.optimizers.{SGD, Adagrad, Adam, Ftrl, RMSprop, Adadelta}`; it converts
exactly or raises `ValueError` naming every setting that would change the math
(`strict=False` converts anyway and warns with the same list). For
`engine="jax-tpu-embedding"` it returns jax-tpu-embedding's `OptimizerSpec`.

The jax-tpu-embedding paths need no TensorFlow: the TensorFlow modules (the
embedding face, the TensorFlow engines' checks) are imported where used.
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, List, Optional, Tuple

import keras

from tf_tpu_embed_opt import engines
from tf_tpu_embed_opt.conversions import keras_differences, learning_rates
from tf_tpu_embed_opt.conversions.learning_rates import (
    KerasStepLearningRate,
    StepLearningRate,
)
from tf_tpu_embed_opt.definitions import registry, spec
from tf_tpu_embed_opt.definitions.algorithms import adagrad
from tf_tpu_embed_opt.engines import jax_tpu_embedding as jax_engine
from tf_tpu_embed_opt.errors import (
    JaxNotInstalled,
    TensorFlowNotInstalled,
    is_jax_missing,
    is_tensorflow_missing,
)
from tf_tpu_embed_opt.optimizers import twins as optimizers

__all__ = [
    "to_keras",
    "to_embedding",
    "keras_algorithm",
    "KerasStepLearningRate",
    "StepLearningRate",
    "ADAGRAD_EPSILON_TOLERANCE",
]

# The bound below which Keras Adagrad's epsilon is negligible (its
# definition says why).
ADAGRAD_EPSILON_TOLERANCE = adagrad.EPSILON_TOLERANCE

# keras.optimizers class name -> the definition whose Keras face mirrors it.
_STOCK = {
    d.keras.stock: d.name
    for d in registry.DEFINITIONS
    if d.keras is not None and d.keras.stock
}


def _tensorflow_modules(what: str, given: Any = None) -> Tuple[Any, Any]:
    """The embedding face's class and proto modules; without TensorFlow,
    `TensorFlowNotInstalled` naming `what`, or a `TypeError` for a `given`
    that is no embedding-face object."""
    try:
        from tf_tpu_embed_opt.embedding import parameters, proto
    except ModuleNotFoundError as error:
        if not is_tensorflow_missing(error):
            raise
        faces = ("tensorflow", "tf_tpu_embed_opt")
        if given is None or type(given).__module__.split(".")[0] in faces:
            raise TensorFlowNotInstalled(what) from error
        raise TypeError(
            f"{what.split()[0]}: argument `embedding_opt` must be an embedding-"
            "face optimizer or a jax-tpu-embedding spec; received "
            f"{given!r} of type {type(given).__name__}."
        ) from None
    return parameters, proto


def _twin_definition(definition: spec.Definition) -> Tuple[spec.Definition, Dict]:
    """The definition whose Keras class serves `definition`, and the flags."""
    if definition.keras is not None:
        return definition, {}
    for candidate in registry.DEFINITIONS:
        if candidate.keras is None:
            continue
        for flag, variant in candidate.keras.variants.items():
            if variant == definition.name:
                return candidate, {flag: True}
    raise ValueError(f"No Keras twin for {definition.name}.")


def to_keras(
    embedding_opt: Any, *, engine: Optional[str] = None
) -> keras.optimizers.Optimizer:
    """The Keras optimizer computing what the TPU engine computes for `embedding_opt`.

    Row gradients are summed over duplicate ids, only looked-up rows change (all
    rows for `Adam(lazy_adam=False)`), gradient clipping, weight decay of the
    looked-up rows and weight clipping run in the engine's order, and Keras-only
    terms are off (Adam: no bias correction, the engine's epsilon placement;
    Adagrad: epsilon 0). A callable learning rate stays a callable.

    With `engine="TPUEmbeddingV2"` the twin computes what SparseCore computes:
    the settings `TPUEmbeddingV2` drops (gradient and weight clipping,
    `use_gradient_accumulation=False`, `lazy_adam=False`) are left out, with a
    warning naming them, exactly as `check_engine` lists them.

    A jax-tpu-embedding `OptimizerSpec` gives the twin computing what its
    lowering computes (docs/tpu_semantics.md, "jax-tpu-embedding"): lazy;
    Adam with the bias correction and epsilon after it
    (`algorithm_1_epsilon=True`); `LaProp` and `F2A` with the step schedules of
    their specs. A learning-rate callable of the step becomes a Keras
    `LearningRateSchedule` evaluated at the optimizer's `iterations` (the step
    keras-rs gives the engine). An embedding optimizer with
    `engine="jax-tpu-embedding"` gives the twin of its exact spec, or is
    refused naming what the spec cannot hold.

    Args:
      embedding_opt: An optimizer of `tf_tpu_embed_opt.embedding`, one of
        TensorFlow's `tf.tpu.experimental.embedding` classes, or a
        jax-tpu-embedding `OptimizerSpec`.
      engine: The engine whose math to reproduce: `"TPUEmbedding"` (the
        default for embedding optimizers), `"TPUEmbeddingV2"` (SparseCore) or
        `"jax-tpu-embedding"` (the default, and the only engine, for a spec).

    Returns:
      An optimizer of `tf_tpu_embed_opt.optimizers`.

    Raises:
      TypeError: Not an embedding optimizer.
      ValueError: A bad `engine`; `use_gradient_accumulation=False` for an
        algorithm that is not linear in the gradient on `TPUEmbedding` (the
        engine then applies each contribution as a separate step, which a Keras
        optimizer cannot reproduce); on `TPUEmbeddingV2`, an optimizer or
        setting it refuses (another algorithm, weight decay); on
        `jax-tpu-embedding`, a setting its spec cannot hold.
    """
    if engine is not None:
        engine = engines.check_engine_name(engine, "to_keras")
    if jax_engine.is_spec(embedding_opt):
        if engine is not None and engine.tensorflow:
            raise ValueError(
                f"to_keras: {type(embedding_opt).__name__} is a jax-tpu-engine "
                f"spec; it runs on engine 'jax-tpu-embedding', not {engine!r}."
            )
        return _twin_of_spec(embedding_opt)
    engine = spec.TPU_EMBEDDING if engine is None else engine
    what = f"to_keras of {type(embedding_opt).__name__}"
    embedding, proto = _tensorflow_modules(what, embedding_opt)
    opt = proto.as_embedding_optimizer(embedding_opt, "embedding_opt", "to_keras")
    if not engine.tensorflow:
        table = jax_engine.check_optimizer(opt, None)
        if not table.runs:
            raise ValueError(
                "to_keras: jax-tpu-embedding has no exact spec for this "
                "optimizer: " + "; ".join(s.describe() for s in table.rejected) + "."
            )
        # What the spec would hold is what the TensorFlow engine's twin computes.
    if engine.sparsecore_op:
        report = engines.check_configuration(opt, engine)
        table = report.tables[0]
        if not table.runs:
            raise ValueError(
                "to_keras: TPUEmbeddingV2 cannot run this optimizer: "
                + "; ".join(s.describe() for s in table.rejected)
                + "."
            )
        if table.dropped:
            warnings.warn(
                "to_keras: TPUEmbeddingV2 drops "
                + "; ".join(s.describe() for s in table.dropped)
                + ". The Keras optimizer leaves them out too.",
                stacklevel=2,
            )
        opt = proto.as_embedding_optimizer(engines.sparsecore_equivalent(opt))
    definition = embedding.definition_of(opt)
    if not opt.use_gradient_accumulation:
        # Without accumulation the engine applies each contribution as its own
        # step; summing first is the same only for an update linear in the
        # gradient (plain SGD).
        nonlinear = []
        if not definition.linear_in_gradient:
            nonlinear.append(f"the {definition.name} update")
        if opt.weight_decay_factor:
            nonlinear.append("weight decay")
        if opt.clip_weight_min is not None or opt.clip_weight_max is not None:
            nonlinear.append("weight clipping")
        if nonlinear:
            raise ValueError(
                f"to_keras: with use_gradient_accumulation=False the engine "
                "applies each gradient contribution as a separate step, and "
                f"{' and '.join(nonlinear)} then differ from one step with the "
                "summed gradient, which the Keras optimizer applies. Use "
                "use_gradient_accumulation=True."
            )
    return twin_of_engine_optimizer(definition, opt, engine.rounding)


def twin_of_engine_optimizer(
    definition: spec.Definition, opt: Any, rounding: str = "keras"
) -> Any:
    """The twin computing what engine optimizer `opt` of `definition` computes,
    rounding as `rounding` says (see the twins' `rounding`)."""
    twin, flags = _twin_definition(definition)
    kwargs: Dict[str, Any] = {"learning_rate": opt.learning_rate}
    for argument in twin.keras_arguments:
        if argument.name in flags:
            kwargs[argument.name] = flags[argument.name]
        elif argument.hyper is not None:
            kwargs[argument.name] = getattr(opt, argument.hyper)
        elif argument.name in twin.keras.variants:
            kwargs[argument.name] = False
        else:
            kwargs[argument.name] = argument.engine
    kwargs.update(
        clip_weight_min=opt.clip_weight_min,
        clip_weight_max=opt.clip_weight_max,
        clip_gradient_min=opt.clip_gradient_min,
        clip_gradient_max=opt.clip_gradient_max,
        weight_decay_factor=opt.weight_decay_factor or None,
        multiply_weight_decay_factor_by_learning_rate=bool(
            opt.weight_decay_factor
            and opt.multiply_weight_decay_factor_by_learning_rate
        ),
        rounding=rounding,
    )
    return optimizers.class_for(twin)(**kwargs)


def _twin_of_spec(jax_spec: Any) -> keras.optimizers.Optimizer:
    if jax_engine.is_rule_spec(jax_spec):
        return getattr(optimizers, jax_spec.optimizer)(
            learning_rate=learning_rates.of_spec(jax_spec.learning_rate),
            rounding=spec.JAX_ENGINE,
            **jax_spec.arguments,
            **jax_spec.options,
        )
    definition, rate, arguments = jax_engine.read_spec(jax_spec)
    return optimizers.class_for(definition)(
        learning_rate=learning_rates.of_spec(rate),
        rounding=spec.JAX_ENGINE,
        **arguments,
    )


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


def _source_definition(keras_opt: Any) -> spec.Definition:
    if isinstance(keras_opt, optimizers.TwinOptimizer):
        return keras_opt._definition
    for keras_name, definition_name in _STOCK.items():
        if type(keras_opt) is getattr(keras.optimizers, keras_name):
            return registry.BY_NAME[definition_name]
    if type(keras_opt).__name__ == "ClippyAdagrad":
        raise TypeError(
            "to_embedding: ClippyAdagrad has no embedding engine equivalent: "
            "its clipping factor is a minimum over every looked-up row of the "
            "variable, which no engine's per-row update (and no "
            "jax-tpu-embedding custom optimizer, which sees one row at a time) "
            "computes."
        )
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
    if not isinstance(keras_opt, keras.optimizers.Optimizer):
        given = f"a {where}, which is no Keras optimizer"
    elif getattr(keras.optimizers, name, None) is not type(keras_opt):
        given = f"{where}, a Keras optimizer this package does not know"
    else:
        why = _NO_ENGINE.get(name, "no TPU embedding engine runs its update")
        given = f"keras.optimizers.{name} ({why})"
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


def to_embedding(
    keras_opt: Any, *, strict: bool = True, engine: str = "TPUEmbedding"
) -> Any:
    """The embedding optimizer with the same math as a Keras optimizer.

    Conversions (table in docs/optimizers.md): SGD without momentum → `SGD`; SGD
    with momentum and a constant learning rate → `Momentum` (Keras's form
    m ← μ·m − η·g equals TensorFlow 1's m ← μ·m + g when η is constant);
    Adagrad → `Adagrad` (epsilon must be 0 or below the documented bound);
    Adam → `Adam` (non-lazy unless `lazy=True`; Keras's epsilon placement; the
    bias correction as a callable learning rate that reads the Keras
    optimizer's `iterations`); Ftrl → `FTRL`; RMSprop → `RMSProp` or
    `CenteredRMSProp`; Adadelta → `Adadelta`; this package's other twins to
    their engine class. A `LearningRateSchedule` becomes a callable evaluating
    it at the Keras optimizer's `iterations`.

    A callable learning rate that reads `iterations` (schedules, Adam's bias
    correction) must be evaluated before the Keras optimizer's own
    `apply_gradients` in the same step, as `TPUEmbedding.apply_gradients` is
    when it runs first; Keras uses `iterations + 1` inside its step.

    With `engine="TPUEmbeddingV2"` the result must also run exactly on
    SparseCore (`check_engine`): an algorithm SparseCore lacks, a setting
    `TPUEmbeddingV2` drops (non-lazy Adam, which stock Keras Adam is; gradient
    or weight clipping) or refuses (weight decay) is refused like a Keras-only
    setting. The callable learning rate carrying Adam's bias correction is
    exact there too: `TPUEmbeddingV2` calls it at every `apply_gradients`.

    Args:
      keras_opt: The Keras optimizer.
      strict: Refuse (True) or warn (False) when a setting has no exact engine
        equivalent.
      engine: The engine that will run the result: `"TPUEmbedding"` (default)
        or `"TPUEmbeddingV2"` (SparseCore, keras-rs on TensorFlow).

    Returns:
      An optimizer of `tf_tpu_embed_opt.embedding`.

    Raises:
      TypeError: Unsupported optimizer.
      ValueError: With `strict=True`, a setting the engine cannot reproduce;
        the message lists each one.
    """
    if not isinstance(strict, bool):
        raise TypeError(
            f"to_embedding: argument `strict` must be True or False; received "
            f"{strict!r}."
        )
    engine = engines.check_engine_name(engine, "to_embedding")
    definition = _source_definition(keras_opt)
    arguments = _keras_arguments(keras_opt, definition)
    options = (
        dict(keras_opt._options)
        if isinstance(keras_opt, optimizers.TwinOptimizer)
        else dict(optimizers.ENGINE_OPTIONS)
    )
    if not engine.tensorflow:
        return _to_spec(keras_opt, definition, arguments, options, strict)
    embedding, _ = _tensorflow_modules(f"to_embedding(..., engine={engine!r})")
    differences = keras_differences.base_differences(keras_opt, engine)
    rate = learning_rates.for_embedding(keras_opt)

    target, values, remap_differences = _engine_target(definition, arguments, rate)
    differences += keras_differences.keras_only_differences(definition, arguments)
    differences += remap_differences
    rate = _with_learning_rate_factor(keras_opt, definition, arguments, rate)

    if not target.tensorflow_engines:
        raise ValueError(
            f"to_embedding: {target.name} exists only on jax-tpu-embedding; "
            f"the TensorFlow engines have no {target.name} (convert with "
            "engine='jax-tpu-embedding')."
        )
    if engine.sparsecore_op and target.name not in engines.SPARSECORE_OPTIMIZERS:
        differences.append(
            f"it converts to {target.name}, which TPUEmbeddingV2 cannot run "
            f"(SparseCore runs {', '.join(engines.SPARSECORE_OPTIMIZERS)})"
        )
    if differences:
        keras_differences.refuse(keras_opt, differences, engine, strict)

    kwargs = _embedding_arguments(keras_opt, target, values, options, rate)
    try:
        result = embedding.class_for(target)(**kwargs)
    except (TypeError, ValueError) as error:
        raise ValueError(f"to_embedding: {error}") from None
    if engine.sparsecore_op and target.name in engines.SPARSECORE_OPTIMIZERS:
        problems = engines.check_configuration(result, engine).tables[0].problems
        if problems:
            keras_differences.refuse(
                keras_opt,
                [f"the conversion needs {s.describe()}" for s in problems],
                engine,
                strict,
            )
    return result


def _to_spec(
    keras_opt: Any,
    definition: spec.Definition,
    arguments: Dict[str, Any],
    options: Dict[str, Any],
    strict: bool,
) -> Any:
    """`to_embedding(keras_opt, engine="jax-tpu-embedding")`: the exact spec.

    jax-tpu-embedding's own spec where it computes the twin's math; else a
    `RuleOptimizerSpec`, the custom optimizer that runs the twin's rule on
    each looked-up row. Refused: what no row rule can run (Keras's base
    options; `lazy=False` where it matters).
    """
    engine = spec.JAX_ENGINE
    target = _variant(definition, arguments)
    refused = keras_differences.base_differences(keras_opt, engine)
    # What the engine's own spec cannot hold; a custom spec holds it.
    custom = [] if target.jax is not None else [jax_engine.no_spec(target.name)]
    if keras_opt.clipvalue:
        reason = jax_engine.option_reason("clipvalue")
        custom.append(f"clipvalue={keras_opt.clipvalue!r}: {reason}")
    for name in (
        "clip_gradient_min",
        "clip_gradient_max",
        "clip_weight_min",
        "clip_weight_max",
        "weight_decay_factor",
    ):
        if options[name] is not None:
            reason = jax_engine.option_reason(
                "clipvalue" if name.startswith("clip_gradient") else name
            )
            custom.append(f"{name}={options[name]!r}: {reason}")
    values: Dict[str, Any] = {}
    for argument in definition.keras_arguments:
        value = arguments[argument.name]
        wanted = (
            jax_engine.implied_value(definition, argument)
            if target.jax is not None
            else (True if argument.name == "lazy" else None)
        )
        if wanted is None:
            values[argument.name] = value
        elif value != wanted and not keras_differences.negligible(
            definition, argument, value, arguments
        ):
            why = jax_engine.implied_reason(definition, argument.name)
            reason = f"{argument.name}={value!r}: {why}"
            (refused if argument.name == "lazy" else custom).append(reason)
    if refused:
        keras_differences.refuse(keras_opt, refused, engine, strict)
    rate = learning_rates.for_spec(keras_opt)
    if custom:
        return _custom_spec(keras_opt, definition, arguments, options, rate)
    fields = {
        name: values[jax_engine.keras_name(definition, name)]
        for name in definition.jax.fields
    }
    try:
        return jax_engine.make_spec(definition, rate, fields)
    except (TypeError, ValueError) as error:
        raise ValueError(f"to_embedding: {error}") from None


def _custom_spec(
    keras_opt: Any,
    definition: spec.Definition,
    arguments: Dict[str, Any],
    options: Dict[str, Any],
    rate: Any,
) -> Any:
    """The `RuleOptimizerSpec` running the twin of `keras_opt` on each row."""
    try:
        from tf_tpu_embed_opt.engines import jax_custom
    except ModuleNotFoundError as error:
        if not is_jax_missing(error):
            raise
        raise JaxNotInstalled(
            "to_embedding(..., engine='jax-tpu-embedding') (its custom spec)",
            error.name or "jax",
        ) from error

    arguments = dict(arguments)
    if "lazy" in arguments:
        arguments["lazy"] = True  # the engine's rule (refused or warned above)
    options = dict(options)
    options["clip_gradient_min"], options["clip_gradient_max"] = (
        keras_differences.gradient_clip(keras_opt, options)
    )
    name = optimizers.class_for(definition).__name__
    return jax_custom.RuleOptimizerSpec(name, rate, arguments, options)


def _with_learning_rate_factor(
    keras_opt: Any, definition: spec.Definition, arguments: Dict[str, Any], rate: Any
) -> Any:
    """`rate`, carrying the definition's learning-rate factor of the step
    (Keras Adam's bias correction) where the Keras arguments turn it on."""
    if not any(
        argument.in_learning_rate and arguments[argument.name] != argument.engine
        for argument in definition.keras_arguments
    ):
        return rate
    if isinstance(rate, KerasStepLearningRate):
        rate = rate.rate
    return KerasStepLearningRate(
        keras_opt, rate, definition.keras.learning_rate_factor, arguments
    )


def _embedding_arguments(
    keras_opt: Any,
    target: spec.Definition,
    values: Dict[str, Any],
    options: Dict[str, Any],
    rate: Any,
) -> Dict[str, Any]:
    """The embedding class's arguments: the learning rate, the target's
    hyperparameters, and the engine options as TensorFlow's arguments."""
    kwargs = {"learning_rate": rate}
    for hyper in target.hypers:
        if hyper.name in values:
            kwargs[hyper.name] = values[hyper.name]
    low, high = keras_differences.gradient_clip(keras_opt, options)
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


def _variant(definition: spec.Definition, arguments: Dict[str, Any]) -> Any:
    """The algorithm a Keras class runs with `arguments`: a Keras flag may
    switch to a variant (RMSprop's `centered`)."""
    for flag, variant in definition.keras.variants.items():
        if arguments.get(flag):
            return registry.BY_NAME[variant]
    return definition


def _engine_target(
    definition: spec.Definition, arguments: Dict[str, Any], rate: Any
) -> Tuple[spec.Definition, Dict[str, Any], List[str]]:
    """The engine algorithm a Keras class with `arguments` computes, its
    hyperparameters, and what keeps that from being exact (a `Remap` that
    needs a constant learning rate, given a schedule)."""
    remap = definition.keras.remap
    if remap is not None and remap.applies(arguments):
        differences = []
        if callable(rate) and remap.needs_constant_learning_rate:
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
