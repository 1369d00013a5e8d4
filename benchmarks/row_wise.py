"""RowWiseAdagrad against FBGEMM's CPU kernels: state bytes and a step (#54).

One table of `--rows` x 64 float32 (default 1,000,000) and `--ids` Zipf(1.05)
ids per step over its rows (default 16,384: about 6,850 distinct), one output
per id (an unpooled lookup, TorchRec's `EmbeddingCollection`). A step is the
forward lookup, the backward of a mean squared error (FBGEMM: of a fixed output
gradient) and the optimizer's update of the looked-up rows:

- this package: `layers.Embedding` with `RowWiseAdagrad` and with `Adagrad`,
  a Keras model of the layer alone trained with `train_on_batch` (as `fit`
  steps: compiled, the state updated in place), on this process's Keras
  backend;
- FBGEMM: `SplitTableBatchedEmbeddingBagsCodegen` with `EXACT_ROWWISE_ADAGRAD`
  and `EXACT_ADAGRAD` on the host CPU (`EmbeddingLocation.HOST`,
  `ComputeDevice.CPU`, `PoolingMode.NONE`, one thread), in a child process
  run by `--fbgemm-python` (a Python with torch and fbgemm-gpu-cpu: see
  tests/fbgemm_golden.py), on the same ids. Without it the report says so.

The four are timed round-robin (`--rounds` rounds of `--steps` steps each,
after a warm-up), so that a busier stretch of the machine falls on each; the
median step is reported with its ratio to FBGEMM's row-wise step and to the
package's Adagrad step. The optimizer state is measured from the variables
that hold it (in FBGEMM, `split_optimizer_states()`).

Run from the repository root:

    KERAS_BACKEND=jax python -m benchmarks.row_wise \\
        --fbgemm-python /path/to/fbgemm-venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

os.environ.setdefault("KERAS_BACKEND", "jax")

import keras  # noqa: E402
import numpy as np  # noqa: E402

if __package__ in (None, ""):
    # Run as a file: `benchmarks` is the checkout's folder, not on the path.
    sys.path.append(str(pathlib.Path(__file__).resolve().parent.parent))

import tf_tpu_embed_opt as teo  # noqa: E402
from benchmarks import round_robin  # noqa: E402

DIM = 64
LEARNING_RATE = 0.05
FBGEMM = {"RowWiseAdagrad": "EXACT_ROWWISE_ADAGRAD", "Adagrad": "EXACT_ADAGRAD"}

# The child's program: builds both FBGEMM tables, then answers each line
# "<optimizer> <steps>" with the step times in ms, as one JSON line.
_FBGEMM_CHILD = r"""
import json, sys, time
import numpy as np
import torch
import fbgemm_gpu  # registers FBGEMM's operators
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
    EmbeddingLocation, PoolingMode)
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    ComputeDevice, SplitTableBatchedEmbeddingBagsCodegen)

torch.set_num_threads(1)
ids_path, rows, dim, learning_rate = sys.argv[1:]
batches = [torch.from_numpy(b.astype(np.int64)) for b in np.load(ids_path)]
gradient = torch.full((len(batches[0]), int(dim)), 0.01)
offsets = torch.arange(len(batches[0]) + 1, dtype=torch.int64)
tables = {}
for name in sys.stdin.readline().split():
    tables[name] = SplitTableBatchedEmbeddingBagsCodegen(
        embedding_specs=[
            (int(rows), int(dim), EmbeddingLocation.HOST, ComputeDevice.CPU)],
        optimizer=getattr(EmbOptimType, name),
        learning_rate=float(learning_rate),
        pooling_mode=PoolingMode.NONE,
    )
state = {
    name: sum(s.numel() * s.element_size() for s in t.split_optimizer_states()[0])
    for name, t in tables.items()
}
print(json.dumps({"state_bytes": state, "torch": torch.__version__,
                  "fbgemm_gpu": fbgemm_gpu.__version__}), flush=True)
step = 0
for line in sys.stdin:
    name, count = line.split()
    times = []
    for _ in range(int(count)):
        ids = batches[step % len(batches)]
        step += 1
        start = time.perf_counter()
        tables[name](ids, offsets).backward(gradient)
        times.append((time.perf_counter() - start) * 1e3)
    print(json.dumps(times), flush=True)
"""


def _zipf_ids(rows: int, ids: int, batches: int) -> np.ndarray:
    """Zipf(1.05) over the table's rows: row k (from 0) drawn with
    probability ∝ (k + 1)^-1.05 (16,384 of 1,000,000 rows: about 6,850
    distinct)."""
    rng = np.random.default_rng(0)
    weights = np.arange(1, rows + 1, dtype=np.float64) ** -1.05
    return rng.choice(rows, size=(batches, ids), p=weights / weights.sum()).astype(
        "int32"
    )


def _model(rows: int, label: str) -> Any:
    optimizer = getattr(teo.optimizers, label)(LEARNING_RATE)
    ids = keras.Input((), dtype="int32")
    layer = teo.layers.Embedding(rows, DIM, optimizer=optimizer, name="table")
    model = keras.Model(ids, layer(ids))
    # A loss whose gradient needs the looked-up rows, as a model's does.
    model.compile(optimizer="sgd", loss="mse")
    return model


def _state_bytes(model: Any) -> int:
    """The bytes of the table's optimizer slots, from their variables."""
    layer = model.get_layer("table")
    return sum(
        int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in layer.slots.values()
    )


class _FbgemmChild:
    """FBGEMM's tables in a child process of `python`, stepped on request."""

    def __init__(self, python: str, ids_path: str, rows: int) -> None:
        self._process = subprocess.Popen(
            [python, "-c", _FBGEMM_CHILD, ids_path, str(rows), str(DIM)]
            + [str(LEARNING_RATE)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.info = json.loads(self._ask(" ".join(FBGEMM.values())))

    def _ask(self, line: str) -> str:
        self._process.stdin.write(line + "\n")
        self._process.stdin.flush()
        answer = self._process.stdout.readline()
        if not answer:
            raise RuntimeError(f"the FBGEMM child ended ({self._process.wait()})")
        return answer

    def steps_ms(self, label: str, steps: int) -> List[float]:
        return json.loads(self._ask(f"{FBGEMM[label]} {steps}"))

    def close(self) -> None:
        self._process.stdin.close()
        self._process.wait(timeout=60)


def _steps_ms(model: Any, batches: np.ndarray, steps: int, start: int) -> List[float]:
    labels = np.full((batches.shape[1], DIM), 0.01, "float32")
    times = []
    for index in range(start, start + steps):
        batch = batches[index % len(batches)]
        begin = time.perf_counter()
        model.train_on_batch(batch, labels)
        times.append((time.perf_counter() - begin) * 1e3)
    return times


def _fbgemm(options: Any, ids_path: str) -> Optional[_FbgemmChild]:
    if not options.fbgemm_python:
        print("FBGEMM: not run (no --fbgemm-python)")
        return None
    child = _FbgemmChild(options.fbgemm_python, ids_path, options.rows)
    print(
        f"FBGEMM: fbgemm_gpu {child.info['fbgemm_gpu']}, torch "
        f"{child.info['torch']}, one thread"
    )
    return child


def _measure(options: Any, batches: np.ndarray, fbgemm: Any) -> Dict[str, Any]:
    """Each variant's step times (ms) and optimizer state bytes."""
    models, state = {}, {}
    for label in FBGEMM:
        models[label] = _model(options.rows, label)
        state[label] = _state_bytes(models[label])
    if fbgemm is not None:
        for label in FBGEMM:
            state[f"FBGEMM {label}"] = fbgemm.info["state_bytes"][FBGEMM[label]]
    times: Dict[str, List[float]] = {name: [] for name in state}
    for label in FBGEMM:  # warm-up
        _steps_ms(models[label], batches, options.warmup, 0)
        if fbgemm is not None:
            fbgemm.steps_ms(label, options.warmup)
    for round_ in range(options.rounds):
        start = options.warmup + round_ * options.steps
        for label in FBGEMM:
            times[label] += _steps_ms(models[label], batches, options.steps, start)
            if fbgemm is not None:
                times[f"FBGEMM {label}"] += fbgemm.steps_ms(label, options.steps)
    return {"times": times, "state": state}


def _report(measured: Dict[str, Any]) -> None:
    medians = {k: statistics.median(v) for k, v in measured["times"].items()}
    reference = medians.get("FBGEMM RowWiseAdagrad")
    print(
        "| step | median ms | / FBGEMM row-wise | / package Adagrad | "
        "optimizer state bytes |"
    )
    print("|---|--:|--:|--:|--:|")
    for name, median in medians.items():
        versus = f"{median / reference:.2f}" if reference else "n/a"
        print(
            f"| {name} | {median:.2f} | {versus} | "
            f"{median / medians['Adagrad']:.2f} | {measured['state'][name]:,} |"
        )


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--ids", type=int, default=16_384)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument(
        "--fbgemm-python",
        default=None,
        help="a Python with torch and fbgemm-gpu-cpu (FBGEMM's side is left "
        "out without it)",
    )
    round_robin.add_allocator_option(parser)
    options = parser.parse_args(argv)
    settings = round_robin.set_allocator(options)
    print(
        f"# {os.cpu_count()} cores; keras {keras.__version__} on "
        f"{keras.backend.backend()}; {options.rows:,} x {DIM} table, "
        f"{options.ids:,} Zipf(1.05) ids a step; host allocator: {settings}"
    )
    batches = _zipf_ids(options.rows, options.ids, 16)
    distinct = statistics.mean(len(np.unique(b)) for b in batches)
    print(f"distinct ids a step: {distinct:,.0f}")
    with tempfile.TemporaryDirectory() as directory:
        ids_path = os.path.join(directory, "ids.npy")
        np.save(ids_path, batches)
        fbgemm = _fbgemm(options, ids_path)
        try:
            measured = _measure(options, batches, fbgemm)
        finally:
            if fbgemm is not None:
                fbgemm.close()
    _report(measured)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
