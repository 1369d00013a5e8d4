"""Cost of moving JAX TPU tables with their slots between topologies (issue #27).

A jax-tpu-embedding checkpoint step of a job of 2 devices x 4 SparseCores
holds one stack of two Adam tables (`rows / 2 x dim` float32 each, with
`momentum` and `velocity`). Then, one after the other and `--repeats` times
each, each in a fresh process (the minimum is reported):

- `restore`: orbax's own restore of the stack's three arrays (the model
  item, as NumPy arrays): what any reader must at least do.
- `read`: `jax_orbax.read_jax_tables`, every table and slot unstacked and
  unsharded, one array at a time.
- `restore_save`: orbax's own restore of the item and save of it as a new
  step: what any conversion must at least do.
- `convert`: `checkpoint convert STEP DST --to-jax 4x2` (read, retarget the
  spec, restack for 8 SparseCores of 2 per device, write with the dense
  items carried over, atomically).
- `to_keras`: `load_into_keras` of the step into `keras.Variable`s and the
  slots of the Adam twin (with its verification read).

Ratios: `read` and `to_keras` to `restore`, `convert` to `restore_save`; the
goal of the issue is within 2x of orbax's own restore of the same arrays.
Files go to `--directory` (default: a temporary one, removed afterwards);
the OS page cache is warm for every run alike. No TensorFlow is needed.

Run from the repository root:

    KERAS_BACKEND=jax python -m benchmarks.jax_checkpoint_convert [--quick]
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

import numpy as np

FULL = (2 * 2**20, 64)
QUICK = (64 * 2**10, 64)
SLOTS = {"momenta": "momentum", "velocities": "velocity"}


def _source(directory: str, rows: int, dim: int) -> str:
    """The job's step: two Adam tables stacked, 2 devices x 4 SparseCores."""
    from tf_tpu_embed_opt import checkpoints
    from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import (
        writer as jax_orbax_writer,
    )

    rng = np.random.default_rng(0)
    tables = {"items": (rows // 2, dim), "users": (rows - rows // 2, dim)}
    spec = jax_orbax_writer.embedding_spec_for(
        tables,
        num_devices=2,
        sparsecores_per_device=4,
        stacks={"items_users": ["items", "users"]},
    )
    states = (
        (
            name,
            {
                "parameters": rng.standard_normal(shape, np.float32),
                "momenta": rng.standard_normal(shape, np.float32),
                "velocities": rng.random(shape, np.float32),
            },
        )
        for name, shape in tables.items()
    )
    return checkpoints.write_checkpoint(
        os.path.join(directory, "source"),
        states,
        format="jax-tpu-embedding",
        step=1000,
        embedding_spec=spec,
        algorithms=dict.fromkeys(tables, "Adam"),
    )


def _restore(step: str) -> dict:
    """Orbax's own restore of the whole model item, as NumPy arrays."""
    import orbax.checkpoint as ocp

    directory = os.path.join(step, "model")
    checkpointer = ocp.PyTreeCheckpointer()
    tree = checkpointer.metadata(directory).item_metadata.tree
    import jax

    restore_args = jax.tree_util.tree_map(
        lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree
    )
    return checkpointer.restore(
        directory, args=ocp.args.PyTreeRestore(item=tree, restore_args=restore_args)
    )


def _restore_save(step: str, directory: str) -> None:
    import orbax.checkpoint as ocp

    tree = _restore(step)
    manager = ocp.CheckpointManager(os.path.join(directory, "restore_save"))
    manager.save(1000, args=ocp.args.Composite(model=ocp.args.StandardSave(tree)))
    manager.wait_until_finished()
    manager.close()


def _to_keras(step: str) -> float:
    """Seconds of `load_into_keras` (the Keras variables made beforehand)."""
    import keras

    import tf_tpu_embed_opt as teo
    from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import reader as jax_orbax
    from tf_tpu_embed_opt.checkpoints.keras import state as keras_state

    reader = jax_orbax.JaxCheckpointReader(step)
    variables = {
        name: keras.Variable(np.zeros(info.shape, np.float32), name=name)
        for name, info in reader.tables.items()
    }
    twin = teo.optimizers.Adam(0.001, lazy=True)
    twin.build(list(variables.values()))
    gc.collect()
    start = time.perf_counter()
    keras_state.load_into_keras(reader, variables, twin)
    return time.perf_counter() - start


def _timed(name: str, step: str, directory: str) -> float:
    """Seconds of one run of `name`."""
    import orbax.checkpoint  # noqa: F401 - every run's imports before the clock

    if name == "to_keras":
        return _to_keras(step)
    if name == "restore":
        job = lambda: _restore(step)  # noqa: E731
    elif name == "read":
        from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import reader as jax_orbax

        job = lambda: jax_orbax.read_jax_tables(step)  # noqa: E731
    elif name == "restore_save":
        # A step that exists already would not be saved again.
        shutil.rmtree(os.path.join(directory, "restore_save"), ignore_errors=True)
        job = lambda: _restore_save(step, directory)  # noqa: E731
    else:
        # The modules convert loads on first use, loaded before the clock.
        from tf_tpu_embed_opt import cli
        from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import reader as jax_orbax  # noqa: F401
        from tf_tpu_embed_opt.cli import checkpoint  # noqa: F401

        target = os.path.join(directory, "convert")
        shutil.rmtree(target, ignore_errors=True)
        command = ["checkpoint", "convert", step, target, "--to-jax", "4x2"]
        job = lambda: cli.main(command)  # noqa: E731
    gc.collect()
    start = time.perf_counter()
    job()
    return time.perf_counter() - start


RUNS = ("restore", "read", "to_keras", "restore_save", "convert")
BASE = {"read": "restore", "to_keras": "restore", "convert": "restore_save"}


def measure(quick: bool, repeats: int, directory: str) -> Dict[str, List[float]]:
    """Seconds of each run, `repeats` times, round-robin, in fresh processes."""
    size = ["--quick"] if quick else []

    def child(*arguments: str) -> str:
        command = [sys.executable, "-m", "benchmarks.jax_checkpoint_convert"]
        command += [*arguments, f"--directory={directory}", *size]
        env = dict(os.environ, KERAS_BACKEND=os.environ.get("KERAS_BACKEND", "jax"))
        result = subprocess.run(
            command, check=True, capture_output=True, text=True, env=env
        )
        return result.stdout.strip().splitlines()[-1]

    step = child("--run=source")
    times: Dict[str, List[float]] = {name: [] for name in RUNS}
    for _ in range(repeats):
        for name in RUNS:
            times[name].append(float(child(f"--run={name}", f"--step={step}")))
    return times


def report(times: Dict[str, List[float]], rows: int, dim: int) -> str:
    moved = 3 * rows * dim * 4
    lines = [
        f"Adam stack {rows:,} x {dim} (2 tables; table + 2 slots = "
        f"{moved / 2**30:.2f} GiB), 2x4 -> 4x2 SparseCores, min of "
        f"{len(times['restore'])}, {os.cpu_count()} CPUs",
        f"{'run':<14}{'seconds':>10}{'GiB/s':>8}{'ratio':>8}  to",
    ]
    for name, values in times.items():
        best = min(values)
        base = BASE.get(name)
        ratio = f"{best / min(times[base]):>8.2f}  {base}" if base else f"{'':>8}"
        lines.append(f"{name:<14}{best:>10.2f}{moved / 2**30 / best:>8.2f}{ratio}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="64K x 64 instead of 2M x 64."
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--directory", help="Where to write (default: a temporary one)."
    )
    parser.add_argument("--run", choices=("source", *RUNS), help=argparse.SUPPRESS)
    parser.add_argument("--step", help=argparse.SUPPRESS)
    args = parser.parse_args()
    rows, dim = QUICK if args.quick else FULL
    if args.run == "source":
        print(_source(args.directory, rows, dim))
        return
    if args.run:
        print(_timed(args.run, args.step, args.directory))
        return
    directory = args.directory or tempfile.mkdtemp(prefix="jax_checkpoint_convert-")
    os.makedirs(directory, exist_ok=True)
    try:
        print(report(measure(args.quick, args.repeats, directory), rows, dim))
    finally:
        if not args.directory:
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
