"""The TensorCore engine (`TPUEmbedding`): it receives the whole proto.

`tf.tpu.experimental.embedding.TPUEmbedding` hands the engine the
`OptimizationParameters` proto of the table's optimizer, every setting
included (docs/tpu_semantics.md), so every optimizer of the embedding face
runs exactly; anything that is no optimizer with such a proto is refused.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

from tf_tpu_embed_opt.definitions import registry, spec
from tf_tpu_embed_opt.engines.base import (
    Setting,
    TableReport,
    dispatch_definition,
    learning_rate_text,
)

__all__ = ["TITLE", "algorithms", "check_optimizer", "for_twin", "runs_as"]

TITLE = "`TPUEmbedding`"


def algorithms() -> Tuple[str, ...]:
    return tuple(d.name for d in registry.DEFINITIONS)


def runs_as(definition: spec.Definition) -> str:
    return "yes" if definition.tensorflow_engines else "no"


def for_twin(opt: Any) -> Tuple[Any, Tuple[Setting, ...]]:
    """`opt` itself: the engine receives its whole proto."""
    return opt, ()


def check_optimizer(opt: Any, table: Optional[str]) -> TableReport:
    definition = dispatch_definition(opt)
    if definition is None:
        refusal = Setting(
            "optimizer",
            type(opt).__name__,
            "rejected",
            "not an optimizer with OptimizationParameters (TensorFlow's "
            "CustomOptimizer raises in TPUEmbedding)",
        )
        return TableReport(table, opt, None, (), (), (refusal,))
    received: List[Tuple[str, Any]] = [
        ("proto", f"OptimizationParameters.{definition.proto_oneof}"),
        ("learning_rate", learning_rate_text(opt.learning_rate)),
    ]
    for name in definition.parameter_names:
        if name in ("learning_rate", "slot_variable_creation_fn"):
            continue
        if name == "clipvalue":
            value = (opt.clip_gradient_min, opt.clip_gradient_max)
        else:
            value = getattr(opt, name)
        received.append((name, repr(value)))
    return TableReport(table, opt, definition.name, tuple(received), (), ())
