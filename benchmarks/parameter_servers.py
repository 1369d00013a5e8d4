"""Benchmark: a row-sparse step on a table sharded over 2 parameter servers (issue #14).

Compares, on this machine, one training step of an embedding table (lookup
of a batch of Zipf-distributed ids with `teo.sharded.lookup`, squared-error
loss, gradient, `tf_tpu_embed_opt.optimizers.Adagrad` update):

- `one process`: the unsharded table, the step a `tf.function` in this
  process;
- `2 servers`: the table under `ParameterServerStrategy` with
  `FixedShardsPartitioner(2)` over 2 in-process parameter servers on
  127.0.0.1, the step scheduled by a `ClusterCoordinator` on 1 worker (so the
  two run the same sequence of steps), all steps scheduled, then one wait
  (how parameter-server training runs);
- references on the same cluster, timed the same way: `TF on the servers`,
  the step written with TensorFlow's own pieces only (`tf.nn.embedding_lookup`
  on the `ShardedVariable`, `tape.gradient` with respect to the shards, the
  duplicate ids summed, TensorFlow's fused `ResourceSparseApplyAdagradV2` on
  each shard on its server): what a sparse Adagrad step costs on this runtime
  without the package; and `empty step`, a scheduled function that returns a
  constant on the worker: the coordinator's cost of any step.

Bytes moved per step are the TCP bytes of every connection whose server end
is a task of the cluster (`ss -ti`: `bytes_received` + `bytes_sent` on the
worker's and the servers' ports; TensorFlow's tensor transfers are pulled by
the receiver, so rows sent to a server travel on a connection to the
worker's port), over the pipelined steps, divided by the steps. They should
grow with the looked-up rows and not with the table: the harness runs two
table sizes and three batch sizes.

Times are medians of `--repeats` runs of `--steps` steps; results are ratios
of numbers measured in one process, one after the other.

    python -m benchmarks.parameter_servers [--quick]
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

DIM = 32


def _ids(rows: int, batch: int, steps: int, seed: int = 0) -> List[np.ndarray]:
    generator = np.random.default_rng(seed)
    # Zipf over the whole table, folded into range: duplicates and a long tail.
    return [(generator.zipf(1.2, batch) - 1) % rows for _ in range(steps)]


def _model(rows: int) -> Tuple[Any, Any]:
    import keras

    import tf_tpu_embed_opt as teo

    table = teo.sharded.Embedding(
        rows, DIM, embeddings_initializer=keras.initializers.RandomUniform(seed=1)
    )
    table.build((None,))
    optimizer = teo.optimizers.Adagrad(0.1)
    optimizer.build(table.trainable_variables)
    return table, optimizer


def _step_function(table: Any, optimizer: Any) -> Any:
    import tensorflow as tf

    import tf_tpu_embed_opt as teo

    def step(ids):
        with tf.GradientTape() as tape:
            # Row reads on both sides: `keras.layers.Embedding` on one
            # unsharded variable reads the whole table (1M x 32: ~1 s/step).
            rows = teo.sharded.lookup(table.embeddings, ids)
            loss = tf.reduce_sum(tf.square(rows - 1.0))
        variables = table.trainable_variables
        grads = teo.sharded.gradients(tape, loss, variables)
        optimizer.apply_gradients(zip(grads, variables))

    return step


def _reference_step_function(table: Any, optimizer: Any) -> Any:
    """The same step with TensorFlow's own lookup, gradient and fused kernel."""
    import tensorflow as tf

    import tf_tpu_embed_opt as teo

    shards = teo.sharded.shards_of(table.embeddings)
    accumulators = next(
        teo.sharded.shards_of(v)
        for v in optimizer.variables
        if v.shape == table.embeddings.shape
    )
    epsilon = float(optimizer.get_config()["epsilon"])

    def step(ids):
        with tf.GradientTape() as tape:
            tape.watch(shards)
            rows = tf.nn.embedding_lookup(table.embeddings.value, ids)
            loss = tf.reduce_sum(tf.square(rows - 1.0))
        for gradient, shard, accumulator in zip(
            tape.gradient(loss, shards), shards, accumulators
        ):
            # The fused kernel applies a repeated id once per occurrence;
            # the engine's (and the package's) rule sums them first.
            distinct, positions = tf.unique(gradient.indices)
            summed = tf.math.unsorted_segment_sum(
                gradient.values, positions, tf.shape(distinct)[0]
            )
            with tf.device(shard.device):
                tf.raw_ops.ResourceSparseApplyAdagradV2(
                    var=shard.handle,
                    accum=accumulator.handle,
                    lr=tf.constant(0.1),
                    epsilon=tf.constant(epsilon),
                    grad=summed,
                    indices=distinct,
                )

    return step


def one_process(rows: int, batches: Sequence[np.ndarray], repeats: int) -> float:
    """Median seconds per step, unsharded, in this process."""
    import tensorflow as tf

    table, optimizer = _model(rows)
    step = tf.function(_step_function(table, optimizer))
    ids = [tf.constant(b, tf.int32) for b in batches]
    step(ids[0])
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for batch in ids:
            step(batch)
        # The last update's value is the synchronisation point.
        optimizer.iterations.numpy()
        times.append((time.perf_counter() - start) / len(ids))
    return statistics.median(times)


def _server_bytes(ports: Sequence[int]) -> int:
    """TCP bytes received plus sent on connections to `ports`, or -1."""
    try:
        output = subprocess.run(
            ["ss", "-tinH", "state", "established"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return -1
    total = 0
    lines = output.splitlines()
    for header, info in zip(lines[::2], lines[1::2]):
        fields = header.split()
        local = fields[2] if len(fields) > 2 else ""
        if not any(local.endswith(f":{port}") for port in ports):
            continue
        for key in ("bytes_received", "bytes_sent"):
            match = re.search(rf"{key}:(\d+)", info)
            if match:
                total += int(match.group(1))
    return total


def _free_ports(count: int) -> List[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


class TwoServers:
    """1 worker and 2 parameter servers in this process, on 127.0.0.1."""

    def __init__(self) -> None:
        import tensorflow as tf

        ports = _free_ports(3)
        self.ps_ports = ports[1:]
        self.ports = ports
        cluster = tf.train.ClusterSpec(
            {
                "worker": [f"127.0.0.1:{ports[0]}"],
                "ps": [f"127.0.0.1:{port}" for port in self.ps_ports],
            }
        )
        for job, count in (("worker", 1), ("ps", 2)):
            for index in range(count):
                tf.distribute.Server(
                    cluster, job_name=job, task_index=index, start=True
                )
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            cluster, rpc_layer="grpc"
        )
        self.strategy = tf.distribute.experimental.ParameterServerStrategy(
            resolver,
            variable_partitioner=tf.distribute.experimental.partitioners.FixedShardsPartitioner(
                2
            ),
        )
        self.coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(
            self.strategy
        )

    def _time(self, function: Any, batches: Sequence[Any]) -> float:
        """Seconds per step: all steps scheduled, then one wait."""
        start = time.perf_counter()
        for batch in batches:
            self.coordinator.schedule(function, args=(batch,))
        self.coordinator.join()
        return (time.perf_counter() - start) / len(batches)

    def measure(
        self, rows: int, batches: Sequence[np.ndarray], repeats: int
    ) -> Dict[str, float]:
        import tensorflow as tf

        with self.strategy.scope():
            table, optimizer = _model(rows)
        functions = {}
        for key, replica_step in (
            ("ours", _step_function(table, optimizer)),
            ("tf", _reference_step_function(table, optimizer)),
            ("empty", lambda ids: tf.constant(0.0)),
        ):
            functions[key] = tf.function(
                lambda ids, fn=replica_step: self.strategy.run(fn, args=(ids,))
            )
        ids = [tf.constant(b, tf.int32) for b in batches]
        for function in functions.values():
            self._time(function, ids[:1])
        times: Dict[str, List[float]] = {key: [] for key in functions}
        moved = []
        for _ in range(repeats):
            # Interleaved, so that a change of the machine's load hits all.
            before = _server_bytes(self.ports)
            times["ours"].append(self._time(functions["ours"], ids))
            moved.append((_server_bytes(self.ports) - before) / len(ids))
            for key in ("tf", "empty"):
                times[key].append(self._time(functions[key], ids))
        result = {key: statistics.median(value) for key, value in times.items()}
        result["bytes"] = statistics.median(moved) if min(moved) >= 0 else float("nan")
        return result


def main(argv: Sequence[str] = ()) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(list(argv))
    os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
    if args.quick:
        tables, sizes, args.steps, args.repeats = (1_000, 4_000), (64, 256), 4, 1
    else:
        tables, sizes = (100_000, 1_000_000), (512, 4096, 16_384, 65_536)
    cases = [(rows, batch) for rows in tables for batch in sizes]
    data = {case: _ids(case[0], case[1], args.steps) for case in cases}
    cluster = TwoServers()
    local, remote = {}, {}
    for case in cases:
        # One case at a time, so that both sides see about the same load.
        local[case] = one_process(case[0], data[case], args.repeats)
        remote[case] = cluster.measure(case[0], data[case], args.repeats)
    lines = [
        f"Adagrad, dim {DIM}, {args.steps} steps x {args.repeats} repeats, "
        f"{os.cpu_count()} CPUs; 1 worker, 2 parameter servers on 127.0.0.1",
        "",
        "| rows | ids/step | distinct | one process ms | 2 servers ms | ratio"
        " | TF on the servers ms | ours / TF | empty step ms | bytes/step"
        " | bytes/distinct row |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for case in cases:
        rows, batch = case
        distinct = np.mean([len(np.unique(b)) for b in data[case]])
        r = remote[case]
        lines.append(
            f"| {rows:,} | {batch:,} | {distinct:,.0f} | {local[case] * 1e3:.2f} "
            f"| {r['ours'] * 1e3:.2f} | {r['ours'] / local[case]:.2f}x "
            f"| {r['tf'] * 1e3:.2f} | {r['ours'] / r['tf']:.2f} "
            f"| {r['empty'] * 1e3:.2f} "
            f"| {r['bytes']:,.0f} | {r['bytes'] / distinct:,.0f} |"
        )
    report = "\n".join(lines)
    print(report, flush=True)
    return report


if __name__ == "__main__":
    status = 0
    try:
        main(sys.argv[1:])
    except BaseException:  # noqa: BLE001 - reported, then the process ends
        import traceback

        traceback.print_exc()
        status = 1
    sys.stdout.flush()
    # The servers run in this process; ending it ends them.
    os._exit(status)
