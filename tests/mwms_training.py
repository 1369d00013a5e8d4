"""One worker of a 2-process `MultiWorkerMirroredStrategy` run on 127.0.0.1.

Run by tests/test_parameter_servers.py, once per worker:

    python tests/mwms_training.py SPEC.json TASK_INDEX OUT.npz

The spec gives the workers' addresses, the optimizers and the steps. Each
step's global batch (`ps_training.batches`, BATCH examples) is split between
the workers, half each; the loss is averaged over the global batch, and Keras's
`apply_gradients` sums the gradients over the workers (all-reduce). The
variables of every optimizer's model are written to `OUT.npz`.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Dict

import numpy as np


def main(spec_path: str, task: int, output_path: str) -> None:
    spec = json.loads(open(spec_path).read())
    os.environ["TF_CONFIG"] = json.dumps(
        {
            "cluster": {"worker": spec["workers"]},
            "task": {"type": "worker", "index": task},
        }
    )
    import ps_training
    import tensorflow as tf

    from tf_tpu_embed_opt.layers import sharded

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    count = len(spec["workers"])
    rows, steps = spec["rows"], spec["steps"]
    share = ps_training.BATCH // count
    results: Dict[str, Any] = {}
    for name in spec["names"]:
        with strategy.scope():
            model = ps_training.make_model(rows)
            optimizer = ps_training.optimizer_factories()[name]()
            optimizer.build(model.trainable_variables)

        @tf.function
        def step(ids, labels, model=model, optimizer=optimizer):
            def replica_step(ids, labels):
                with tf.GradientTape() as tape:
                    errors = tf.square(model(ids) - labels)
                    loss = tf.reduce_sum(errors) / ps_training.BATCH
                variables = model.trainable_variables
                grads = sharded.gradients(tape, loss, variables)
                optimizer.apply_gradients(zip(grads, variables))

            strategy.run(replica_step, args=(ids, labels))

        for ids, labels in ps_training.batches(rows, steps):
            mine = slice(task * share, (task + 1) * share)
            step(tf.constant(ids[mine]), tf.constant(labels[mine]))
        for key, value in ps_training.state_of(model, optimizer).items():
            results[f"{name}|{key}"] = value
    results["fit"] = np.array(_fit_outcome(strategy, spec["names"][0]))
    np.savez(output_path, **results)


def _fit_outcome(strategy: Any, name: str) -> str:
    """What `model.fit` does under this strategy: "ok" or the error's line.

    Keras 3.15's trainer reduces the first batch (a tuple of `PerReplica`)
    with `strategy.reduce` before building, which only takes one
    `DistributedValues` under a multi-worker strategy.
    """
    import keras
    import ps_training
    import tensorflow as tf

    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((3,), dtype="int32"),
                keras.layers.Embedding(20, 4),
                keras.layers.Flatten(),
                keras.layers.Dense(1),
            ]
        )
        model.compile(optimizer=ps_training.optimizer_factories()[name](), loss="mse")
    ids = np.arange(24, dtype=np.int32).reshape(8, 3) % 20
    data = tf.data.Dataset.from_tensor_slices((ids, np.ones((8, 1), np.float32)))
    try:
        model.fit(data.batch(4), epochs=1, verbose=0)
    except Exception as error:  # noqa: BLE001 - the outcome is the result
        return f"{type(error).__name__}: {str(error).splitlines()[0]}"
    return "ok"


if __name__ == "__main__":
    import ps_training

    ps_training.run_as_script(main, sys.argv[1], int(sys.argv[2]), sys.argv[3])
