"""Benchmark of a training step with `tf_tpu_embed_opt.layers.Embedding` (#26).

The issue's model, as a new user writes it: ids -> Embedding(rows, 64) ->
mean -> Dense(1), trained with `model.train_on_batch` on 4,096 Zipf ids per
step (batch 256 x 16), dense layers with `keras.optimizers.Adam`. Each
configuration is timed in this process: after a compile call and `--warmup`
steps, `--steps` steps one at a time (`time.perf_counter`, the outputs
fetched), and the median is reported, with ratios:

- the row-sparse layer at N rows over the same layer at 10k rows (goal: at
  most 1.5 at 1M and 10M rows);
- `keras.layers.Embedding` with Keras's own optimizer at N rows over the
  row-sparse layer at N rows (goal: at least 20 at 1M rows).

Before timing, the harness checks that the table moved only in the rows the
batch looked up. `--only LABEL:ROWS[:keras|:twin]` times one configuration in
its own process and prints the process's maximum resident set
(`resource.getrusage`) with it; `:twin` is `keras.layers.Embedding` with the
twin as the model's optimizer (on TensorFlow, the `tf.IndexedSlices` path).
`BENCH_JIT=0` or `1` sets `model.compile(jit_compile=...)` (default "auto").

Run from the repository root:

    KERAS_BACKEND=jax python -m benchmarks.row_sparse_embedding [--quick]
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import time
from typing import Any, Callable, Dict, List, Tuple

os.environ.setdefault("KERAS_BACKEND", "jax")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import tf_tpu_embed_opt as teo  # noqa: E402

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


def _time(rows: int, label: str, mode: str, steps: int, warmup: int) -> float:
    model, layer = _model(rows, label, mode)
    batches = _zipf_ids(rows, steps + warmup + 1)
    y = np.ones((BATCH, 1), "float32")
    before = keras.ops.convert_to_numpy(layer.embeddings.value)[:1000].copy()
    model.train_on_batch(batches[0], y)
    if mode == "layer":
        after = keras.ops.convert_to_numpy(layer.embeddings.value)[:1000]
        looked_up = np.zeros(1000, bool)
        looked_up[np.unique(batches[0][batches[0] < 1000])] = True
        moved = (after != before).any(axis=1)
        assert not moved[~looked_up].any(), "a row that was not looked up moved"
    for batch in batches[1 : 1 + warmup]:
        model.train_on_batch(batch, y)
    times = []
    for batch in batches[1 + warmup :]:
        start = time.perf_counter()
        model.train_on_batch(batch, y)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10k and 1M rows")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--only",
        default=None,
        help="one configuration: LABEL:ROWS[:keras|:twin] (default: the layer)",
    )
    options = parser.parse_args(argv)
    print(
        f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"keras {keras.__version__} on {keras.backend.backend()}"
    )
    if options.only:
        label, rows, *mode = options.only.split(":")
        mode = mode[0] if mode else "layer"
        ms = 1e3 * _time(int(rows), label, mode, options.steps, options.warmup)
        print(f"{options.only}: {ms:.2f} ms, peak RSS {_peak_mib():.0f} MiB")
        return 0
    sizes = (10_000, 1_000_000) if options.quick else (10_000, 1_000_000, 10_000_000)
    print(
        "| optimizer | rows | row-sparse ms | vs 10k | keras.layers.Embedding ms | "
        "Keras / row-sparse |"
    )
    print("|---|--:|--:|--:|--:|--:|")
    for label in OPTIMIZERS:
        base = None
        for rows in sizes:
            ours = _time(rows, label, "layer", options.steps, options.warmup)
            base = base or ours
            theirs = ""
            ratio = ""
            if rows == 1_000_000:
                keras_ms = _time(rows, label, "keras", max(5, options.steps // 4), 1)
                theirs = f"{1e3 * keras_ms:.1f}"
                ratio = f"{keras_ms / ours:.1f}x"
            print(
                f"| {label} | {rows:,} | {1e3 * ours:.2f} | {ours / base:.2f}x | "
                f"{theirs} | {ratio} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
