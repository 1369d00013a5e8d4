"""Which TPU embedding engine runs a table, and what it does with the optimizer.

Two engines train embedding tables on TPUs, named as users know them:

- `"TPUEmbedding"` (the default): `tf.tpu.experimental.embedding.TPUEmbedding`,
  the TensorCore-era engine; it receives the whole `OptimizationParameters`
  proto of every optimizer of this package.
- `"TPUEmbeddingV2"`: SparseCore minibatching (TPU v5p, v6e and later),
  `tf.tpu.experimental.embedding.TPUEmbeddingV2` and keras-rs's
  `DistributedEmbedding` on TensorFlow. Its `apply_gradients` dispatches with
  `isinstance` on TensorFlow's SGD, Adagrad, AdagradMomentum, Adam and FTRL
  and hands the SparseCore op only some of the optimizer's settings; the rest
  are dropped without a word, weight decay is refused when the object is built
  and every other optimizer fails at the first step
  (docs/tpu_semantics.md, "SparseCore optimizers").

`check_engine` lists, per table, what the engine receives, drops and refuses,
and which tables `TPUEmbeddingV2` stacks into one variable.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import math
import warnings
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
from tensorflow.python.tpu import tpu_embedding_v2_utils

from tf_tpu_embed_opt.definitions import registry, spec
from tf_tpu_embed_opt.embedding import parameters as embedding

__all__ = [
    "ENGINES",
    "SPARSECORE_OPTIMIZERS",
    "SparseCoreOptimizer",
    "Setting",
    "TableReport",
    "EngineReport",
    "check_engine",
    "check_engine_name",
    "sparsecore_equivalent",
]

ENGINES = spec.ENGINES


def check_engine_name(engine: Any, function: str) -> str:
    """`engine` if it names an engine; else a ValueError naming `function`."""
    if not isinstance(engine, str) or engine not in ENGINES:
        raise ValueError(
            f"{function}: argument `engine` must be one of "
            f"{', '.join(repr(e) for e in ENGINES)}; received {engine!r}."
        )
    return engine


@dataclasses.dataclass(frozen=True)
class SparseCoreOptimizer:
    """What `TPUEmbeddingV2.apply_gradients` hands the SparseCore op.

    Attributes:
      definition: Name of the algorithm's definition (`registry.BY_NAME`).
      op: The `gen_xla_ops` function `apply_gradients` calls for it.
      attributes: Hyperparameter (the embedding face's name) -> the op argument
        that receives it.
      slot_hypers: Hyperparameters that reach the engine as slot initial values
        (through the slot initializers, not the op).
      dropped: Hyperparameter -> (the value SparseCore computes with, why); the
        op never receives it.
    """

    definition: str
    op: str
    attributes: Mapping[str, str] = dataclasses.field(default_factory=dict)
    slot_hypers: Tuple[str, ...] = ()
    dropped: Mapping[str, Tuple[Any, str]] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        hypers = {h.name for h in registry.BY_NAME[self.definition].hypers}
        listed = [*self.attributes, *self.slot_hypers, *self.dropped]
        if sorted(listed) != sorted(hypers):
            raise ValueError(
                f"SparseCoreOptimizer {self.definition}: {sorted(listed)} does "
                f"not list each hyperparameter of {sorted(hypers)} exactly once."
            )


_OP = "xla_sparse_dense_matmul_grad_with_{}_and_static_buffer_size"

# Read from TensorFlow 2.21's tpu_embedding_v3.py (`TPUEmbeddingV2.
# apply_gradients`); tests/test_engines.py checks every entry against that code
# path with the SparseCore ops replaced by recorders.
SPARSECORE_OPTIMIZERS: Dict[str, SparseCoreOptimizer] = {
    o.definition: o
    for o in (
        SparseCoreOptimizer("SGD", _OP.format("sgd")),
        SparseCoreOptimizer(
            "Adagrad", _OP.format("adagrad"), slot_hypers=("initial_accumulator_value",)
        ),
        SparseCoreOptimizer(
            "AdagradMomentum",
            _OP.format("adagrad_momentum"),
            attributes={
                "momentum": "beta1",
                "use_nesterov": "use_nesterov",
                "exponent": "exponent",
                "beta2": "beta2",
                "epsilon": "epsilon",
            },
        ),
        SparseCoreOptimizer(
            "Adam",
            _OP.format("adam"),
            attributes={
                "beta_1": "beta1",
                "beta_2": "beta2",
                "epsilon": "epsilon",
                "sum_inside_sqrt": "use_sum_inside_sqrt",
            },
            dropped={
                "lazy_adam": (
                    True,
                    "SparseCore Adam is always lazy: only looked-up rows change",
                )
            },
        ),
        SparseCoreOptimizer(
            "FTRL",
            _OP.format("ftrl"),
            attributes={
                "learning_rate_power": "learning_rate_power",
                "l1_regularization_strength": "l1_regularization_strength",
                "l2_regularization_strength": "l2_regularization_strength",
                "beta": "beta",
                "multiply_linear_by_learning_rate": "multiply_linear_by_learning_rate",
            },
            slot_hypers=("initial_accumulator_value",),
            dropped={
                "allow_zero_accumulator": (
                    False,
                    "not passed; deprecated and ignored by the TensorCore engine "
                    "too, so it changes nothing",
                )
            },
        ),
    )
}

# Dropped settings that leave the math unchanged (not refused in strict mode).
_HARMLESS = {"allow_zero_accumulator", "low_dimensional_packing_status"}


@dataclasses.dataclass(frozen=True)
class Setting:
    """One optimizer setting and what the engine does with it.

    Attributes:
      name: The embedding face's argument name (`clipvalue`, `lazy_adam`, ...).
      value: The value configured.
      verdict: `"passed"` (the engine receives it), `"dropped"` (silently not
        used), `"changed"` (a converter on the way, keras-rs, gives it another
        meaning) or `"rejected"` (the engine raises).
      reason: What happens instead, for a dropped or rejected setting.
      changes_math: Whether the engine then computes something else than the
        configuration says (False for a dropped setting that has no effect).
    """

    name: str
    value: Any
    verdict: str
    reason: str = ""
    changes_math: bool = True

    def describe(self) -> str:
        text = f"{self.name}={self.value!r}"
        return f"{text}: {self.reason}" if self.reason else text


@dataclasses.dataclass(frozen=True)
class TableReport:
    """What one engine does with one table's optimizer.

    Attributes:
      table: The table's name (`None` for a bare optimizer).
      optimizer: The optimizer checked (after keras-rs's conversion for a
        keras-rs table).
      algorithm: Its definition name (`None` if it is no optimizer this package
        knows).
      received: What the engine receives, in order: the op (SparseCore) and
        every setting passed on, by the embedding face's names.
      dropped: Settings the engine silently does not use or that reach it
        changed.
      rejected: Settings (or the optimizer) the engine refuses.
      stack: For `TPUEmbeddingV2`, the stacked table this table lives in.
    """

    table: Optional[str]
    optimizer: Any
    algorithm: Optional[str]
    received: Tuple[Tuple[str, Any], ...]
    dropped: Tuple[Setting, ...]
    rejected: Tuple[Setting, ...]
    stack: Optional[str] = None

    def verdict(self, name: str) -> str:
        """What the engine does with the setting `name` (an argument name, or
        `"optimizer"` for the algorithm itself): `"passed"`, `"dropped"`,
        `"changed"` or `"rejected"`."""
        for setting in self.rejected + self.dropped:
            if setting.name == name:
                return setting.verdict
        return "passed"

    @property
    def problems(self) -> Tuple[Setting, ...]:
        """Rejected settings and dropped ones that change the math."""
        return self.rejected + tuple(s for s in self.dropped if s.changes_math)

    @property
    def runs(self) -> bool:
        """Whether the engine runs this table at all."""
        return not self.rejected

    @property
    def exact(self) -> bool:
        """Whether the engine computes exactly what the optimizer says."""
        return not self.problems


@dataclasses.dataclass(frozen=True)
class EngineReport:
    """The preflight of one configuration on one engine.

    Attributes:
      engine: `"TPUEmbedding"` or `"TPUEmbeddingV2"`.
      tables: One report per table, in the order of first appearance.
      stacks: For `TPUEmbeddingV2` with features: stacked table -> its tables.
    """

    engine: str
    tables: Tuple[TableReport, ...]
    stacks: Mapping[str, Tuple[str, ...]] = dataclasses.field(default_factory=dict)

    @property
    def runs(self) -> bool:
        return all(t.runs for t in self.tables)

    @property
    def exact(self) -> bool:
        return all(t.exact for t in self.tables)

    def table(self, name: Optional[str]) -> TableReport:
        for report in self.tables:
            if report.table == name:
                return report
        raise KeyError(name)

    def problems(self) -> List[str]:
        """One line per rejected or math-changing dropped setting."""
        lines = []
        for report in self.tables:
            where = f"table {report.table!r}: " if report.table is not None else ""
            for setting in report.problems:
                lines.append(f"{where}{setting.verdict} {setting.describe()}")
        return lines

    def lines(self) -> List[str]:
        """A human-readable report, one line per fact."""
        out = [f"engine: {self.engine}"]
        for report in self.tables:
            name = report.table if report.table is not None else "(optimizer)"
            status = (
                "refused"
                if not report.runs
                else "exact"
                if report.exact
                else "runs, with different math"
            )
            out.append(f"table {name}: {report.algorithm or '?'} - {status}")
            if report.stack is not None:
                out.append(f"  stacked table: {report.stack}")
            for key, value in report.received:
                out.append(f"  receives {key} = {value}")
            for setting in report.dropped:
                verb = "changes" if setting.verdict == "changed" else "drops"
                out.append(f"  {verb} {setting.describe()}")
            for setting in report.rejected:
                out.append(f"  refuses {setting.describe()}")
        for stack, tables in self.stacks.items():
            if len(tables) > 1:
                out.append(f"stacked together in {stack}: {', '.join(tables)}")
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())


def _learning_rate_text(rate: Any) -> str:
    if callable(rate):
        return f"{rate!r} (called at every apply_gradients)"
    return repr(rate)


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
                changes_math=algorithm != "SGD",
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


def _dispatch_definition(opt: Any) -> Any:
    """The definition `TPUEmbeddingV2.apply_gradients` treats `opt` as.

    It tests `isinstance` against TensorFlow's classes in this order, so any
    subclass of them (this package's or a user's) takes that branch.
    """
    definition = _definition_or_none(opt)
    if definition is not None:
        return definition
    for name in SPARSECORE_OPTIMIZERS:
        tf_class = getattr(tpu_embedding_v2_utils, name, None)
        if tf_class is not None and isinstance(opt, tf_class):
            return registry.BY_NAME[name]
    return None


def _check_sparsecore(opt: Any, table: Optional[str]) -> TableReport:
    definition = _dispatch_definition(opt)
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
        ("learning_rate", _learning_rate_text(opt.learning_rate)),
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


def _check_tensorcore(opt: Any, table: Optional[str]) -> TableReport:
    definition = _dispatch_definition(opt)
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
        ("learning_rate", _learning_rate_text(opt.learning_rate)),
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


def _definition_or_none(opt: Any) -> Any:
    try:
        return embedding.definition_of(opt)
    except TypeError:
        return None


def _check_optimizer(opt: Any, table: Optional[str], engine: str) -> TableReport:
    if engine == "TPUEmbeddingV2":
        return _check_sparsecore(opt, table)
    return _check_tensorcore(opt, table)


def sparsecore_equivalent(opt: Any) -> Any:
    """The optimizer whose configuration says what SparseCore computes for `opt`.

    The settings `TPUEmbeddingV2` drops are set to the values SparseCore
    computes with (no clipping, accumulation on, lazy Adam, no packing).

    Raises:
      ValueError: SparseCore refuses `opt` (another algorithm, weight decay).
    """
    report = _check_sparsecore(opt, None)
    if not report.runs:
        raise ValueError(
            "TPUEmbeddingV2 cannot run this optimizer: "
            + "; ".join(s.describe() for s in report.rejected)
            + "."
        )
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


# --- configurations: optimizers, TableConfigs, feature-config nests ----------


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


def _keras_rs_table_optimizer(table: Any, engine: str) -> Tuple[Any, List[Setting]]:
    """What keras-rs hands TensorFlow for a keras-rs table, and why it differs."""
    conversion = _keras_rs_module()
    source = table.optimizer
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
            Setting("optimizer", source, "rejected", f"keras-rs refuses it: {error}")
        ]
    import keras

    if not isinstance(source, keras.optimizers.Optimizer):
        return converted, []
    from tf_tpu_embed_opt import convert

    try:
        exact = convert.to_embedding(source, engine=engine)
    except (TypeError, ValueError) as error:
        exact, why = None, _bare_message(str(error))
    else:
        why = ""
    if exact is not None and _same_optimizer(exact, converted):
        return converted, []
    reason = (
        f"keras-rs maps keras.optimizers.{type(source).__name__} by name to "
        f"{_optimizer_text(converted)}, which computes different math"
        + (
            f"; it has no exact {engine} equivalent: {why}"
            if why
            else f"; the exact conversion is {_optimizer_text(exact)}"
        )
        + ". Pass teo.to_embedding(optimizer, engine=...) as the TableConfig "
        "optimizer instead"
    )
    return converted, [Setting("optimizer", type(source).__name__, "changed", reason)]


def _bare_message(message: str) -> str:
    """A conversion error without its function prefix and strict=False hint."""
    message = (
        message.split(": ", 1)[1] if message.startswith("to_embedding: ") else message
    )
    for hint in (" Pass strict=False", " Converted without them"):
        message = message.split(hint)[0]
    return message.rstrip(".")


def _optimizer_text(opt: Any) -> str:
    """`opt` as its class and arguments (TensorFlow's classes have no repr)."""
    from tf_tpu_embed_opt.embedding import proto

    try:
        return repr(proto.as_embedding_optimizer(opt))
    except (TypeError, ValueError):
        return repr(opt)


def _keras_optimizer(keras_opt: Any) -> Tuple[Any, List[Setting]]:
    """`to_embedding`'s result for a Keras optimizer, and what it changes."""
    from tf_tpu_embed_opt import convert

    name = type(keras_opt).__name__
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            converted = convert.to_embedding(keras_opt, strict=False)
        except (TypeError, ValueError) as error:
            return None, [Setting("optimizer", name, "rejected", str(error))]
    changes = [
        Setting("optimizer", name, "changed", _bare_message(str(w.message)))
        for w in caught
        if issubclass(w.category, UserWarning)
    ]
    return converted, changes


def _same_optimizer(a: Any, b: Any) -> bool:
    """Equal settings; floats compared as the float32 the engine computes in."""
    da, db = _definition_or_none(a), _definition_or_none(b)
    if da is None or da is not db:
        return False
    left, right = embedding.arguments(a), embedding.arguments(b)
    return left.keys() == right.keys() and all(
        _same_value(left[k], right[k]) for k in left
    )


def _same_value(a: Any, b: Any) -> bool:
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
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b))
    return a == b


def _flatten(config: Any) -> List[Tuple[str, Any]]:
    from tensorflow.python.util import nest

    return nest.flatten_with_joined_string_paths(config)


def _padded_width(dim: int) -> int:
    return int(math.ceil(dim / 8) * 8)


def _stack_key(table: Any) -> Tuple[int, str]:
    # TPUEmbeddingV2 groups by padded width and a digest of the optimizer's
    # hash and the quantization config's repr (tpu_embedding_v3.py,
    # _stack_tables_with_same_table_dim_and_optimizer).
    key = (hash(table.optimizer), repr(table.quantization_config))
    digest = hashlib.sha1(repr(key).encode(), usedforsecurity=False).hexdigest()
    return _padded_width(table.dim), digest


def _stacks(
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
    gives tables without an optimizer the global one first.
    """
    clones = {}
    for index, table in enumerate(tables):
        clone = copy.copy(table)
        if clone.name is None:
            clone.name = f"table_{index}"
        if clone.optimizer is None:
            clone.optimizer = optimizer
        clones[id(table)] = clone
    flat = []
    for path, feature in features:
        clone = copy.copy(feature)
        clone.table = clones[id(feature.table)]
        # Sample counts only matter for TensorFlow's stack size limits.
        clone.output_shape = [d or 1 for d in (feature.output_shape or [1])]
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
    legacy = _legacy_stacks(list(clones.values()), flat, num_partitions)
    if legacy is not None:
        return legacy
    disabled = getattr(config, "disable_table_stacking", False)
    groups: Dict[Any, List[str]] = {}
    for table in sorted(clones.values(), key=lambda t: t.name):
        key = (table.name,) if disabled else _stack_key(table)
        groups.setdefault(key, []).append(table.name)
    return {"_".join(names): tuple(names) for names in groups.values()}


def _legacy_stacks(
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
    algorithm but SGD, Adagrad, AdagradMomentum, Adam and FTRL), and for
    `TPUEmbeddingV2` which tables it stacks into one variable (same padded
    width, equal optimizer hash, same quantization config).

    Args:
      obj: An embedding optimizer (this package's or TensorFlow's), a Keras
        optimizer (read as `to_embedding` converts it; what it cannot convert
        exactly is reported as changed), a
        `tf.tpu.experimental.embedding.TableConfig`, or a nest of
        `FeatureConfig`s (TensorFlow's, or keras-rs's
        `keras_rs.layers.FeatureConfig`, whose Keras optimizers are read as
        keras-rs converts them).
      engine: `"TPUEmbeddingV2"` (SparseCore, the default here) or
        `"TPUEmbedding"`.
      strict: Raise `ValueError` listing every refused setting and every dropped
        one that changes the math, instead of returning the report.
      optimizer: The global optimizer, for tables without one (as the engines'
        `optimizer` argument).
      num_partitions: Number of TPU chips (`num_replicas_in_sync`), for
        stacking.
      sparse_cores_per_partition: SparseCores per chip, for stacking.
      sparse_core_embedding_config: The
        `tf.tpu.experimental.embedding.SparseCoreEmbeddingConfig` the engine
        gets (for keras-rs, the one keras-rs builds): its
        `disable_table_stacking`, and `allow_id_dropping=True`, reported per
        table because ids over the per-SparseCore limits then lose their
        gradients.

    Returns:
      An `EngineReport`.

    Raises:
      ValueError: Bad `engine`; with `strict=True`, a problem (the message lists
        all of them).
      TypeError: `obj` is none of the above.
    """
    check_engine_name(engine, "check_engine")
    if not isinstance(strict, bool):
        raise TypeError(
            f"check_engine: argument `strict` must be True or False; received "
            f"{strict!r}."
        )
    for name, value in (
        ("num_partitions", num_partitions),
        ("sparse_cores_per_partition", sparse_cores_per_partition),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(
                f"check_engine: argument `{name}` must be a positive int; "
                f"received {value!r}."
            )
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
    report = _build_report(
        obj,
        engine,
        optimizer,
        num_partitions,
        sparse_cores_per_partition,
        sparse_core_embedding_config,
    )
    report = _with_id_dropping(report, sparse_core_embedding_config)
    if strict and report.problems():
        raise ValueError(
            f"check_engine: {engine} would not compute the configured math: "
            + "; ".join(report.problems())
            + "."
        )
    return report


def _with_id_dropping(report: EngineReport, config: Any) -> EngineReport:
    """`report`, with id dropping listed for every table that runs."""
    if report.engine != "TPUEmbeddingV2" or not getattr(
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


def _build_report(
    obj: Any,
    engine: str,
    optimizer: Any,
    num_partitions: int,
    sparse_cores_per_partition: int,
    config: Any,
) -> EngineReport:
    if isinstance(obj, tpu_embedding_v2_utils._Optimizer):
        return EngineReport(engine, (_check_optimizer(obj, None, engine),))
    import keras

    if isinstance(obj, keras.optimizers.Optimizer):
        converted, changes = _keras_optimizer(obj)
        return EngineReport(
            engine, (_table_report(None, converted, engine, None, changes),)
        )
    if isinstance(obj, tpu_embedding_v2_utils.TableConfig):
        table_optimizer = obj.optimizer if obj.optimizer is not None else optimizer
        return EngineReport(engine, (_table_report(obj, table_optimizer, engine),))
    features = _flatten(obj) if obj is not None else []
    keras_rs = [f for _, f in features if _is_keras_rs(f, "FeatureConfig")]
    tf_features = [
        f for _, f in features if isinstance(f, tpu_embedding_v2_utils.FeatureConfig)
    ]
    if not features or len(keras_rs) + len(tf_features) != len(features):
        raise TypeError(
            "check_engine: argument `obj` must be an embedding optimizer, a "
            "tf.tpu.experimental.embedding.TableConfig, or a nest of "
            "tf.tpu.experimental.embedding.FeatureConfig or "
            f"keras_rs.layers.FeatureConfig; received {obj!r}."
        )
    if keras_rs and tf_features:
        raise TypeError(
            "check_engine: argument `obj` mixes TensorFlow and keras-rs "
            "FeatureConfigs; pass one kind."
        )
    tables: List[Any] = []
    for _, feature in features:
        if not any(feature.table is t for t in tables):
            tables.append(feature.table)
    reports = []
    for index, table in enumerate(tables):
        name = table.name if table.name is not None else f"table_{index}"
        if keras_rs:
            converted, problems = _keras_rs_table_optimizer(table, engine)
            reports.append(_table_report(table, converted, engine, name, problems))
        else:
            table_optimizer = (
                table.optimizer if table.optimizer is not None else optimizer
            )
            reports.append(_table_report(table, table_optimizer, engine, name))
    stacks: Dict[str, Tuple[str, ...]] = {}
    if engine == "TPUEmbeddingV2" and all(r.runs for r in reports):
        named = features
        if keras_rs:
            # keras-rs builds TensorFlow's tables from its own configs; the
            # stacking is decided on those.
            try:
                tf_config, keras_rs_config = (
                    _keras_rs_module().keras_to_tf_tpu_configuration(
                        obj, "auto", num_partitions
                    )
                )
            except ValueError:
                named = []
            else:
                named = _flatten(tf_config)
                if config is None:
                    config = keras_rs_config
        tf_tables: List[Any] = []
        for _, feature in named:
            if not any(feature.table is t for t in tf_tables):
                tf_tables.append(feature.table)
        if named:
            stacks = _stacks(
                tf_tables,
                named,
                optimizer,
                num_partitions,
                sparse_cores_per_partition,
                config,
            )
            where = {t: s for s, members in stacks.items() for t in members}
            reports = [
                dataclasses.replace(r, stack=where.get(r.table)) for r in reports
            ]
    return EngineReport(engine, tuple(reports), stacks)


def _table_report(
    table: Any,
    table_optimizer: Any,
    engine: str,
    name: Optional[str] = None,
    extra: Sequence[Setting] = (),
) -> TableReport:
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
    report = _check_optimizer(table_optimizer, name, engine)
    changed = tuple(s for s in extra if s.verdict == "changed")
    refused = tuple(s for s in extra if s.verdict == "rejected")
    return dataclasses.replace(
        report, dropped=report.dropped + changed, rejected=report.rejected + refused
    )
