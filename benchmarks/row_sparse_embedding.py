"""Benchmark of a training step with `tf_tpu_embed_opt.layers.Embedding` (#26).

The issue's model, as a new user writes it: ids -> Embedding(rows, 64) ->
mean -> Dense(1), trained with `model.train_on_batch` on 4,096 Zipf ids per
step (batch 256 x 16), dense layers with `keras.optimizers.Adam`. Each
configuration is timed in this process: after a compile call and `--warmup`
steps, `--steps` steps one at a time (`time.perf_counter`, the outputs
fetched), and the median is reported, with ratios:

- the row-sparse layer at N rows over the same layer at 10k rows (goal: at
  most 1.5 at 1M and 10M rows);
- on JAX, `keras.layers.Embedding` with Keras's own optimizer at N rows over
  the row-sparse layer at N rows (goal: at least 20 at 1M rows);
- on TensorFlow, `keras.layers.Embedding` with the twin as the model's
  optimizer (the `tf.IndexedSlices` path) over the layer (goal: the layer
  takes at most 1.2x as long, i.e. a ratio of at least 0.83);
- memory (Linux): the resident set after the warm-up over the resident set
  before the model was built ("resident": the table, its slots, compiled
  code and whatever building left behind), and how far the timed steps' peak
  rises above it ("a step adds": `/proc/self/clear_refs` resets the peak,
  `VmHWM` reads it), against the bytes of the table and its slots (goal: a
  step adds what the batch needs, not a table). In one process a model
  reuses memory an earlier one freed; `--only` gives each its own.

Before timing, the harness checks that the table moved only in the rows the
batch looked up. `--only LABEL:ROWS[:keras|:twin]` times one configuration in
its own process and prints its memory and the process's maximum resident set
(`resource.getrusage`) with it; `:twin` is `keras.layers.Embedding` with the
twin as the model's optimizer (on TensorFlow, the `tf.IndexedSlices` path).
`BENCH_JIT=0` or `1` sets `model.compile(jit_compile=...)` (default "auto").

Run from the repository root:

    KERAS_BACKEND=jax python -m benchmarks.row_sparse_embedding [--quick]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import platform
import resource
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Tuple

os.environ.setdefault("KERAS_BACKEND", "jax")

import keras  # noqa: E402
import numpy as np  # noqa: E402

if __package__ in (None, ""):
    # Run as a file (`python benchmarks/row_sparse_embedding.py`): `benchmarks` is the
    # checkout's folder, which Python does not put on the path then.
    sys.path.append(str(pathlib.Path(__file__).resolve().parent.parent))

import tf_tpu_embed_opt as teo  # noqa: E402
from benchmarks import memory, round_robin  # noqa: E402

DIM = 64
JIT = os.environ.get("BENCH_JIT", "auto")
JIT = JIT if JIT == "auto" else JIT == "1"
BATCH, IDS_PER_ROW = 256, 16  # 4,096 ids per step

OPTIMIZERS: Dict[str, Tuple[Callable[[], Any], Callable[[], Any]]] = {
    # label: (the layer's table optimizer, Keras's own for keras.layers.Embedding)
    "Adagrad": (
        lambda: teo.optimizers.Adagrad(0.05),
        lambda: keras.optimizers.Adagrad(0.05),
    ),
    "lazy Adam": (
        lambda: teo.optimizers.Adam(0.001, lazy=True),
        lambda: keras.optimizers.Adam(0.001),
    ),
}


def _zipf_ids(rows: int, steps: int, seed: int = 0) -> List[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [
        ((rng.zipf(1.2, size=(BATCH, IDS_PER_ROW)) - 1) % rows).astype("int32")
        for _ in range(steps)
    ]


def _model(rows: int, label: str, mode: str) -> Tuple[Any, Any]:
    keras.utils.set_random_seed(0)
    ids = keras.Input((IDS_PER_ROW,), dtype="int32")
    table_optimizer, stock = OPTIMIZERS[label]
    if mode == "layer":
        layer = teo.layers.Embedding(rows, DIM, optimizer=table_optimizer())
        dense_optimizer = keras.optimizers.Adam(0.001)
    else:
        layer = keras.layers.Embedding(rows, DIM)
        # "twin": the twin as the model's optimizer, which on TensorFlow
        # steps the tf.IndexedSlices rows (the path before the layer).
        dense_optimizer = stock() if mode == "keras" else table_optimizer()
    pooled = keras.layers.GlobalAveragePooling1D()(layer(ids))
    model = keras.Model(ids, keras.layers.Dense(1)(pooled))
    model.compile(optimizer=dense_optimizer, loss="mse", jit_compile=JIT)
    return model, layer


def _time(
    rows: int, label: str, mode: str, steps: int, warmup: int
) -> Tuple[float, float, float]:
    """The median step in seconds; the resident set after the warm-up over
    the one before the model, and the steps' peak over the former, in MiB
    (NaN where the peak cannot be reset)."""
    baseline = memory.resident_mib("VmRSS")
    model, layer = _model(rows, label, mode)
    batches = _zipf_ids(rows, steps + warmup + 1)
    y = np.ones((BATCH, 1), "float32")
    # The first rows only: a copy of the whole table would count in the peak.
    before = keras.ops.convert_to_numpy(layer.embeddings.value[:1000])
    model.train_on_batch(batches[0], y)
    if mode == "layer":
        after = keras.ops.convert_to_numpy(layer.embeddings.value[:1000])
        looked_up = np.zeros(1000, bool)
        looked_up[np.unique(batches[0][batches[0] < 1000])] = True
        moved = (after != before).any(axis=1)
        assert not moved[~looked_up].any(), "a row that was not looked up moved"
    for batch in batches[1 : 1 + warmup]:
        model.train_on_batch(batch, y)
    times = []
    with memory.PeakAbove() as peak:
        for batch in batches[1 + warmup :]:
            start = time.perf_counter()
            model.train_on_batch(batch, y)
            times.append(time.perf_counter() - start)
    return statistics.median(times), peak.resident - baseline, peak.added


def _state_mib(rows: int, label: str) -> float:
    """The table and its slots, in MiB."""
    slots = len(OPTIMIZERS[label][0]().slot_table())
    return (1 + slots) * rows * DIM * 4 / 2**20


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10k and 1M rows")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--only",
        default=None,
        help="one configuration: LABEL:ROWS[:keras|:twin] (default: the layer)",
    )
    round_robin.add_allocator_option(parser)
    options = parser.parse_args(argv)
    print(
        f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"keras {keras.__version__} on {keras.backend.backend()}; host "
        f"allocator: {round_robin.set_allocator(options)}"
    )
    if options.only:
        label, rows, *mode = options.only.split(":")
        mode = mode[0] if mode else "layer"
        seconds, resident, added = _time(
            int(rows), label, mode, options.steps, options.warmup
        )
        print(
            f"{options.only}: {1e3 * seconds:.2f} ms; resident {resident:.0f} "
            f"MiB, a step adds {added:.1f} MiB (table and slots "
            f"{_state_mib(int(rows), label):.0f} MiB); process peak RSS "
            f"{_peak_mib():.0f} MiB"
        )
        return 0
    sizes = (
        (10_000, 1_000_000)
        if options.quick
        else (10_000, 100_000, 1_000_000, 4_000_000, 10_000_000)
    )
    # On TensorFlow the reference is today's tf.IndexedSlices path; on JAX,
    # keras.layers.Embedding with Keras's own optimizer.
    reference = "twin" if keras.backend.backend() == "tensorflow" else "keras"
    print(
        "| optimizer | rows | row-sparse ms | vs 10k | table + slots MiB | "
        f"resident MiB | a step adds MiB | {reference} ms | {reference} / row-sparse |"
    )
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|")
    for label in OPTIMIZERS:
        base = None
        for rows in sizes:
            ours, resident, added = _time(
                rows, label, "layer", options.steps, options.warmup
            )
            base = base or ours
            theirs = ""
            ratio = ""
            if rows == 1_000_000:
                steps = max(5, options.steps // 4)
                reference_s, _, _ = _time(rows, label, reference, steps, 1)
                theirs = f"{1e3 * reference_s:.1f}"
                ratio = f"{reference_s / ours:.2f}x"
            print(
                f"| {label} | {rows:,} | {1e3 * ours:.2f} | {ours / base:.2f}x | "
                f"{_state_mib(rows, label):.0f} | {resident:.0f} | {added:.1f} | "
                f"{theirs} | {ratio} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
