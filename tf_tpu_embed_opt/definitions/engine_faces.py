"""How the engines see an algorithm: records a `Definition` carries.

`Remap` (Keras arguments under which a Keras class computes another engine
algorithm), `SparseCoreOptimizer` (what `TPUEmbeddingV2` hands SparseCore's
op) and `JaxFace` (the algorithm in jax-tpu-embedding). `spec` re-exports
them; algorithm modules import them from there. No TensorFlow, no Keras.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional, Tuple

__all__ = ["JaxFace", "Remap", "SparseCoreOptimizer"]


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
class SparseCoreOptimizer:
    """What `TPUEmbeddingV2.apply_gradients` hands the SparseCore op.

    TensorFlow 2.21's `tpu_embedding_v3.py` dispatches on five algorithms and
    passes the op only some of their settings (docs/tpu_semantics.md,
    "SparseCore optimizers"); an algorithm's definition holds this record
    where SparseCore runs it (`Definition.sparsecore`).

    Attributes:
      definition: Name of the algorithm's definition.
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
        same meaning, for every attribute but `learning_rate`.
      implied: The values of this definition's arguments (engine
        hyperparameters or Keras arguments) with which its rule computes what
        the spec's lowering computes (Adam: lazy, bias-corrected, epsilon
        added after the bias correction). A conversion refuses other values.
      slots: This definition's slot name -> the spec's slot name (the field of
        its `...SlotVariables` named tuple), in the spec's order.
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
