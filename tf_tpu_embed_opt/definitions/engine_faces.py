"""The engines, and how they see an algorithm: records a `Definition` carries.

`Engine` (one object per TPU embedding engine, found in `ENGINES`: its name
and what it is), `Remap` (Keras arguments under which a Keras class computes
another engine algorithm), `TensorFlowFace` (the algorithm on TensorFlow's
engines: its proto member, ops and class), `SparseCoreOptimizer` (what
`TPUEmbeddingV2` hands SparseCore's op) and `JaxFace` (the algorithm in
jax-tpu-embedding). A definition without one of these records is not on that
engine. `spec`
re-exports them; algorithm modules import them from there. No TensorFlow, no
Keras.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Mapping, Optional, Tuple

__all__ = [
    "ENGINES",
    "Engine",
    "JAX_TPU_EMBEDDING",
    "JaxFace",
    "Remap",
    "SparseCoreOptimizer",
    "TensorFlowFace",
    "TPU_EMBEDDING",
    "TPU_EMBEDDING_V2",
    "engine_named",
]


class Engine(str):
    """One TPU embedding engine: its name, as users pass it (`engine=`), which
    the object equals (so it is the string wherever a name is shown or
    stored), and what the engine is, which the package asks instead of
    comparing names.

    Attributes:
      words: How messages name it (`"TPU engine"`, ...).
      tensorflow: Whether it is one of TensorFlow's engines (its optimizers
        are the embedding face's classes and their proto); otherwise
        jax-tpu-embedding, whose optimizers are its specs.
      whole_proto: Whether it receives an optimizer's whole
        `OptimizationParameters` proto (`TPUEmbedding`).
      sparsecore_op: Whether it hands TensorFlow's SparseCore op some of the
        settings only, for the algorithms that op runs (`TPUEmbeddingV2`): a
        conversion asks its verdict on the table first.
      rounding: The order of arithmetic its twin follows (`"keras"`, that of
        Keras and TensorFlow's kernels, or jax-tpu-embedding's own).
      module: The module of `tf_tpu_embed_opt.engines` that carries the
        engine's behaviour (`engines.behaviour_of`: what it runs, its judge
        of a table's optimizer, what a twin of it reproduces; the
        `engines.base.EngineBehaviour` protocol).
    """

    words: str
    tensorflow: bool
    whole_proto: bool
    sparsecore_op: bool
    rounding: str
    module: str

    def __new__(
        cls,
        name: str,
        *,
        words: str,
        tensorflow: bool,
        module: str,
        whole_proto: bool = False,
        sparsecore_op: bool = False,
    ) -> "Engine":
        engine = super().__new__(cls, name)
        engine.words = words
        engine.module = module
        engine.tensorflow = tensorflow
        engine.whole_proto = whole_proto
        engine.sparsecore_op = sparsecore_op
        engine.rounding = "keras" if tensorflow else name
        return engine

    @property
    def name(self) -> str:
        return str.__str__(self)

    def __repr__(self) -> str:
        return repr(self.name)

    def __reduce__(self) -> Any:
        return (engine_named, (self.name,))


TPU_EMBEDDING = Engine(
    "TPUEmbedding",
    words="TPU engine",
    tensorflow=True,
    module="tensorcore",
    whole_proto=True,
)
TPU_EMBEDDING_V2 = Engine(
    "TPUEmbeddingV2",
    words="TPUEmbeddingV2 engine",
    tensorflow=True,
    module="sparsecore",
    sparsecore_op=True,
)
JAX_TPU_EMBEDDING = Engine(
    "jax-tpu-embedding",
    words="jax-tpu-embedding engine",
    tensorflow=False,
    module="jax_tpu_embedding",
)

# The TPU embedding engines a conversion can target, named as users know them:
# `TPUEmbedding` (the TensorCore-era engine, the default), `TPUEmbeddingV2`
# (SparseCore through TensorFlow) and `jax-tpu-embedding` (SparseCore through
# JAX: keras-rs on Keras's JAX backend). Kept here, free of TensorFlow, for the
# command line's parser.
ENGINES: Tuple[Engine, ...] = (TPU_EMBEDDING, TPU_EMBEDDING_V2, JAX_TPU_EMBEDDING)


def engine_named(name: Any, function: str = "engine_named") -> Engine:
    """The engine called `name` (an `Engine` passes through).

    Raises:
      ValueError: No engine is called that; the message names `function`'s
        argument `engine` and the engines there are.
    """
    for engine in ENGINES:
        if isinstance(name, str) and engine.name == name:
            return engine
    raise ValueError(
        f"{function}: argument `engine` must be one of "
        f"{', '.join(repr(e) for e in ENGINES)}; received {name!r}."
    )


@dataclasses.dataclass(frozen=True)
class Remap:
    """Keras arguments under which a Keras class computes another engine
    algorithm than its own (SGD with momentum is the engine's Momentum).

    Attributes:
      applies: f(arguments) -> whether these Keras arguments select it.
      algorithm: The engine algorithm's definition name.
      hypers: f(arguments) -> that algorithm's hyperparameters.
      arguments: The Keras arguments it accounts for (not compared with
        their `engine` values by the conversions).
      needs_constant_learning_rate: Why it is exact only for a constant
        learning rate (a schedule is then refused with this reason), or
        `None`.
    """

    applies: Callable[[Mapping[str, Any]], bool]
    algorithm: str
    hypers: Callable[[Mapping[str, Any]], Mapping[str, Any]]
    arguments: Tuple[str, ...]
    needs_constant_learning_rate: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class TensorFlowFace:
    """An algorithm on TensorFlow's engines (`TPUEmbedding`, `TPUEmbeddingV2`).

    Attributes:
      oneof: Its member of the `OptimizationParameters.parameters` oneof
        (`rms_prop`), which is also its part of the ops' Python names
        (`load_tpu_embedding_rms_prop_parameters`).
      op_name: Its part of the ops' names: `LoadTPUEmbedding` + op_name +
        `Parameters` (`RMSProp`, `ADAM`).
      tensorflow_class: TensorFlow's own class in
        `tf.tpu.experimental.embedding` that the embedding class extends;
        `None` where TensorFlow exposes none.
      checks: The hyperparameters TensorFlow's own class validates, in its
        order; the embedding class checks them first, before the arguments
        TensorFlow accepts (so that it refuses in TensorFlow's order).
      reference_kernel: TensorFlow's CPU training op the TPU proto names as
        the reference implementation, if any.
      late: Hyperparameters that TensorFlow's class takes after the arguments
        every embedding optimizer shares (before `low_dimensional_packing_status`,
        which stays last): FTRL's `multiply_linear_by_learning_rate`. The
        others come first, after `learning_rate`.
    """

    oneof: str
    op_name: str
    tensorflow_class: Optional[str] = None
    checks: Tuple[str, ...] = ()
    reference_kernel: Optional[str] = None
    late: Tuple[str, ...] = ()

    @property
    def op_module_name(self) -> str:
        return self.oneof


@dataclasses.dataclass(frozen=True)
class SparseCoreOptimizer:
    """What `TPUEmbeddingV2.apply_gradients` hands the SparseCore op.

    TensorFlow 2.21's `tpu_embedding_v3.py` dispatches on five algorithms and
    passes the op only some of their settings (docs/tpu_semantics.md,
    "SparseCore optimizers"); an algorithm's definition holds this record
    where SparseCore runs it (`Definition.sparsecore`).

    What the record leaves out (`None`) its definition fills in
    (`completed`).

    Attributes:
      definition: Name of the algorithm's definition; `None`: the definition
        holding the record.
      op: The `gen_xla_ops` function `apply_gradients` calls for it; `None`:
        the SparseCore kernel named after the algorithm in snake case
        (`AdagradMomentum`: `op_of("adagrad_momentum")`).
      attributes: Hyperparameter (the embedding face's name) -> the op argument
        that receives it; `None`: every hyperparameter not in `slot_hypers`
        or `dropped`, each the op's argument of the same name.
      slot_hypers: Hyperparameters that reach the engine as slot initial values
        (through the slot initializers, not the op); `None`: those that are
        a slot's initial value.
      dropped: Hyperparameter -> (the value SparseCore computes with, why); the
        op never receives it.
    """

    definition: Optional[str] = None
    op: Optional[str] = None
    attributes: Optional[Mapping[str, str]] = None
    slot_hypers: Optional[Tuple[str, ...]] = None
    dropped: Mapping[str, Tuple[Any, str]] = dataclasses.field(default_factory=dict)

    def completed(
        self, definition: str, hypers: Tuple[str, ...], slot_starts: Tuple[str, ...]
    ) -> "SparseCoreOptimizer":
        """This record with what it leaves out filled in, for the definition
        named `definition`, whose hyperparameters are `hypers` and whose
        slots start at the hyperparameters `slot_starts`."""
        kernel = re.sub(r"(?<=[a-z])(?=[A-Z])", "_", definition).lower()
        slot_hypers = self.slot_hypers
        if slot_hypers is None:
            slot_hypers = tuple(name for name in hypers if name in slot_starts)
        attributes = self.attributes
        if attributes is None:
            taken = {*slot_hypers, *self.dropped}
            attributes = {name: name for name in hypers if name not in taken}
        return dataclasses.replace(
            self,
            definition=self.definition or definition,
            op=self.op or self.op_of(kernel),
            attributes=attributes,
            slot_hypers=slot_hypers,
        )

    @staticmethod
    def op_of(kernel: str) -> str:
        """The op `apply_gradients` calls for SparseCore's `kernel` (`adam`)."""
        return f"xla_sparse_dense_matmul_grad_with_{kernel}_and_static_buffer_size"


@dataclasses.dataclass(frozen=True)
class JaxFace:
    """How an algorithm appears in jax-tpu-embedding (the `jax-tpu-embedding` engine).

    jax-tpu-embedding describes a table's optimizer with one `OptimizerSpec`
    class per algorithm (`jax_tpu_embedding.sparsecore.lib.nn.embedding_spec`);
    its per-row update is the lowering in `sparsecore/lib/core/primitives/
    sparse_dense_matmul_grad_with_<algorithm>.py` (docs/tpu_semantics.md,
    "jax-tpu-embedding").

    Attributes:
      spec_class: The `OptimizerSpec` subclass's name (`AdagradOptimizerSpec`).
      fields: This definition's argument name (an engine hyperparameter or a
        Keras argument) -> the spec's attribute and constructor argument of the
        same meaning, for every attribute but `learning_rate`. Given: the
        names that differ only. Every Keras argument of the twin that is
        neither `implied` nor `lazy` is a field, of its own name unless given
        here (its `Definition` fills them in, in the twin's signature order).
      implied: The values of this definition's arguments (engine
        hyperparameters or Keras arguments) with which its rule computes what
        the spec's lowering computes (Adam: lazy, bias-corrected, epsilon
        added after the bias correction). A conversion refuses other values.
      slots: This definition's slot name -> the spec's slot name (the field of
        its `...SlotVariables` named tuple), for the slots whose names
        differ; a slot not named keeps its own (`Definition.jax_slots`: the
        definition lists its slots in the spec's order).
      reasons: Why the spec computes only the `implied` value of an
        argument (what its lowering does instead), by argument; `lazy` is
        the engine's own rule and needs none.
      record: The `OptimizerSpecProto.OptimizerType` jax-tpu-embedding's
        checkpoints record for the spec (`"ADAM"`); `None`: it records
        `CUSTOM` (LaProp), which it reads back as SGD.
    """

    spec_class: str
    fields: Mapping[str, str] = dataclasses.field(default_factory=dict)
    implied: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    slots: Mapping[str, str] = dataclasses.field(default_factory=dict)
    reasons: Mapping[str, str] = dataclasses.field(default_factory=dict)
    record: Optional[str] = None
