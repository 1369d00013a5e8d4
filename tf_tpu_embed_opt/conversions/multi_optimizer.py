"""A TPU job's per-table optimizers as one Keras optimizer, and back.

A `TPUEmbedding` job has a global embedding optimizer, per-table overrides
(`TableConfig(optimizer=...)`) and a Keras optimizer for the dense layers. On
CPU/GPU the same model needs one Keras optimizer: `keras_optimizer` builds a
`keras.optimizers.MultiOptimizer` that applies each table's twin
(`to_keras(table_optimizer)`) to that table's variable and the dense optimizer
to every other variable. `embedding_optimizers` goes back: the engine
optimizer of each table, converted exactly by `to_embedding` or refused.

keras-rs's tables (a nest of `keras_rs.layers.FeatureConfig`) work the same
way on every Keras backend, TensorFlow not needed: keras-rs trains a table it
keeps off SparseCore (`placement="default_device"`, or `"auto"` where there is
no SparseCore) with the model's optimizer, not the table's; the
`MultiOptimizer` applies each table's own optimizer math to it (or, with
`engine="jax-tpu-embedding"`, what the SparseCore job computes for it).

Older Keras 3 releases have no `MultiOptimizer`; there `keras_optimizer`
raises `ImportError`.

Saving its state (Keras 3.15.1, measured): a `.keras` save restores every
inner optimizer's variables when the loaded model's optimizer has the same
variables (it does for what `keras_optimizer` builds: one twin per table);
`tf.train.Checkpoint(optimizer=multi)` saves only the `MultiOptimizer`'s own
`iterations`, not the inner optimizers' slots — track them too with
`tf.train.Checkpoint(model=model, **checkpoint_objects(multi))`. The
tables with their slots move to and from the TPU layout with
`keras_state.save_tpu_checkpoint` / `keras_state.load_into_keras`.
"""

from __future__ import annotations

import re
from typing import Any, Dict, Mapping, Optional

import keras

from tf_tpu_embed_opt import errors
from tf_tpu_embed_opt.conversions import faces as convert
from tf_tpu_embed_opt.conversions import preflight_jax
from tf_tpu_embed_opt.optimizers import twins

__all__ = [
    "keras_optimizer",
    "embedding_optimizers",
    "table_optimizers",
    "checkpoint_objects",
]


_MULTI = getattr(keras.optimizers, "MultiOptimizer", None)

if _MULTI is not None:

    @keras.saving.register_keras_serializable(package="tf_tpu_embed_opt")
    class TableMultiOptimizer(_MULTI):
        """What `keras_optimizer` returns: a `keras.optimizers.MultiOptimizer`
        that, when built, refuses a table no variable matches, which Keras
        would leave to the default (dense) optimizer without a word, and a
        table several variables match.

        Args:
          optimizer_map, loss_scale_factor, name: As `MultiOptimizer`'s.
          tables: {table name: the pattern of its variable's path, as a key of
            `optimizer_map`} of the tables that must each match a variable
            (keras-rs's tables need not: keras-rs trains those it places on
            SparseCore itself).
        """

        def __init__(
            self,
            optimizer_map: Any,
            loss_scale_factor: Any = None,
            name: Optional[str] = None,
            tables: Optional[Mapping[str, str]] = None,
        ) -> None:
            super().__init__(
                optimizer_map, loss_scale_factor=loss_scale_factor, name=name
            )
            self._tables = dict(tables or {})

        def build(self, var_list: Any) -> None:
            if not self.built:
                _check_matched(self._tables, [v.path for v in var_list])
            super().build(var_list)

        def get_config(self) -> Dict[str, Any]:
            return {**super().get_config(), "tables": dict(self._tables)}


def _check_matched(tables: Mapping[str, str], paths: Any) -> None:
    """Refuses a table whose pattern matches none of `paths`, or several."""
    for table, pattern in tables.items():
        matched = [path for path in paths if re.fullmatch(pattern, path)]
        if len(matched) > 1:
            # Keras names layers uniquely only among siblings: two sub-models
            # may each hold an Embedding named like the table.
            raise ValueError(
                f"keras_optimizer: table {table!r} matches {len(matched)} of "
                f"the variables its optimizer is built on ({matched}), and a "
                "table of the engine is one variable; give keras_optimizer "
                "`variables={table name: layer, variable or path}`."
            )
        if not matched:
            held = [p for p in paths if p.endswith("/embeddings")]
            raise ValueError(
                f"keras_optimizer: table {table!r} matches none of the "
                f"variables its optimizer is built on (it looks for the path "
                f"{pattern!r}), so the default optimizer would train it. The "
                f"variables of Embedding layers: {held}. Name the table's "
                f"Embedding layer {table!r}, or give keras_optimizer "
                "`variables={table name: layer, variable or path}`; leave out "
                "of `tables` a table the model does not train."
            )


def _multi_optimizer() -> Any:
    if getattr(keras.optimizers, "MultiOptimizer", None) is None:
        raise ImportError(
            f"keras.optimizers.MultiOptimizer does not exist in Keras "
            f"{keras.__version__} (TensorFlow 2.21 ships Keras 3.15, which has "
            "it); use `to_keras` per table instead."
        )
    return TableMultiOptimizer


def table_optimizers(
    tables: Any, embedding_optimizer: Optional[Any] = None
) -> Dict[str, Any]:
    """Table name -> engine optimizer, as `TPUEmbedding` resolves them.

    Args:
      tables: A nest of `tf.tpu.experimental.embedding.FeatureConfig` (as
        given to `TPUEmbedding`), a sequence of `TableConfig`, or a mapping
        {table name: embedding optimizer or None}.
      embedding_optimizer: The global optimizer, for tables without their own.

    Raises:
      TypeError: `tables` is none of these.
      ValueError: A table has no optimizer and there is no global one, or two
        different tables share a name.
    """
    import tensorflow as tf

    from tf_tpu_embed_opt.embedding import proto

    TFE = tf.tpu.experimental.embedding
    if embedding_optimizer is not None:
        # Checked whether a table uses it or not, as tpu_embedding_configuration
        # checks its global optimizer.
        embedding_optimizer = proto.as_embedding_optimizer(
            embedding_optimizer, "embedding_optimizer", "keras_optimizer"
        )
    pairs = None
    if isinstance(tables, Mapping) and not any(
        isinstance(v, (TFE.FeatureConfig, TFE.TableConfig)) for v in tables.values()
    ):
        # {table name: embedding optimizer or None}
        for key in tables:
            if not isinstance(key, str):
                raise TypeError(
                    "`tables` as a mapping {table name: embedding optimizer} "
                    f"is keyed by table names (str); received the key {key!r} "
                    f"of type {type(key).__name__}."
                )
        pairs = list(tables.items())
    if pairs is None:
        configs = []
        for item in tf.nest.flatten(tables):
            if isinstance(item, TFE.FeatureConfig):
                item = item.table
            if not isinstance(item, TFE.TableConfig):
                raise TypeError(
                    "`tables` must be a nest of tf.tpu.experimental.embedding."
                    "FeatureConfig or TableConfig, or a mapping {table name: "
                    f"embedding optimizer}}; it holds {item!r} of type "
                    f"{type(item).__name__}."
                )
            if not any(item is c for c in configs):
                configs.append(item)
        names = [c.name for c in configs]
        if None in names:
            raise ValueError(
                "Every TableConfig needs a `name` (TPUEmbedding would invent "
                "'table_<i>' names that a Keras model does not know)."
            )
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"Tables must have unique names; repeated: {duplicates}.")
        pairs = [(c.name, c.optimizer) for c in configs]
    resolved = {}
    for name, optimizer in pairs:
        if optimizer is None:
            optimizer = embedding_optimizer
        if optimizer is None:
            raise ValueError(
                f"Table {name!r} has no optimizer and `embedding_optimizer` "
                "(the global one) is None."
            )
        resolved[name] = proto.as_embedding_optimizer(
            optimizer, f"the optimizer of table {name!r}"
        )
    return resolved


def _variable_path(table: str, target: Any) -> str:
    if isinstance(target, str):
        return target
    if isinstance(target, keras.layers.Embedding):
        if not target.built:
            raise ValueError(
                f"Table {table!r}: the Embedding layer {target.name!r} is not "
                "built; build the model first or give the variable path."
            )
        return target.embeddings.path
    if isinstance(target, keras.Variable):
        return target.path
    raise TypeError(
        f"Table {table!r}: the variable must be given as its path (str), a "
        "keras.Variable or a keras.layers.Embedding; received "
        f"{target!r} of type {type(target).__name__}."
    )


def _paths(names: Any, variables: Optional[Mapping[str, Any]]) -> Dict[str, str]:
    if variables is None:
        # An Embedding layer named like the table keeps it at
        # "<table>/embeddings" after the path of the layers it sits in: none in
        # a functional model, the model's name in a subclassed or Sequential
        # one, keras-rs's DistributedEmbedding for keras-rs's tables.
        return {name: f"(?:.*/)?{re.escape(name)}/embeddings" for name in names}
    if not isinstance(variables, Mapping):
        raise TypeError(
            "`variables` must be a mapping {table name: variable path, "
            f"keras.Variable or keras.layers.Embedding}}; received "
            f"{type(variables).__name__}."
        )
    unknown = sorted(set(variables) - set(names))
    missing = sorted(set(names) - set(variables))
    if unknown or missing:
        raise ValueError(
            f"`variables` must list exactly the tables {sorted(names)}; "
            f"missing {missing}, unknown {unknown}."
        )
    return {name: re.escape(_variable_path(name, variables[name])) for name in names}


def keras_optimizer(
    tables: Any,
    dense_optimizer: Any,
    *,
    embedding_optimizer: Optional[Any] = None,
    variables: Optional[Mapping[str, Any]] = None,
    name: Optional[str] = None,
    engine: Optional[str] = None,
) -> Any:
    """One Keras optimizer for a TPU model: each table's twin, dense elsewhere.

    Example:

    ```python
    optimizer = keras_optimizer(feature_config, keras.optimizers.Adam(),
                                embedding_optimizer=teo.embedding.Adagrad(0.1))
    model.compile(optimizer=optimizer, loss="mse")
    ```

    For keras-rs's tables (a nest of `keras_rs.layers.FeatureConfig`, on any
    Keras backend) each table gets its own optimizer's math: this package's
    twin of a stock `keras.optimizers` class (same arguments, same math,
    duplicate ids summed), or a copy of any other Keras optimizer. With
    `engine="jax-tpu-embedding"` it gets the twin of what keras-rs's JAX
    conversion hands SparseCore instead (`to_keras` of that spec), so that a
    CPU/GPU run computes what the SparseCore job computes.

    Args:
      tables: The `TPUEmbedding` feature config (a nest of `FeatureConfig`),
        `TableConfig`s, a mapping {table name: embedding optimizer}, or a
        nest of `keras_rs.layers.FeatureConfig`.
      dense_optimizer: The Keras optimizer of every other variable.
      embedding_optimizer: The global embedding optimizer, for tables without
        their own (as `TPUEmbedding(feature_config, optimizer)`); not for
        keras-rs's tables, which always have one.
      variables: {table name: variable path, `keras.Variable` or built
        `keras.layers.Embedding`}; by default the variable of the Embedding
        layer named like the table, at any depth (`"<table>/embeddings"`
        after the path of the layers it sits in: none in a functional model,
        the model's name in a subclassed or Sequential one; keras-rs names the
        layer of a table like the table). A table that no variable matches,
        or several do, is refused when the optimizer is built (keras-rs's
        tables excepted, as keras-rs trains those it places on SparseCore
        itself): name the layers like the tables, or give `variables`.
      name: Name of the `MultiOptimizer`.
      engine: keras-rs's tables only: `None` (each table's own optimizer) or
        `"jax-tpu-embedding"` (what keras-rs's SparseCore conversion runs).

    Returns:
      A `keras.optimizers.MultiOptimizer` (`TableMultiOptimizer`) with one
      twin per table (in table order) and `dense_optimizer` as its default.
      When it is built (in the first step), a table of a TensorFlow
      configuration that none of the variables matches is refused (Keras
      would train it with `dense_optimizer`), as is one that several match.

    Raises:
      ImportError: This Keras has no `MultiOptimizer`.
      TensorFlowNotInstalled: TPUEmbedding's tables where TensorFlow is not
        installed.
      TypeError, ValueError: Bad tables, optimizers or variables.
    """
    multi = _multi_optimizer()
    if not isinstance(dense_optimizer, keras.optimizers.Optimizer) or isinstance(
        dense_optimizer, multi
    ):
        raise TypeError(
            "`dense_optimizer` must be a Keras optimizer (not a MultiOptimizer); "
            f"received {dense_optimizer!r} of type {type(dense_optimizer).__name__}"
            f"{errors.tf_keras_note(dense_optimizer)}."
        )
    if twins.unscaled(dense_optimizer) is not dense_optimizer:
        # A MultiOptimizer refuses it when it is built, i.e. in the first step.
        raise TypeError(
            "keras_optimizer: argument `dense_optimizer` is a LossScaleOptimizer, "
            "which a MultiOptimizer cannot hold; give its inner optimizer and "
            "wrap what keras_optimizer returns instead (as `mixed_float16` "
            "compiles it)."
        )
    features = preflight_jax.keras_rs_features(tables, "keras_optimizer")
    if features is not None:
        if embedding_optimizer is not None:
            raise TypeError(
                "keras_optimizer: `embedding_optimizer` is for TPUEmbedding's "
                "configs; keras-rs's tables each have their own optimizer."
            )
        optimizers = preflight_jax.keras_rs_table_optimizers(
            features, engine, "keras_optimizer"
        )
        paths = _paths(list(optimizers), variables)
        checked = {}
    else:
        if engine is not None:
            raise ValueError(
                "keras_optimizer: argument `engine` is for keras-rs's tables; "
                f"received {engine!r} with a TensorFlow configuration (its "
                "twins compute what TPUEmbedding computes)."
            )
        errors.require_tensorflow(
            "keras_optimizer of TPUEmbedding's tables (a feature config, "
            "TableConfigs or {table name: embedding optimizer}; keras-rs's "
            "FeatureConfigs run without it)"
        )
        resolved = table_optimizers(tables, embedding_optimizer)
        optimizers = {t: convert.to_keras(o) for t, o in resolved.items()}
        paths = _paths(list(resolved), variables)
        checked = paths
    repeated = sorted({p for p in paths.values() if list(paths.values()).count(p) > 1})
    if repeated:
        raise ValueError(f"Several tables map to the same variables {repeated}.")
    mapping = {paths[table]: optimizer for table, optimizer in optimizers.items()}
    return multi(
        keras.optimizers.OptimizerMap(dense_optimizer, mapping),
        name=name,
        tables=checked,
    )


def embedding_optimizers(
    optimizer: Any,
    variables: Mapping[str, Any],
    *,
    strict: bool = True,
) -> Dict[str, Any]:
    """The engine optimizer of each table, from a Keras `MultiOptimizer`.

    Each table's Keras optimizer (the one the `MultiOptimizer` applies to its
    variable) goes through `to_embedding`: exact, or refused (`strict=True`)
    naming the setting the engine cannot reproduce. Assign the results to the
    `TableConfig`s: `table.optimizer = result[table.name]`.

    Args:
      optimizer: A `keras.optimizers.MultiOptimizer` (or a single Keras
        optimizer used for every table).
      variables: {table name: variable path, `keras.Variable` or built
        `keras.layers.Embedding`}.
      strict: Passed to `to_embedding`.

    Returns:
      {table name: embedding optimizer}.

    Raises:
      ValueError: A table's Keras optimizer has no exact engine equivalent.
    """
    if not isinstance(variables, Mapping) or not variables:
        raise TypeError(
            "`variables` must be a non-empty mapping {table name: variable "
            f"path, keras.Variable or keras.layers.Embedding}}; received {variables!r}."
        )
    multi = getattr(keras.optimizers, "MultiOptimizer", None)
    result = {}
    for table, target in variables.items():
        path = _variable_path(table, target)
        inner = optimizer
        if multi is not None and isinstance(optimizer, multi):
            mapper = optimizer._optimizer_map
            if isinstance(mapper, keras.optimizers.OptimizerMap):
                inner = mapper[path]
            elif isinstance(target, (str, keras.layers.Embedding)):
                raise TypeError(
                    f"Table {table!r}: this MultiOptimizer chooses by a "
                    "callable, which needs the keras.Variable itself; received "
                    f"{target!r}."
                )
            else:
                inner = mapper(target)
        try:
            result[table] = convert.to_embedding(inner, strict=strict)
        except (TypeError, ValueError) as error:
            raise type(error)(f"Table {table!r} ({path}): {error}") from None
    return result


def checkpoint_objects(optimizer: Any, name: str = "optimizer") -> Dict[str, Any]:
    """Children for `tf.train.Checkpoint` that save a `MultiOptimizer` whole.

    `tf.train.Checkpoint(optimizer=multi)` saves only the `MultiOptimizer`'s
    own variables (Keras 3.15.1 does not track its inner optimizers); this
    adds each inner optimizer as `<name>_<i>`, in the order of
    `multi.optimizers` (the same for a `MultiOptimizer` built the same way).
    The same for a `MultiOptimizer` inside a `LossScaleOptimizer`, as
    `mixed_float16` compiles it (`model.optimizer`).

    Example: `tf.train.Checkpoint(model=model,
    **checkpoint_objects(model.optimizer))`.

    Args:
      optimizer: A Keras optimizer; any other than a `MultiOptimizer` (also
        inside a `LossScaleOptimizer`) is returned as `{name: it}`.
      name: The checkpoint name of the optimizer itself.

    Returns:
      `{name: optimizer, f"{name}_0": inner 0, ...}`.

    Raises:
      TypeError: `optimizer` is no Keras optimizer, or `name` no identifier
        (`tf.train.Checkpoint` takes its children as keyword arguments).
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            "checkpoint_objects: argument `optimizer` must be a Keras optimizer "
            f"(a MultiOptimizer or another); received {optimizer!r} of type "
            f"{type(optimizer).__name__}."
        )
    if not isinstance(name, str) or not name.isidentifier():
        raise TypeError(
            "checkpoint_objects: argument `name` must be an identifier, the "
            f"keyword tf.train.Checkpoint takes it by; received {name!r}."
        )
    objects = {name: optimizer}
    multi = getattr(keras.optimizers, "MultiOptimizer", None)
    unscaled = twins.unscaled(optimizer)
    if multi is not None and isinstance(unscaled, multi):
        for index, inner in enumerate(unscaled.optimizers):
            objects[f"{name}_{index}"] = inner
    return objects
