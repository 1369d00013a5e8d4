"""TensorFlow's own TPUEmbeddingV2 code path, run on CPU with recorders.

`TPUEmbeddingV2` needs a TPUStrategy and SparseCore ops without CPU kernels.
This harness builds the real object under a stand-in strategy (TensorFlow
checks the strategy only with `isinstance`; its table stacking runs on CPU),
creates the table and slot variables with the optimizer's own
`_create_slots`, and runs the real `apply_gradients` with the SparseCore ops
of `gen_xla_ops` replaced by recorders of the arguments they receive.
"""

from __future__ import annotations

import inspect
import types
from typing import Any, Dict, Optional

import numpy as np
import tensorflow as tf

v3 = None
try:
    from tensorflow.python.distribute import tpu_strategy
    from tensorflow.python.tpu import tpu_embedding_v3 as v3
except ImportError:  # pragma: no cover - TensorFlow without TPUEmbeddingV2
    pass

SPARSECORE_OPS = {
    "xla_sparse_dense_matmul_grad_with_sgd_and_static_buffer_size": 1,
    "xla_sparse_dense_matmul_grad_with_adagrad_and_static_buffer_size": 2,
    "xla_sparse_dense_matmul_grad_with_adagrad_momentum_and_static_buffer_size": 3,
    "xla_sparse_dense_matmul_grad_with_adam_and_static_buffer_size": 3,
    "xla_sparse_dense_matmul_grad_with_ftrl_and_static_buffer_size": 3,
}


def available() -> Optional[str]:
    """None if the harness can run, else why not."""
    if v3 is None:
        return "this TensorFlow has no tpu_embedding_v3 (TPUEmbeddingV2)"
    missing = [
        name
        for name in (
            "_stack_tables_with_same_table_dim_and_optimizer",
            "TPUEmbeddingV2",
        )
        if not hasattr(v3, name)
    ]
    missing += [op for op in SPARSECORE_OPS if not hasattr(v3.xla_ops, op)]
    if not missing:
        # The recorders replace these ops; a TensorFlow whose apply_gradients
        # calls other ones would run real TPU ops instead.
        source = inspect.getsource(v3.TPUEmbeddingV2.apply_gradients)
        missing += [f"a call of {op}" for op in SPARSECORE_OPS if op not in source]
    if missing:
        return f"this TensorFlow's TPUEmbeddingV2 lacks {missing}"
    return None


def _fake_strategy(num_replicas: int, sparse_cores: int) -> Any:
    class StandInStrategy(tpu_strategy.TPUStrategyV2):
        def __init__(self):  # noqa: D107 - no TPU to connect to
            pass

    StandInStrategy.num_replicas_in_sync = num_replicas
    StandInStrategy.extended = types.SimpleNamespace(
        tpu_hardware_feature=types.SimpleNamespace(
            num_embedding_devices_per_chip=sparse_cores
        )
    )
    return StandInStrategy()


def build(monkeypatch, feature_config, optimizer=None, *, num_replicas=1, config=None):
    """A real `TPUEmbeddingV2` built on CPU (its __init__ runs unchanged)."""
    strategy = _fake_strategy(num_replicas, 4)
    monkeypatch.setattr(
        v3, "distribute_lib", types.SimpleNamespace(get_strategy=lambda: strategy)
    )
    return v3.TPUEmbeddingV2(
        feature_config, optimizer, sparse_core_embedding_config=config
    )


def _numpy(value: Any) -> Any:
    if isinstance(value, (tf.Tensor, tf.Variable)):
        return value.numpy()
    return value


def run_step(monkeypatch, optimizer: Any, *, dim: int = 8, vocabulary: int = 32):
    """One `apply_gradients` of a one-table TPUEmbeddingV2; what the op received.

    Returns:
      `("raised", exception)` if TensorFlow raises (building or stepping), else
      `("called", op name, {argument: value as numpy})`.
    """
    table = tf.tpu.experimental.embedding.TableConfig(
        vocabulary_size=vocabulary, dim=dim, optimizer=optimizer, name="table"
    )
    feature = tf.tpu.experimental.embedding.FeatureConfig(
        table, output_shape=[8], name="feature"
    )
    calls: Dict[str, Dict[str, Any]] = {}

    def recorder(op_name: str, outputs: int):
        def op(**kwargs):
            calls[op_name] = {k: _numpy(v) for k, v in kwargs.items()}
            table_value = kwargs["embedding_table"]
            if outputs == 1:
                return tf.identity(table_value)
            return tuple(tf.identity(table_value) for _ in range(outputs))

        return op

    for op_name, outputs in SPARSECORE_OPS.items():
        monkeypatch.setattr(v3.xla_ops, op_name, recorder(op_name, outputs))
    try:
        emb = build(monkeypatch, feature)
        variables = {}
        for stacked, tables in emb._stacked_table_to_tables.items():
            shape = (tables[0].vocabulary_size, tables[0].dim)
            parameters = tf.Variable(tf.zeros(shape), name=stacked)

            def creator(name, initializer, shape=shape):
                return tf.Variable(initializer(shape, dtype=tf.float32), name=name)

            slots = tables[0].optimizer._create_slots(parameters, creator)
            variables[stacked] = {"parameters": parameters, **slots}
        emb._variables = variables
        emb._built = True
        preserved = {
            stacked: types.SimpleNamespace(
                row_pointers=tf.zeros([4], tf.int32),
                sorted_sample_ids=tf.zeros([4], tf.int32),
                sorted_token_ids=tf.zeros([4], tf.int32),
                sorted_gains=tf.ones([4], tf.float32),
                num_minibatches_per_physical_sparse_core=tf.constant(1),
            )
            for stacked in emb._stacked_table_to_tables
        }
        gradient = tf.ones([8, dim])
        emb.apply_gradients(gradient, preserved)
    except Exception as error:  # what TensorFlow raises is the verdict
        return ("raised", error)
    ((op_name, arguments),) = calls.items()
    return ("called", op_name, arguments)


def same_arguments(a: Dict[str, Any], b: Dict[str, Any]) -> bool:
    if a.keys() != b.keys():
        return False
    return all(np.array_equal(np.asarray(a[k]), np.asarray(b[k])) for k in a)
