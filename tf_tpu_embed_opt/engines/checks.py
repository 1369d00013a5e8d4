"""Preflight of TensorFlow embedding configurations on the TensorFlow engines.

`check_configuration` reads embedding optimizers (this package's or TensorFlow's),
`TableConfig`s and nests of TensorFlow `FeatureConfig`s, asks the engine
module (`tensorcore`, `sparsecore`) about each table's optimizer, and adds
what `TPUEmbeddingV2` does with the features (stacking, output shapes).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf
from tensorflow.python.tpu import tpu_embedding_v2_utils

from tf_tpu_embed_opt import errors
from tf_tpu_embed_opt.embedding.configuration import table_name
from tf_tpu_embed_opt.engines import behaviour_of, sparsecore
from tf_tpu_embed_opt.engines.base import (
    EngineReport,
    Setting,
    TableReport,
    check_engine_name,
    check_preflight_arguments,
    refuse_a_global_optimizer,
    shared_name_refusals,
    tables_of,
)

__all__ = [
    "check_configuration",
    "check_optimizer",
    "check_arguments",
    "finish",
    "flatten",
    "name_refusals",
    "named_tables",
    "table_report",
    "tables_of",
    "with_stacks",
]


def check_optimizer(opt: Any, table: Optional[str], engine: str) -> TableReport:
    """What `engine` does with the embedding optimizer `opt` of `table`: the
    engine's own judge says."""
    return behaviour_of(engine).check_optimizer(opt, table)


def flatten(config: Any) -> List[Tuple[str, Any]]:
    """`(path, leaf)` pairs of a nest of feature configs, as TensorFlow walks it."""
    from tensorflow.python.util import nest

    return nest.flatten_with_joined_string_paths(config)


def check_arguments(
    engine: Any,
    strict: Any,
    num_partitions: Any,
    sparse_cores_per_partition: Any,
    sparse_core_embedding_config: Any,
) -> None:
    """`check_engine`'s argument checks (shared with `preflight.check_engine`);
    the engine named."""
    engine = check_engine_name(engine, "check_engine")
    check_preflight_arguments(strict, num_partitions, sparse_cores_per_partition)
    config_class = getattr(
        tf.tpu.experimental.embedding, "SparseCoreEmbeddingConfig", None
    )
    if sparse_core_embedding_config is not None and not (
        config_class is not None
        and isinstance(sparse_core_embedding_config, config_class)
    ):
        raise TypeError(
            "check_engine: argument `sparse_core_embedding_config` must be None "
            "or a tf.tpu.experimental.embedding.SparseCoreEmbeddingConfig; "
            f"received {sparse_core_embedding_config!r}."
        )
    return engine


def finish(report: EngineReport, strict: bool, config: Any) -> EngineReport:
    """`report` with id dropping listed; with `strict`, raises on a problem."""
    report = sparsecore.with_id_dropping(report, config)
    if strict and report.problems():
        raise ValueError(
            f"check_engine: {report.engine} would not compute the configured "
            "math: " + "; ".join(report.problems()) + "."
        )
    return report


def check_configuration(
    obj: Any,
    engine: str = "TPUEmbeddingV2",
    *,
    strict: bool = False,
    optimizer: Any = None,
    num_partitions: int = 1,
    sparse_cores_per_partition: int = 4,
    sparse_core_embedding_config: Any = None,
) -> EngineReport:
    """Preflight of an embedding-face configuration on one engine.

    As `tf_tpu_embed_opt.check_engine` (which documents every argument), for
    embedding optimizers (this package's or TensorFlow's), a
    `tf.tpu.experimental.embedding.TableConfig` or a nest of TensorFlow
    `FeatureConfig`s. Keras optimizers and keras-rs configurations are read by
    `tf_tpu_embed_opt.check_engine`, which converts them first.

    Returns:
      An `EngineReport`.

    Raises:
      ValueError: Bad `engine`; with `strict=True`, a problem (the message lists
        all of them).
      TypeError: `obj` is none of the above.
    """
    engine = check_arguments(
        engine,
        strict,
        num_partitions,
        sparse_cores_per_partition,
        sparse_core_embedding_config,
    )
    report = _build_report(
        obj,
        engine,
        optimizer,
        num_partitions,
        sparse_cores_per_partition,
        sparse_core_embedding_config,
    )
    return finish(report, strict, sparse_core_embedding_config)


def _build_report(
    obj: Any,
    engine: str,
    optimizer: Any,
    num_partitions: int,
    sparse_cores_per_partition: int,
    config: Any,
) -> EngineReport:
    if optimizer is not None and not isinstance(
        optimizer, tpu_embedding_v2_utils._Optimizer
    ):
        # As tpu_embedding_configuration refuses it, whether a table uses it
        # or not (TensorFlow's engines look at it only for a table without
        # an optimizer).
        raise TypeError(
            "check_engine: argument `optimizer` (the global optimizer of a "
            "configuration's tables) must be an embedding optimizer of "
            "tf_tpu_embed_opt.embedding or tf.tpu.experimental.embedding; "
            f"received {optimizer!r} of type {errors.type_path(optimizer)}."
        )
    if isinstance(obj, tpu_embedding_v2_utils._Optimizer):
        refuse_a_global_optimizer(obj, optimizer)
        return EngineReport(engine, (check_optimizer(obj, None, engine),))
    if isinstance(obj, tpu_embedding_v2_utils.TableConfig):
        table_optimizer = obj.optimizer if obj.optimizer is not None else optimizer
        return EngineReport(engine, (table_report(obj, table_optimizer, engine),))
    features = flatten(obj) if obj is not None else []
    if not features or not all(
        isinstance(f, tpu_embedding_v2_utils.FeatureConfig) for _, f in features
    ):
        raise TypeError(
            "check_engine: argument `obj` must be an embedding optimizer, a "
            "tf.tpu.experimental.embedding.TableConfig, or a nest of "
            "tf.tpu.experimental.embedding.FeatureConfig (tf_tpu_embed_opt."
            "check_engine also reads Keras optimizers and "
            f"keras_rs.layers.FeatureConfig); received {obj!r}."
        )
    shapes = _output_shape_refusals(features) if engine.sparsecore_op else {}
    named = named_tables(features)
    names = name_refusals(named, engine)
    reports = []
    for name, table in named:
        table_optimizer = table.optimizer if table.optimizer is not None else optimizer
        report = table_report(table, table_optimizer, engine, name)
        refused = (*names.get(id(table), ()), *shapes.get(id(table), ()))
        if refused:
            report = dataclasses.replace(report, rejected=report.rejected + refused)
        reports.append(report)
    return with_stacks(
        EngineReport(engine, tuple(reports)),
        features,
        optimizer,
        num_partitions,
        sparse_cores_per_partition,
        config,
    )


def _output_shape_refusals(
    features: Sequence[Tuple[str, Any]],
) -> Dict[int, List[Setting]]:
    """Table id -> its features whose `output_shape` TPUEmbeddingV2 refuses.

    TensorFlow 2.21's `TPUEmbeddingV2.__init__` sums every feature's output
    shape: one without `output_shape` (unknown rank) raises `ValueError:
    Cannot iterate over a shape with unknown rank.`, one with an unknown
    dimension `TypeError: unsupported operand type(s) for +=: 'int' and
    'NoneType'`. Its stacking (also in TensorFlow 2.16) multiplies each
    shape's dimensions with `functools.reduce`, which raises `TypeError:
    reduce() of empty iterable with no initial value` for a shape of none.
    """
    refusals: Dict[int, List[Setting]] = {}
    for path, feature in features:
        shape = tf.TensorShape(feature.output_shape)
        if shape.rank is None:
            reason = (
                f"feature {path!r} has no output_shape: TPUEmbeddingV2.__init__ "
                "raises ValueError('Cannot iterate over a shape with unknown "
                "rank.'); give FeatureConfig(output_shape=[batch, ...])"
            )
        elif shape.rank == 0:
            reason = (
                f"feature {path!r} has output_shape [] (no dimension): "
                "TPUEmbeddingV2.__init__ raises TypeError (it multiplies the "
                "dimensions up); give FeatureConfig(output_shape=[batch, ...])"
            )
        elif any(d is None for d in shape.as_list()):
            reason = (
                f"feature {path!r} has output_shape {shape.as_list()} with an "
                "unknown dimension: TPUEmbeddingV2.__init__ raises TypeError "
                "(it adds the dimensions up); give every dimension"
            )
        else:
            continue
        setting = Setting("output_shape", feature.output_shape, "rejected", reason)
        refusals.setdefault(id(feature.table), []).append(setting)
    return refusals


def _with_gradient_warnings(
    report: EngineReport, features: Sequence[Tuple[str, Any]]
) -> EngineReport:
    """Tables whose features cannot go without a gradient on TPUEmbeddingV2.

    TensorFlow 2.21's `TPUEmbeddingV2._stack_gradients` replaces a feature's
    `None` gradient by zeros built at the table's padded width and reshapes
    them to the unpadded one, which raises for a `dim` that is not a multiple
    of 8 (docs/tpu_semantics.md, "SparseCore optimizers").
    """
    warned = {}
    for name, table in named_tables(features):
        if table.dim % 8:
            warned[name] = (
                f"dim {table.dim} is not a multiple of 8: if a step passes None "
                "as the gradient of one of its features, TPUEmbeddingV2 (as of "
                "TensorFlow 2.21) fails reshaping the zeros it sends instead "
                f"(padded to {sparsecore.padded_width(table.dim)} columns); pass "
                "a zero gradient yourself"
            )
    if not warned:
        return report
    tables = tuple(
        dataclasses.replace(r, warnings=r.warnings + (warned[r.table],))
        if r.table in warned
        else r
        for r in report.tables
    )
    return dataclasses.replace(report, tables=tables)


def named_tables(features: Sequence[Tuple[str, Any]]) -> List[Tuple[str, Any]]:
    """The features' tables (`tables_of`), each with the name `TPUEmbedding`
    and `TPUEmbeddingV2` give it (`table_<index>` where it has none)."""
    return [(table_name(t, i), t) for i, t in enumerate(tables_of(features))]


def name_refusals(
    named: Sequence[Tuple[str, Any]], engine: Any
) -> Dict[int, Tuple[Setting, ...]]:
    """Table id -> the refusal of its name, for the `(name, table)` pairs of
    `named_tables` that share a name, on a TensorFlow engine.

    `TPUEmbedding.__init__` and `TPUEmbeddingV2.__init__` (TensorFlow 2.21's
    `tpu_embedding_v2.py`, `tpu_embedding_base.py`) raise `ValueError:
    Tables must have a unique name.` for a name a table before it has, an
    unnamed table's `table_<index>` included.
    """
    if not engine.tensorflow:
        return {}
    return shared_name_refusals(
        named,
        lambda name: (
            f"{engine}.__init__ raises ValueError('Tables must have a "
            f"unique name. Multiple tables with name {name} found.')"
        ),
    )


def with_stacks(
    report: EngineReport,
    features: Sequence[Tuple[str, Any]],
    optimizer: Any,
    num_partitions: int,
    sparse_cores_per_partition: int,
    config: Any,
) -> EngineReport:
    """`report` with `TPUEmbeddingV2`'s stacking of the TensorFlow `features`,
    and its warnings about them."""
    if not report.engine.sparsecore_op or not features:
        return report
    report = _with_gradient_warnings(report, features)
    if not report.runs:
        return report
    stacks: Dict[str, Tuple[str, ...]] = sparsecore.stacks(
        tables_of(features),
        features,
        optimizer,
        num_partitions,
        sparse_cores_per_partition,
        config,
    )
    where = {t: s for s, members in stacks.items() for t in members}
    tables = tuple(
        dataclasses.replace(r, stack=where.get(r.table)) for r in report.tables
    )
    return EngineReport(report.engine, tables, stacks)


def table_report(
    table: Any,
    table_optimizer: Any,
    engine: str,
    name: Optional[str] = None,
    extra: Sequence[Setting] = (),
) -> TableReport:
    """What `engine` does with `table`'s optimizer, with `extra` findings.

    `extra` holds what a converter on the way did (keras-rs's changes and
    refusals); `table_optimizer=None` with no `extra` is refused.
    """
    if name is None and table is not None:
        name = table.name
    if table_optimizer is None and extra:
        return TableReport(name, None, None, (), (), tuple(extra))
    if table_optimizer is None:
        refusal = Setting(
            "optimizer",
            None,
            "rejected",
            "the table has no optimizer and no global optimizer was given",
        )
        return TableReport(name, None, None, (), (), (refusal, *extra))
    report = check_optimizer(table_optimizer, name, engine)
    changed = tuple(s for s in extra if s.verdict == "changed")
    refused = tuple(s for s in extra if s.verdict == "rejected")
    return dataclasses.replace(
        report, dropped=report.dropped + changed, rejected=report.rejected + refused
    )
