"""Trains `tf_tpu_embed_opt.layers.Embedding` under `keras.distribution` on JAX.

Run by `test_row_sparse_embedding.py` in a fresh process, since JAX fixes its
device count when it starts:

    XLA_FLAGS=--xla_force_host_platform_device_count=4 KERAS_BACKEND=jax \
        python tests/row_sparse_distributed.py 4 OUT.npz

With 1 device it trains without a distribution; with 4 it trains the same
steps four times: `DataParallel` (the batch split over 4 devices), a
`ModelParallel` whose `LayoutMap` shards the table's rows over 4 devices, a
2 x 2 mesh doing both, and one sharding the table's columns over 4 devices
(where `RowWiseAdagrad`'s `[rows, 1]` state stays whole); also for two
Adagrad tables in one `StackedEmbedding`, one of them read by two features
(the stack sharded alike). It saves
each table, slot, step counter and whether the slots are sharded as the
table (a `[rows, 1]` slot as its rows).

Exact by construction, so the 1- and 4-device results must be bit-identical:
the loss is `sum(outputs * G) / batch` with `G` in {+-1/2, +-1, +-2} and a
power-of-two batch, so each looked-up row's gradient is a sum of a few such
values over 2**5, which is exact in any order of summation; everything else
the backward pass does to a row is elementwise. (With the columns sharded,
XLA compiles those element-wise ops per device and may contract a
multiply-add into an FMA that the one-device step does not: the test bounds
that layout, docs/tpu_semantics.md, "Rounding".)
"""

import sys

import keras
import numpy as np

import tf_tpu_embed_opt as teo

ROWS, DIM, BATCH, STEPS = 40, 4, 32, 6
OPTIMIZERS = {
    "Adagrad": lambda: teo.optimizers.Adagrad(0.2),
    "Adam-lazy": lambda: teo.optimizers.Adam(0.05, lazy=True),
    "Ftrl-lazy": lambda: teo.optimizers.Ftrl(
        0.1, l1_regularization_strength=0.01, lazy=True
    ),
    # One value of state per row ([rows, 1]).
    "RowWiseAdagrad": lambda: teo.optimizers.RowWiseAdagrad(0.2),
}


def data():
    rng = np.random.default_rng(3)
    # Zipf-like ids: many duplicates within and across the batch's shards.
    ids = np.minimum(rng.zipf(1.6, (BATCH * STEPS, 3)) - 1, ROWS - 1)
    g = rng.choice(np.float32([-2, -1, -0.5, 0.5, 1, 2]), (BATCH * STEPS, 3, DIM))
    return ids.astype("int32"), g


def _stacked(ids):
    """Two Adagrad tables in one stack (64 rows), three features: two read
    the first table (one `Embedding` in two entries), one the second; returns
    the stack (a row-sparse `Embedding`) and the outputs."""
    tables = [
        teo.layers.Embedding(
            rows,
            DIM,
            optimizer=OPTIMIZERS["Adagrad"](),
            embeddings_initializer=keras.initializers.RandomUniform(seed=seed),
            name=f"part_{seed}",
        )
        for seed, rows in ((1, ROWS), (2, 24))
    ]
    layer = teo.layers.StackedEmbedding([*tables, tables[0]], name="table")
    first, second, third = layer([ids, ids % 24, (ids * 7 + 3) % ROWS])
    return layer._stacks[0], first + second + third


def _slot_sharding(layer, slot):
    """The sharding a slot should have: the table's; for a slot of one
    value per row, the table's rows' only."""
    import jax

    table = layer.embeddings.value.sharding
    if tuple(slot.shape) == tuple(layer.embeddings.shape) or not hasattr(table, "spec"):
        return table
    rows = table.spec[0] if len(table.spec) else None
    return jax.sharding.NamedSharding(
        table.mesh, jax.sharding.PartitionSpec(rows, None)
    )


def train(name, distribution):
    keras.distribution.set_distribution(distribution)
    try:
        ids = keras.Input((3,), dtype="int32")
        if name == "Stacked":
            layer, outputs = _stacked(ids)
        else:
            layer = teo.layers.Embedding(
                ROWS,
                DIM,
                optimizer=OPTIMIZERS[name](),
                embeddings_initializer=keras.initializers.RandomUniform(seed=1),
                name="table",
            )
            outputs = layer(ids)
        model = keras.Model(ids, outputs)
        model.compile(
            optimizer=keras.optimizers.SGD(1.0),
            loss=lambda g, outputs: keras.ops.sum(outputs * g, axis=(1, 2)),
        )
        x, g = data()
        model.fit(x, g, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        state = {"table": layer.embeddings, **layer.slots}
        result = {k: np.asarray(v.value) for k, v in state.items()}
        result["iterations"] = np.asarray(layer.optimizer.iterations)
        # Each slot is laid out like the table, a [rows, 1] one like its rows.
        result["same_layout"] = np.array(
            all(
                v.value.sharding.is_equivalent_to(_slot_sharding(layer, v), 2)
                for v in layer.slots.values()
            )
        )
        result["table_spec"] = np.array(str(layer.embeddings.value.sharding))
        return result
    finally:
        keras.distribution.set_distribution(None)


def main(devices, out):
    import jax

    assert len(jax.devices()) == devices, jax.devices()
    layouts = {"one": None}
    if devices > 1:
        dist = keras.distribution
        layouts = {"data": dist.DataParallel(devices=jax.devices())}
        for shape in ((1, devices), (2, devices // 2)):
            mesh = dist.DeviceMesh(shape, ("batch", "model"), jax.devices())
            layout_map = dist.LayoutMap(mesh)
            layout_map["table/embeddings"] = ("model", None)
            layout_map["table/stack_0/embeddings"] = ("model", None)
            layouts[f"rows{shape[0]}x{shape[1]}"] = dist.ModelParallel(
                layout_map=layout_map, batch_dim_name="batch"
            )
        # The table's columns sharded: a [rows, 1] slot stays whole.
        mesh = dist.DeviceMesh((1, devices), ("batch", "model"), jax.devices())
        layout_map = dist.LayoutMap(mesh)
        layout_map["table/embeddings"] = (None, "model")
        layout_map["table/stack_0/embeddings"] = (None, "model")
        layouts["columns"] = dist.ModelParallel(
            layout_map=layout_map, batch_dim_name="batch"
        )
    results = {}
    for name in (*OPTIMIZERS, "Stacked"):
        for label, distribution in layouts.items():
            for key, value in train(name, distribution).items():
                results[f"{name}/{label}/{key}"] = value
    np.savez(out, **results)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
