"""`describe ... --engine jax-tpu-embedding`: the spec, its slots and its twin.

jax-tpu-embedding takes no proto: a table's optimizer is an `OptimizerSpec`.
This prints the spec that computes the described optimizer exactly (or what
keeps it from having one), its slots by jax-tpu-embedding's names with their
initial values, the Keras twin computing the same on CPU/GPU, and the memory
of a table. LaProp and F2A exist only here.
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, Optional, Tuple

from tf_tpu_embed_opt.cli.parser import out
from tf_tpu_embed_opt.definitions import arguments as arguments_module
from tf_tpu_embed_opt.definitions import spec
from tf_tpu_embed_opt.definitions.spec import Definition
from tf_tpu_embed_opt.engines import jax_tpu_embedding as jax_engine
from tf_tpu_embed_opt.engines.base import EngineReport
from tf_tpu_embed_opt.errors import tensorflow_installed

__all__ = ["describe", "describe_spec", "spec_of_embedding"]

ENGINE = spec.JAX_ENGINE


def describe(
    definition: Definition,
    arguments: Dict[str, Any],
    sizes: Optional[Tuple[int, int]],
    memory_lines: Any,
    engine: str = ENGINE,
    without_tensorflow: bool = False,
) -> int:
    """Prints the jax-tpu-embedding description; returns the exit status
    (2 where the engine cannot run it, or `engine` lacks the algorithm).

    Args:
      definition: The algorithm.
      arguments: The command line's arguments of its embedding class (for a
        TensorFlow algorithm), of its spec (LaProp, F2A) or of its twin (an
        algorithm no engine has built in), by definition name.
      sizes: `(vocabulary_size, dim)` for the memory estimate, or None.
      memory_lines: `describe`'s memory table, given the definition and sizes.
      engine: The engine asked for; a TensorFlow engine only reaches here for
        an algorithm it does not have.
      without_tensorflow: Check the arguments from the definitions, as where
        TensorFlow is not installed (which is detected), instead of building
        the embedding class.
    """
    if spec.engine_named(engine, "describe").tensorflow:
        out(
            f"{definition.name} exists only on {ENGINE}; {engine} has no "
            f"{definition.name}. Describe it with --engine {ENGINE}."
        )
        return 2
    jax_spec = _spec(definition, arguments, without_tensorflow)
    if jax_spec is None:
        return 2
    describe_spec(jax_spec, sizes, memory_lines)
    return 0


def describe_spec(
    jax_spec: Any, sizes: Optional[Tuple[int, int]], memory_lines: Any
) -> None:
    """Prints `jax_spec` (one this package made or reads), its slots by
    jax-tpu-embedding's names, its Keras twin and, given `sizes`, the memory
    of a table (`memory_lines`, as in `describe`)."""
    from tf_tpu_embed_opt.conversions import faces as convert

    twin = convert.to_keras(jax_spec)
    rule = twin.rule
    # The spec's own algorithm (a Keras optimizer may convert to another's).
    definition = rule.definition
    out(spec_call(definition, jax_spec))
    if jax_engine.is_rule_spec(jax_spec):
        names = {s.name: s.name for s in rule.slots()}
        out(
            "  A jax-tpu-embedding CustomOptimizerSpec that runs the twin's "
            "rule on each looked-up row (tf_tpu_embed_opt.engines.jax_custom)."
        )
        for reason in jax_engine.check_optimizer(jax_spec, None).custom:
            out(f"  Custom, because {reason}.")
    else:
        names = dict(definition.jax_slots)
        out(
            "  jax_tpu_embedding.sparsecore.lib.nn.embedding_spec: "
            + definition.summary
        )
    out(f"  Update per looked-up row: {rule.math}")
    out()
    out(
        "Slots (one float32 variable the shape of the table each; "
        "jax-tpu-embedding's names):"
    )
    if not names:
        out("  none")
    width = max([len(n) for n in names.values()] or [0])
    by_name = {s.name: s for s in rule.slots()}
    for ours, theirs in names.items():
        slot = by_name[ours]
        start = rule.slot_initial(slot)
        out(f"  {theirs:<{width}}  initial value {start!r}. {slot.doc}")
    out()
    out(
        f"Keras twin (what {ENGINE} computes, on CPU/GPU: "
        "tf_tpu_embed_opt.to_keras(spec)):"
    )
    out(f"  tf_tpu_embed_opt.optimizers.{twin!r}")
    if sizes is not None:
        out()
        # The slots this spec keeps, those listed above: one source for both.
        for line in memory_lines(definition, *sizes, len(names)):
            out(line)


def _spec(
    definition: Definition, arguments: Dict[str, Any], without_tensorflow: bool
) -> Any:
    """The jax-tpu-embedding spec of `definition` with `arguments`: through
    the embedding class and its twin (a TensorFlow algorithm), its own spec
    class, or a custom spec running the twin's rule; `None`, after saying
    why, where the engine cannot run the embedding class's settings."""
    from tf_tpu_embed_opt.conversions import faces as convert

    if definition.tensorflow_engines:
        embedding = None if without_tensorflow else _embedding_classes()
        if embedding is None:
            # The class's arguments, checked from the definitions.
            opt = arguments_module.Checked(definition, **arguments)
        else:
            opt = embedding.class_for(definition)(**arguments)
        return spec_of_embedding(opt, definition, from_classes=embedding is not None)
    if definition.jax is not None:
        rate = arguments.pop("learning_rate", definition.learning_rate_default)
        values = {**definition.defaults, **arguments}
        return jax_engine.make_spec(definition, rate, values)
    # No spec of its own: the engine runs the twin's rule (a custom spec).
    from tf_tpu_embed_opt.optimizers import twins

    return convert.to_embedding(twins.class_for(definition)(**arguments), engine=ENGINE)


def spec_of_embedding(
    opt: Any, definition: Definition, from_classes: bool = True
) -> Any:
    """The jax-tpu-embedding spec that computes embedding optimizer `opt`
    (of `definition`) exactly, through its twin on the engine; `None`, after
    saying why, where the engine cannot run its settings. Without
    `from_classes`, `opt` is its arguments checked from the definitions
    (TensorFlow not installed)."""
    from tf_tpu_embed_opt.conversions import faces as convert

    report = EngineReport(ENGINE, (jax_engine.check_optimizer(opt, None),))
    if not report.runs:
        out(repr(opt))
        out()
        out(f"What {ENGINE} does with it:")
        for line in report.lines():
            out(line)
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        if from_classes:
            twin = convert.to_keras(opt, engine=ENGINE)
        else:
            # `to_keras`'s own mapping, which reads only `opt`'s arguments.
            twin = convert.twin_of_engine_optimizer(definition, opt, ENGINE)
    return convert.to_embedding(twin, engine=ENGINE)


def spec_call(definition: Definition, jax_spec: Any) -> str:
    """`XOptimizerSpec(learning_rate=..., ...)` with every field of the spec
    (jax-tpu-embedding's own `repr` shows none)."""
    if jax_engine.is_rule_spec(jax_spec):
        return repr(jax_spec)
    fields = ", ".join(
        f"{field}={getattr(jax_spec, field)!r}"
        for field in ("learning_rate", *definition.jax.fields.values())
    )
    return f"{type(jax_spec).__name__}({fields})"


def _embedding_classes() -> Any:
    """`embedding.parameters`, or None where TensorFlow is not installed."""
    if not tensorflow_installed():
        return None
    from tf_tpu_embed_opt.embedding import parameters

    return parameters
