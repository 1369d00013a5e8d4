"""Writes tests/data/fbgemm_golden.npz with FBGEMM's CPU kernels (issue #54).

Runs where FBGEMM is installed (not in CI):

    pip install torch==2.14.1 'setuptools>=77.0.3' numpy
    pip install --no-deps fbgemm-gpu-cpu==1.9.0
    python tests/fbgemm_golden.py

For every run of `fbgemm_inputs.CONFIGS` (FBGEMM's `EXACT_ROWWISE_ADAGRAD`
with each weight-decay mode, `EXACT_ADAGRAD`, `EXACT_SGD`; pooled and
unpooled lookups; dims 16, 64, 128; and `EXACT_ROWWISE_ADAGRAD` on an FP16
table, recorded as float32) it trains one table of
`SplitTableBatchedEmbeddingBagsCodegen` on the host CPU
(`EmbeddingLocation.HOST`, `ComputeDevice.CPU`, one thread) for
`fbgemm_inputs.STEPS` steps of the forward pass and its backward with the
recorded output gradient (FBGEMM updates the table inside the backward), and
records the table and optimizer state after step 1, step 10 and the last.
"""

from __future__ import annotations

import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import fbgemm_inputs  # noqa: E402

OUT = pathlib.Path(__file__).resolve().parent / "data" / "fbgemm_golden.npz"
RECORDED_STEPS = (1, 10, fbgemm_inputs.STEPS)


def _run(config: fbgemm_inputs.Config) -> dict:
    import torch
    from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
        EmbeddingLocation,
        PoolingMode,
    )
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
        WeightDecayMode,
    )

    table = SplitTableBatchedEmbeddingBagsCodegen(
        embedding_specs=[
            (fbgemm_inputs.ROWS, config.dim, EmbeddingLocation.HOST, ComputeDevice.CPU)
        ],
        optimizer=getattr(EmbOptimType, config.optimizer),
        learning_rate=config.learning_rate,
        eps=config.eps,
        weight_decay=config.weight_decay,
        weight_decay_mode=getattr(WeightDecayMode, config.weight_decay_mode),
        pooling_mode=PoolingMode.SUM if config.pooled else PoolingMode.NONE,
        weights_precision=getattr(SparseType, config.precision),
    )
    table.split_embedding_weights()[0].copy_(
        torch.from_numpy(fbgemm_inputs.initial_table(config))
    )
    recorded = {}
    for step, (ids, offsets, gradient) in enumerate(fbgemm_inputs.steps(config), 1):
        output = table(torch.from_numpy(ids), torch.from_numpy(offsets))
        output.backward(torch.from_numpy(gradient).reshape(output.shape))
        if step in RECORDED_STEPS:
            prefix = f"{config.name}/step{step}"
            weights = table.split_embedding_weights()[0]
            recorded[f"{prefix}/table"] = weights.detach().float().numpy().copy()
            states = table.split_optimizer_states()  # none for EXACT_SGD
            for index, state in enumerate(states[0] if states else ()):
                recorded[f"{prefix}/state{index}"] = state.detach().numpy().copy()
    return recorded


def main() -> int:
    import fbgemm_gpu  # noqa: F401 - registers FBGEMM's operators
    import torch

    torch.set_num_threads(1)
    arrays = {}
    for config in fbgemm_inputs.CONFIGS:
        arrays.update(_run(config))
    arrays["versions"] = np.array(
        [f"torch {torch.__version__}", f"fbgemm_gpu {fbgemm_gpu.__version__}"]
    )
    OUT.parent.mkdir(exist_ok=True)
    np.savez_compressed(OUT, **arrays)
    print(f"{OUT}: {len(fbgemm_inputs.CONFIGS)} runs, {OUT.stat().st_size:,} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
