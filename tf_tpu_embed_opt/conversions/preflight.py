"""Preflight of any configuration: convert it first, then ask the engine.

`check_engine` reads what the engines (`tf_tpu_embed_opt.engines`) read, the
embedding face's optimizers and TensorFlow's table and feature configs, and
also Keras optimizers (read as `to_embedding` converts them; what it cannot
convert exactly is reported as changed) and keras-rs's `FeatureConfig`s (whose
Keras optimizers are read as keras-rs converts them, each of keras-rs's changes
of the math named). On the `jax-tpu-embedding` engine it reads
jax-tpu-embedding's specs, Keras optimizers and keras-rs's configurations as
keras-rs converts them on Keras's JAX backend (`preflight_jax`), without
TensorFlow.
"""

from __future__ import annotations

from typing import Any, List, Tuple

import keras

from tf_tpu_embed_opt import engines
from tf_tpu_embed_opt.conversions import preflight_jax
from tf_tpu_embed_opt.conversions.preflight_jax import same_value
from tf_tpu_embed_opt.definitions import spec
from tf_tpu_embed_opt.engines import jax_tpu_embedding as jax_engine
from tf_tpu_embed_opt.engines.base import (
    EngineReport,
    Setting,
    definition_or_none,
    refuse_a_global_optimizer,
)
from tf_tpu_embed_opt.errors import require_tensorflow

__all__ = ["check_engine"]


def check_engine(
    obj: Any,
    engine: str = "TPUEmbeddingV2",
    *,
    strict: bool = False,
    optimizer: Any = None,
    num_partitions: int = 1,
    sparse_cores_per_partition: int = 4,
    sparse_core_embedding_config: Any = None,
) -> EngineReport:
    """Preflight: what `engine` does with the optimizers of a configuration.

    Lists, per table, what the engine receives, every setting it would silently
    drop and everything it refuses (weight decay; on `TPUEmbeddingV2` any
    algorithm but SGD, Adagrad, AdagradMomentum, Adam and FTRL; a name two
    tables share, an unnamed table's `table_<index>` included, which
    TensorFlow's engines refuse and keras-rs on JAX merges into one table),
    and for `TPUEmbeddingV2` which tables it stacks into one variable (same
    padded width, equal optimizer hash, same quantization config).

    On `"jax-tpu-embedding"` (keras-rs on Keras's JAX backend) it lists what
    keras-rs's JAX conversion makes of each table's Keras optimizer and every
    way that changes the math (dropped weight decay and clipping, Adagrad's
    epsilon, Keras Adam turned into the engine's lazy Adam with epsilon after
    the bias correction), and the tables keras-rs keeps off SparseCore
    (`placement="default_device"`), which the model's optimizer trains
    instead of the table's; it needs no TensorFlow.

    Args:
      obj: An embedding optimizer (this package's or TensorFlow's), a Keras
        optimizer (read as `to_embedding` converts it; what it cannot convert
        exactly is reported as changed), a
        `tf.tpu.experimental.embedding.TableConfig`, or a nest of
        `FeatureConfig`s (TensorFlow's, or keras-rs's
        `keras_rs.layers.FeatureConfig`, whose Keras optimizers are read as
        keras-rs converts them).
      engine: `"TPUEmbeddingV2"` (SparseCore, the default here),
        `"TPUEmbedding"` or `"jax-tpu-embedding"` (also reads
        jax-tpu-embedding's `OptimizerSpec`s).
      strict: Raise `ValueError` listing every refused setting and every dropped
        one that changes the math, instead of returning the report.
      optimizer: The global optimizer, for tables without one (as the engines'
        `optimizer` argument; for keras-rs's tables, the `DistributedEmbedding`'s
        `optimizer=`, which keras-rs's TensorFlow layer gives a `TableConfig`
        with `optimizer=None`; keras-rs's JAX layer has no `optimizer=` and
        refuses such a table, so on `"jax-tpu-embedding"` it is refused for
        keras-rs's tables). For TensorFlow's configurations an embedding
        optimizer, checked whether a table uses it or not; refused where
        `obj` is itself an optimizer (a jax-tpu-embedding spec too).
      num_partitions: Number of TPU chips (`num_replicas_in_sync`), for
        stacking.
      sparse_cores_per_partition: SparseCores per chip, for stacking.
      sparse_core_embedding_config: The
        `tf.tpu.experimental.embedding.SparseCoreEmbeddingConfig` the engine
        gets (for keras-rs, the one keras-rs builds): its
        `disable_table_stacking`, and `allow_id_dropping=True`, reported per
        table because ids over the per-SparseCore limits then lose their
        gradients. Must be None for `"jax-tpu-embedding"`.

    Returns:
      An `EngineReport`.

    Raises:
      TensorFlowNotInstalled: A TensorFlow engine where TensorFlow is not
        installed.
      ValueError: Bad `engine`; a jax-tpu-embedding spec on a TensorFlow
        engine; keras-rs's features that keras-rs cannot turn
        into TensorFlow's configuration (for example a batch size that
        `num_partitions` does not divide); with `strict=True`, a problem (the
        message lists all of them).
      TypeError: `obj` is none of the above.
    """
    if isinstance(obj, keras.optimizers.Optimizer):
        refuse_a_global_optimizer(obj, optimizer)
    named = spec.engine_named(engine, "check_engine")
    if not named.tensorflow:
        return preflight_jax.check_jax_engine(
            obj,
            strict=strict,
            optimizer=optimizer,
            num_partitions=num_partitions,
            sparse_cores_per_partition=sparse_cores_per_partition,
            sparse_core_embedding_config=sparse_core_embedding_config,
        )
    _check_tensorflow_engine(obj, named)
    engine = engines.check_arguments(
        engine,
        strict,
        num_partitions,
        sparse_cores_per_partition,
        sparse_core_embedding_config,
    )
    config = sparse_core_embedding_config
    if isinstance(obj, keras.optimizers.Optimizer):
        # Converted as for TPUEmbedding; the engine then says what it does.
        converted, changes = preflight_jax.converted_with_changes(
            obj, spec.TPU_EMBEDDING
        )
        report = EngineReport(
            engine, (engines.table_report(None, converted, engine, None, changes),)
        )
        return engines.finish(report, strict, config)
    features = _keras_rs_features(obj)
    if not features:
        return engines.check_configuration(
            obj,
            engine,
            strict=strict,
            optimizer=optimizer,
            num_partitions=num_partitions,
            sparse_cores_per_partition=sparse_cores_per_partition,
            sparse_core_embedding_config=config,
        )
    report = _keras_rs_tables(features, engine, optimizer)
    on_sparsecore = {
        path: f for path, f in features if not preflight_jax.on_default_device(f.table)
    }
    if engine.sparsecore_op and report.runs and on_sparsecore:
        # keras-rs builds TensorFlow's tables from its own configs (those it
        # places on SparseCore, by path); the stacking is decided on those.
        try:
            tf_config, keras_rs_config = (
                _keras_rs_module().keras_to_tf_tpu_configuration(
                    on_sparsecore, "auto", num_partitions
                )
            )
        except ValueError as error:
            # keras-rs would refuse these features when the layer is built:
            # a report that they run, without their stacking, would be wrong.
            raise ValueError(
                "check_engine: keras-rs cannot build TensorFlow's configuration "
                f"of argument `obj` for num_partitions={num_partitions}: {error}"
            ) from None
        if config is None:
            config = keras_rs_config
        report = engines.with_stacks(
            report,
            engines.flatten(tf_config),
            optimizer,
            num_partitions,
            sparse_cores_per_partition,
            config,
        )
    return engines.finish(report, strict, config)


def _keras_rs_tables(
    features: List[Tuple[str, Any]], engine: Any, optimizer: Any
) -> EngineReport:
    """What a TensorFlow engine does with each table of keras-rs `features`."""
    reports = []
    named = engines.named_tables(features)
    # keras-rs hands TensorFlow's layer the tables it places on SparseCore
    # (on a TPU, "auto" is SparseCore; the others are Keras layers).
    placed = [(n, t) for n, t in named if not preflight_jax.on_default_device(t)]
    names = engines.name_refusals(placed, engine)
    for name, table in named:
        if preflight_jax.on_default_device(table):
            reports.append(preflight_jax.default_device_report(table))
            continue
        converted, problems = _keras_rs_table_optimizer(table, engine, optimizer)
        problems = [*problems, *names.get(id(table), ())]
        reports.append(engines.table_report(table, converted, engine, name, problems))
    return EngineReport(engine, tuple(reports))


def _check_tensorflow_engine(obj: Any, engine: spec.Engine) -> None:
    """Refuses a jax-tpu-embedding spec on TensorFlow's `engine`, and that
    engine where TensorFlow is not installed."""
    if jax_engine.is_spec(obj):
        raise ValueError(
            f"check_engine: {type(obj).__name__} is a jax-tpu-embedding spec; it "
            f"runs on engine 'jax-tpu-embedding', not {str(engine)!r}."
        )
    require_tensorflow(
        f"check_engine(..., engine={str(engine)!r}) (engine="
        "'jax-tpu-embedding' runs without it)"
    )


def _keras_rs_features(obj: Any) -> List[Tuple[str, Any]]:
    """The `(path, FeatureConfig)` pairs of a keras-rs nest; [] for anything else.

    A nest that mixes keras-rs's and TensorFlow's feature configs is refused.
    """
    if obj is None or isinstance(obj, (keras.optimizers.Optimizer, str)):
        return []
    try:
        features = engines.flatten(obj)
    except (TypeError, ValueError):
        return []
    keras_rs = [f for _, f in features if _is_keras_rs(f, "FeatureConfig")]
    if not keras_rs:
        return []
    if len(keras_rs) != len(features):
        raise TypeError(
            "check_engine: argument `obj` mixes TensorFlow and keras-rs "
            "FeatureConfigs; pass one kind."
        )
    return features


def _keras_rs_module() -> Any:
    try:
        from keras_rs.src.layers.embedding.tensorflow import config_conversion
    except Exception:  # keras-rs absent or not importable with this Keras.
        return None
    return config_conversion


def _is_keras_rs(obj: Any, name: str) -> bool:
    return any(
        c.__name__ == name and c.__module__.startswith("keras_rs")
        for c in type(obj).__mro__
    )


def _keras_rs_table_optimizer(
    table: Any, engine: str, global_optimizer: Any
) -> Tuple[Any, List[Setting]]:
    """What keras-rs hands TensorFlow for a keras-rs table, and why it differs.

    A table without an optimizer gets, in keras-rs's TensorFlow layer, the
    `DistributedEmbedding`'s `optimizer=` argument: here `global_optimizer`.
    """
    conversion = _keras_rs_module()
    source = table.optimizer if table.optimizer is not None else global_optimizer
    if source is None:
        return None, []  # the engine's refusal: no optimizer, no global one
    if conversion is None:
        raise ValueError(
            "check_engine: reading a keras-rs configuration needs keras-rs's "
            "TensorFlow conversion (keras_rs.src.layers.embedding.tensorflow), "
            "which cannot be imported here."
        )
    try:
        converted = conversion.to_tf_tpu_optimizer(source)
    except ValueError as error:
        return None, [
            Setting(
                "optimizer",
                preflight_jax.shown(source),
                "rejected",
                f"keras-rs refuses it: {error}",
            )
        ]
    if not isinstance(source, keras.optimizers.Optimizer):
        return converted, []
    changed = preflight_jax.keras_rs_change(
        source,
        converted,
        engine,
        _same_optimizer,
        _optimizer_text,
        ". Pass teo.to_embedding(optimizer, engine=...) as the TableConfig "
        "optimizer instead",
    )
    return converted, [] if changed is None else [changed]


def _optimizer_text(opt: Any) -> str:
    """`opt` as its class and arguments (TensorFlow's classes have no repr)."""
    from tf_tpu_embed_opt.embedding import proto

    try:
        return repr(proto.as_embedding_optimizer(opt))
    except (TypeError, ValueError):
        return repr(opt)


def _same_optimizer(a: Any, b: Any) -> bool:
    """Equal settings; floats compared as the float32 the engine computes in."""
    from tf_tpu_embed_opt.embedding import parameters as embedding

    da, db = definition_or_none(a), definition_or_none(b)
    if da is None or da is not db:
        return False
    left, right = embedding.arguments(a), embedding.arguments(b)
    return left.keys() == right.keys() and all(
        same_value(left[k], right[k]) for k in left
    )
