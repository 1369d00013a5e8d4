"""A parameter server that fails, and the recovery, for tests/test_ps_failures.py.

Run as a script in a subprocess (`ps_training.run_script`), in one of two
modes (the spec's "mode"):

- "fail": a loopback cluster whose servers are processes of their own (1
  worker, 2 parameter servers), so that one can be killed by its PID. A
  `sharded.Embedding` split over both servers trains STEPS steps with the
  engine's Adagrad; after `join`, a `tf.train.Checkpoint` is written (the
  recipe's checkpoint) and the table read back; one more step runs. Then
  parameter server 1 is frozen (SIGSTOP) and two more steps are scheduled:
  nothing in TensorFlow reports it, so the script waits for them with
  `wait_or_raise` (the guide's deadline on `ClusterCoordinator.done`) and
  records that the deadline passed. Then the frozen server is killed
  (SIGKILL), and the script records the error `join` raises, and how long it
  took.
- "resume": a fresh cluster (in-process servers, 3 parameter servers: the
  table now has 3 shards) restores that checkpoint, records the table, and
  trains MORE steps; the test compares them with one process that restores
  the same checkpoint and trains the same steps.

    python tests/ps_failure_cluster.py SPEC.json OUT.npz
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np

ROWS = 32
DIM = 4
STEPS = 3
MORE = 2
LEARNING_RATE = 0.1
IDS = (1, 2, 2, 17, 30)
# How long `join` may take to report the killed server (measured: 0.05 s).
JOIN_BOUND = 60.0
# The deadline for steps that a frozen server keeps from finishing.
FREEZE_DEADLINE = 5.0

_SERVER = (
    "import json, sys, tensorflow as tf; "
    "spec = tf.train.ClusterSpec(json.loads(sys.argv[1])); "
    "tf.distribute.Server(spec, job_name=sys.argv[2], "
    "task_index=int(sys.argv[3]), protocol='grpc', start=True).join()"
)


def wait_or_raise(coordinator, seconds):
    """The guide's `wait_or_raise` (docs/guides/parameter-servers.md), run
    from the page itself: the documented code is the tested code."""
    import re

    import doc_pages

    page = doc_pages.TEXTS[doc_pages.ROOT / "docs" / "guides" / "parameter-servers.md"]
    (block,) = [
        b
        for b in re.findall(r"```py\n(.*?)```", page, re.S)
        if "def wait_or_raise(" in b
    ]
    namespace = {}
    exec(compile(block, "parameter-servers.md wait_or_raise", "exec"), namespace)
    return namespace["wait_or_raise"](coordinator, seconds)


def make(strategy, shards):
    """The table, its optimizer and the step function, on `strategy`."""
    import tensorflow as tf

    import tf_tpu_embed_opt as teo
    from tf_tpu_embed_opt.layers import sharded

    with strategy.scope():
        layer = sharded.Embedding(
            ROWS,
            DIM,
            name="table",
            embeddings_initializer=lambda shape, dtype=None: (
                np.arange(ROWS * DIM, dtype=np.float32).reshape(ROWS, DIM) / 100.0
            ),
        )
        layer.build((None,))
        optimizer = teo.to_keras(teo.embedding.Adagrad(LEARNING_RATE))
        optimizer.build(layer.trainable_variables)
    ids = tf.constant(IDS)

    @tf.function
    def step():
        def replica_step():
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.square(layer(ids)))
            variables = layer.trainable_variables
            grads = sharded.gradients(tape, loss, variables)
            optimizer.apply_gradients(zip(grads, variables))

        strategy.run(replica_step)

    return layer, optimizer, step


def table_of(layer):
    from tf_tpu_embed_opt.layers import sharded

    return np.concatenate([s.numpy() for s in sharded.shards_of(layer.embeddings)])


def _strategy(resolver, shards):
    import tensorflow as tf

    def partitioner(shape, dtype):
        return [shards, 1] if len(shape) == 2 else [1] * len(shape)

    strategy = tf.distribute.experimental.ParameterServerStrategy(
        resolver, variable_partitioner=partitioner
    )
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    return strategy, coordinator


def fail(spec, output_path):
    import tensorflow as tf
    from ps_training import free_ports

    ports = iter(free_ports(3))
    cluster = {
        "worker": [f"127.0.0.1:{next(ports)}"],
        "ps": [f"127.0.0.1:{next(ports)}", f"127.0.0.1:{next(ports)}"],
    }
    servers = {
        (job, index): subprocess.Popen(
            [sys.executable, "-c", _SERVER, json.dumps(cluster), job, str(index)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for job in ("worker", "ps")
        for index in range(len(cluster[job]))
    }
    try:
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(cluster), rpc_layer="grpc"
        )
        strategy, coordinator = _strategy(resolver, 2)
        layer, optimizer, step = make(strategy, 2)
        for _ in range(STEPS):
            coordinator.schedule(step)
        coordinator.join()  # nothing in flight: the checkpoint holds STEPS
        prefix = tf.train.Checkpoint(model=layer, optimizer=optimizer).write(
            os.path.join(spec["directory"], "ckpt")
        )
        saved = table_of(layer)
        coordinator.schedule(step)
        coordinator.join()
        os.kill(servers[("ps", 1)].pid, signal.SIGSTOP)
        for _ in range(2):
            coordinator.schedule(step)
        try:
            wait_or_raise(coordinator, FREEZE_DEADLINE)
            frozen = ""
        except TimeoutError as error:
            frozen = str(error)
        os.kill(servers[("ps", 1)].pid, signal.SIGKILL)
        servers[("ps", 1)].wait(timeout=30)
        outcome = {}
        started = time.monotonic()

        def run():
            try:
                coordinator.join()
                outcome["error"] = ""
            except Exception as error:  # noqa: BLE001 - recorded for the test
                outcome["error"] = f"{type(error).__name__}: {error}"
            outcome["seconds"] = time.monotonic() - started

        waiter = threading.Thread(target=run, daemon=True)
        waiter.start()
        waiter.join(JOIN_BOUND)
        np.savez(
            output_path,
            prefix=np.array(prefix),
            saved=saved,
            frozen=np.array(frozen),
            error=np.array(outcome.get("error", "still waiting")),
            seconds=np.array(outcome.get("seconds", JOIN_BOUND)),
            ps_address=np.array(cluster["ps"][1]),
        )
    finally:
        for server in servers.values():
            if server.poll() is None:
                os.kill(server.pid, signal.SIGKILL)
                server.wait(timeout=30)


def resume(spec, output_path):
    import tensorflow as tf
    from ps_training import start_cluster

    strategy, coordinator = _strategy(start_cluster(1, 3), 3)
    layer, optimizer, step = make(strategy, 3)
    tf.train.Checkpoint(model=layer, optimizer=optimizer).read(
        spec["prefix"]
    ).assert_consumed()
    restored = table_of(layer)
    for _ in range(MORE):
        coordinator.schedule(step)
        coordinator.join()
    np.savez(output_path, restored=restored, trained=table_of(layer))


def main(spec_path: str, output_path: str) -> None:
    spec = json.loads(open(spec_path).read())
    {"fail": fail, "resume": resume}[spec["mode"]](spec, output_path)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from ps_training import run_as_script

    run_as_script(main, sys.argv[1], sys.argv[2])
