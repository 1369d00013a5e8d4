"""Tables sharded over parameter servers <-> the TPU checkpoint layouts (issue #14).

A subprocess (this file run as a script) starts a cluster of in-process
servers on 127.0.0.1 (1 worker, 3 parameter servers, `tests/ps_training.py`),
trains a table sharded 2 ways and writes it with its optimizer state in the
`TPUEmbedding` layout (`save_tpu_checkpoint`), then loads TPU checkpoints
(`TPUEmbedding` and SparseCore layouts) into tables sharded 2 and 3 ways
(`load_into_keras`) and trains on. The process is bounded in steps and time
and ended by its PID if it overruns.

Oracles, none of them this package's sharded code:

* TensorFlow's `TPUEmbeddingForServing` with the engine optimizer restores
  what the cluster wrote (`assert_existing_objects_matched`) to the values the
  sharded table and slots had, and wrote the `TPUEmbedding` checkpoint that is
  loaded;
* one process, unsharded, loading the same checkpoint the same way and
  training with Keras's own loop (`tape.gradient`), gives the values the
  cluster reaches after training on;
* TensorFlow's checkpoint I/O ops, noted as they run (`SaveV2`, `RestoreV2`
  and its whole-tensor reader): the rows of a sharded table and its slots are
  written and read only as row slices, on the servers holding them.

In one process (sharded by a variable creator, as tests/test_sharded.py):
refusals and a damaged file leave sharded tables and slots unchanged, a slot
the optimizer does not keep goes out as zeros, and sharded tables go to the
SparseCore layout.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import sys
import time

import numpy as np
import ps_training
import pytest
from test_sharded import sharding

ROWS = 23
DIM = ps_training.DIM
STEPS = 3
NAME = "to_keras(Adam)"
TIMEOUT = 240
# As tests/test_parameter_servers.py: float32 values relative to
# max(1, |value|); the worker may round a matmul differently from this process.
TOLERANCE = 1e-6
ROOT = pathlib.Path(__file__).resolve().parents[1]


def _engine_optimizer(algorithm):
    """The engine optimizer of a registry definition (e.g. "Adam")."""
    from tf_tpu_embed_opt import embedding
    from tf_tpu_embed_opt.definitions import registry

    definition = registry.BY_NAME[algorithm]
    return embedding.class_for(definition)(learning_rate=ps_training.LEARNING_RATE)


def _serving(algorithm):
    """TensorFlow's CPU `TPUEmbedding`: the table `table` and its optimizer."""
    import tensorflow as tf
    from tensorflow.python.tpu.tpu_embedding_for_serving import (
        TPUEmbeddingForServing,
    )

    embedding = tf.tpu.experimental.embedding
    table = embedding.TableConfig(
        vocabulary_size=ROWS,
        dim=DIM,
        name="table",
        optimizer=_engine_optimizer(algorithm),
    )
    return TPUEmbeddingForServing({"table": embedding.FeatureConfig(table=table)}, None)


def _random_state(algorithm, seed):
    from tf_tpu_embed_opt.definitions import registry

    rng = np.random.default_rng(seed)
    state = {"parameters": rng.normal(0.0, 0.5, (ROWS, DIM)).astype(np.float32)}
    for slot in registry.BY_NAME[algorithm].slots:
        # Adagrad's accumulators and Adam's velocities are sums of squares;
        # Adam's momenta are signed.
        low = -0.3 if slot.name == "momenta" else 0.2
        state[slot.name] = rng.uniform(low, 1.5, (ROWS, DIM)).astype(np.float32)
    return state


def _tensorflow_checkpoint(directory, algorithm, seed):
    """A `TPUEmbedding` checkpoint written by TensorFlow itself."""
    import tensorflow as tf

    serving = _serving(algorithm)
    serving.build()
    state = _random_state(algorithm, seed)
    for key, variable in serving._variables["table"].items():
        variable.assign(state[key])
    prefix = tf.train.Checkpoint(embedding=serving).write(
        str(directory / f"tpu-{algorithm}")
    )
    return prefix, state


def _sparsecore_layouts():
    """`TPUEmbeddingV2`'s layouts of the table (4 SparseCores), and why not."""
    import tensorflow as tf

    from tf_tpu_embed_opt.checkpoints import sparsecore as sparsecore_layout

    try:
        # As tests/test_sparsecore_layout.py: TensorFlow 2.16 has neither.
        from tensorflow.core.tpu.kernels import sparse_core_layout_pb2  # noqa: F401
        from tensorflow.python.tpu import tpu_embedding_v3  # noqa: F401
    except ImportError as error:
        return None, f"this TensorFlow has no SparseCore layout ({error})"
    embedding = tf.tpu.experimental.embedding
    table = embedding.TableConfig(
        vocabulary_size=ROWS, dim=DIM, name="table", optimizer=_engine_optimizer("Adam")
    )
    features = {"table": embedding.FeatureConfig(table=table, output_shape=[16])}
    # The rows are padded and dealt round-robin over the SparseCores.
    try:
        return sparsecore_layout.stack_layouts(features, num_replicas=1), None
    except NotImplementedError as error:
        return None, str(error)


def _sparsecore_checkpoint(directory):
    """A SparseCore (`TPUEmbeddingV2`) checkpoint, or None with the reason."""
    from tf_tpu_embed_opt.checkpoints import sparsecore as sparsecore_layout

    layouts, reason = _sparsecore_layouts()
    if layouts is None:
        return None, None, reason
    state = _random_state("Adam", seed=4)
    prefix = sparsecore_layout.write_checkpoint(
        str(directory / "sparsecore"), layouts, {"table": state}, "Adam"
    )
    return prefix, state, None


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Runs the cluster once; returns its results and the checkpoints' states."""
    directory = tmp_path_factory.mktemp("sharded_tpu")
    tpu_prefix, tpu_state = _tensorflow_checkpoint(directory, "Adam", seed=3)
    adagrad_prefix, adagrad_state = _tensorflow_checkpoint(directory, "Adagrad", 6)
    sparsecore_prefix, sparsecore_state, reason = _sparsecore_checkpoint(directory)
    saved = str(directory / "saved" / "ckpt")
    adam = {"name": NAME, "algorithm": "Adam", "kind": "tpu"}
    loads = [
        dict(adam, key="tpu>3", path=tpu_prefix, shards=3, step=7),
        # The cluster's own TPU checkpoint (2 shards) into 3, with its step.
        dict(adam, key="saved>3", path=saved, shards=3),
        # The engine's Adagrad state into ClippyAdagrad (its accumulator, and
        # its clipping factor reduced across the shards), given the model.
        dict(
            key="adagrad>3",
            name="ClippyAdagrad()",
            algorithm="Adagrad",
            kind="tpu",
            path=adagrad_prefix,
            shards=3,
            step=7,
            target="model",
        ),
    ]
    if sparsecore_prefix is not None:
        loads.append(
            dict(
                adam,
                key="sparsecore>2",
                kind="sparsecore",
                path=sparsecore_prefix,
                shards=2,
                step=7,
            )
        )
    results = ps_training.run_script(
        __file__, directory, {"save": saved, "loads": loads}, TIMEOUT
    )
    return {
        "results": results,
        "saved": saved,
        "loads": {run["key"]: run for run in loads},
        "states": {
            "tpu>3": tpu_state,
            "adagrad>3": adagrad_state,
            "sparsecore>2": sparsecore_state,
        },
        "sparsecore_skip": reason,
    }


def _of(results, prefix):
    return {
        key[len(prefix) :]: value
        for key, value in results.items()
        if key.startswith(prefix)
    }


def _slot_variables(algorithm):
    """Engine slot -> the name of the Keras slot variable of the table."""
    from tf_tpu_embed_opt.definitions import registry

    return {
        slot.name: f"optimizer/table_embeddings_{slot.keras_variable_name}"
        for slot in registry.BY_NAME[algorithm].slots
    }


def test_a_sharded_table_saves_in_the_tpu_layout_with_its_slots(cluster):
    """TensorFlow's TPUEmbeddingForServing restores what the cluster wrote."""
    import tensorflow as tf

    from tf_tpu_embed_opt import checkpoints

    results = cluster["results"]
    trained = _of(results, "saved|state|")
    serving = _serving("Adam")
    status = tf.train.Checkpoint(embedding=serving).read(cluster["saved"])
    serving.build()
    status.assert_existing_objects_matched()
    restored = {k: v.numpy() for k, v in serving._variables["table"].items()}
    assert set(restored) == {"parameters", *_slot_variables("Adam")}
    np.testing.assert_array_equal(restored["parameters"], trained["model/embeddings"])
    for slot, variable in _slot_variables("Adam").items():
        np.testing.assert_array_equal(restored[slot], trained[variable], err_msg=slot)
    reader = checkpoints.TPUCheckpointReader(cluster["saved"])
    assert int(reader.read_scalar("step")) == STEPS

    # Each server wrote its own rows: the table's and slots' keys were saved
    # only as row slices, each on the host of the shard holding those rows.
    devices = [str(results[f"saved|device|{i}"]) for i in range(2)]
    assert len(set(devices)) == 2 and all("/job:ps/" in d for d in devices)
    split = int(results["saved|rows|0"])
    expected_slices = [
        f"{ROWS} {DIM} 0,{split}:-",
        f"{ROWS} {DIM} {split},{ROWS - split}:-",
    ]
    written = {}
    for device, names, slices in json.loads(str(results["saved|io"]))["SaveV2"]:
        for name, where in zip(names, slices):
            if "/table" in name:
                written.setdefault(name, []).append((where, device))
    assert len(written) == 3, written
    for name, parts in written.items():
        assert sorted(parts) == sorted(zip(expected_slices, devices)), (name, parts)


@pytest.mark.parametrize("key", ["tpu>3", "saved>3", "adagrad>3", "sparsecore>2"])
def test_a_tpu_checkpoint_loads_into_sharded_tables_and_trains_on(cluster, key):
    """Loaded shard by shard, then as one process loaded the same way."""
    if key not in cluster["loads"]:
        pytest.skip(cluster["sparsecore_skip"])
    results = cluster["results"]
    run = cluster["loads"][key]
    shards = run["shards"]
    devices = [str(results[f"{key}|device|embeddings/{i}"]) for i in range(shards)]
    assert len(set(devices)) == shards and all("/job:ps/" in d for d in devices)
    slots = _slot_variables(run["algorithm"])
    io = json.loads(str(results[f"{key}|io"]))
    if run["kind"] == "tpu":
        # Each server read its shards' rows of the table and of each slot
        # itself (to verify, then to load); none came whole to this process.
        assert [k for k in io["whole"] if "/table" in k] == [], io["whole"]
        sizes = [int(results[f"{key}|rows|{i}"]) for i in range(shards)]
        starts = np.cumsum([0, *sizes])
        expected_reads = [
            (f"{ROWS} {DIM} {start},{size}:-", device)
            for start, size, device in zip(starts, sizes, devices)
        ]
        reads = {}
        for device, names, slices in io["RestoreV2"]:
            for name, where in zip(names, slices):
                reads.setdefault(name, []).append((where, device))
        assert len(reads) == 1 + len(slots), reads
        for name, parts in reads.items():
            assert sorted(parts) == sorted(expected_reads * 2), (name, parts)

    loaded, trained = _of(results, f"{key}|loaded|"), _of(results, f"{key}|trained|")
    expected, reference = _one_process(run)
    # Right after loading: exactly the checkpoint's table, slots and step.
    state = cluster["states"].get(key)
    if state is None:  # the cluster's own checkpoint
        state = {
            "parameters": _of(results, "saved|state|")["model/embeddings"],
            **{
                slot: _of(results, "saved|state|")[variable]
                for slot, variable in _slot_variables("Adam").items()
            },
        }
    np.testing.assert_array_equal(loaded["model/embeddings"], state["parameters"])
    assert set(state) == {"parameters", *slots}
    for slot, variable in slots.items():
        np.testing.assert_array_equal(loaded[variable], state[slot], err_msg=slot)
    assert int(loaded["optimizer/iteration"]) == run.get("step", STEPS)
    assert loaded.keys() == expected.keys()
    for name, value in expected.items():
        np.testing.assert_array_equal(loaded[name], value, err_msg=name)
    # Then STEPS steps on the cluster: as in one process.
    failures = []
    assert trained.keys() == reference.keys()
    for name, value in reference.items():
        scale = np.maximum(1.0, np.abs(value))
        diff = float(np.max(np.abs(trained[name] - value) / scale))
        if diff > TOLERANCE:
            failures.append((name, diff))
    assert not failures, failures
    # The rows moved: training changed the loaded table.
    assert not np.array_equal(trained["model/embeddings"], state["parameters"])


def _source(run):
    from tf_tpu_embed_opt import checkpoints
    from tf_tpu_embed_opt.checkpoints import sparsecore as sparsecore_layout

    if run["kind"] == "sparsecore":
        return sparsecore_layout.SparseCoreCheckpointReader(
            run["path"], run["algorithm"]
        )
    return checkpoints.TPUCheckpointReader(run["path"])


def _load(run, model, optimizer):
    import tf_tpu_embed_opt as teo

    # A model's tables are its Embedding layers of the same name.
    target = model if run.get("target") == "model" else {"table": model.table}
    teo.load_into_keras(
        _source(run),
        target,
        optimizer,
        step=run.get("step"),
        step_path=None if "step" in run else "step",
    )


def _one_process(run):
    """The oracle: unsharded, loaded the same way, Keras's own loop."""
    import tensorflow as tf

    model = ps_training.make_model(ROWS)
    optimizer = ps_training.optimizer_factories()[run["name"]]()
    optimizer.build(model.trainable_variables)
    _load(run, model, optimizer)
    loaded = ps_training.state_of(model, optimizer)

    @tf.function
    def step(ids, labels):
        with tf.GradientTape() as tape:
            loss = ps_training.loss_of(model, ids, labels)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))

    for ids, labels in ps_training.batches(ROWS, STEPS, seed=2):
        step(ids, labels)
    return loaded, ps_training.state_of(model, optimizer)


# --- In one process: refusals and the writer's slices ----------------------


def test_refusals_leave_sharded_tables_and_slots_unchanged(tmp_path):
    import tf_tpu_embed_opt as teo
    from tf_tpu_embed_opt import checkpoints
    from tf_tpu_embed_opt.layers import sharded

    with sharding(2):
        model = ps_training.make_model(ROWS)
    optimizer = ps_training.optimizer_factories()[NAME]()
    optimizer.build(model.trainable_variables)
    assert sharded.shards_of(model.table.embeddings) is not None
    before = ps_training.state_of(model, optimizer)

    # Another algorithm's slots (Adagrad's accumulators for the twin of Adam).
    adagrad = str(tmp_path / "adagrad")
    checkpoints.write_tpu_checkpoint(
        adagrad,
        [
            (
                "table",
                {
                    "parameters": np.ones((ROWS, DIM), np.float32),
                    "accumulators": np.ones((ROWS, DIM), np.float32),
                },
            )
        ],
    )
    with pytest.raises(ValueError, match="Table 'table'.*accumulators"):
        teo.load_into_keras(adagrad, {"table": model.table}, optimizer, step=9)
    # Another vocabulary size.
    state = _random_state("Adam", seed=5)
    other = str(tmp_path / "other")
    checkpoints.write_tpu_checkpoint(
        other, [("table", {k: np.concatenate([v, v[:1]]) for k, v in state.items()})]
    )
    with pytest.raises(ValueError, match=r"shape \(24, 4\).*has \(23, 4\)"):
        teo.load_into_keras(other, {"table": model.table}, optimizer, step=9)
    after = ps_training.state_of(model, optimizer)
    for name, value in before.items():
        np.testing.assert_array_equal(after[name], value, err_msg=name)


def test_a_damaged_file_read_shard_by_shard_changes_nothing(tmp_path):
    """The rows each shard reads are checked before any shard is assigned."""
    import tf_tpu_embed_opt as teo
    from tf_tpu_embed_opt import checkpoints

    with sharding(2):
        model = ps_training.make_model(ROWS)
    optimizer = ps_training.optimizer_factories()[NAME]()
    optimizer.build(model.trainable_variables)
    before = ps_training.state_of(model, optimizer)
    prefix = checkpoints.write_tpu_checkpoint(
        str(tmp_path / "ckpt"), [("table", _random_state("Adam", seed=8))]
    )
    # The table's data file (the object graph's is smaller): its last tensor
    # is damaged, so the table and its first slot read intact.
    data = max(tmp_path.glob("ckpt.data-*"), key=lambda path: path.stat().st_size)
    size = data.stat().st_size
    with open(data, "r+b") as f:
        f.seek(size - 100)
        byte = f.read(1)
        f.seek(size - 100)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(
        ValueError, match=r"table 'table', slot '\w+' rows \d+:\d+ cannot be read"
    ):
        teo.load_into_keras(prefix, {"table": model.table}, optimizer, step=9)
    after = ps_training.state_of(model, optimizer)
    for name, value in before.items():
        np.testing.assert_array_equal(after[name], value, err_msg=name)


def test_a_float32_checkpoint_into_sharded_bfloat16_tables_is_refused(tmp_path):
    """Narrowing to bfloat16 needs every value checked before any changes;
    shards read their rows on their own servers, so it is refused there,
    while the same checkpoint loads into one unsharded bfloat16 table."""
    import tensorflow as tf

    import tf_tpu_embed_opt as teo
    from tf_tpu_embed_opt import checkpoints, embedding
    from tf_tpu_embed_opt.layers import sharded

    def table():
        layer = sharded.Embedding(ROWS, DIM, dtype="bfloat16", name="table")
        layer.build((None,))
        return layer

    def values(layer, optimizer):
        variables = (layer.embeddings, *optimizer.variables)
        return [tf.convert_to_tensor(v.value).numpy() for v in variables]

    def optimizer_of(layer):
        # Built outside `sharding`: the slots follow the table's shards.
        optimizer = teo.to_keras(embedding.Adam(learning_rate=0.1))
        optimizer.build([layer.embeddings])
        return optimizer

    # Quarters in [-2, 2): every one a bfloat16 value, so only the place of
    # the rows' reads decides.
    rng = np.random.default_rng(3)
    state = {
        key: rng.integers(-8, 8, (ROWS, DIM)).astype(np.float32) / 4
        for key in ("parameters", "momenta", "velocities")
    }
    state["velocities"] = np.abs(state["velocities"])
    prefix = checkpoints.write_checkpoint(
        str(tmp_path / "ckpt"), [("table", state)], step=6
    )
    with sharding(2):
        layer = table()
    optimizer = optimizer_of(layer)
    assert sharded.shards_of(layer.embeddings) is not None
    before = values(layer, optimizer)
    for verify, why in (
        (True, "its shards' rows are read on their parameter servers"),
        (False, "`verify=False` reads each value only as it loads it"),
    ):
        with pytest.raises(ValueError) as refused:
            teo.load_into_keras(prefix, {"table": layer}, optimizer, verify=verify)
        message = str(refused.value)
        assert message.startswith(
            "Table 'table': the checkpoint holds it as float32, which loads into "
            "its bfloat16 variables only once every value is found"
        ), message
        assert f"that cannot be done here: {why}." in message, message
    after = values(layer, optimizer)
    for old, new in zip(before, after):
        np.testing.assert_array_equal(new, old)

    layer = table()
    optimizer = optimizer_of(layer)
    assert sharded.shards_of(layer.embeddings) is None
    teo.load_into_keras(prefix, {"table": layer}, optimizer)
    loaded = dict(
        zip(["table", *(v.name for v in optimizer.variables)], values(layer, optimizer))
    )
    for key, name in (
        ("parameters", "table"),
        ("momenta", "table_embeddings_momentum"),
        ("velocities", "table_embeddings_velocity"),
    ):
        np.testing.assert_array_equal(loaded[name].astype(np.float32), state[key], key)
    assert int(optimizer.iterations) == 6


def test_a_slot_the_optimizer_does_not_keep_is_written_as_zeros(tmp_path):
    """RMSProp without momentum, sharded: `mom` is written as 0, read unkept."""
    import tensorflow as tf
    from tensorflow.python.tpu.tpu_embedding_for_serving import (
        TPUEmbeddingForServing,
    )

    import tf_tpu_embed_opt as teo

    table_opt = teo.embedding.RMSProp(learning_rate=0.05, momentum=0.0)
    with sharding(3):
        model = ps_training.make_model(ROWS)
    optimizer = teo.to_keras(table_opt)
    optimizer.build(model.trainable_variables)
    slot = next(v for v in optimizer.variables if v.name == "table_embeddings_velocity")
    slot.assign(np.full((ROWS, DIM), 0.5, np.float32))
    prefix = teo.save_tpu_checkpoint(
        str(tmp_path / "ckpt"), {"table": model.table}, optimizer
    )
    embedding = tf.tpu.experimental.embedding
    config = embedding.TableConfig(
        vocabulary_size=ROWS, dim=DIM, name="table", optimizer=table_opt
    )
    serving = TPUEmbeddingForServing(
        {"table": embedding.FeatureConfig(table=config)}, None
    )
    status = tf.train.Checkpoint(embedding=serving).read(prefix)
    serving.build()
    status.assert_existing_objects_matched()
    variables = serving._variables["table"]
    np.testing.assert_array_equal(
        variables["parameters"].numpy(),
        tf.convert_to_tensor(model.table.embeddings.value).numpy(),
    )
    np.testing.assert_array_equal(variables["ms"].numpy(), np.full((ROWS, DIM), 0.5))
    np.testing.assert_array_equal(variables["mom"].numpy(), np.zeros((ROWS, DIM)))
    # Back into the shards from TensorFlow's values: `mom` is read (checked),
    # not kept.
    variables["parameters"].assign(variables["parameters"] + 1.0)
    variables["ms"].assign(variables["ms"] * 3.0)
    changed = tf.train.Checkpoint(embedding=serving).write(str(tmp_path / "changed"))
    teo.load_into_keras(changed, {"table": model.table}, optimizer, step=2)
    np.testing.assert_array_equal(
        tf.convert_to_tensor(model.table.embeddings.value).numpy(),
        variables["parameters"].numpy(),
    )
    np.testing.assert_array_equal(
        tf.convert_to_tensor(slot.value).numpy(), np.full((ROWS, DIM), 1.5)
    )


def test_a_sharded_table_writes_the_sparsecore_layout(tmp_path):
    """Table states of sharded tables, one at a time, to the SparseCore writer."""
    from tf_tpu_embed_opt.checkpoints import sparsecore as sparsecore_layout
    from tf_tpu_embed_opt.checkpoints.keras import state as keras_state

    layouts, reason = _sparsecore_layouts()
    if layouts is None:
        pytest.skip(reason)
    with sharding(3):
        model = ps_training.make_model(ROWS)
    optimizer = ps_training.optimizer_factories()[NAME]()
    optimizer.build(model.trainable_variables)
    rng = np.random.default_rng(9)
    for variable in optimizer.variables:
        if variable.name.startswith("table_embeddings_"):
            variable.assign(rng.uniform(0.2, 1.5, variable.shape).astype(np.float32))
    tables = keras_state.keras_tables({"table": model.table}, optimizer)
    path = sparsecore_layout.write_checkpoint(
        str(tmp_path / "sc"), layouts, keras_state.keras_table_states(tables), "Adam"
    )
    state = sparsecore_layout.SparseCoreCheckpointReader(path, "Adam").read("table")
    values = ps_training.state_of(model, optimizer)
    np.testing.assert_array_equal(state["parameters"], values["model/embeddings"])
    for slot, variable in _slot_variables("Adam").items():
        np.testing.assert_array_equal(state[slot], values[variable], err_msg=slot)


# --- The cluster process ----------------------------------------------------


@contextlib.contextmanager
def _noting_io():
    """Notes TensorFlow's checkpoint I/O: where each op runs, what it touches.

    Yields a dict: `"SaveV2"` and `"RestoreV2"` list `(device scope, keys,
    shape_and_slices)` per op; `"whole"` lists the keys read whole into this
    process by TensorFlow's checkpoint reader.
    """
    import tensorflow as tf
    from tensorflow.python.eager import context
    from tensorflow.python.training import py_checkpoint_reader

    noted = {"SaveV2": [], "RestoreV2": [], "whole": []}
    reader = py_checkpoint_reader.CheckpointReader
    originals = {
        "SaveV2": tf.raw_ops.SaveV2,
        "RestoreV2": tf.raw_ops.RestoreV2,
        "whole": reader.get_tensor,
    }

    def noting(op):
        def run(**kwargs):
            noted[op].append(
                (
                    context.context().device_name,
                    [str(name) for name in kwargs["tensor_names"]],
                    [str(where) for where in kwargs["shape_and_slices"]],
                )
            )
            return originals[op](**kwargs)

        return run

    def whole(self, key):
        noted["whole"].append(key)
        return originals["whole"](self, key)

    tf.raw_ops.SaveV2, tf.raw_ops.RestoreV2 = noting("SaveV2"), noting("RestoreV2")
    reader.get_tensor = whole
    try:
        yield noted
    finally:
        tf.raw_ops.SaveV2 = originals["SaveV2"]
        tf.raw_ops.RestoreV2 = originals["RestoreV2"]
        reader.get_tensor = originals["whole"]


def _main(spec_path, output_path):
    import tensorflow as tf

    import tf_tpu_embed_opt as teo
    from tf_tpu_embed_opt.layers import sharded

    spec = json.loads(open(spec_path).read())
    started = time.time()
    cluster = ps_training.Cluster(num_workers=1, num_ps=3)
    results = {}

    def record(prefix, model, optimizer):
        for name, value in ps_training.state_of(model, optimizer).items():
            results[f"{prefix}|{name}"] = value

    # Train a table sharded 2 ways, then save it in the TPUEmbedding layout,
    # noting where each SaveV2 runs and what it writes.
    model, optimizer = cluster.build(NAME, ROWS, 2)
    train = cluster.trainer([(model, optimizer)])
    for ids, labels in ps_training.batches(ROWS, STEPS):
        train(tf.constant(ids), tf.constant(labels))
    with _noting_io() as io:
        teo.save_tpu_checkpoint(spec["save"], {"table": model.table}, optimizer)
    record("saved|state", model, optimizer)
    results["saved|io"] = np.array(json.dumps(io))
    for position, shard in enumerate(sharded.shards_of(model.table.embeddings)):
        results[f"saved|device|{position}"] = np.array(shard.device)
        results[f"saved|rows|{position}"] = np.array(int(shard.shape[0]))

    # Load TPU checkpoints into sharded tables and train on, all in one step.
    pairs = []
    for run in spec["loads"]:
        model, optimizer = cluster.build(run["name"], ROWS, run["shards"])
        with _noting_io() as io:
            _load(run, model, optimizer)
        results[f"{run['key']}|io"] = np.array(json.dumps(io))
        record(f"{run['key']}|loaded", model, optimizer)
        for name, device in ps_training.devices_of(model, optimizer).items():
            results[f"{run['key']}|device|{name}"] = np.array(device)
        for position, shard in enumerate(sharded.shards_of(model.table.embeddings)):
            results[f"{run['key']}|rows|{position}"] = np.array(int(shard.shape[0]))
        pairs.append((model, optimizer))
    train = cluster.trainer(pairs)
    for ids, labels in ps_training.batches(ROWS, STEPS, seed=2):
        train(tf.constant(ids), tf.constant(labels))
    for run, (model, optimizer) in zip(spec["loads"], pairs):
        record(f"{run['key']}|trained", model, optimizer)
    if time.time() - started > spec["time_limit"]:
        results["timed_out"] = np.array(True)
    np.savez(output_path, **results)


if __name__ == "__main__":
    os.environ["GRPC_FAIL_FAST"] = "use_caller"
    ps_training.run_as_script(_main, sys.argv[1], sys.argv[2])


def test_a_jax_tpu_embedding_step_loads_shard_by_shard(tmp_path):
    """Each shard of a sharded table (and slot) is given only its rows, read
    from the orbax step range by range (`JaxCheckpointReader.read_rows`,
    which reads only the chunks holding them with `cache_bytes=0`)."""
    pytest.importorskip("orbax.checkpoint")
    import tensorflow as tf

    import tf_tpu_embed_opt as teo
    from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import reader as jax_orbax
    from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import (
        writer as jax_orbax_writer,
    )
    from tf_tpu_embed_opt.checkpoints.keras import tables as keras_tables

    with sharding(3):
        model = ps_training.make_model(ROWS)
    optimizer = ps_training.optimizer_factories()[NAME]()
    optimizer.build(model.trainable_variables)
    state = _random_state("Adam", seed=11)
    spec = jax_orbax_writer.embedding_spec_for(
        {"table": (ROWS, DIM)}, num_devices=2, sparsecores_per_device=4
    )
    step = jax_orbax_writer.write_jax_checkpoint(
        tmp_path, 5, [("table", state)], spec, {"table": "Adam"}
    )
    reader = jax_orbax.JaxCheckpointReader(step, cache_bytes=0)
    ranges = []
    read_rows = reader.read_rows

    def noting(name, key, rows, device=None):
        ranges.append((key, tuple(rows)))
        return read_rows(name, key, rows, device)

    reader.read_rows = noting
    teo.load_into_keras(reader, {"table": model.table}, optimizer, step=5)
    (table,) = keras_tables.keras_tables({"table": model.table}, optimizer)
    for key, variable in (("parameters", table.variable), *table.slots.items()):
        np.testing.assert_array_equal(
            tf.convert_to_tensor(variable.value).numpy(), state[key], err_msg=key
        )
    # Three shards of 23 rows, each key read once to check, once to assign.
    shards = [(0, 8), (8, 16), (16, 23)]
    for key in ("parameters", "momenta", "velocities"):
        assert [r for k, r in ranges if k == key] == shards * 2, key
    assert int(optimizer.iterations.numpy()) == 5
