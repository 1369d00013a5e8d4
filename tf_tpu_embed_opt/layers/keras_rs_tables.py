"""keras-rs tables off SparseCore, trained row by row with their own optimizers.

keras-rs's `DistributedEmbedding` gives each table placed on the default device
(`placement="default_device"`, or `"auto"` off TPU) a `keras_rs.layers.
EmbedReduce`, a `keras.layers.Embedding`: its whole table is the gradient and
the model's optimizer trains it, whatever the table's `optimizer`.
`row_sparse_tables` swaps each for `EmbedReduce` below, the same layer with this
package's row-sparse lookup (`Embedding`): the table steps in the backward pass
with its own optimizer, on the looked-up rows only, as SparseCore steps it.
With `stack=True` the tables go into one `StackedEmbedding` instead, looked up
and stepped as SparseCore stacks them (one dedup per stack and step), and the
combiner is applied here as keras-rs's `EmbedReduce` applies it.
"""

from __future__ import annotations

import copy
import functools
import inspect
from typing import Any, Dict, List, Mapping, Optional, Sequence

import keras
from keras import ops

from tf_tpu_embed_opt.conversions import preflight_jax
from tf_tpu_embed_opt.layers.embedding import Embedding, table_optimizer
from tf_tpu_embed_opt.layers.stacked import StackedEmbedding
from tf_tpu_embed_opt.optimizers import backend

__all__ = ["row_sparse_tables"]


@functools.lru_cache(maxsize=None)
def embed_reduce_class() -> type:
    """`EmbedReduce`: keras-rs's `EmbedReduce` whose lookup is `Embedding`'s.

    Made on first use, so that keras-rs stays optional.
    """
    import keras_rs

    @keras.saving.register_keras_serializable(package="tf_tpu_embed_opt")
    class EmbedReduce(keras_rs.layers.EmbedReduce, Embedding):
        """keras-rs's `EmbedReduce` (lookup, weights, combiner) with the
        row-sparse lookup of `tf_tpu_embed_opt.layers.Embedding`.

        An entry whose weight is 0 is no lookup: it adds nothing to the output
        (as in keras-rs) and steps no row. keras-rs pads ragged inputs this
        way on JAX, and SparseCore never sees such padding. Where keras-rs
        takes no weights (`mean` and `sqrtn` of one id per example, which
        give the row whatever its weight), every entry is a lookup, as there.
        """

        _absent_ids = True
        _instead_of_a_second_call = (
            "give each feature its own table, or stack the tables "
            "(`row_sparse_tables(..., stack=True)`), which looks each table "
            "up once per step"
        )

        def call(self, inputs: Any, weights: Any = None, training: Any = None):
            _check_dense(inputs, f"tf_tpu_embed_opt EmbedReduce {self.name!r}")
            if weights is not None:
                inputs = _absent_where_weightless(
                    inputs, weights, self.input_dim, self.combiner
                )
            self._training_of_caller = training
            try:
                return keras_rs.layers.EmbedReduce.call(self, inputs, weights)
            finally:
                self._training_of_caller = None

    EmbedReduce.__module__ = __name__
    return EmbedReduce


def _check_dense(inputs: Any, owner: str) -> None:
    if backend.BACKEND == "tensorflow":
        import tensorflow as tf

        # Ragged ids are looked up by their flat values (`Embedding.call`).
        dense = not isinstance(inputs, tf.SparseTensor)
        takes = "dense or ragged ids"
        instead = (
            "On TensorFlow a keras-rs table with sparse inputs is row-sparse "
            "already: train it with tf_tpu_embed_opt.keras_optimizer instead."
        )
    else:
        from jax.experimental import sparse

        dense = not isinstance(inputs, sparse.JAXSparse)
        takes = "dense ids"
        # As keras-rs pads ragged inputs on JAX.
        instead = (
            "Give the ids dense, with weights: an entry whose weight is 0 is no lookup."
        )
    if not dense:
        raise TypeError(
            f"{owner}: the row-sparse lookup takes {takes}; received "
            f"{type(inputs).__name__}. {instead}"
        )


def _weighs(ids: Any, combiner: str) -> bool:
    """Whether keras-rs's `EmbedReduce` applies the weights to these ids: it
    does but for `mean` and `sqrtn` of one id per example (ids of rank 1 or
    less), where it takes ones, so that each example's output is its row."""
    return len(ids.shape) > 1 or combiner == "sum"


def _absent_where_weightless(
    inputs: Any, weights: Any, input_dim: int, combiner: str
) -> Any:
    """`inputs`, with `input_dim` (no lookup) where the weight is 0 and
    keras-rs applies the weights (`_weighs`); as they are where it does not."""
    if not _weighs(inputs, combiner):
        return inputs
    if backend.BACKEND == "tensorflow":
        import tensorflow as tf

        if isinstance(inputs, tf.RaggedTensor):
            return _ragged_absent_where_weightless(inputs, weights, input_dim)
    weights = ops.convert_to_tensor(weights)
    while len(weights.shape) < len(inputs.shape):
        weights = ops.expand_dims(weights, -1)
    weightless = ops.broadcast_to(ops.equal(weights, 0), ops.shape(inputs))
    return ops.where(weightless, ops.cast(input_dim, inputs.dtype), inputs)


def _ragged_absent_where_weightless(inputs: Any, weights: Any, input_dim: int) -> Any:
    """`_absent_where_weightless` of ragged ids (TensorFlow): `weights` ragged
    as the ids, or of lower rank, broadcast to them as keras-rs multiplies
    the rows by them."""
    import tensorflow as tf

    if not isinstance(weights, tf.RaggedTensor):
        weights = tf.convert_to_tensor(weights)
    while weights.shape.rank < inputs.shape.rank:
        weights = tf.expand_dims(weights, -1)
    # Shaped as the ids (TensorFlow broadcasts dense to ragged).
    weightless = tf.logical_and(tf.ones_like(inputs, tf.bool), tf.equal(weights, 0))
    absent = tf.fill(tf.shape(inputs.flat_values), tf.cast(input_dim, inputs.dtype))
    return inputs.with_flat_values(
        tf.where(weightless.flat_values, absent, inputs.flat_values)
    )


class _FeatureStack(StackedEmbedding):
    """The stacks of a keras-rs `DistributedEmbedding`'s default-device
    tables: called with one id array per feature (several features may read
    one table); an id equal to its table's row count is no lookup."""

    _absent_ids = True

    def __init__(self, tables: Any, features: Sequence[int], **kwargs: Any) -> None:
        super().__init__(tables, **kwargs)
        self._features = [int(table) for table in features]

    def _config_tables(self) -> List[Dict[str, Any]]:
        # Each table once; `features` says which each feature reads.
        return [copy.deepcopy(table.config) for table in self._tables]

    def get_config(self) -> Dict[str, Any]:
        return dict(super().get_config(), features=list(self._features))


class _StackedDefaultDevice:
    """keras-rs's default-device methods (build, call, get and set tables)
    over one `_FeatureStack` of its tables."""

    def __init__(
        self,
        stack: _FeatureStack,
        paths: Sequence[str],
        combiners: Mapping[str, str],
        rows: Mapping[str, int],
    ) -> None:
        self.stack = stack
        self.paths = list(paths)
        self.combiners = dict(combiners)
        self.rows = dict(rows)
        self.tables = [name for names in stack.stacks for name in names]

    def build(self, input_shapes: Any) -> None:
        if not self.stack.built:
            self.stack.build()

    def call(
        self, inputs: Mapping[str, Any], weights: Any = None, training: Any = False
    ) -> Dict[str, Any]:
        given, looked_up = [], []
        for path in self.paths:
            _check_dense(inputs[path], f"row_sparse_tables (feature {path!r})")
            feature_ids = ops.convert_to_tensor(inputs[path])
            given.append(feature_ids)
            if weights is not None:
                _check_weights(feature_ids, weights[path], path)
                feature_ids = _absent_where_weightless(
                    feature_ids, weights[path], self.rows[path], self.combiners[path]
                )
            looked_up.append(feature_ids)
        looked = self.stack(looked_up, training=training)
        return {
            path: _combine(
                rows,
                ids,
                None if weights is None else weights[path],
                self.combiners[path],
            )
            for path, ids, rows in zip(self.paths, given, looked)
        }

    def get_embedding_tables(self) -> Dict[str, Any]:
        return {name: self.stack.table(name).value for name in self.tables}

    def set_tables(self, tables: Mapping[str, Any]) -> None:
        for name, values in tables.items():
            if name in self.tables:
                self.stack.set_table(name, {"embeddings": values})


def _check_weights(ids: Any, weights: Any, path: str) -> None:
    """keras-rs's check: `weights` shaped like the leading dims of the ids."""
    shape, given = tuple(ids.shape), tuple(weights.shape)
    if len(given) > len(shape) or any(
        a is not None and b is not None and a != b for a, b in zip(shape, given)
    ):
        raise ValueError(
            f"row_sparse_tables (feature {path!r}): the shape of `weights`, "
            f"{given}, is not compatible with the shape of the ids, {shape}."
        )


def _combine(rows: Any, ids: Any, weights: Any, combiner: str) -> Any:
    """What keras-rs's `EmbedReduce` makes of looked-up `rows`, in its
    operations and order: each row times its weight (ones without weights,
    and for `mean` and `sqrtn` of one id per example), then over the ids of
    an example, the sum, divided for `mean` by the sum of the weights and for
    `sqrtn` by the root of the sum of their squares (0 where that is 0)."""
    rank = len(rows.shape)
    dtype = (
        rows.dtype
        if weights is None
        else keras.backend.result_type(rows.dtype, weights.dtype)
    )
    if weights is None or not _weighs(ids, combiner):
        weights = ops.ones_like(ids, dtype=dtype)
    else:
        weights = ops.cast(weights, dtype)
    if len(weights.shape) < rank:
        weights = ops.expand_dims(weights, axis=tuple(range(len(weights.shape), rank)))
    rows = ops.multiply(rows, weights)
    if rank <= 2:
        return rows
    rows = ops.sum(rows, axis=-2)
    if combiner == "mean":
        return ops.divide_no_nan(rows, ops.sum(weights, axis=-2))
    if combiner == "sqrtn":
        return ops.divide_no_nan(rows, ops.sqrt(ops.sum(ops.square(weights), axis=-2)))
    return rows


def row_sparse_tables(
    embedding: Any, *, engine: Optional[str] = None, stack: bool = False
) -> Any:
    """Trains a keras-rs `DistributedEmbedding`'s default-device tables row by
    row, each with its own optimizer, in the backward pass.

    The one-line change for keras-rs off SparseCore (`placement=
    "default_device"`, or `"auto"` on CPU/GPU), before the layer is built:

    ```python
    embedding = tf_tpu_embed_opt.layers.row_sparse_tables(
        keras_rs.layers.DistributedEmbedding(feature_configs), stack=True)
    ```

    Each such table's `EmbedReduce` becomes this package's `EmbedReduce`: the
    same lookup, weights and combiner, with the lookup of
    `tf_tpu_embed_opt.layers.Embedding`. The table and its slots step only on
    the looked-up rows, duplicates summed, by the engine's lazy rule, and the
    model's optimizer never touches them. The ids come dense, or on
    TensorFlow also ragged (with or without weights: ragged as the ids, or
    one per example). Entries whose weight is 0 (keras-rs's padding of ragged
    inputs on JAX) are no lookup, where keras-rs applies the weights: for
    `mean` and `sqrtn` of one id per example it takes none (the example's
    output is its row), and every entry is a lookup. SparseCore tables are
    left as they are.

    With `stack=True` the tables go into one `StackedEmbedding` (a sublayer
    named `default_device_stacks`): tables of the same width, dtype and
    optimizer settings share a stack, which is looked up and stepped once
    per step, as SparseCore stacks tables (keras-rs's default,
    `table_stacking="auto"`). The step is the same, bit for bit; a model of
    many tables runs faster, most on JAX. Each table keeps its name:
    `get_embedding_tables`, `set_embedding_tables` (JAX), `load_into_keras`
    and `save_tpu_checkpoint` read and write it by name, and
    `embedding.default_device_stacks.get_table(name)` gives its slots.

    Args:
      embedding: A `keras_rs.layers.DistributedEmbedding`, not yet built.
      engine: `None`: each table's own Keras optimizer, through its twin
        (stock `SGD` and `Adagrad`, or a lazy twin; Keras's own `Adam` and
        `Ftrl` step every row and are refused). `"jax-tpu-embedding"`: what
        keras-rs's JAX layer hands SparseCore for it (lazy `Adam` and `FTRL`
        included), so a CPU/GPU run computes what the SparseCore job computes.
      stack: Whether to stack the tables (see above). The variables' paths
        differ between the two forms (`.../<table>/embeddings` against
        `.../default_device_stacks/stack_<k>/embeddings`), so weights saved
        in one form load only into the same form.

    Returns:
      `embedding`, changed in place.

    Raises:
      TypeError: Not a keras-rs `DistributedEmbedding`, this keras-rs keeps
        its default-device layers elsewhere, or `stack` is not a bool.
      ValueError: It is built, has no default-device tables, `engine` is
        unknown, or a table's optimizer cannot run row by row (named).
    """
    if not preflight_jax._is_keras_rs(embedding, "DistributedEmbedding"):
        raise TypeError(
            "row_sparse_tables: argument `embedding` must be a "
            f"keras_rs.layers.DistributedEmbedding; received {embedding!r} of "
            f"type {type(embedding).__name__}."
        )
    if not isinstance(stack, bool):
        raise TypeError(
            "row_sparse_tables: argument `stack` must be True or False; "
            f"received {stack!r} of type {type(stack).__name__}."
        )
    if embedding.built:
        raise ValueError(
            "row_sparse_tables: argument `embedding` is built already; call "
            "it on the DistributedEmbedding before the model uses it."
        )
    if getattr(embedding, "_row_sparse_tables", None) is not None:
        raise ValueError(
            "row_sparse_tables: argument `embedding` has row-sparse tables "
            f"already ({embedding._row_sparse_tables}); call it once."
        )
    placed = getattr(embedding, "_placement_to_path_to_feature_config", None)
    layers = getattr(embedding, "_default_device_embedding_layers", None)
    if placed is None or (layers is None and "default_device" in placed):
        raise TypeError(
            "row_sparse_tables: this keras-rs keeps its default-device tables "
            "in a way this package does not know (tested with keras-rs 0.4)."
        )
    features = placed.get("default_device", {})
    if not features:
        raise ValueError(
            "row_sparse_tables: the DistributedEmbedding has no table on the "
            "default device (tables it places on SparseCore are stepped there)."
        )
    optimizers = preflight_jax.keras_rs_table_optimizers(
        list(features.items()), engine, "row_sparse_tables"
    )
    if not stack:
        _check_unshared(layers, features)
    make = Embedding if stack else embed_reduce_class()
    # Every replacement first, so that a refused table changes nothing.
    replacements: Dict[int, Any] = {}
    for path, old in layers.items():
        if id(old) in replacements:
            continue  # a table shared by several features
        table = features[path].table
        try:
            optimizer = table_optimizer(optimizers[table.name])
        except (TypeError, ValueError) as error:
            hint = (
                ""
                if engine is not None
                else " With engine='jax-tpu-embedding' a table follows what "
                "keras-rs hands SparseCore (lazy Adam and FTRL)."
            )
            raise type(error)(f"Table {table.name!r}: {error}{hint}") from None
        replacements[id(old)] = make(
            name=old.name,
            input_dim=old.input_dim,
            output_dim=old.output_dim,
            embeddings_initializer=old.embeddings_initializer,
            optimizer=optimizer,
            **({} if stack else {"combiner": old.combiner}),
        )
    if stack:
        _stack_tables(embedding, layers, replacements)
    else:
        for path in list(layers):
            # `pop` untracks keras-rs's layer, so it leaves no weights behind.
            layers[path] = replacements[id(layers.pop(path))]
            # TensorFlow's checkpoints follow attributes, not the dict Keras
            # tracks (`Embedding.build`). Keras's saving visits the dict
            # first, so its files keep their paths.
            setattr(embedding, f"_row_sparse_{layers[path].name}", layers[path])
    _become_row_sparse(embedding, {"engine": engine, "stack": stack})
    return embedding


def _become_row_sparse(embedding: Any, options: Dict[str, Any]) -> None:
    """Makes `embedding` a `RowSparseDistributedEmbedding` of `options` (the
    arguments of `row_sparse_tables`), whose config says so, so that a
    `.keras` file rebuilds it row-sparse."""
    object.__setattr__(embedding, "__class__", row_sparse_class(type(embedding)))
    # Keras reads `training`'s default from the signature it kept when the
    # layer was made (`RowSparseDistributedEmbedding.call`).
    embedding._call_signature = inspect.signature(embedding.call)
    embedding._row_sparse_tables = options


# The registered name of a `DistributedEmbedding` that `row_sparse_tables`
# changed (`row_sparse_class`), in this package.
_PACKAGE = "tf_tpu_embed_opt"
_REGISTERED = "RowSparseDistributedEmbedding"


@functools.lru_cache(maxsize=None)
def row_sparse_class(base: type) -> type:
    """`base` (keras-rs's `DistributedEmbedding`) whose config records the
    arguments of `row_sparse_tables`, and which `from_config` rebuilds with
    them: a `.keras` file of a model with such tables loads (with keras-rs's
    config alone Keras would rebuild keras-rs's own tables, with one variable
    each, and refuse the file's table, slots and step counter)."""

    @keras.saving.register_keras_serializable(package=_PACKAGE, name=_REGISTERED)
    class RowSparseDistributedEmbedding(base):
        """keras-rs's `DistributedEmbedding` after
        `tf_tpu_embed_opt.layers.row_sparse_tables`."""

        def call(
            self, inputs: Any, weights: Any = None, training: Optional[bool] = None
        ) -> Any:
            # keras-rs takes `training=False` where a call does not give it,
            # and Keras hands that to the tables: a custom loop that calls
            # the model without `training` would leave them untrained. Not
            # given, it stays None, which the tables refuse to differentiate
            # (`layers/gradients.py`).
            return super().call(inputs, weights, training)

        # Never rematerialized, as its tables (`Embedding.rematerialized_call`).
        rematerialized_call = Embedding.rematerialized_call

        def get_config(self) -> Dict[str, Any]:
            config = super().get_config()
            return {**config, "row_sparse_tables": self._row_sparse_tables}

        @classmethod
        def from_config(cls, config: Dict[str, Any]) -> Any:
            return _rebuilt(base, config)

    RowSparseDistributedEmbedding.__module__ = __name__
    return RowSparseDistributedEmbedding


def _rebuilt(base: type, config: Dict[str, Any]) -> Any:
    """The row-sparse `DistributedEmbedding` of a config that
    `RowSparseDistributedEmbedding.get_config` wrote."""
    config = dict(config)
    options = config.pop("row_sparse_tables")
    return row_sparse_tables(base.from_config(config), **options)


class _RowSparseLoader:
    """What Keras's loader finds under `RowSparseDistributedEmbedding`
    before keras-rs is imported (the package stays light, and keras-rs
    optional): its `from_config` imports keras-rs and rebuilds the layer.
    `row_sparse_class` then registers the layer's own class under the name."""

    @classmethod
    def from_config(cls, config: Dict[str, Any]) -> Any:
        import keras_rs

        return _rebuilt(keras_rs.layers.DistributedEmbedding, config)


keras.saving.get_custom_objects().setdefault(
    f"{_PACKAGE}>{_REGISTERED}", _RowSparseLoader
)


def _check_unshared(layers: Mapping[str, Any], features: Mapping[str, Any]) -> None:
    """Refuses a table read by several features: each would step it apart."""
    readers: Dict[int, List[str]] = {}
    for path, layer in layers.items():
        readers.setdefault(id(layer), []).append(path)
    for paths in readers.values():
        if len(paths) > 1:
            raise ValueError(
                f"row_sparse_tables: table {features[paths[0]].table.name!r} "
                f"is read by the features {paths}; each lookup would step it "
                "apart, from the same rows. Pass stack=True: the stacked "
                "tables are looked up once per step, every feature's ids "
                "together, as SparseCore looks them up."
            )


def _stack_tables(
    embedding: Any, layers: Dict[str, Any], specs: Dict[int, Embedding]
) -> None:
    """Puts the tables `specs` (by keras-rs's layer) into one `_FeatureStack`
    and has `embedding` call it for its default-device features."""
    tables: List[Embedding] = list(specs.values())
    paths = list(layers)
    stack = _FeatureStack(
        tables,
        [tables.index(specs[id(layers[path])]) for path in paths],
        name="default_device_stacks",
    )
    combiners = {path: layers[path].combiner for path in paths}
    rows = {path: layers[path].input_dim for path in paths}
    for path in paths:
        # `pop` untracks keras-rs's layer, so it leaves no weights behind.
        layers.pop(path)
    binding = _StackedDefaultDevice(stack, paths, combiners, rows)
    embedding.default_device_stacks = stack
    embedding._default_device_build = binding.build
    embedding._default_device_call = binding.call
    embedding._default_device_get_embedding_tables = binding.get_embedding_tables
    embedding._default_device_set_tables = binding.set_tables
