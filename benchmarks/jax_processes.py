"""A table split over JAX processes: the step against one process, and a
table larger than one process's memory (issue #40).

The job is the guide's ("Training across processes on JAX",
docs/guides/jax-processes.md) with one table: a row-sparse
`tf_tpu_embed_opt.layers.Embedding` with the engine's Adagrad, split by rows
over every device of every process (`keras.distribution`, the `model` mesh
axis), fed a batch of Zipf ids, stepped by a jitted step that donates the
state (so the table and its slot are updated in place), processes joined on
127.0.0.1 with gloo collectives.

- **Step** (`--step`): the same job as 1 process of 2 CPU devices and as 2
  processes of 1 device each, alternated round by round; reported: the
  median ms/step of each (process 0's clock, outputs fetched) and their
  ratio. On one 2-core machine the two processes share its cores, so the
  ratio is the cost of going through gloo and the coordination service,
  not a speed-up.
- **Memory** (`--memory`): a table of `--table-gib` GiB (and its Adagrad
  slot as large) over `--processes` processes of 1 device, each capped at
  `--memory-gib` GiB by a memory cgroup (v1 or v2; uncapped, and said so,
  where none can be made). Each process initializes its rows only (Keras
  shards an initializer that large at creation), trains `--steps` steps,
  saves the step with orbax (each process its rows), restores it and
  compares its rows. Reported per process: whether it finished, its peak
  resident memory and the cgroup's peak, and the times.

Run from the repository root (no TensorFlow needed):

    KERAS_BACKEND=jax python -m benchmarks.jax_processes --step
    KERAS_BACKEND=jax python -m benchmarks.jax_processes --memory \\
        --table-gib 3 --processes 4 --memory-gib 2.5
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

if __package__ in (None, ""):
    # Run as a file (`python benchmarks/jax_processes.py`): `benchmarks` is the
    # checkout's folder, which Python does not put on the path then.
    sys.path.append(str(pathlib.Path(__file__).resolve().parent.parent))

from benchmarks.jax_table_larger_than_memory import _cgroup  # noqa: E402

DIM = 64
BATCH, FEATURES = 4096, 8
# A run's bound (starting, steps, saving and restoring included).
BOUND_SECONDS = 1800


def child(settings: Dict[str, Any]) -> None:
    """One process of the job; writes its measurements to
    `settings["out"].<process>.json`."""
    import jax

    process, processes = settings["process"], settings["processes"]
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if processes > 1:
        jax.distributed.initialize(settings["coordinator"], processes, process)
    import keras

    measured: Dict[str, Any] = {"resident_after_start": _resident()}
    started = time.perf_counter()
    net, mesh = _model(settings)
    dense = keras.optimizers.SGD(1.0)
    dense.build(net.trainable_variables)
    trainable = [v.value for v in net.trainable_variables]
    non_trainable = [v.value for v in net.non_trainable_variables]
    state = [v.value for v in dense.variables]
    jax.block_until_ready(trainable)
    measured["init_seconds"] = time.perf_counter() - started
    measured["resident_after_init"] = _resident()
    times, trainable = _steps(
        settings, net, mesh, dense, (trainable, non_trainable, state)
    )
    measured["resident_after_steps"] = _resident()
    # The first steps compile.
    measured["step_ms"] = [1000 * t for t in times[2:]]
    measured["local_rows"] = sum(
        s.data.shape[0] for s in trainable[0].addressable_shards
    )
    if settings.get("directory"):
        import orbax.checkpoint as ocp

        paths = [v.path for v in net.trainable_variables]
        arrays = {
            "table": trainable[paths.index("table/embeddings")],
            "slot": trainable[paths.index("table/accumulator")],
        }
        started = time.perf_counter()
        with ocp.StandardCheckpointer() as checkpointer:
            checkpointer.save(settings["directory"], arrays)
            checkpointer.wait_until_finished()
        measured["save_seconds"] = time.perf_counter() - started
        measured["resident_after_save"] = _resident()
        # This process's rows, to compare with what it restores, which it
        # restores in their place (the state dropped first).
        saved = {key: _digests(value) for key, value in arrays.items()}
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, arrays)
        del trainable, arrays
        started = time.perf_counter()
        with ocp.StandardCheckpointer() as checkpointer:
            restored = checkpointer.restore(settings["directory"], abstract)
        measured["restore_seconds"] = time.perf_counter() - started
        measured["resident_after_restore"] = _resident()
        measured["restored_equal"] = all(
            _digests(restored[key]) == saved[key] for key in saved
        )
    with open(f"{settings['out']}.{process}.json", "w") as handle:
        json.dump(measured, handle)


def _model(settings: Dict[str, Any]) -> Tuple[Any, Any]:
    """The one-table model, its table sharded by rows over every device of
    the job, and the job's device mesh."""
    import jax
    import keras

    import tf_tpu_embed_opt as teo

    keras.utils.set_random_seed(7)
    devices = np.array(jax.devices()).reshape(1, -1)
    mesh = keras.distribution.DeviceMesh(devices.shape, ("batch", "model"), devices)
    layout_map = keras.distribution.LayoutMap(mesh)
    layout_map["table/embeddings"] = ("model", None)
    keras.distribution.set_distribution(
        keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch")
    )
    ids = keras.Input((FEATURES,), dtype="int32")
    table = teo.layers.Embedding(
        settings["rows"],
        DIM,
        optimizer=teo.optimizers.Adagrad(0.05, epsilon=0.0),
        embeddings_initializer=(
            keras.initializers.RandomUniform(-0.05, 0.05, seed=1)
            if settings["initializer"] == "uniform"
            else settings["initializer"]
        ),
        out_of_range_ids="zeros",
        name="table",
    )
    return keras.Model(ids, table(ids)), mesh


def _steps(
    settings: Dict[str, Any], net: Any, mesh: Any, dense: Any, arrays: Tuple
) -> Tuple[List[float], List[Any]]:
    """Times `settings["steps"]` jitted steps that donate `arrays`
    (trainable, non-trainable, optimizer state); gives the seconds of each
    and the trainable arrays after them."""
    import jax
    from jax import sharding

    def loss(trainable, non_trainable, x, g):
        out, non_trainable = net.stateless_call(
            trainable, non_trainable, x, training=True
        )
        return (out * g).sum() / BATCH, non_trainable

    def step(trainable, non_trainable, state, x, g):
        grads, non_trainable = jax.grad(loss, has_aux=True)(
            trainable, non_trainable, x, g
        )
        trainable, state = dense.stateless_apply(state, grads, trainable)
        return trainable, non_trainable, state

    step = jax.jit(step, donate_argnums=(0, 1, 2))
    replicated = sharding.NamedSharding(mesh.backend_mesh, sharding.PartitionSpec())
    rows = settings["rows"]
    times = []
    for s in range(settings["steps"]):
        rng = np.random.default_rng([5, s])
        x = np.minimum(rng.zipf(1.2, (BATCH, FEATURES)) - 1, rows - 1).astype("int32")
        g = rng.standard_normal((BATCH, FEATURES, DIM)).astype("float32")
        x = jax.make_array_from_process_local_data(replicated, x)
        g = jax.make_array_from_process_local_data(replicated, g)
        begun = time.perf_counter()
        arrays = step(*arrays, x, g)
        jax.block_until_ready(arrays[0])
        times.append(time.perf_counter() - begun)
    return times, arrays[0]


def _digests(value: Any) -> List[str]:
    """A digest of each of this process's shards of `value`, in order."""
    return [
        hashlib.sha256(np.asarray(shard.data).tobytes()).hexdigest()
        for shard in sorted(value.addressable_shards, key=lambda s: str(s.index))
    ]


def _resident() -> int:
    """This process's peak resident bytes so far (`VmHWM`)."""
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run(
    processes: int,
    devices: int,
    rows: int,
    steps: int,
    directory: str,
    memory: Optional[int] = None,
    checkpoint: Optional[str] = None,
    initializer: str = "uniform",
) -> List[Dict[str, Any]]:
    """Runs the job as `processes` processes of `devices` CPU devices each;
    returns each process's measurements (and its cgroup's peak)."""
    out = os.path.join(directory, f"run-{time.monotonic_ns()}")
    coordinator = f"127.0.0.1:{_free_port()}"
    env = dict(
        os.environ,
        KERAS_BACKEND="jax",
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
    )
    children, groups = [], []
    for process in range(processes):
        settings = dict(
            process=process,
            processes=processes,
            coordinator=coordinator,
            rows=rows,
            steps=steps,
            out=out,
            directory=checkpoint,
            initializer=initializer,
        )
        command = [sys.executable, "-m", "benchmarks.jax_processes", "--child"]
        command.append(json.dumps(settings))
        group = _cgroup(memory, f"_{process}") if memory else None
        groups.append(group)
        joined = f"echo $$ > {group[0]}/cgroup.procs && " if group else ""
        quoted = " ".join("'" + part.replace("'", "'\\''") + "'" for part in command)
        children.append(
            subprocess.Popen(["sh", "-c", joined + "exec " + quoted], env=env)
        )
    deadline = time.monotonic() + BOUND_SECONDS
    try:
        for child_process in children:
            child_process.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    finally:
        for child_process in children:
            if child_process.poll() is None:
                os.kill(child_process.pid, signal.SIGKILL)
                child_process.wait()
    results = []
    for process, (child_process, group) in enumerate(zip(children, groups)):
        found: Dict[str, Any] = {"returncode": child_process.returncode}
        path = f"{out}.{process}.json"
        if os.path.exists(path):
            with open(path) as handle:
                found.update(json.load(handle))
        if group:
            with open(group[1]) as handle:
                found["cgroup_peak_bytes"] = int(handle.read())
            os.rmdir(group[0])
        found["capped"] = group is not None
        results.append(found)
    return results


def step_comparison(rows: int, steps: int, rounds: int, directory: str) -> None:
    medians: Dict[str, List[float]] = {"1x2": [], "2x1": []}
    for _ in range(rounds):
        for name, (processes, devices) in (("1x2", (1, 2)), ("2x1", (2, 1))):
            results = run(processes, devices, rows, steps, directory)
            if any(r["returncode"] != 0 for r in results):
                raise SystemExit(f"{name}: a process failed: {results}")
            medians[name].extend(results[0]["step_ms"])
    one, two = (float(np.median(medians[n])) for n in ("1x2", "2x1"))
    print(
        f"table {rows:,} x {DIM} float32, Adagrad; batch {BATCH} x {FEATURES} Zipf "
        f"ids; {rounds} rounds x {steps - 2} steps"
    )
    print(f"1 process x 2 devices:  {one:8.2f} ms/step")
    print(f"2 processes x 1 device: {two:8.2f} ms/step ({two / one:.2f}x)")


def memory_run(
    table_gib: float,
    processes: int,
    memory_gib: float,
    steps: int,
    initializers: List[str],
    directory: str,
) -> int:
    rows = int(table_gib * 2**30) // (DIM * 4)
    rows -= rows % processes
    gib = rows * DIM * 4 / 2**30
    failed = 0
    for initializer in initializers:
        checkpoint = os.path.join(directory, f"checkpoint-{initializer}")
        results = run(
            processes,
            1,
            rows,
            steps,
            directory,
            memory=int(memory_gib * 2**30),
            checkpoint=checkpoint,
            initializer=initializer,
        )
        capped = f"capped at {memory_gib:g} GiB" if results[0]["capped"] else "UNCAPPED"
        print(
            f"table {rows:,} x {DIM} float32 = {gib:.2f} GiB ({initializer} "
            f"initializer), its Adagrad slot as large; {processes} processes of "
            f"1 device, each {capped}"
        )
        for process, found in enumerate(results):
            phases = ", ".join(
                f"{key[len('resident_after_') :]} {value / 2**30:.2f}"
                for key, value in found.items()
                if key.startswith("resident_after_")
            )
            peak = found.get("cgroup_peak_bytes")
            cgroup = f"; cgroup peak {peak / 2**30:.2f} GiB" if peak else ""
            if found["returncode"] != 0 or "restored_equal" not in found:
                failed += 1
                print(
                    f"  process {process}: FAILED (exit {found['returncode']}); "
                    f"peak resident GiB after {phases or 'nothing'}{cgroup}"
                )
                continue
            print(
                f"  process {process}: {found['local_rows']:,} rows; init "
                f"{found['init_seconds']:.1f} s, step "
                f"{np.median(found['step_ms']):.1f} ms, save "
                f"{found['save_seconds']:.1f} s, restore "
                f"{found['restore_seconds']:.1f} s, rows restored equal: "
                f"{found['restored_equal']}; peak resident GiB after {phases}"
                f"{cgroup}"
            )
    return 1 if failed else 0


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--step", action="store_true")
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--table-gib", type=float, default=3.0)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--memory-gib", type=float, default=2.5)
    parser.add_argument(
        "--initializers",
        default="zeros,uniform",
        help="the table's initializers to run with --memory, comma-separated: "
        "'uniform' (keras.initializers.RandomUniform) or a Keras initializer name",
    )
    parser.add_argument("--directory")
    args = parser.parse_args(argv)
    if args.child:
        child(json.loads(args.child))
        return 0
    if not (args.step or args.memory):
        parser.error("give --step, --memory or both")
    directory = args.directory or tempfile.mkdtemp(prefix="teo-jax-processes-")
    try:
        if args.step:
            step_comparison(args.rows, args.steps, args.rounds, directory)
        if args.memory:
            return memory_run(
                args.table_gib,
                args.processes,
                args.memory_gib,
                args.steps,
                args.initializers.split(","),
                directory,
            )
    finally:
        if not args.directory:
            shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
