"""The SparseCore engine (`TPUEmbeddingV2`): what reaches the op, and stacking.

`TPUEmbeddingV2.apply_gradients` dispatches with `isinstance` on TensorFlow's
SGD, Adagrad, AdagradMomentum, Adam and FTRL and hands the SparseCore op only
some of the optimizer's settings; the rest are dropped without a word, weight
decay is refused when the object is built and every other optimizer fails at
the first step (docs/tpu_semantics.md, "SparseCore optimizers"). Tables of the
same padded width and an equal optimizer are stacked into one variable.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
from tensorflow.python.tpu import tpu_embedding_v2_utils

from tf_tpu_embed_opt.definitions import registry, spec
from tf_tpu_embed_opt.embedding import parameters as embedding
from tf_tpu_embed_opt.embedding.configuration import table_name
from tf_tpu_embed_opt.engines.base import (
    EngineReport,
    Setting,
    TableReport,
    dispatch_definition,
    learning_rate_text,
)

__all__ = [
    "SPARSECORE_OPTIMIZERS",
    "SparseCoreOptimizer",
    "TITLE",
    "algorithms",
    "check_optimizer",
    "for_twin",
    "runs_as",
    "sparsecore_equivalent",
    "stacks",
    "with_id_dropping",
]

TITLE = "`TPUEmbeddingV2` (SparseCore, TensorFlow)"


# What `TPUEmbeddingV2.apply_gradients` hands the SparseCore op, for each
# algorithm it runs: each definition's `sparsecore` record, read from
# TensorFlow 2.21's tpu_embedding_v3.py; tests/test_engines.py checks every
# entry against that code path with the SparseCore ops replaced by recorders.
SparseCoreOptimizer = spec.SparseCoreOptimizer
SPARSECORE_OPTIMIZERS: Dict[str, SparseCoreOptimizer] = {
    d.name: d.sparsecore for d in registry.DEFINITIONS if d.sparsecore is not None
}


def algorithms() -> Tuple[str, ...]:
    return tuple(SPARSECORE_OPTIMIZERS)


def runs_as(definition: spec.Definition) -> str:
    return "yes" if definition.name in SPARSECORE_OPTIMIZERS else "no"


# Dropped settings that leave the math unchanged (not refused in strict mode).
_HARMLESS = {"allow_zero_accumulator", "low_dimensional_packing_status"}


def _common_settings(opt: Any, algorithm: str) -> Tuple[List[Setting], List[Setting]]:
    """The shared options' verdicts on SparseCore: (dropped, rejected)."""
    dropped, rejected = [], []
    low, high = opt.clip_gradient_min, opt.clip_gradient_max
    if low is not None or high is not None:
        dropped.append(
            Setting(
                "clipvalue",
                (low, high),
                "dropped",
                "the SparseCore ops have no gradient clipping; gradients are "
                "applied unclipped",
            )
        )
    for name in ("clip_weight_min", "clip_weight_max"):
        value = getattr(opt, name)
        if value is not None:
            dropped.append(
                Setting(
                    name,
                    value,
                    "dropped",
                    "TPUEmbeddingV2 does not pass weight clipping to the "
                    "SparseCore op (its attribute stays at ±inf)",
                )
            )
    if not opt.use_gradient_accumulation:
        dropped.append(
            Setting(
                "use_gradient_accumulation",
                False,
                "dropped",
                "SparseCore always sums each row's gradient first and applies "
                "the optimizer once per row and step",
                changes_math=not registry.BY_NAME[algorithm].linear_in_gradient,
            )
        )
    if opt.low_dimensional_packing_status:
        dropped.append(
            Setting(
                "low_dimensional_packing_status",
                opt.low_dimensional_packing_status,
                "dropped",
                "SparseCore has no low-dimensional packing",
                changes_math=False,
            )
        )
    # TensorFlow tests `is not None`: an explicit 0.0 or False is refused too.
    for name in (
        "weight_decay_factor",
        "multiply_weight_decay_factor_by_learning_rate",
    ):
        value = getattr(opt, name)
        if value is not None:
            rejected.append(
                Setting(
                    name,
                    value,
                    "rejected",
                    "TPUEmbeddingV2.__init__ raises NotImplementedError for any "
                    "value but None",
                )
            )
    return dropped, rejected


def check_optimizer(opt: Any, table: Optional[str]) -> TableReport:
    definition = dispatch_definition(opt)
    if definition is None or definition.name not in SPARSECORE_OPTIMIZERS:
        name = definition.name if definition is not None else type(opt).__name__
        supported = ", ".join(SPARSECORE_OPTIMIZERS)
        refusal = Setting(
            "optimizer",
            name,
            "rejected",
            "TPUEmbeddingV2.apply_gradients raises ValueError('Unsupported "
            "optimizer in minibatching mode.') at the first step; SparseCore "
            f"runs {supported} (TensorFlow's classes or their subclasses)",
        )
        # TensorFlow refuses weight decay first, when the object is built.
        refused = ()
        if definition is not None:
            refused = tuple(_common_settings(opt, definition.name)[1])
        return TableReport(table, opt, name, (), (), (*refused, refusal))
    sc = SPARSECORE_OPTIMIZERS[definition.name]
    received: List[Tuple[str, Any]] = [
        ("op", sc.op),
        ("learning_rate", learning_rate_text(opt.learning_rate)),
    ]
    for hyper, attribute in sc.attributes.items():
        label = hyper if hyper == attribute else f"{hyper} (as {attribute})"
        received.append((label, repr(getattr(opt, hyper))))
    hypers = {h.name: getattr(opt, h.name) for h in definition.hypers}
    for slot in definition.slots:
        received.append((f"slot {slot.name} initial value", slot.initial_value(hypers)))
    dropped, rejected = _common_settings(opt, definition.name)
    for hyper, (engine_value, reason) in sc.dropped.items():
        value = getattr(opt, hyper)
        if value != engine_value:
            dropped.append(
                Setting(
                    hyper,
                    value,
                    "dropped",
                    reason,
                    changes_math=hyper not in _HARMLESS,
                )
            )
    return TableReport(
        table, opt, definition.name, tuple(received), tuple(dropped), tuple(rejected)
    )


# How a refusal of SparseCore starts (its settings follow).
_REFUSAL = "TPUEmbeddingV2 cannot run this optimizer"


def for_twin(opt: Any) -> Tuple[Any, Tuple[Setting, ...]]:
    """What SparseCore computes for `opt` (`sparsecore_equivalent`), and the
    settings `TPUEmbeddingV2` drops on the way."""
    report = check_optimizer(opt, None)
    report.check_runs(_REFUSAL)
    return _equivalent(opt), report.dropped


def sparsecore_equivalent(opt: Any) -> Any:
    """The optimizer whose configuration says what SparseCore computes for `opt`.

    The settings `TPUEmbeddingV2` drops are set to the values SparseCore
    computes with (no clipping, accumulation on, lazy Adam, no packing).

    Raises:
      TypeError: `opt` is not an embedding optimizer.
      ValueError: SparseCore refuses `opt` (another algorithm, weight decay).
    """
    if not isinstance(opt, tpu_embedding_v2_utils._Optimizer):
        raise TypeError(
            "sparsecore_equivalent: argument `opt` must be an embedding "
            "optimizer (tf_tpu_embed_opt.embedding or "
            f"tf.tpu.experimental.embedding); received {opt!r} of type "
            f"{type(opt).__name__}."
        )
    check_optimizer(opt, None).check_runs(_REFUSAL)
    return _equivalent(opt)


def _equivalent(opt: Any) -> Any:
    """`sparsecore_equivalent` of an `opt` SparseCore runs (checked)."""
    definition = embedding.definition_of(opt)
    values = embedding.arguments(opt)
    values.update(
        clipvalue=None,
        clip_weight_min=None,
        clip_weight_max=None,
        use_gradient_accumulation=True,
        low_dimensional_packing_status=False,
    )
    for hyper, (engine_value, _) in SPARSECORE_OPTIMIZERS[
        definition.name
    ].dropped.items():
        values[hyper] = engine_value
    return embedding.class_for(definition)(**values)


def padded_width(dim: int) -> int:
    return int(math.ceil(dim / 8) * 8)


def _stack_key(table: Any) -> Tuple[int, str]:
    # TPUEmbeddingV2 groups by padded width and a digest of the optimizer's
    # hash and the quantization config's repr (tpu_embedding_v3.py,
    # _stack_tables_with_same_table_dim_and_optimizer).
    key = (hash(table.optimizer), repr(table.quantization_config))
    digest = hashlib.sha1(repr(key).encode(), usedforsecurity=False).hexdigest()
    return padded_width(table.dim), digest


def stacks(
    tables: Sequence[Any],
    features: Sequence[Tuple[str, Any]],
    optimizer: Any,
    num_partitions: int,
    sparse_cores_per_partition: int,
    config: Any,
) -> Dict[str, Tuple[str, ...]]:
    """Stacked table -> table names, as TPUEmbeddingV2 would build them.

    Works on copies: TensorFlow's stacking writes layouts and padded shapes
    into the tables it gets, and `TPUEmbeddingV2` names unnamed tables and
    gives tables without an optimizer the global one first. The features'
    output shapes are TensorFlow's to count samples with: `check_engine`
    asks only where it refuses none of them.
    """
    clones = {}
    for index, table in enumerate(tables):
        clone = copy.copy(table)
        clone.name = table_name(table, index)
        if clone.optimizer is None:
            clone.optimizer = optimizer
        clones[id(table)] = clone
    flat = []
    for path, feature in features:
        clone = copy.copy(feature)
        clone.table = clones[id(feature.table)]
        flat.append((path, clone))
    try:
        from tensorflow.python.tpu import tpu_embedding_v3

        result = tpu_embedding_v3._stack_tables_with_same_table_dim_and_optimizer(
            list(clones.values()),
            flat,
            num_partitions,
            sparse_cores_per_partition,
            config
            if config is not None
            else tpu_embedding_v3.SparseCoreEmbeddingConfig(),
        )
    except Exception:  # a TensorFlow without this function or signature
        result = None
    if result is not None:
        return {
            stack: tuple(t.name for t in members)
            for stack, members in result.stacked_table_to_tables.items()
        }
    legacy = _legacystacks(list(clones.values()), flat, num_partitions)
    if legacy is not None:
        return legacy
    disabled = getattr(config, "disable_table_stacking", False)
    groups: Dict[Any, List[str]] = {}
    for table in sorted(clones.values(), key=lambda t: t.name):
        key = (table.name,) if disabled else _stack_key(table)
        groups.setdefault(key, []).append(table.name)
    return {"_".join(names): tuple(names) for names in groups.values()}


def _legacystacks(
    tables: Sequence[Any], features: Sequence[Tuple[str, Any]], num_partitions: int
) -> Optional[Dict[str, Tuple[str, ...]]]:
    """The stacking of older TensorFlow (a `TPUEmbeddingV2` method, before the
    module-level function): groups by exact `dim`, equal optimizer and
    quantization config, sized by `_pywrap_tpu_embedding.stack_tables`.
    None when this TensorFlow is not one of those."""
    try:
        from tensorflow.python.tpu import _pywrap_tpu_embedding, tpu_embedding_v3
    except ImportError:
        return None
    if not hasattr(
        tpu_embedding_v3.TPUEmbeddingV2,
        "_stack_tables_with_same_table_dim_and_optimizer",
    ) or not hasattr(_pywrap_tpu_embedding, "stack_tables"):
        return None
    samples = {t.name: 0 for t in tables}
    for _, feature in features:
        samples[feature.table.name] += int(np.prod(feature.output_shape))
    groups: Dict[Any, int] = {}
    group_of = []
    for table in tables:
        quantization = table.quantization_config
        key = (table.dim, table.optimizer, repr(quantization) if quantization else None)
        group_of.append(groups.setdefault(key, len(groups)))
    stacks = _pywrap_tpu_embedding.stack_tables(
        [t.vocabulary_size for t in tables],
        [t.dim for t in tables],
        [samples[t.name] for t in tables],
        group_of,
        [t.name for t in tables],
        num_partitions,
    )
    return {"_".join(names): tuple(names) for names in stacks}


def with_id_dropping(report: EngineReport, config: Any) -> EngineReport:
    """`report`, with id dropping listed for every table that runs."""
    if not report.engine.sparsecore_op or not getattr(
        config, "allow_id_dropping", False
    ):
        return report
    dropping = Setting(
        "allow_id_dropping",
        True,
        "changed",
        "SparseCoreEmbeddingConfig(allow_id_dropping=True): ids over the "
        "per-SparseCore limits (max_ids_per_table, max_unique_ids_per_table; "
        "256 when not given) are dropped from the step, lookups and gradients",
    )
    tables = tuple(
        dataclasses.replace(t, dropped=t.dropped + (dropping,)) if t.runs else t
        for t in report.tables
    )
    return dataclasses.replace(report, tables=tables)
