"""Training on a local parameter-server cluster, for tests/test_parameter_servers.py.

Imported by the tests (model, data, optimizers, one-process reference) and run
as a script in a subprocess that starts the cluster: in-process
`tf.distribute.Server`s on 127.0.0.1 (2 workers, 3 parameter servers), a
`ParameterServerStrategy` whose partitioner splits each table into the number
of shards asked for, and a `ClusterCoordinator` that schedules one step at a
time (so the order of the updates, and the result, is that of one process).
The script writes the trained values and devices to an `.npz` file and exits
with `os._exit`, which ends the servers of its own process.

    python tests/ps_training.py SPEC.json OUT.npz
"""

from __future__ import annotations

import functools
import json
import os
import socket
import sys
import time
from typing import Any, Callable, Dict, List, Tuple

import numpy as np

DIM = 4
BATCH = 6
IDS_PER_EXAMPLE = 5
LEARNING_RATE = 0.05
NUM_WORKERS = 2
NUM_PS = 3


# A representative subset of optimizer_factories(): row-wise lazy Adagrad,
# non-lazy dense-path Adam, Ftrl's two slots, ClippyAdagrad's cross-shard
# factor. The clusters run it by default (tests/test_parameter_servers.py),
# and the older-TensorFlow CI legs run the one-process shards test on it
# (tests/test_sharded.py, conftest.every_optimizer).
REPRESENTATIVE = ["to_keras(Adagrad)", "Adam()", "to_keras(FTRL)", "ClippyAdagrad()"]


def optimizer_factories() -> Dict[str, Callable[[], Any]]:
    """Every Keras twin, derived from the registry, and ClippyAdagrad.

    For each definition: the TPU-exact twin `to_keras(embedding optimizer)`;
    for each definition with a Keras class, also that class with its
    defaults (Keras's semantics, e.g. non-lazy Adam).
    """
    import tf_tpu_embed_opt as teo
    from tf_tpu_embed_opt import embedding, optimizers
    from tf_tpu_embed_opt.definitions import registry

    factories: Dict[str, Callable[[], Any]] = {}
    for definition in registry.DEFINITIONS:
        factories[f"to_keras({definition.name})"] = lambda d=definition: teo.to_keras(
            embedding.class_for(d)(learning_rate=LEARNING_RATE)
        )
        keras_class = optimizers.class_for(definition)
        if keras_class is not None:
            factories[f"{keras_class.__name__}()"] = lambda c=keras_class: c(
                learning_rate=LEARNING_RATE
            )
    # Keras's weight decay (every row, before the update) on sharded variables.
    factories["Adagrad(weight_decay)"] = lambda: teo.optimizers.Adagrad(
        learning_rate=LEARNING_RATE, weight_decay=0.01
    )
    factories["ClippyAdagrad()"] = lambda: teo.optimizers.ClippyAdagrad(
        learning_rate=1.0, export_clipping_factors=True
    )
    factories["ClippyAdagrad(clip_accumulator_update)"] = lambda: (
        teo.optimizers.ClippyAdagrad(
            learning_rate=0.5,
            variable_relative_threshold=0.05,
            clip_accumulator_update=True,
        )
    )
    return factories


def make_model(rows: int, seed: int = 0) -> Any:
    """A tiny ranking model: a table looked up, a per-row bias, a kernel.

    The table's gradient is row-sparse (`tf.IndexedSlices` with repeated
    ids); the bias table (one value per row, multiplied with the id counts)
    gets a dense gradient; the kernel is an ordinary small variable.
    """
    import keras

    from tf_tpu_embed_opt.layers import sharded

    generator = np.random.default_rng(seed)
    table = generator.normal(0.0, 0.5, (rows, DIM)).astype(np.float32)
    bias = generator.normal(0.0, 0.1, (rows, 1)).astype(np.float32)
    kernel = generator.normal(0.0, 0.5, (DIM, 1)).astype(np.float32)

    def constant(value):
        return lambda shape, dtype=None: np.asarray(value, dtype=np.float32)

    class Ranker(keras.Model):
        def __init__(self):
            # A fixed name: the optimizer's slot names derive from it.
            super().__init__(name="ranker")
            self.table = sharded.Embedding(
                rows, DIM, embeddings_initializer=constant(table), name="table"
            )
            self.table.build((None,))
            self.bias = self.add_weight(
                shape=(rows, 1), initializer=constant(bias), name="bias"
            )
            self.kernel = self.add_weight(
                shape=(DIM, 1), initializer=constant(kernel), name="kernel"
            )
            self.rows = rows

        def call(self, ids):
            import tensorflow as tf

            pooled = tf.reduce_sum(self.table(ids), axis=1)
            counts = tf.reduce_sum(tf.one_hot(ids, self.rows), axis=1)
            return tf.matmul(pooled, self.kernel.value) + tf.matmul(
                counts, tf.convert_to_tensor(self.bias.value)
            )

    return Ranker()


def batches(
    rows: int, steps: int, seed: int = 1
) -> List[Tuple[np.ndarray, np.ndarray]]:
    """`steps` batches of ids with repeats within an example, a batch and steps.

    Ids are Zipf-like over `rows` (row 0 most frequent), so rows of every
    shard are hit, some many times per batch, some rarely.
    """
    generator = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, rows + 1)
    weights /= weights.sum()
    result = []
    for _ in range(steps):
        ids = generator.choice(rows, size=(BATCH, IDS_PER_EXAMPLE), p=weights)
        labels = generator.normal(0.0, 1.0, (BATCH, 1))
        result.append((ids.astype(np.int32), labels.astype(np.float32)))
    return result


def loss_of(model: Any, ids: Any, labels: Any) -> Any:
    import tensorflow as tf

    return tf.reduce_mean(tf.square(model(ids) - labels))


def state_of(model: Any, optimizer: Any) -> Dict[str, np.ndarray]:
    """Model and optimizer variables by name (whole values, any sharding)."""
    import tensorflow as tf

    state = {}
    for variable in model.weights:
        state[f"model/{variable.name}"] = tf.convert_to_tensor(variable.value).numpy()
    for variable in optimizer.variables:
        state[f"optimizer/{variable.name}"] = tf.convert_to_tensor(
            variable.value
        ).numpy()
    return state


@functools.lru_cache(maxsize=None)
def reference(name: str, rows: int, steps: int) -> Dict[str, np.ndarray]:
    """`train_one_process(name, rows, steps)`, once per process (read only)."""
    return train_one_process(name, rows, steps)


def train_one_process(
    name: str,
    rows: int,
    steps: int,
    first_step: int = 0,
    restore: str = "",
    save: str = "",
) -> Dict[str, np.ndarray]:
    """The reference: Keras's own loop (`tape.gradient`) in this process.

    Trains on batches `first_step` to `first_step + steps`, after restoring
    the checkpoint `restore` if given, and writes the checkpoint `save` if
    given.
    """
    import tensorflow as tf

    model = make_model(rows)
    optimizer = optimizer_factories()[name]()
    optimizer.build(model.trainable_variables)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
    if restore:
        checkpoint.read(restore).assert_consumed()

    @tf.function
    def step(ids, labels):
        with tf.GradientTape() as tape:
            loss = loss_of(model, ids, labels)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))

    for ids, labels in batches(rows, first_step + steps)[first_step:]:
        step(ids, labels)
    if save:
        checkpoint.write(save)
    return state_of(model, optimizer)


def free_ports(count: int) -> List[int]:
    sockets = []
    for _ in range(count):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        sockets.append(s)
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def start_cluster(num_workers: int, num_ps: int) -> Any:
    """In-process servers on 127.0.0.1; returns a cluster resolver."""
    import tensorflow as tf

    ports = iter(free_ports(num_workers + num_ps))
    cluster = tf.train.ClusterSpec(
        {
            "worker": [f"127.0.0.1:{next(ports)}" for _ in range(num_workers)],
            "ps": [f"127.0.0.1:{next(ports)}" for _ in range(num_ps)],
        }
    )
    config = tf.compat.v1.ConfigProto()
    config.inter_op_parallelism_threads = 2
    config.intra_op_parallelism_threads = 1
    for job, count in (("worker", num_workers), ("ps", num_ps)):
        for index in range(count):
            tf.distribute.Server(
                cluster, job_name=job, task_index=index, config=config, start=True
            )
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        cluster, rpc_layer="grpc"
    )


class Cluster:
    """A parameter-server strategy whose tables get `self.shards` shards."""

    def __init__(self, num_workers: int = NUM_WORKERS, num_ps: int = NUM_PS):
        import tensorflow as tf

        self.shards = 1
        resolver = start_cluster(num_workers, num_ps)

        def partitioner(shape, dtype):
            # Matrices with more rows than shards (the table, the bias table
            # and the small kernel) are split; scalars are not.
            if len(shape) == 2 and shape[0] > self.shards:
                return [self.shards, 1]
            return [1] * len(shape)

        self.strategy = tf.distribute.experimental.ParameterServerStrategy(
            resolver, variable_partitioner=partitioner
        )
        self.coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(
            self.strategy
        )

    def build(
        self, name: str, rows: int, shards: int, lazy_build: bool = False
    ) -> Tuple[Any, Any]:
        """The model and optimizer; `lazy_build`: the first step builds it."""
        self.shards = shards
        with self.strategy.scope():
            model = make_model(rows)
            optimizer = optimizer_factories()[name]()
            if not lazy_build:
                optimizer.build(model.trainable_variables)
        return model, optimizer

    def trainer(self, pairs: List[Tuple[Any, Any]]) -> Callable[[Any, Any], None]:
        """A step training every `(model, optimizer)` pair on one batch.

        One function for all pairs: a worker prepares one function per
        schedule, whatever its size, which dominates short runs.
        """
        import tensorflow as tf

        from tf_tpu_embed_opt.layers import sharded

        strategy = self.strategy

        @tf.function
        def step(ids, labels):
            def replica_step(ids, labels):
                for model, optimizer in pairs:
                    with tf.GradientTape() as tape:
                        loss = loss_of(model, ids, labels)
                    variables = model.trainable_variables
                    grads = sharded.gradients(tape, loss, variables)
                    optimizer.apply_gradients(zip(grads, variables))

            strategy.run(replica_step, args=(ids, labels))

        def run(ids, labels):
            # One step at a time: the updates are applied in batch order.
            self.coordinator.schedule(step, args=(ids, labels))
            self.coordinator.join()

        return run


def devices_of(model: Any, optimizer: Any) -> Dict[str, str]:
    """Each shard's device, for the table's shards and the slots' shards."""
    from tf_tpu_embed_opt.layers.sharded import shards_of

    devices = {}
    for variable in [*model.weights, *optimizer.variables]:
        for position, shard in enumerate(shards_of(variable) or ()):
            devices[f"{variable.name}/{position}"] = shard.device
    return devices


def main(spec_path: str, output_path: str) -> None:
    """Trains the groups of runs in `spec_path`, writes `output_path`.

    The spec is `{"groups": [[run, ...], ...], "time_limit": seconds}`. A run
    is `{"key", "name", "rows", "shards", "steps"}` with optional
    `first_step`, `restore` (a checkpoint read before training), `save`
    (written after) and `lazy_build` (the optimizer is built by its first
    `apply_gradients`, inside the step); the runs of a group train together
    on the same batches (`rows`, `steps` and `first_step` are the first
    run's). Results are stored under `"{key}|{variable name}"`.
    """
    import tensorflow as tf

    spec = json.loads(open(spec_path).read())
    started = time.time()
    cluster = Cluster()
    results: Dict[str, Any] = {}
    for group in spec["groups"]:
        pairs, checkpoints = [], []
        for run in group:
            model, optimizer = cluster.build(
                run["name"], run["rows"], run["shards"], run.get("lazy_build", False)
            )
            checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
            if run.get("restore"):
                checkpoint.read(run["restore"]).assert_consumed()
            pairs.append((model, optimizer))
            checkpoints.append(checkpoint)
        step = cluster.trainer(pairs)
        first, rows = group[0].get("first_step", 0), group[0]["rows"]
        for ids, labels in batches(rows, first + group[0]["steps"])[first:]:
            step(tf.constant(ids), tf.constant(labels))
        for run, (model, optimizer), checkpoint in zip(group, pairs, checkpoints):
            if run.get("save"):
                checkpoint.write(run["save"])
            for name, value in state_of(model, optimizer).items():
                results[f"{run['key']}|{name}"] = value
            for name, device in devices_of(model, optimizer).items():
                results[f"{run['key']}|device|{name}"] = np.array(device)
        if time.time() - started > spec["time_limit"]:
            results["timed_out"] = np.array(True)
            break
    np.savez(output_path, **results)


def subprocess_env() -> Dict[str, str]:
    """This process's environment, with the same `tf_tpu_embed_opt` and tests.

    The package is the one this process imported (installed or checkout);
    the tests' directory gives the helper scripts' modules.
    """
    import pathlib

    import tf_tpu_embed_opt

    package = pathlib.Path(tf_tpu_embed_opt.__file__).resolve().parents[1]
    tests = pathlib.Path(__file__).resolve().parent
    paths = [str(package), str(tests), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p))
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env.pop("TF_CONFIG", None)
    return env


def run_script(
    script: str, directory: Any, spec: Dict[str, Any], timeout: float
) -> Dict[str, np.ndarray]:
    """Runs `python script SPEC.json OUT.npz` in a child; returns OUT's arrays.

    The spec gets `time_limit` (`timeout` - 60 s), which the script checks
    between runs; a child still running after `timeout` is killed by its PID.
    Raises AssertionError (with the end of the child's output) on a failure.
    """
    import signal
    import subprocess

    spec_path, output = directory / "spec.json", directory / "out.npz"
    spec_path.write_text(json.dumps(dict(spec, time_limit=timeout - 60)))
    process = subprocess.Popen(
        [sys.executable, str(script), str(spec_path), str(output)],
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        log, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.kill(process.pid, signal.SIGKILL)
        process.communicate()
        raise AssertionError(
            f"the cluster process (pid {process.pid}) ran over {timeout} s"
        ) from None
    assert process.returncode == 0, log[-4000:]
    results = dict(np.load(output))
    assert "timed_out" not in results, "the cluster process ran out of time"
    return results


def run_as_script(main: Callable[..., None], *arguments: Any) -> None:
    """Runs `main(*arguments)` as a subprocess's whole life, then ends it.

    A failure's traceback goes to stderr and the exit status is 1. The end is
    `os._exit`: the servers (and TensorFlow's threads) running in this process
    would otherwise keep it alive.
    """
    status = 0
    try:
        main(*arguments)
    except BaseException:  # noqa: BLE001 - reported, then the process ends
        import traceback

        traceback.print_exc()
        status = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    os.environ["GRPC_FAIL_FAST"] = "use_caller"
    run_as_script(main, sys.argv[1], sys.argv[2])
