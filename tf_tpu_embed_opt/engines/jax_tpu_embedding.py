"""The `jax-tpu-embedding` engine: SparseCore through JAX, and keras-rs on JAX.

jax-tpu-embedding (`jax_tpu_embedding.sparsecore`) describes each table's
optimizer with an `OptimizerSpec` (`lib/nn/embedding_spec.py`): one class per
algorithm, its hyperparameters at a step (`get_hyperparameters(step)`), its
slots and the primitive whose lowering is the per-row update
(`lib/core/primitives/sparse_dense_matmul_grad_with_<name>.py`). Those specs
are this engine's embedding face. What each one computes is written once, in
the definitions (`Definition.jax`: the spec class, which argument is which
spec field, the values of the twin's arguments that the spec implies);
docs/tpu_semantics.md, "jax-tpu-embedding", gives the sources.

Every table runs only the looked-up rows, after summing the row's gradient
over its samples; the specs have no gradient clipping, no weight decay and no
gradient-accumulation switch, and weight clipping is an argument of
`tpu_sparse_dense_matmul_grad` (`embedding_var_limits`), not of the spec,
which keras-rs does not pass. This module needs neither TensorFlow nor
jax-tpu-embedding to import; building a spec needs jax-tpu-embedding.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from tf_tpu_embed_opt import errors
from tf_tpu_embed_opt.definitions import registry, spec
from tf_tpu_embed_opt.engines.base import Setting, TableReport, learning_rate_text

__all__ = [
    "ENGINE",
    "JAX_OPTIMIZERS",
    "TITLE",
    "algorithms",
    "check_optimizer",
    "custom_reasons",
    "definition_of_spec",
    "for_twin",
    "implied_reason",
    "implied_value",
    "is_rule_spec",
    "is_spec",
    "keras_name",
    "make_spec",
    "no_spec",
    "option_reason",
    "read_spec",
    "runs_as",
    "spec_module",
]

ENGINE = spec.JAX_ENGINE
TITLE = "`jax-tpu-embedding` (SparseCore, JAX)"

# Definition name -> its jax-tpu-embedding spec class, in registry order.
JAX_OPTIMIZERS: Dict[str, str] = {
    d.name: d.jax.spec_class for d in registry.ALL if d.jax is not None
}

# Why a twin argument must have the value the spec implies: the engine's
# lazy rule here, each algorithm's own in its definition (`JaxFace.reasons`).
_LAZY_REASON = (
    "jax-tpu-embedding updates only the looked-up rows and their slots "
    "(lazy=True computes that)"
)

_OPTION_REASONS = {
    "clipvalue": "the specs have no gradient clipping",
    "clip_weight_min": (
        "the specs have no weight clipping (jax-tpu-embedding clips through "
        "the embedding_var_limits argument of tpu_sparse_dense_matmul_grad, "
        "which keras-rs does not pass)"
    ),
    "weight_decay_factor": "the specs have no weight decay",
}
_OPTION_REASONS["clip_weight_max"] = _OPTION_REASONS["clip_weight_min"]

# The TensorFlow engines' options that only a custom spec holds.
_EMBEDDING_OPTIONS = (
    "clip_gradient_min",
    "clip_gradient_max",
    "clip_weight_min",
    "clip_weight_max",
    "weight_decay_factor",
)


def spec_module() -> Any:
    """`jax_tpu_embedding.sparsecore.lib.nn.embedding_spec`.

    Raises:
      JaxNotInstalled: jax-tpu-embedding (or JAX) is not installed; the
        message names the `[jax]` extra.
    """
    return errors.import_from_jax_extra(
        "jax_tpu_embedding.sparsecore.lib.nn.embedding_spec",
        "The jax-tpu-embedding engine",
    )


def is_spec(obj: Any) -> bool:
    """Whether `obj` is a jax-tpu-embedding `OptimizerSpec` (without importing it)."""
    return any(
        c.__name__ == "OptimizerSpec" and c.__module__.startswith("jax_tpu_embedding")
        for c in type(obj).__mro__
    )


def is_rule_spec(obj: Any) -> bool:
    """Whether `obj` is this package's `RuleOptimizerSpec` (`jax_custom`): a
    custom optimizer running one of the twins."""
    return type(obj).__module__ == "tf_tpu_embed_opt.engines.jax_custom"


def definition_of_spec(obj: Any) -> Optional[spec.Definition]:
    """The definition a spec computes; `None` for one this package cannot read
    (`CustomOptimizerSpec`, a user's subclass)."""
    name = type(obj).__name__
    for definition in registry.ALL:
        if definition.jax is not None and definition.jax.spec_class == name:
            module = spec_module()
            if type(obj) is getattr(module, name):
                return definition
    return None


def keras_name(definition: spec.Definition, name: str) -> str:
    """The twin's argument for a definition argument (hyper or Keras name)."""
    for argument in definition.keras_arguments:
        if name in (argument.name, argument.hyper):
            return argument.name
    raise KeyError(name)


def implied_value(definition: spec.Definition, argument: spec.KerasArg) -> Any:
    """The value of a twin argument with which it computes the spec's math.

    Arguments the spec carries (`JaxFace.fields`) have no fixed value:
    `None`. The others take `JaxFace.implied`, else the TensorFlow engines'
    value (`KerasArg.engine`), else their default.
    """
    face = definition.jax
    for name in (argument.name, argument.hyper):
        if name is not None and name in face.implied:
            return face.implied[name]
    if argument.name in face.fields or argument.hyper in face.fields:
        return None
    if argument.engine is not None:
        return argument.engine
    return argument.default


def implied_reason(definition: spec.Definition, name: str) -> str:
    """Why argument `name` of `definition`'s twin must have the value its
    jax-tpu-embedding spec implies."""
    if name == "lazy":
        return _LAZY_REASON
    reasons = definition.jax.reasons if definition.jax is not None else {}
    return reasons.get(name, "jax-tpu-embedding has no such option")


def option_reason(name: str) -> str:
    return _OPTION_REASONS[name]


def custom_reasons(
    definition: spec.Definition,
    target: spec.Definition,
    arguments: Mapping[str, Any],
    options: Mapping[str, Any],
) -> Tuple[str, ...]:
    """Why a twin runs as a custom spec rather than jax-tpu-embedding's own.

    Args:
      definition: The algorithm of the twin's class.
      target: The algorithm it runs with `arguments` (a variant).
      arguments: Every argument of the twin, `lazy=True` where it has one.
      options: Its engine options (`clip_gradient_min`, ...,
        `weight_decay_factor`); a decay factor of 0 decays nothing.

    Returns:
      One `"setting=value: reason"` per setting that the engine's own spec
      cannot hold (or that it has no spec for the algorithm); empty where
      its own spec computes the same.
    """
    options = {**options, "weight_decay_factor": options["weight_decay_factor"] or None}
    _, custom, _ = keras_settings(definition, target, arguments, options, None, ())
    return tuple(custom)


def keras_settings(
    definition: spec.Definition,
    target: spec.Definition,
    arguments: Mapping[str, Any],
    options: Mapping[str, Any],
    clipvalue: Any,
    negligible: Sequence[str],
) -> Tuple[List[str], List[str], Dict[str, Any]]:
    """What this engine makes of a Keras optimizer's settings.

    Args:
      definition: The algorithm of its Keras class.
      target: The algorithm it runs with `arguments` (a variant).
      arguments: Its Keras arguments.
      options: Its engine options (this package's keywords).
      clipvalue: Its Keras `clipvalue`.
      negligible: The Keras-only arguments whose values change nothing.

    Returns:
      `(refused, custom, fields)`: what no row rule can run (`lazy=False`
      where it matters); what the engine's own spec cannot hold, which a
      custom spec holds; and, where that is nothing, the own spec's fields.
    """
    custom = [] if target.jax is not None else [_no_own_spec(target.name)]
    if clipvalue:
        custom.append(f"clipvalue={clipvalue!r}: {option_reason('clipvalue')}")
    for name in _EMBEDDING_OPTIONS:
        if options[name] is not None:
            reason = option_reason(
                "clipvalue" if name.startswith("clip_gradient") else name
            )
            custom.append(f"{name}={options[name]!r}: {reason}")
    refused: List[str] = []
    values: Dict[str, Any] = {}
    for argument in definition.keras_arguments:
        value = arguments[argument.name]
        wanted = (
            implied_value(definition, argument)
            if target.jax is not None
            else (True if argument.name == "lazy" else None)
        )
        if wanted is None:
            values[argument.name] = value
        elif value != wanted and argument.name not in negligible:
            why = implied_reason(definition, argument.name)
            reason = f"{argument.name}={value!r}: {why}"
            (refused if argument.name == "lazy" else custom).append(reason)
    if custom:
        return refused, custom, {}
    fields = {
        name: values[keras_name(definition, name)] for name in definition.jax.fields
    }
    return refused, custom, fields


def make_spec(
    definition: spec.Definition, learning_rate: Any, values: Mapping[str, Any]
) -> Any:
    """The spec computing `definition` with `values` (by definition argument name).

    Raises:
      ValueError: The definition has no jax-tpu-embedding spec.
    """
    if definition.jax is None:
        raise ValueError(no_spec(definition.name))
    cls = getattr(spec_module(), definition.jax.spec_class)
    kwargs = {field: values[name] for name, field in definition.jax.fields.items()}
    return cls(learning_rate=learning_rate, **kwargs)


def no_spec(name: str) -> str:
    return (
        f"jax-tpu-embedding has no {name}; it runs "
        + ", ".join(JAX_OPTIMIZERS)
        + " (engine 'jax-tpu-embedding')"
    )


def _no_own_spec(name: str) -> str:
    """Why an algorithm without a spec of the engine's own runs as a custom
    spec (a reason, where `no_spec` is a refusal)."""
    return f"jax-tpu-embedding has no spec of its own for {name} (its own: " + (
        ", ".join(JAX_OPTIMIZERS) + ")"
    )


def read_spec(obj: Any, owner: str = "to_keras") -> Tuple[spec.Definition, Any, Dict]:
    """`(definition, learning rate, twin arguments)` computing what `obj` computes.

    The twin arguments are by Keras name: the spec's fields, and the values it
    implies (`JaxFace.implied`). A field or learning rate given as a 0-d
    array is read as the Python number.

    Raises:
      TypeError: `obj` is no `OptimizerSpec` this package reads.
    """
    definition = definition_of_spec(obj)
    if definition is None:
        raise TypeError(
            f"{owner}: {type(obj).__name__} is a jax-tpu-embedding spec whose "
            "update this package does not read (a CustomOptimizerSpec runs the "
            "user's own computation); the specs it reads are "
            + ", ".join(JAX_OPTIMIZERS.values())
            + "."
        )
    arguments: Dict[str, Any] = {}
    for name, field in definition.jax.fields.items():
        arguments[keras_name(definition, name)] = _number(getattr(obj, field))
    for argument in definition.keras_arguments:
        if argument.name not in arguments:
            arguments[argument.name] = implied_value(definition, argument)
    return definition, _number(obj.learning_rate), arguments


def _number(value: Any) -> Any:
    """`value`, a 0-d array read as the Python number it holds."""
    if hasattr(value, "item") and getattr(value, "shape", None) == ():
        return value.item()
    return value


def algorithms() -> Tuple[str, ...]:
    """Its own spec's, and those a custom spec runs row by row: every
    algorithm but those no engine runs (`Definition.engine_refusal`)."""
    return tuple(d.name for d in registry.ALL if d.engine_refusal is None)


def runs_as(definition: spec.Definition) -> str:
    if definition.jax is not None:
        return f"`{definition.jax.spec_class}`"
    if definition.factor is not None:
        return f"no: one {definition.factor.name.replace('_', ' ')} per variable"
    if definition.engine_refusal is not None:
        return "no: state of one value per row"
    return "`RuleOptimizerSpec` (a `CustomOptimizerSpec`)"


def for_twin(opt: Any) -> Tuple[Any, Tuple[Setting, ...]]:
    """`opt`, where a spec computes exactly its math (its own, or the custom
    one running its twin's rule on each row): that is what the twin of the
    TensorFlow engines' optimizer computes."""
    check_optimizer(opt, None).check_runs(
        "jax-tpu-embedding has no exact spec for this optimizer"
    )
    return opt, ()


def check_optimizer(opt: Any, table: Optional[str]) -> TableReport:
    """What jax-tpu-embedding does with `opt`: a spec, or an embedding-face
    optimizer of the TensorFlow engines (what its conversion would lose)."""
    if is_rule_spec(opt):
        rule = opt.rule
        received = [
            ("spec", f"RuleOptimizerSpec (CustomOptimizerSpec) of {opt.optimizer}"),
            ("learning_rate", learning_rate_text(opt.learning_rate)),
            *((name, repr(value)) for name, value in opt.arguments.items()),
            *((name, repr(value)) for name, value in opt.given_options.items()),
        ]
        why = custom_reasons(rule.definition, rule.active, rule.arguments, opt.options)
        return TableReport(
            table, opt, rule.active.name, tuple(received), (), (), custom=why
        )
    if is_spec(opt):
        definition = definition_of_spec(opt)
        if definition is None:
            refusal = Setting(
                "optimizer",
                type(opt).__name__,
                "rejected",
                "its update is the user's own computation, which this package "
                "does not read",
            )
            return TableReport(table, opt, None, (), (), (refusal,))
        received: List[Tuple[str, Any]] = [
            ("spec", definition.jax.spec_class),
            ("learning_rate", learning_rate_text(opt.learning_rate)),
        ]
        for field in definition.jax.fields.values():
            received.append((field, repr(getattr(opt, field))))
        return TableReport(
            table,
            opt,
            definition.name,
            tuple(received),
            (),
            tuple(_out_of_domain(opt, definition)),
        )
    return _check_embedding_optimizer(opt, table)


def _out_of_domain(opt: Any, definition: spec.Definition) -> List[Setting]:
    """The values of spec `opt` its algorithm does not take, each refused
    with why. jax-tpu-embedding's specs take any value (a learning rate of
    -0.1 or "0.1", an Adam beta_2 of 1.5): the engine then steps with it, or
    fails, and no twin computes the same (`to_keras` refuses them alike)."""
    owner = type(opt).__name__
    _, rate, arguments = read_spec(opt, "check_engine")
    refused: List[Setting] = []

    def judge(name: str, value: Any, check: Callable[[], None]) -> None:
        try:
            check()
        except (TypeError, ValueError) as error:
            refused.append(Setting(name, value, "rejected", str(error)))

    if not callable(rate):
        judge(
            "learning_rate",
            rate,
            functools.partial(
                spec.check_real, owner, "learning_rate", rate, spec.NON_NEGATIVE
            ),
        )
    by_name = {a.name: a for a in definition.keras_arguments}
    for name, field in definition.jax.fields.items():
        argument = by_name[keras_name(definition, name)]
        value = arguments[argument.name]
        judge(field, value, functools.partial(argument.check, owner, value))
    return refused


def _check_embedding_optimizer(opt: Any, table: Optional[str]) -> TableReport:
    """What jax-tpu-embedding does with an optimizer of the TensorFlow engines.

    Its own spec where that computes the same; else a `RuleOptimizerSpec`
    (`jax_custom`), which runs the twin of `opt` on each looked-up row,
    gradient and weight clipping and weight decay included. Refused: what no
    row rule computes (`use_gradient_accumulation=False`, non-lazy Adam).
    """
    from tf_tpu_embed_opt.engines.base import dispatch_definition

    # This package's classes (and `arguments.Checked`, where TensorFlow is
    # missing) carry their definition; TensorFlow's own are dispatched.
    definition = getattr(opt, "_definition", None) or dispatch_definition(opt)
    if definition is None:
        name = type(opt).__name__
        refusal = Setting("optimizer", name, "rejected", no_spec(name))
        return TableReport(table, opt, None, (), (), (refusal,))
    rejected: List[Setting] = []
    hypers = {h.name: getattr(opt, h.name) for h in definition.hypers}
    lazy_hyper = definition.keras.lazy_hyper if definition.keras else None
    if lazy_hyper is not None and not hypers[lazy_hyper]:
        rejected.append(Setting(lazy_hyper, False, "rejected", _LAZY_REASON))
    if not opt.use_gradient_accumulation:
        rejected.append(
            Setting(
                "use_gradient_accumulation",
                False,
                "rejected",
                "jax-tpu-embedding always sums a row's gradient over the step "
                "before the update",
            )
        )
    # The twin of `opt` (lazy: a non-lazy one is refused above).
    arguments = {
        argument.name: hypers[argument.hyper]
        if argument.hyper is not None
        else argument.engine
        for argument in definition.keras_arguments
    }
    if "lazy" in arguments:
        arguments["lazy"] = True
    options = {name: getattr(opt, name) for name in _EMBEDDING_OPTIONS}
    why = custom_reasons(definition, definition, arguments, options)
    received = [
        (
            "spec",
            f"RuleOptimizerSpec (CustomOptimizerSpec) running {definition.name}"
            if why
            else definition.jax.spec_class,
        )
    ]
    return TableReport(
        table, opt, definition.name, tuple(received), (), tuple(rejected), custom=why
    )
