"""Loads checkpoints into a job of several JAX processes with
`load_into_keras`, recording which rows each process reads.

Run by `test_jax_processes.py`, one process per `PROCESS`, all on 127.0.0.1:

    KERAS_BACKEND=jax XLA_FLAGS=--xla_force_host_platform_device_count=2 \
        python tests/jax_processes_load.py PROCESS PROCESSES PORT OUT SOURCE...

The model is the guide's ("Training across processes on JAX"): a table
`table` split by rows over the processes and a stack of `part_2` and
`part_3`, split alike. Each `SOURCE` (a checkpoint path of any format) is
loaded in turn with `load_into_keras(source, net, None)`; after each, every
variable is gathered whole and written by process 0 to `OUT` (`.npz`, keys
`<source index>:<variable path>`). Every process writes the reads it made
to `OUT.<process>.json`: `(source index, table, key, start, stop)` rows read
through `read_rows`, and `(source index, table, key, -1, -1)` of whole
reads. Then every process writes the tables as they are (the last source's)
with `write_checkpoint` from `keras_table_states`: as a jax-tpu-embedding
step of 2 chips x 4 SparseCores (`OUT.jax/9`, each process its rows), and
in the `TPUEmbedding` layout (`OUT.tpu/ckpt`), which needs the tables whole
in one process (`refused`: its error, or `None` when it wrote).
"""

import json
import sys

import numpy as np

ROWS, DIM = 64, 4
PARTS = (("part_2", 40), ("part_3", 24))
ALGORITHMS = {"table": "Adagrad", "part_2": "Adam", "part_3": "Adam"}


def model(processes):
    """The guide's tables under its distribution (the `model` mesh axis
    across the processes)."""
    import jax
    import keras

    import tf_tpu_embed_opt as teo

    devices = np.array(jax.devices()).reshape(processes, -1).T
    mesh = keras.distribution.DeviceMesh(devices.shape, ("batch", "model"), devices)
    layout_map = keras.distribution.LayoutMap(mesh)
    layout_map["table/embeddings"] = ("model", None)
    layout_map["stacked/stack_0/embeddings"] = ("model", None)
    keras.distribution.set_distribution(
        keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch")
    )
    ids = keras.Input((3,), dtype="int32")
    table = teo.layers.Embedding(
        ROWS, DIM, optimizer=teo.optimizers.Adagrad(0.2), name="table"
    )
    parts = [
        teo.layers.Embedding(
            rows, DIM, optimizer=teo.optimizers.Adam(0.05, lazy=True), name=name
        )
        for name, rows in PARTS
    ]
    first, second = teo.layers.StackedEmbedding(parts, name="stacked")(
        [ids % 40, ids % 24]
    )
    return keras.Model(ids, table(ids) + first + second)


def recorded(checkpoint, index, reads):
    """`checkpoint` with its reads recorded in `reads`."""
    read_rows, read_tensor = checkpoint.read_rows, checkpoint.read_tensor

    def rows(name, key, span, device=None):
        reads.append((index, name, key, *span))
        return read_rows(name, key, span, device)

    def tensor(name, key):
        reads.append((index, name, key, -1, -1))
        return read_tensor(name, key)

    checkpoint.read_rows, checkpoint.read_tensor = rows, tensor
    return checkpoint


def main(process, processes, port, out, sources):
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if processes > 1:
        jax.distributed.initialize(f"127.0.0.1:{port}", processes, process)
    import keras

    keras.utils.set_random_seed(7)  # the same initial values everywhere
    from jax.experimental import multihost_utils

    import tf_tpu_embed_opt as teo
    from tf_tpu_embed_opt import checkpoints

    net = model(processes)
    reads = []
    found = {}
    for index, source in enumerate(sources):
        checkpoint = recorded(checkpoints.open_checkpoint(source), index, reads)
        teo.load_into_keras(checkpoint, net, None)
        for variable in net.variables:
            value = variable.value
            if not value.is_fully_addressable:
                value = multihost_utils.process_allgather(value, tiled=True)
            found[f"{index}:{variable.path}"] = np.asarray(value)
    # Writing the tables back: every process writes its rows of the
    # jax-tpu-embedding layout; the TPUEmbedding layout needs them whole.
    from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import (
        writer as jax_orbax_writer,
    )
    from tf_tpu_embed_opt.checkpoints.keras import tables as keras_tables

    tables = keras_tables.keras_tables(net, None, list(ALGORITHMS))
    spec = jax_orbax_writer.embedding_spec_for(
        {name: (rows, DIM) for name, rows in (("table", ROWS), *PARTS)},
        num_devices=2,
        sparsecores_per_device=4,
        stacks={"parts": ["part_2", "part_3"]},
    )
    checkpoints.write_checkpoint(
        f"{out}.jax",
        keras_tables.keras_table_states(tables),
        format="jax-tpu-embedding",
        step=9,
        embedding_spec=spec,
        algorithms=ALGORITHMS,
    )
    try:
        checkpoints.write_checkpoint(
            f"{out}.tpu/ckpt",
            keras_tables.keras_table_states(tables),
            algorithms=ALGORITHMS,
        )
    except ValueError as error:
        refused = str(error)
    else:
        refused = None
    if processes > 1:
        # `save_tpu_checkpoint` writes that layout from the model itself.
        try:
            teo.save_tpu_checkpoint(
                f"{out}.saved/ckpt", net, None, names=list(ALGORITHMS), step=9
            )
        except ValueError as error:
            refused += "\n" + str(error)
    table = net.get_layer("table").embeddings.value
    held = {s.index[0].indices(ROWS)[:2] for s in table.addressable_shards}
    with open(f"{out}.{process}.json", "w") as file:
        json.dump({"reads": reads, "held": sorted(held), "refused": refused}, file)
    if process == 0:
        np.savez(out, **found)


if __name__ == "__main__":
    process, processes, port = (int(a) for a in sys.argv[1:4])
    main(process, processes, port, sys.argv[4], sys.argv[5:])
