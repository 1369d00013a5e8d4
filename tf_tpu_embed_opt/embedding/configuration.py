"""The `TPUEmbeddingConfiguration` that `TPUEmbedding` sends to the TPU, on CPU."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from tensorflow.core.protobuf.tpu import tpu_embedding_configuration_pb2
from tensorflow.python.framework.tensor_shape import TensorShape
from tensorflow.python.tpu import tpu_embedding_v2_utils
from tensorflow.python.util import nest

from tf_tpu_embed_opt.embedding import proto

__all__ = ["table_name", "tpu_embedding_configuration"]

TPUEmbeddingConfiguration = tpu_embedding_configuration_pb2.TPUEmbeddingConfiguration


def table_name(table: Any, index: int) -> str:
    """`table`'s name, else the one `TPUEmbedding` and `TPUEmbeddingV2` give
    the `index`-th of their tables (in order of first appearance) when it has
    none: `table_<index>` (TensorFlow's `tpu_embedding_base.py`)."""
    return table.name if table.name is not None else f"table_{index}"


def _check_count(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"tpu_embedding_configuration: argument `{name}` must be an int >= "
            f"{minimum}; received {value!r} of type {type(value).__name__}."
        )
    if value < minimum:
        raise ValueError(
            f"tpu_embedding_configuration: argument `{name}` must be an int >= "
            f"{minimum}; received {value!r}."
        )


def _place(path: Tuple[Any, ...]) -> str:
    """Where `path` (`nest.flatten_with_tuple_paths`'s) leads in
    `feature_config`: `feature_config['items'][0]`."""
    return "feature_config" + "".join(f"[{key!r}]" for key in path)


def _feature_labels(
    places: List[Tuple[Any, ...]], features: List[Any], table_names: Dict[int, str]
) -> List[str]:
    """How errors name each feature (at its path in `places`): by its name,
    else by its place, with its table's name (the one `TPUEmbedding` gives
    an unnamed table)."""
    return [
        (
            f"feature {feature.name!r}"
            if feature.name
            else f"the feature at {_place(path)}"
        )
        + f" (table {table_names[id(feature.table)]!r})"
        for path, feature in zip(places, features)
    ]


def _output_shapes(
    features: List[Any], labels: List[str], per_replica_input_shapes: Optional[Any]
) -> List[TensorShape]:
    """Output shapes as `TPUEmbedding` derives them (`build`); `labels` name
    the features in errors."""
    if per_replica_input_shapes is None:
        shapes = [feature.output_shape for feature in features]
    else:
        inputs = nest.flatten(
            per_replica_input_shapes,
            expand_composites=False,
        )
        if len(inputs) != len(features):
            raise ValueError(
                "tpu_embedding_configuration: `per_replica_input_shapes` must "
                f"have one shape per feature ({len(features)}); received "
                f"{len(inputs)}."
            )
        shapes = []
        for feature, label, raw in zip(features, labels, inputs):
            shape = TensorShape(raw)
            if shape.rank is None or shape.rank < 1:
                raise ValueError(
                    "tpu_embedding_configuration: each input shape must have "
                    f"rank >= 1; received {shape} for {label}."
                )
            if (
                shape.rank == 2
                and shape[-1] != 1
                and not feature.output_shape
                and feature.max_sequence_length > 0
            ):
                dims = shape.as_list()
                dims.insert(len(dims) - 1, feature.max_sequence_length)
                shape = TensorShape(dims)
            output = shape if shape.rank == 1 else shape[:-1]
            if feature.output_shape.rank is not None and not (
                feature.output_shape.is_compatible_with(output)
            ):
                raise ValueError(
                    "tpu_embedding_configuration: input shape "
                    f"{TensorShape(raw)} gives output shape {output} for "
                    f"{label}, which conflicts with its configured "
                    f"output_shape {feature.output_shape}."
                )
            shapes.append(output)
    for label, shape in zip(labels, shapes):
        if not shape.is_fully_defined() or shape.rank == 0:
            raise ValueError(
                f"tpu_embedding_configuration: the output shape of {label} is "
                "not known; set FeatureConfig(output_shape=...) or pass "
                "`per_replica_input_shapes`."
            )
    return shapes


def tpu_embedding_configuration(
    feature_config: Any,
    optimizer: Optional[Any] = None,
    *,
    num_hosts: int = 1,
    num_tensor_cores: int = 1,
    num_cores_per_replica: Optional[int] = None,
    pipeline_execution_with_tensor_core: bool = False,
    per_replica_input_shapes: Optional[Any] = None,
) -> TPUEmbeddingConfiguration:
    """Builds the configuration `TPUEmbedding` would send to the TPU.

    Follows `TPUEmbedding.__init__` and `_create_config_proto` (TensorFlow
    2.21): tables in order of first appearance in the flattened
    `feature_config`; a table without optimizer gets `optimizer`; unnamed tables
    are called `table_{i}`; distinct callable learning rates get dynamic tags in
    table order; `vocabulary_size` is at least `num_hosts`. Nothing is mutated:
    the inputs keep their unset names and optimizers. Optimizers may be this
    package's classes or TensorFlow's own (which cannot write their protos under
    protobuf >= 7.34 themselves).

    Args:
      feature_config: A nested structure of
        `tf.tpu.experimental.embedding.FeatureConfig`.
      optimizer: The global embedding optimizer for tables without their own.
      num_hosts: Number of TPU hosts.
      num_tensor_cores: Number of TensorCores: replicas × cores per replica.
      num_cores_per_replica: With model parallelism, the cores per replica; sets
        `spmd_sharding`. Must divide `num_tensor_cores`.
      pipeline_execution_with_tensor_core: As the `TPUEmbedding` argument.
      per_replica_input_shapes: Input shapes per feature (same structure as
        `feature_config`) when `FeatureConfig.output_shape` is not set.

    Returns:
      A `tensorflow.tpu.TPUEmbeddingConfiguration`.

    Raises:
      TypeError: A feature is not a `FeatureConfig`, an optimizer is not an
        embedding optimizer, or a count is not an int.
      ValueError: Duplicate table names, a table without optimizer, unknown
        output shapes, or inconsistent counts.
    """
    _check_counts(num_hosts, num_tensor_cores, num_cores_per_replica)
    if not isinstance(pipeline_execution_with_tensor_core, bool):
        raise TypeError(
            "tpu_embedding_configuration: argument "
            "`pipeline_execution_with_tensor_core` must be True or False; "
            f"received {pipeline_execution_with_tensor_core!r}."
        )
    places, features = _features(feature_config)
    if optimizer is not None:
        optimizer = proto.as_embedding_optimizer(
            optimizer, "optimizer", "tpu_embedding_configuration"
        )
    tables, names, optimizers = _tables(features, optimizer)

    # TensorFlow collects callables with `in` (equality) and indexes them with a
    # dict; the same operations here give the same tags.
    dynamic: List[Any] = []
    for opt in optimizers:
        if callable(opt.learning_rate) and opt.learning_rate not in dynamic:
            dynamic.append(opt.learning_rate)
    tags: Dict[Any, int] = {rate: i for i, rate in enumerate(dynamic)}

    config = TPUEmbeddingConfiguration()
    for table, name, opt in zip(tables, names, optimizers):
        descriptor = config.table_descriptor.add()
        descriptor.name = name
        descriptor.vocabulary_size = max(table.vocabulary_size, num_hosts)
        descriptor.dimension = table.dim
        tag = tags[opt.learning_rate] if callable(opt.learning_rate) else None
        descriptor.optimization_parameters.CopyFrom(
            proto.to_proto(opt, learning_rate_tag=tag)
        )
        if table.quantization_config:
            table.quantization_config._set_optimization_parameters(
                descriptor.optimization_parameters
            )

    table_ids = {id(table): i for i, table in enumerate(tables)}
    labels = _feature_labels(
        places, features, {id(table): name for table, name in zip(tables, names)}
    )
    for feature, shape in zip(
        features, _output_shapes(features, labels, per_replica_input_shapes)
    ):
        descriptor = config.feature_descriptor.add()
        if feature.name:
            descriptor.name = feature.name
        descriptor.table_id = table_ids[id(feature.table)]
        descriptor.input_shape.extend(shape.as_list())

    config.mode = TPUEmbeddingConfiguration.TRAINING
    config.num_hosts = num_hosts
    config.num_tensor_cores = num_tensor_cores
    config.sharding_strategy = TPUEmbeddingConfiguration.DIV_DEFAULT
    config.pipeline_execution_with_tensor_core = pipeline_execution_with_tensor_core
    if num_cores_per_replica:
        config.spmd_sharding.enabled = True
        config.spmd_sharding.num_cores_per_replica = num_cores_per_replica
    return config


def _check_counts(
    num_hosts: Any, num_tensor_cores: Any, num_cores_per_replica: Any
) -> None:
    _check_count("num_hosts", num_hosts, 1)
    _check_count("num_tensor_cores", num_tensor_cores, 1)
    if num_cores_per_replica is not None:
        _check_count("num_cores_per_replica", num_cores_per_replica, 1)
        if num_tensor_cores % num_cores_per_replica:
            raise ValueError(
                "tpu_embedding_configuration: `num_tensor_cores` "
                f"({num_tensor_cores}) must be a multiple of "
                f"`num_cores_per_replica` ({num_cores_per_replica})."
            )


def _features(feature_config: Any) -> Tuple[List[Tuple[Any, ...]], List[Any]]:
    """The paths and `FeatureConfig`s of `feature_config`, flattened (in
    `nest.flatten`'s order), checked."""
    pairs = nest.flatten_with_tuple_paths(feature_config)
    if not pairs:
        raise ValueError(
            "tpu_embedding_configuration: `feature_config` has no features."
        )
    for path, feature in pairs:
        if not isinstance(feature, tpu_embedding_v2_utils.FeatureConfig):
            raise TypeError(
                "tpu_embedding_configuration: `feature_config` must hold "
                "tf.tpu.experimental.embedding.FeatureConfig objects; received "
                f"{feature!r} of type {type(feature).__name__}"
                + (f" at {_place(path)}." if path else ".")
            )
    return [path for path, _ in pairs], [feature for _, feature in pairs]


def _tables(
    features: List[Any], optimizer: Any
) -> Tuple[List[Any], List[str], List[Any]]:
    """(tables in order of first appearance, their names, their optimizers:
    their own, else `optimizer`), as `TPUEmbedding.__init__` orders and names
    them."""
    tables: List[Any] = []
    for feature in features:
        if feature.table not in tables:
            tables.append(feature.table)
    names: List[str] = []
    optimizers: List[Any] = []
    for index, table in enumerate(tables):
        name = table_name(table, index)
        if name in names:
            raise ValueError(
                "tpu_embedding_configuration: tables must have unique names; "
                f"found two named {name!r}."
            )
        names.append(name)
        table_optimizer = table.optimizer if table.optimizer is not None else optimizer
        if table_optimizer is None:
            raise ValueError(
                f"tpu_embedding_configuration: table {name!r} has no optimizer "
                "and no global `optimizer` was given."
            )
        optimizers.append(
            proto.as_embedding_optimizer(
                table_optimizer,
                f"the optimizer of table {name!r}",
                "tpu_embedding_configuration",
            )
        )
    return tables, names, optimizers
