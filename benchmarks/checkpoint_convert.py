"""Cost of moving a table with its optimizer state between layouts (issue #10).

One Adam table (`rows x dim` float32 plus its `momenta` and `velocities`) is
written in the `TPUEmbedding` checkpoint layout. Then, one after the other and
`--repeats` times each (the minimum is reported):

- `baseline`: TensorFlow's own reader and writer move the same bytes: the
  three tensors read with `tf.train.load_checkpoint(...).get_tensor` and
  written with one `tf.raw_ops.SaveV2` (what any conversion must at least do).
- `convert`: `tf-tpu-embed-opt checkpoint convert` (`TPUCheckpointReader` ->
  `write_tpu_checkpoint`, another object path), with its atomic write.
- `to_keras`: `load_into_keras` into a `keras.Variable` and the slots of the
  `to_keras` Adam twin, with the default verification read (`verify=True`);
  `to_keras_noverify` without it.
- `from_keras`: `save_tpu_checkpoint` of that variable and twin.

Each run is timed in a fresh process (set-up excluded), round-robin; ratios
are to `baseline`; the target of the issue is `convert` <= 2x. Files go to
`--directory` (default: a temporary directory, removed afterwards); the OS
page cache is warm for every run alike.

Run from the repository root:

    python -m benchmarks.checkpoint_convert [--quick]
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

import keras
import numpy as np
import tensorflow as tf

import tf_tpu_embed_opt as teo
from tf_tpu_embed_opt import checkpoints
from tf_tpu_embed_opt.checkpoints.keras import state as keras_state

FULL = (4 * 2**20, 64)
QUICK = (64 * 2**10, 64)


def _source(directory: str, rows: int, dim: int) -> str:
    """An Adam table in the TPUEmbedding layout, written chunk-free."""
    rng = np.random.default_rng(0)
    state = {
        "parameters": rng.standard_normal((rows, dim), np.float32),
        "momenta": rng.standard_normal((rows, dim), np.float32),
        "velocities": rng.random((rows, dim), np.float32),
    }
    prefix = checkpoints.write_checkpoint(
        os.path.join(directory, "source", "ckpt"), [("table", state)]
    )
    del state
    gc.collect()
    return prefix


def _baseline(source: str, directory: str) -> None:
    reader = tf.train.load_checkpoint(source)
    keys = sorted(
        k for k in reader.get_variable_to_shape_map() if k.startswith("embedding/")
    )
    tensors = [reader.get_tensor(k) for k in keys]
    tf.raw_ops.SaveV2(
        prefix=os.path.join(directory, "baseline", "ckpt"),
        tensor_names=keys,
        shape_and_slices=[""] * len(keys),
        tensors=tensors,
    )


def _convert(source: str, directory: str) -> None:
    reader = checkpoints.TPUCheckpointReader(source)
    checkpoints.write_checkpoint(
        os.path.join(directory, "convert", "ckpt"),
        ((name, reader.read(name)) for name in reader.tables),
        object_path="model/tpu_embedding",
    )


def _keras_target(rows: int, dim: int):
    variable = keras.Variable(np.zeros((rows, dim), np.float32), name="table")
    twin = teo.to_keras(teo.embedding.Adam(0.001))
    twin.build([variable])
    return variable, twin


def _timed(name: str, source: str, directory: str, rows: int, dim: int) -> float:
    """Seconds of one run of `name`, set-up (Keras variables) excluded."""
    if name == "baseline":
        job = lambda: _baseline(source, directory)  # noqa: E731
    elif name == "convert":
        job = lambda: _convert(source, directory)  # noqa: E731
    elif name in ("to_keras", "to_keras_noverify"):
        variable, twin = _keras_target(rows, dim)
        job = lambda: keras_state.load_into_keras(  # noqa: E731
            source, {"table": variable}, twin, verify=name == "to_keras"
        )
    else:
        variable, twin = _keras_target(rows, dim)
        keras_state.load_into_keras(source, {"table": variable}, twin, verify=False)
        job = lambda: keras_state.save_tpu_checkpoint(  # noqa: E731
            os.path.join(directory, "from_keras", "ckpt"), {"table": variable}, twin
        )
    gc.collect()
    start = time.perf_counter()
    job()
    return time.perf_counter() - start


RUNS = ("baseline", "convert", "to_keras", "to_keras_noverify", "from_keras")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="64K x 64 instead of 4M x 64."
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--directory", help="Where to write (default: a temporary one)."
    )
    parser.add_argument("--run", choices=("source", *RUNS), help=argparse.SUPPRESS)
    parser.add_argument("--source", help=argparse.SUPPRESS)
    args = parser.parse_args()
    rows, dim = QUICK if args.quick else FULL
    if args.run == "source":
        print(_source(args.directory, rows, dim))
        return
    if args.run:
        # One measurement in a fresh process, so that no run pays for the
        # memory another one left fragmented.
        print(_timed(args.run, args.source, args.directory, rows, dim))
        return
    directory = args.directory or tempfile.mkdtemp(prefix="checkpoint_convert-")
    os.makedirs(directory, exist_ok=True)
    size = ["--quick"] if args.quick else []

    def child(*arguments: str) -> str:
        command = [sys.executable, "-m", "benchmarks.checkpoint_convert"]
        command += [*arguments, f"--directory={directory}", *size]
        result = subprocess.run(command, check=True, capture_output=True, text=True)
        return result.stdout.strip().splitlines()[-1]

    try:
        source = child("--run=source")
        times: Dict[str, List[float]] = {name: [] for name in RUNS}
        # Round-robin, so that load from other processes spreads over all runs.
        for _ in range(args.repeats):
            for name in RUNS:
                times[name].append(float(child(f"--run={name}", f"--source={source}")))
        moved = 3 * rows * dim * 4
        base = min(times["baseline"])
        print(
            f"Adam table {rows:,} x {dim} (table + 2 slots = {moved / 2**30:.2f} "
            f"GiB), min of {args.repeats}, TensorFlow {tf.__version__}, "
            f"{os.cpu_count()} CPUs"
        )
        print(f"{'run':<20}{'seconds':>10}{'GiB/s':>8}{'ratio':>8}")
        for name, values in times.items():
            best = min(values)
            rate = moved / 2**30 / best
            print(f"{name:<20}{best:>10.2f}{rate:>8.2f}{best / base:>8.2f}")
    finally:
        if not args.directory:
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
