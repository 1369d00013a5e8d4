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
from typing import Any, Dict, Optional, Tuple

import keras

from tf_tpu_embed_opt import engines
from tf_tpu_embed_opt.conversions import keras_reading, learning_rates
from tf_tpu_embed_opt.conversions.keras_reading import keras_algorithm
from tf_tpu_embed_opt.conversions.learning_rates import (
    KerasStepLearningRate,
    StepLearningRate,
)
from tf_tpu_embed_opt.definitions import registry, spec
from tf_tpu_embed_opt.definitions.algorithms import adagrad
from tf_tpu_embed_opt.engines import jax_tpu_embedding as jax_engine
from tf_tpu_embed_opt.errors import (
    TensorFlowNotInstalled,
    import_from_jax_extra,
    is_tensorflow_missing,
    keras_optimizer_note,
    type_path,
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


# `_tensorflow_modules`' `given` when no object is to be judged.
_NOTHING_GIVEN = object()


def _tensorflow_modules(what: str, given: Any = _NOTHING_GIVEN) -> Tuple[Any, Any]:
    """The embedding face's class and proto modules; without TensorFlow,
    `TensorFlowNotInstalled` naming `what`, or a `TypeError` for a `given`
    that is no embedding-face object.

    Without TensorFlow no embedding-face object can be built: a `given` of
    TensorFlow's (where a part of it is missing) needs TensorFlow; any other
    (a Keras optimizer, `None`, a name) is refused for what it is, as where
    TensorFlow is installed (installing it would not change that).
    """
    try:
        from tf_tpu_embed_opt.embedding import parameters, proto
    except ModuleNotFoundError as error:
        if not is_tensorflow_missing(error):
            raise
        tensorflows = type(given).__module__.split(".")[0] == "tensorflow"
        if given is _NOTHING_GIVEN or tensorflows:
            raise TensorFlowNotInstalled(what) from error
        raise TypeError(
            f"{what.split()[0]}: argument `embedding_opt` must be an embedding-"
            "face optimizer or a jax-tpu-embedding spec; received "
            f"{given!r} of type {type_path(given)}"
            f"{keras_optimizer_note(given)}."
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
    Adagrad: epsilon 0). A callable learning rate stays a callable; one that
    `to_embedding` made from a Keras optimizer (`KerasStepLearningRate`)
    keeps following that optimizer's steps, and the twin is saved with a
    `KerasStepSchedule` of its own steps instead (refused while the two have
    stepped apart).

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
                f"to_keras: {type(embedding_opt).__name__} is a jax-tpu-embedding "
                f"spec; it runs on engine 'jax-tpu-embedding', not {engine!r}."
            )
        return _twin_of_spec(embedding_opt)
    engine = spec.TPU_EMBEDDING if engine is None else engine
    what = f"to_keras of {type(embedding_opt).__name__}"
    embedding, proto = _tensorflow_modules(what, embedding_opt)
    opt = proto.as_embedding_optimizer(embedding_opt, "embedding_opt", "to_keras")
    try:
        computed, dropped = engines.behaviour_of(engine).for_twin(opt)
    except ValueError as error:
        raise ValueError(f"to_keras: {error}") from None
    if dropped:
        warnings.warn(
            f"to_keras: {engine} drops "
            + "; ".join(s.describe() for s in dropped)
            + ". The Keras optimizer leaves them out too.",
            stacklevel=2,
        )
    opt = proto.as_embedding_optimizer(computed)
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
            differ = "differs" if len(nonlinear) == 1 else "differ"
            raise ValueError(
                f"to_keras: with use_gradient_accumulation=False the engine "
                "applies each gradient contribution as a separate step, and "
                f"{' and '.join(nonlinear)} then {differ} from one step with the "
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
    SparseCore (`check_engine`): a setting `TPUEmbeddingV2` drops (non-lazy
    Adam, which stock Keras Adam is; gradient or weight clipping) or refuses
    (weight decay) is refused like a Keras-only setting, and an algorithm
    SparseCore lacks (Momentum, RMSProp, ...) is refused even with
    `strict=False`: there is no setting to leave out. The callable learning
    rate carrying Adam's bias correction is exact there too: `TPUEmbeddingV2`
    calls it at every `apply_gradients`.

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
        the message lists each one. Whatever `strict`, an algorithm the
        engine does not run.
    """
    if not isinstance(strict, bool):
        raise TypeError(
            f"to_embedding: argument `strict` must be True or False; received "
            f"{strict!r}."
        )
    engine = engines.check_engine_name(engine, "to_embedding")
    if engine.tensorflow:
        embedding, _ = _tensorflow_modules(f"to_embedding(..., engine={engine!r})")
    behaviour = engines.behaviour_of(engine)
    algorithms = behaviour.algorithms()
    reading = keras_reading.read(keras_opt, engine, algorithms)
    _refuse(reading, reading.differences, strict)
    if engine.tensorflow:
        try:
            result = embedding.class_for(reading.target)(**reading.embedding_arguments)
        except (TypeError, ValueError) as error:
            raise ValueError(f"to_embedding: {error}") from None
        if reading.target.name in algorithms:  # else refused above, by name
            problems = behaviour.check_optimizer(result, None).problems
            needs = [f"the conversion needs {s.describe()}" for s in problems]
            _refuse(reading, needs, strict)
        return result
    return _spec_of(reading)


def _refuse(
    reading: keras_reading.KerasReading, differences: Any, strict: bool
) -> None:
    """Raise (strict) or warn, at `to_embedding`'s caller, about `differences`:
    settings the engine cannot reproduce."""
    if not differences:
        return
    message = (
        f"to_embedding: {type(reading.optimizer).__name__} has settings the "
        f"{reading.engine.words} cannot reproduce: " + "; ".join(differences) + "."
    )
    if strict:
        raise ValueError(message + " Pass strict=False to convert without them.")
    warnings.warn(message + " Converted without them.", stacklevel=3)


def _spec_of(reading: keras_reading.KerasReading) -> Any:
    """jax-tpu-embedding's own spec where it computes the twin's math; else a
    `RuleOptimizerSpec`, the custom optimizer that runs the twin's rule on
    each looked-up row."""
    try:
        if reading.custom:
            return _custom_spec(reading)
        return jax_engine.make_spec(reading.definition, reading.rate, reading.values)
    except (TypeError, ValueError) as error:
        # A value the engine's spec or the twin's rule refuses (stock Keras
        # checks fewer), named as the TensorFlow engines' refusals are.
        raise ValueError(f"to_embedding: {error}") from None


def _custom_spec(reading: keras_reading.KerasReading) -> Any:
    """The `RuleOptimizerSpec` running the twin of the optimizer read on each
    row."""
    jax_custom = import_from_jax_extra(
        "tf_tpu_embed_opt.engines.jax_custom",
        "to_embedding(..., engine='jax-tpu-embedding') (its custom spec)",
    )

    arguments = dict(reading.arguments)
    if "lazy" in arguments:
        arguments["lazy"] = True  # the engine's rule (refused or warned above)
    options = dict(reading.options)
    # The spec rounds as the engine does, whatever the twin's `rounding`.
    options.pop("rounding", None)
    options["clip_gradient_min"], options["clip_gradient_max"] = reading.clip
    name = optimizers.class_for(reading.definition).__name__
    return jax_custom.RuleOptimizerSpec(name, reading.rate, arguments, options)
