"""Checkpoints saved while parameter-server steps are in flight, for
tests/test_consistent_checkpoints.py.

Run as a script in a subprocess that starts a loopback cluster (1 worker, 2
parameter servers, see `ps_training.start_cluster`): a `sharded.Embedding` of
ROWS x DIM whose table is split over both servers, trained with the engine's
Adagrad on a step that looks up every row once with the gradient GRADIENT,
so that the number of steps a row has taken can be read back from its
accumulator (and from its weights). `STEPS` steps are scheduled without
waiting, then a checkpoint is written at once: with `save_tpu_checkpoint`,
and (for comparison, what TensorFlow's own writer does) with
`tf.train.Checkpoint.write`. The script writes the initial table and the
checkpoint prefixes to an `.npz` file and ends with `os._exit`.

    python tests/ps_consistent_save.py SPEC.json OUT.npz
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

ROWS = 64
DIM = 8
STEPS = 300
LEARNING_RATE = 0.01
GRADIENT = 1.0
INITIAL_ACCUMULATOR = 0.1


def main(spec_path: str, output_path: str) -> None:
    import keras
    import tensorflow as tf
    from ps_training import start_cluster

    import tf_tpu_embed_opt as teo
    from tf_tpu_embed_opt.layers import sharded

    spec = json.loads(open(spec_path).read())
    resolver = start_cluster(1, 2)

    def partitioner(shape, dtype):
        return [2, 1] if len(shape) == 2 else [1] * len(shape)

    strategy = tf.distribute.experimental.ParameterServerStrategy(
        resolver, variable_partitioner=partitioner
    )
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        layer = sharded.Embedding(ROWS, DIM, name="table")
        layer.build((None,))
        optimizer = teo.to_keras(
            teo.embedding.Adagrad(
                LEARNING_RATE, initial_accumulator_value=INITIAL_ACCUMULATOR
            )
        )
        optimizer.build(layer.trainable_variables)
    initial = np.concatenate([s.numpy() for s in sharded.shards_of(layer.embeddings)])
    ids = tf.range(ROWS)

    @tf.function
    def step():
        def replica_step():
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(layer(ids)) * GRADIENT
            variables = layer.trainable_variables
            grads = sharded.gradients(tape, loss, variables)
            optimizer.apply_gradients(zip(grads, variables))

        strategy.run(replica_step)

    for _ in range(STEPS):
        coordinator.schedule(step)
    ours = teo.save_tpu_checkpoint(
        os.path.join(spec["directory"], "ours", "ckpt"), {"table": layer}, optimizer
    )
    for _ in range(STEPS):
        coordinator.schedule(step)
    theirs = tf.train.Checkpoint(model=layer, optimizer=optimizer).write(
        os.path.join(spec["directory"], "theirs", "ckpt")
    )
    coordinator.join()
    np.savez(
        output_path,
        initial=initial,
        ours=np.array(ours),
        theirs=np.array(theirs),
        keras_version=np.array(keras.__version__),
    )


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from ps_training import run_as_script

    os.environ["GRPC_FAIL_FAST"] = "use_caller"
    run_as_script(main, sys.argv[1], sys.argv[2])
