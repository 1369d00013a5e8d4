"""jax-tpu-embedding checkpoints as its own code writes them, for the tests.

Its `stack_tables`, `prepare_feature_specs_for_training` and
`create_proto_from_feature_specs` lay out the tables (stacked, padded,
mod-sharded, rotated) and write the `EmbeddingSpecProto`; its
`stack_and_shard_tables` puts known values into that layout. The step is
saved with orbax as jax-tpu-embedding's flax examples save theirs (a `model`
item holding each stack's `EmbeddingVariables`, an `embedding_spec` item
holding the proto).
"""

# Runs without TensorFlow.

import os

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax_tpu_embedding.sparsecore.lib.nn import (
    embedding,
    embedding_spec,
    table_stacking,
)

# Table name -> (vocabulary size, dim); a, b and c are stacked together.
TABLES = {"a": (100, 8), "b": (37, 8), "c": (300, 8), "d": (50, 16)}
SLOTS = ("momentum", "velocity")  # AdamOptimizerSpec's


# The dense layers' optax state, saved as the item `optimizer` (as
# jax-tpu-embedding's examples save `nnx.state(optimizer, nnx.OptState)`).
DENSE_OPTIMIZER_STATE = {"step": np.int32(1000), "mu": {"kernel": np.full((4, 2), 0.5)}}
DENSE_KERNEL = np.arange(8, dtype=np.float32).reshape(4, 2)


def feature_specs(
    devices, cores, optimizer=None, stacked=("a", "b", "c"), rotation=None
):
    """The tables' feature specs, `stacked` stacked (`stack_tables`'s
    `rotation`), and prepared for a job of `devices` x `cores`; every table's
    optimizer is `optimizer` (Adam by default, whose slots `SLOTS` are)."""
    if optimizer is None:
        optimizer = embedding_spec.AdamOptimizerSpec(learning_rate=0.1)
    features = {}
    for name, (vocabulary, dim) in TABLES.items():
        table = embedding_spec.TableSpec(
            name=name,
            vocabulary_size=vocabulary,
            embedding_dim=dim,
            initializer=jax.nn.initializers.zeros,
            optimizer=optimizer,
            combiner="sum",
        )
        features[name] = embedding_spec.FeatureSpec(
            name=f"feature_{name}",
            table_spec=table,
            input_shape=(16, 1),
            output_shape=(16, dim),
        )
    table_stacking.stack_tables(
        features,
        list(stacked),
        global_device_count=devices,
        num_sc_per_device=cores,
        rotation=rotation,
    )
    embedding.prepare_feature_specs_for_training(
        features, global_device_count=devices, num_sc_per_device=cores
    )
    return features


def table_values(seed=0):
    rng = np.random.default_rng(seed)
    return {
        part: {
            name: rng.normal(size=shape).astype(np.float32)
            for name, shape in TABLES.items()
        }
        for part in ("table", *SLOTS)
    }


def stacked_arrays(table_specs, values, shards):
    """jax-tpu-embedding's `stack_and_shard_tables` of each part of `values`
    (`{part: {table: array}}`), as 2-D arrays: `{part: {stack: array}}`."""
    return {
        part: {
            stack: np.asarray(value).reshape(-1, np.asarray(value).shape[-1])
            for stack, value in table_stacking.stack_and_shard_tables(
                table_specs, values[part], shards
            ).items()
        }
        for part in values
    }


def save_step(
    directory,
    devices,
    cores,
    values,
    tamper=None,
    record=None,
    optimizer=None,
    as_jax=False,
    stacked=("a", "b", "c"),
):
    """A checkpoint step as jax-tpu-embedding's examples write one; returns
    the step directory and jax-tpu-embedding's own stacked arrays. `record`
    (text of an `OptimizerSpecProto`) is written into every table spec with a
    combiner, as jax-tpu-embedding after 0.1.0 writes them; `optimizer` is
    the tables' spec (`feature_specs`), which 0.2.0 records itself and which
    must fit the slots of `values`; `stacked`: the tables stacked together.
    `as_jax`: the stacks saved as `jax.Array`s on the CPU, as a job saves
    them (orbax records each with its sharding), instead of NumPy arrays."""
    features = feature_specs(devices, cores, optimizer, stacked)
    specs = {name: feature.table_spec for name, feature in features.items()}
    shards = devices * cores
    stacked = stacked_arrays(specs, values, shards)
    variables = {
        stack: {
            "table": stacked["table"][stack],
            "slot": {part: stacked[part][stack] for part in values if part != "table"},
        }
        for stack in stacked["table"]
    }
    if tamper is not None:
        tamper(variables)
    if as_jax:
        variables = jax.tree_util.tree_map(jax.numpy.asarray, variables)
    proto = embedding.create_proto_from_feature_specs(features, devices, cores)
    if record is not None:
        proto = with_records(proto, record)
    manager = ocp.CheckpointManager(os.fspath(directory))
    model = {
        "dense": {"kernel": DENSE_KERNEL},
        "embedding_layer": {"embedding_table": {"value": variables}},
    }
    manager.save(
        1000,
        args=ocp.args.Composite(
            model=ocp.args.StandardSave(model),
            optimizer=ocp.args.StandardSave(DENSE_OPTIMIZER_STATE),
            embedding_spec=ocp.args.ProtoSave(proto),
        ),
    )
    manager.wait_until_finished()
    manager.close()
    return os.path.join(directory, "1000"), specs, stacked, shards


def with_records(proto, record):
    """`proto` as jax-tpu-embedding 0.2.0 writes it (its
    `create_proto_from_feature_specs` adds each table's `combiner` and
    `optimizer`, and the stack's `activation_mem_bytes_limit`), with each
    table's optimizer record `record`: fields 0.1.0's message does not have,
    so the newer message is used. A record 0.2.0 wrote already is replaced."""
    from google.protobuf import text_format

    from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import (
        spec_proto as jax_spec_proto,
    )

    newer = jax_spec_proto.parse(text_format.MessageToString(proto))
    for stack in newer.stacked_table_specs:
        stack.activation_mem_bytes_limit = 2 * 1024 * 1024
        for table in stack.table_specs:
            table.combiner = "sum"
            table.optimizer.Clear()
            text_format.Parse(record, table.optimizer)
    return newer


def cut_data_file(step_dir, item="model"):
    """Cuts the largest file of an item (its arrays' data) to 3/4, as an
    interrupted copy would; orbax's index and metadata stay intact. Returns
    every file of the item."""
    files = [
        os.path.join(root, name)
        for root, _, names in os.walk(os.path.join(step_dir, item))
        for name in names
    ]
    data = max(files, key=os.path.getsize)
    with open(data, "r+b") as handle:
        handle.truncate(os.path.getsize(data) * 3 // 4)
    return files


def their_stacks(devices, cores, values):
    """jax-tpu-embedding's own stacked arrays of `values` for a job of
    `devices` x `cores` (`{part: {stack: array}}`), and its table specs."""
    features = feature_specs(devices, cores)
    specs = {name: feature.table_spec for name, feature in features.items()}
    return stacked_arrays(specs, values, devices * cores), specs


def bits(array):
    return np.asarray(array, np.float32).view(np.uint32)


def assert_same_bits(stacks, expected):
    """Each stack's table and slots (`{stack: {"table", "slot"}}`) equal
    `expected` (`{part: {stack: array}}`) bit for bit, NaN padding included."""
    assert sorted(stacks) == sorted(expected["table"])
    for stack, variables in stacks.items():
        parts = {"table": variables["table"], **variables["slot"]}
        assert sorted(parts) == sorted(expected)
        for part, value in parts.items():
            np.testing.assert_array_equal(
                bits(value), bits(expected[part][stack]), err_msg=f"{stack} {part}"
            )
