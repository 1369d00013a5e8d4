"""Preflight on the `jax-tpu-embedding` engine: keras-rs on Keras's JAX backend.

keras-rs's `DistributedEmbedding` on JAX converts each table's Keras
optimizer with `keras_rs.src.layers.embedding.jax.config_conversion.
keras_to_jte_optimizer`, a mapping by name (measured with keras-rs 0.4.0):
it drops Keras's `weight_decay` and `clipvalue`, keeps only Adagrad's default
epsilon and drops it, and turns Keras's dense Adam into the engine's lazy Adam
with epsilon after the bias correction. Tables with
`placement="default_device"` become plain embedding layers, trained by the
model's optimizer: the table's optimizer is not used at all. Here each
table's conversion by keras-rs is compared with the exact one
(`to_embedding(..., engine="jax-tpu-embedding")`) and every difference named,
before any TPU time is spent. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import warnings
from typing import Any, Dict, List, Optional, Tuple

import keras
import numpy as np

from tf_tpu_embed_opt.conversions import faces as convert
from tf_tpu_embed_opt.conversions import keras_reading
from tf_tpu_embed_opt.definitions import spec
from tf_tpu_embed_opt.engines import jax_tpu_embedding as jax_engine
from tf_tpu_embed_opt.engines.base import (
    EngineReport,
    Setting,
    TableReport,
    check_preflight_arguments,
    refuse_a_global_optimizer,
    shared_name_refusals,
    tables_of,
)
from tf_tpu_embed_opt.optimizers.twins import twin_of_stock

__all__ = [
    "check_jax_engine",
    "conversion_module",
    "converted_with_changes",
    "default_device_report",
    "on_default_device",
    "keras_rs_change",
    "keras_rs_features",
    "bare_message",
    "same_value",
    "shown",
]

ENGINE = spec.JAX_ENGINE


def check_jax_engine(
    obj: Any,
    *,
    strict: bool = False,
    optimizer: Any = None,
    num_partitions: int = 1,
    sparse_cores_per_partition: int = 4,
    sparse_core_embedding_config: Any = None,
) -> EngineReport:
    """`tf_tpu_embed_opt.check_engine(obj, "jax-tpu-embedding", ...)`."""
    _check_arguments(
        strict, num_partitions, sparse_cores_per_partition, sparse_core_embedding_config
    )
    if jax_engine.is_spec(obj):
        refuse_a_global_optimizer(obj, optimizer)
        report = EngineReport(ENGINE, (jax_engine.check_optimizer(obj, None),))
    elif isinstance(obj, keras.optimizers.Optimizer):
        report = EngineReport(ENGINE, (_keras_optimizer_table(obj, None),))
    else:
        features = keras_rs_features(obj, "check_engine")
        if features is None:
            report = _embedding_face(obj, optimizer)
        else:
            if optimizer is not None:
                raise ValueError(
                    "check_engine: argument `optimizer` stands for the "
                    "DistributedEmbedding's `optimizer=`, which only keras-rs's "
                    "TensorFlow layer has; keras-rs's JAX layer takes none "
                    "(each TableConfig needs its own), so on 'jax-tpu-embedding' "
                    f"it must be None; received {optimizer!r}."
                )
            tables = tables_of(features)
            names = _name_refusals(tables)
            report = EngineReport(
                ENGINE,
                tuple(
                    _with(_keras_rs_table(t), rejected=names.get(id(t), ()))
                    for t in tables
                ),
            )
    if strict and report.problems():
        raise ValueError(
            "check_engine: jax-tpu-embedding would not compute the configured "
            "math: " + "; ".join(report.problems()) + "."
        )
    return report


def _check_arguments(
    strict: Any, num_partitions: Any, sparse_cores_per_partition: Any, config: Any
) -> None:
    check_preflight_arguments(strict, num_partitions, sparse_cores_per_partition)
    if config is not None:
        raise TypeError(
            "check_engine: argument `sparse_core_embedding_config` is "
            "TensorFlow's (TPUEmbeddingV2) and must be None for engine "
            f"'jax-tpu-embedding'; received {config!r}."
        )


def keras_rs_features(obj: Any, owner: str) -> Any:
    """The `(path, FeatureConfig)` pairs of a keras-rs nest; None for anything else.

    Read with `keras.tree`, so that no TensorFlow is needed; a nest that mixes
    keras-rs's and other configs is refused.
    """
    if obj is None or isinstance(obj, (keras.optimizers.Optimizer, str)):
        return None
    try:
        features = keras.tree.flatten_with_path(obj)
    except (TypeError, ValueError):
        return None
    ours = [f for _, f in features if _is_keras_rs(f, "FeatureConfig")]
    if not ours:
        return None
    if len(ours) != len(features):
        raise TypeError(
            f"{owner}: the configuration mixes keras-rs FeatureConfigs with "
            "other objects; pass a nest of keras_rs.layers.FeatureConfig."
        )
    return features


def _is_keras_rs(obj: Any, name: str) -> bool:
    return any(
        c.__name__ == name and c.__module__.startswith("keras_rs")
        for c in type(obj).__mro__
    )


def _embedding_face(obj: Any, optimizer: Any) -> EngineReport:
    """Embedding optimizers of the TensorFlow engines, and their configs."""
    if importlib.util.find_spec("tensorflow") is None:
        raise TypeError(
            "check_engine: argument `obj` must be a jax-tpu-embedding "
            "OptimizerSpec, a Keras optimizer or a nest of "
            "keras_rs.layers.FeatureConfig (TensorFlow's embedding classes need "
            f"TensorFlow, which is not installed); received {obj!r}."
        )
    from tf_tpu_embed_opt.engines import checks

    return checks.check_configuration(obj, ENGINE, optimizer=optimizer)


def shown(optimizer: Any) -> Any:
    """A keras-rs table's optimizer as a report shows it: a Keras optimizer
    by its class name, as the reports name every Keras optimizer (its repr
    is an address), anything else as given."""
    if isinstance(optimizer, keras.optimizers.Optimizer):
        return type(optimizer).__name__
    return optimizer


def converted_with_changes(keras_opt: Any, engine: str) -> Tuple[Any, List[Setting]]:
    """`to_embedding(keras_opt, engine=engine)`, and what converting it changes.

    `(None, [the refusal])` where it cannot convert at all; otherwise the
    optimizer `strict=False` gives and one "changed" setting per warning.
    """
    name = type(keras_opt).__name__
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            converted = convert.to_embedding(keras_opt, strict=False, engine=engine)
        except (TypeError, ValueError) as error:
            refusal = Setting("optimizer", name, "rejected", bare_message(str(error)))
            return None, [refusal]
    changes = [
        Setting("optimizer", name, "changed", bare_message(str(w.message)))
        for w in caught
        if issubclass(w.category, UserWarning)
    ]
    return converted, changes


def _keras_optimizer_table(keras_opt: Any, table: Any) -> TableReport:
    """The exact spec of a Keras optimizer, and what converting it changes."""
    converted, changes = converted_with_changes(keras_opt, ENGINE)
    if converted is None:
        return TableReport(table, None, None, (), (), tuple(changes))
    report = jax_engine.check_optimizer(converted, table)
    return _with(report, dropped=tuple(changes))


def _with(report: TableReport, **extra: Any) -> TableReport:
    return dataclasses.replace(
        report,
        **{key: getattr(report, key) + tuple(value) for key, value in extra.items()},
    )


def conversion_module(owner: str = "check_engine") -> Any:
    """keras-rs's JAX conversion (`keras_to_jte_optimizer`), or a ValueError."""
    try:
        return importlib.import_module(
            "keras_rs.src.layers.embedding.jax.config_conversion"
        )
    except ImportError as error:
        raise ValueError(
            f"{owner}: reading a keras-rs configuration for engine "
            "'jax-tpu-embedding' needs keras-rs's JAX conversion (keras-rs "
            "with jax-tpu-embedding; the `[jax]` extra, `pip install '.[jax]'` "
            "from a checkout), "
            f"which cannot be imported here: {error}"
        ) from error


def _name_refusals(tables: List[Any]) -> Dict[int, Tuple[Setting, ...]]:
    """The keras-rs tables on SparseCore that share a name, refused: keras-rs's
    JAX conversion (`_keras_to_jte_feature_config`, keras-rs 0.4) keeps one
    table spec per name, the first a feature reaches, and points every
    feature of that name's tables at it. Tables on `"default_device"` are
    embedding layers of their own."""
    placed = [(t.name, t) for t in tables if not on_default_device(t)]
    return shared_name_refusals(
        placed,
        lambda name: (
            "keras-rs's JAX conversion makes one table of those named "
            f"{name!r}, the first a feature reaches, and every feature of theirs "
            "looks up and trains that one"
        ),
    )


def on_default_device(table: Any) -> bool:
    """Whether keras-rs keeps the keras-rs `table` off SparseCore on every
    device (`placement="default_device"`): a Keras embedding layer of its
    own, never handed to a TPU engine."""
    return table.placement == "default_device"


def default_device_report(table: Any) -> TableReport:
    """The report of a keras-rs table on `placement="default_device"`, on
    every engine: keras-rs (on either backend) builds a Keras embedding
    layer for it, which the model's optimizer trains; the table's optimizer
    is never read."""
    source, what = table.optimizer, "optimizer (None)"
    if isinstance(source, str):
        what = f"optimizer {source!r}"  # never read: not even resolved
    elif source is not None:
        what = type(source).__name__
    reason = (
        "keras-rs builds a plain embedding layer for this table, which the "
        f"model's optimizer trains; the table's {what} is not used. "
        "Train it with teo.layers.row_sparse_tables(distributed_embedding) "
        "(row by row, the table's optimizer) or teo.keras_optimizer("
        "feature_configs, dense_optimizer)"
    )
    setting = Setting("placement", "default_device", "changed", reason)
    return TableReport(table.name, source, None, (), (setting,), ())


def _keras_rs_table(table: Any) -> TableReport:
    """What keras-rs on JAX makes of one table, and why it differs."""
    source = table.optimizer
    if source is None:
        reason = (
            "keras-rs's JAX layer cannot train a table without an optimizer "
            "(its conversion fails on None; only its TensorFlow layer falls "
            "back to the DistributedEmbedding's `optimizer=`); give the "
            "TableConfig its optimizer"
        )
        refusal = Setting("optimizer", None, "rejected", reason)
        return TableReport(table.name, None, None, (), (), (refusal,))
    if on_default_device(table):
        return default_device_report(table)
    warnings_ = ()
    if table.placement == "auto":
        warnings_ = (
            "placement='auto': where keras-rs finds no SparseCore (CPU, GPU, "
            "TPUs without SparseCore) it trains this table with the model's "
            "optimizer instead of the table's; teo.layers.row_sparse_tables("
            "distributed_embedding) or teo.keras_optimizer(feature_configs, "
            "dense_optimizer) keeps the table's there",
        )
    conversion = conversion_module()
    try:
        converted = conversion.keras_to_jte_optimizer(table.optimizer)
    except (ValueError, AttributeError) as error:
        reason = f"keras-rs refuses it: {error}"
        if isinstance(error, AttributeError):
            # keras_to_jte_optimizer reads Keras's `_learning_rate` first.
            reason = (
                f"keras-rs's JAX layer fails on it ({type(source).__name__} is "
                f"no Keras optimizer; AttributeError: {error}); give the "
                "TableConfig a Keras optimizer (keras-rs converts SGD, "
                "Adagrad, Adam and Ftrl)"
            )
        refusal = Setting("optimizer", shown(source), "rejected", reason)
        return TableReport(
            table.name, None, None, (), (), (refusal,), warnings=warnings_
        )
    if isinstance(source, str):
        source = keras.optimizers.get(source)  # as keras-rs did
    report = jax_engine.check_optimizer(converted, table.name)
    warnings_ = warnings_ + _float32_step_warning(converted)
    if not isinstance(source, keras.optimizers.Optimizer):
        return _with(report, warnings=warnings_)
    changed = keras_rs_change(source, converted, ENGINE, _same_spec, _spec_text)
    if changed is None:
        return _with(report, warnings=warnings_ + _negligible_drops(source))
    return _with(report, dropped=(changed,), warnings=warnings_)


def keras_rs_change(
    source: Any, converted: Any, engine: str, same: Any, text: Any, advice: str = ""
) -> Any:
    """None if keras-rs's `converted` is the exact conversion of `source`;
    else the "changed" setting naming what keras-rs changes.

    Args:
      source: The table's Keras optimizer.
      converted: What keras-rs's conversion made of it.
      engine: The engine keras-rs hands it to.
      same: Whether two engine optimizers compute the same.
      text: An engine optimizer as text.
      advice: What to do instead, appended to the reason.
    """
    try:
        exact = convert.to_embedding(source, engine=engine)
    except (TypeError, ValueError) as error:
        exact, why = None, bare_message(str(error))
        nearest = _nearest(source, engine)
        if nearest is not None:
            why += f" (the nearest: {text(nearest)})"
    else:
        why = ""
    if exact is not None and same(exact, converted):
        return None
    reason = (
        f"keras-rs maps keras.optimizers.{type(source).__name__} by name to "
        f"{text(converted)}, which computes different math"
        + (
            f"; it has no exact {engine} equivalent: {why}"
            if why
            else f"; the exact conversion is {text(exact)}"
        )
        + advice
    )
    return Setting("optimizer", type(source).__name__, "changed", reason)


def _nearest(source: Any, engine: str) -> Any:
    """What `to_embedding(..., strict=False)` makes of `source` (the settings
    it cannot reproduce left out), or None."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return convert.to_embedding(source, engine=engine, strict=False)
    except (TypeError, ValueError):
        return None


# keras-rs's JAX layer counts steps in a float32 weight, which stops at 2**24.
_FLOAT32_STEP_LIMIT = 2**24


def _float32_step_warning(converted: Any) -> Tuple[str, ...]:
    """Where the spec's math reads the step: keras-rs's counter is float32."""
    uses = []
    if callable(converted.learning_rate):
        uses.append("the learning-rate schedule")
    definition = jax_engine.definition_of_spec(converted)
    if definition is not None and definition.step_hypers is not None:
        uses.append(f"{definition.name}'s step terms")
    if not uses:
        return ()
    return (
        "keras-rs's JAX DistributedEmbedding counts steps in a float32 weight "
        "(`iteration` in keras_rs/src/layers/embedding/jax/"
        "distributed_embedding.py; the backward pass returns step + 1): from "
        f"step 2**24 = {_FLOAT32_STEP_LIMIT:,} on it stops advancing, and with "
        f"it {' and '.join(uses)}, while Keras's `iterations` keeps counting",
    )


def _negligible_drops(source: Any) -> Tuple[str, ...]:
    """keras-rs's drops that the exact conversion shows to be negligible (as
    the definitions bound them)."""
    return tuple(
        f"keras-rs drops {type(source).__name__}'s {argument.name}={value!r}: "
        f"{argument.engine_lacks}, as it is here"
        for argument, value in keras_reading.negligible_settings(source)
    )


def _spec_text(jax_spec: Any) -> str:
    definition = jax_engine.definition_of_spec(jax_spec)
    if definition is None:
        return repr(jax_spec)
    fields = ", ".join(
        f"{field}={getattr(jax_spec, field)!r}"
        for field in ("learning_rate", *definition.jax.fields.values())
    )
    return f"{type(jax_spec).__name__}({fields})"


def _same_spec(a: Any, b: Any) -> bool:
    definition = jax_engine.definition_of_spec(a)
    if definition is None or type(a) is not type(b):
        return False
    fields = ("learning_rate", *definition.jax.fields.values())
    return all(same_value(getattr(a, f), getattr(b, f)) for f in fields)


def bare_message(message: str) -> str:
    """A conversion error without its function prefix and strict=False hint."""
    message = (
        message.split(": ", 1)[1] if message.startswith("to_embedding: ") else message
    )
    for hint in (" Pass strict=False", " Converted without them"):
        message = message.split(hint)[0]
    return message.rstrip(".")


def same_value(a: Any, b: Any) -> bool:
    """Equal settings, floats compared as the float32 the engines compute in."""
    if callable(a) and callable(b) and a is not b:
        # keras-rs wraps a Keras schedule in its own callable of the same
        # optimizer's iterations; the exact conversion may add Adam's bias
        # correction. Their values now tell the two apart.
        try:
            return np.float32(a()) == np.float32(b())
        except Exception:  # noqa: BLE001 - a callable that needs a TPU context
            return False
    # keras-rs reads a Keras float learning rate back from its float32
    # variable (0.10000000149011612 for 0.1): the same value on the TPU.
    if isinstance(a, float) and isinstance(b, float):
        return np.float32(a) == np.float32(b)
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    return a == b


def keras_rs_table_optimizers(
    features: Any, engine: Optional[str], owner: str
) -> Dict[str, Any]:
    """Table name -> a fresh Keras optimizer with the math of each keras-rs
    table's optimizer, in order: its twin (or a copy) with `engine=None`,
    the twin of what keras-rs hands SparseCore with `"jax-tpu-embedding"`.
    """
    if engine not in (None, spec.JAX_ENGINE):
        raise ValueError(
            f"{owner}: argument `engine` must be None or "
            f"'jax-tpu-embedding' for keras-rs's tables; received {engine!r}."
        )
    tables: Dict[str, Any] = {}
    for _, feature in features:
        table = feature.table
        if table.name in tables and tables[table.name] is not table:
            raise ValueError(
                f"Tables must have unique names; repeated: [{table.name!r}]."
            )
        tables[table.name] = table
    result = {}
    for table_name, table in tables.items():
        try:
            result[table_name] = _table_optimizer(table.optimizer, engine, owner)
        except (TypeError, ValueError) as error:
            raise type(error)(f"Table {table_name!r}: {error}") from None
    return result


def _table_optimizer(optimizer: Any, engine: Optional[str], owner: str) -> Any:
    """A fresh Keras optimizer with the math of a keras-rs table's optimizer."""
    if isinstance(optimizer, str):
        optimizer = keras.optimizers.get(optimizer)
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        # keras-rs's own conversion fails on it with AttributeError.
        raise TypeError(
            "a keras-rs table's optimizer must be a Keras optimizer or its "
            f"name; received {optimizer!r} of type {type(optimizer).__name__}."
        )
    if engine is not None:
        conversion = conversion_module(owner)
        try:
            converted = conversion.keras_to_jte_optimizer(optimizer)
        except ValueError as error:
            raise ValueError(f"keras-rs refuses it: {error}") from None
        return convert.to_keras(converted)
    twin = twin_of_stock(optimizer)
    if twin is not None:
        return twin
    return type(optimizer).from_config(optimizer.get_config())
