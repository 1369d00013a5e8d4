"""Row-sparse tables across JAX processes: the programs of the guide
"Training across processes on JAX" (a custom step, and `fit`), run as 2
processes x 2 CPU devices on 127.0.0.1, equal 1 process x 4 devices bit for
bit (`jax_processes.py` says why the comparison is exact), also through a
checkpoint that 2 processes wrote and 1 process continues from; each
process holds only its rows of a table; checkpoints of the TPU layouts load
with each process reading only its rows (`jax_processes_load.py`); a killed
or frozen process stops the other, naming it; a batch holding an id outside
a table is refused in every process (`refused_ids_distributed.py`).

Each run is bounded (steps, and time: its processes are ended by their
PIDs).
"""

# Runs without TensorFlow.
# (Fit across processes takes tf.data, and the load test's children read
# TensorFlow's checkpoint layouts: both are skipped without it.)

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from child_env import child_env
from conftest import same_in_the_jax_leg, version_independent

# The children run on Keras's JAX backend whatever the suite's backend. CI
# runs each test once: two processes equal to one, and an id outside a table
# refused in both, in the JAX legs (same_in_the_jax_leg: how JAX reports a
# refused step across processes differs by release); the others as
# version_independent, in the TensorFlow 2.21 leg's virtualenv, which has the
# `jax` extra: fit (tf.data) and the load test (TensorFlow's layouts) need
# TensorFlow, and the killed or frozen process test, which needs neither,
# runs in the same CI stream as the JAX leg either way.
pytest.importorskip("jax")
pytest.importorskip("orbax.checkpoint")

import jax_processes  # noqa: E402

from tf_tpu_embed_opt import checkpoints  # noqa: E402

SCRIPT = os.path.join(os.path.dirname(__file__), "jax_processes.py")
# What a run of 6 small steps may take on a loaded 2-core machine, starting
# included (about 15 s there when quiet).
BOUND_SECONDS = 240


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _start(processes, devices, directory, script=SCRIPT, arguments=(), **settings):
    """Starts `script` (`jax_processes.py`) as `processes` processes, with
    `arguments` after its own; returns them, their logs and their output."""
    out = str(directory / f"{processes}.npz")
    port = str(_free_port())
    env = child_env(
        KERAS_BACKEND="jax",
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
        **settings,
    )
    logs = [open(directory / f"{processes}-{p}.log", "w+") for p in range(processes)]
    children = [
        subprocess.Popen(
            [sys.executable, script, str(p), str(processes), port, out, *arguments],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        for p, log in enumerate(logs)
    ]
    return children, logs, out


def _end(children, logs, seconds):
    """Waits at most `seconds` for the processes, kills those left by their
    PIDs; returns their logs."""
    deadline = time.monotonic() + seconds
    try:
        for child in children:
            child.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    finally:
        for child in children:
            if child.poll() is None:
                os.kill(child.pid, signal.SIGKILL)
                child.wait()
    texts = []
    for log in logs:
        log.seek(0)
        texts.append(log.read())
        log.close()
    return texts


def _run(processes, devices, directory, name, **settings):
    """Starts the guide's program (or `script=`) as `processes` processes;
    returns a function that waits for them and returns process 0's results."""
    directory = directory / name
    directory.mkdir()
    children, logs, out = _start(processes, devices, directory, **settings)

    def finished():
        texts = _end(children, logs, BOUND_SECONDS)
        for p, (child, text) in enumerate(zip(children, texts)):
            assert child.returncode == 0, (
                f"{name}: process {p} of {processes}:\n{text[-3000:]}"
            )
        return np.load(out)

    return finished


def _assert_equal(got, want):
    tables = [k for k in want.files if k.endswith("embeddings")]
    assert sorted(tables) == ["stacked/stack_0/embeddings", "table/embeddings"]
    # Every variable: tables, slots, the table optimizers' step counters.
    assert sorted(got.files) == sorted(want.files)
    for key in want.files:
        if key not in ("local_rows", "table_sharding"):
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    # Each table's step counter (`layers.table_step`: [low, high] float32,
    # high * 2**24 + low).
    step = [k for k in want.files if k.endswith("/step")]
    assert step and all(list(want[k]) == [6, 0] for k in step), step


@same_in_the_jax_leg
def test_two_processes_equal_one_also_through_checkpoints(tmp_path):
    """2 processes train 3 steps and save (each process its shards); from
    that step 1 process of 4 devices trains on to step 6: equal to 6
    uninterrupted steps of 1 process bit for bit (so the 2 processes' 3 steps
    equal 1 process's too)."""
    saved = tmp_path / "saved"
    # The two runs are independent: started together.
    one = _run(1, 4, tmp_path, "one")
    two = _run(2, 2, tmp_path, "two", STEPS="3", CHECKPOINTS=str(saved))
    try:
        one = one()
    finally:
        two = two()
    assert sorted(p.name for p in saved.iterdir()) == ["1", "2", "3"]
    # Each of the two processes holds half of the table's 64 rows; the one
    # process, all of them.
    assert "'model'" in str(two["table_sharding"])
    assert int(two["local_rows"]) == 32 and int(one["local_rows"]) == 64
    # Written by 2 processes, read by 1 (with other shardings).
    moved = _run(1, 4, tmp_path, "moved", CHECKPOINTS=str(saved))()
    _assert_equal(moved, one)


@version_independent
def test_fit_across_processes_with_keras_checkpoints(tmp_path):
    """The guide's program with `fit`: 2 processes fit 3 steps, saving each
    with `keras.callbacks.OrbaxCheckpoint` (each process its shards); 1
    process of 4 devices loads the last with `load_weights` and fits on to
    step 6: equal to 6 uninterrupted steps of 1 process bit for bit. The
    2 processes also write the table as a jax-tpu-embedding step, each its
    rows; that step and the callback's read through `open_checkpoint` (and
    load with `load_into_keras` into one process) as the processes held
    the table."""
    pytest.importorskip("tensorflow")  # fit across processes takes tf.data
    saved = tmp_path / "saved"
    one = _run(1, 4, tmp_path, "one", arguments=["fit"])
    tpu_job = tmp_path / "tpu_job"
    two = _run(
        2,
        2,
        tmp_path,
        "two",
        arguments=["fit"],
        STEPS="3",
        CHECKPOINTS=str(saved),
        TPU_JOB=str(tpu_job),
    )
    try:
        one = one()
    finally:
        two = two()
    assert sorted(p.name for p in saved.iterdir()) == ["3"]
    assert int(two["local_rows"]) == 32 and int(one["local_rows"]) == 64
    # The package's reader reads the step the 2 processes wrote, as they
    # held it (gathered from both): the way to the TPU layouts.
    step = checkpoints.open_checkpoint(saved / "3")
    assert step.format == "keras" and step.step == 3
    state = step.read("table")
    np.testing.assert_array_equal(state["parameters"], two["table/embeddings"])
    np.testing.assert_array_equal(state["accumulators"], two["table/accumulator"])
    # The table as a TPU job's step, each process writing its rows: as held.
    written = checkpoints.open_checkpoint(tpu_job / "3")
    assert written.format == "jax-tpu-embedding" and written.step == 3
    held = written.read("table")
    np.testing.assert_array_equal(held["parameters"], two["table/embeddings"])
    np.testing.assert_array_equal(held["accumulators"], two["table/accumulator"])
    assert {p.name for p in (tpu_job / "3" / "model").iterdir()} >= {
        "ocdbt.process_0",
        "ocdbt.process_1",
    }
    # ... and loads into one CPU process with `load_into_keras`.
    import keras

    import tf_tpu_embed_opt as teo

    fresh = teo.layers.Embedding(64, 4, optimizer=teo.optimizers.Adagrad(0.2))
    fresh.build((None,))
    teo.load_into_keras(written, {"table": fresh}, None)
    numpy = keras.ops.convert_to_numpy
    np.testing.assert_array_equal(numpy(fresh.embeddings), two["table/embeddings"])
    np.testing.assert_array_equal(
        numpy(fresh.slots["accumulators"]), two["table/accumulator"]
    )
    # A table this small is kept inline in the step's merged index (as the
    # guide says), not in a process's files: without process 1's files it
    # still reads whole. (A larger one is refused, naming the table:
    # test_keras_orbax.py.)
    partial = tmp_path / "partial" / "3"
    shutil.copytree(saved / "3", partial)
    shutil.rmtree(partial / "pytree" / "ocdbt.process_1")
    inline = checkpoints.open_checkpoint(partial).read("table")
    np.testing.assert_array_equal(inline["parameters"], state["parameters"])
    moved = _run(1, 4, tmp_path, "moved", arguments=["fit"], CHECKPOINTS=str(saved))()
    assert sorted(moved.files) == sorted(one.files)
    assert {"table/embeddings", "table/accumulator"} <= set(one.files)
    for key in one.files:
        if key not in ("local_rows", "table_sharding"):
            np.testing.assert_array_equal(moved[key], one[key], err_msg=key)
    # The table's step counter: [low, high] float32 (`layers.table_step`).
    assert list(one["table/step"]) == [6, 0]


# Gloo's error when a peer's end breaks a transfer, as XLA's CPU collectives
# raise it ("Gloo all-reduce failed: " and gloo's transport message).
BROKEN_TRANSFER = (
    r"Gloo [\w -]+ failed: .*"
    r"(Connection closed by peer|Connection reset by peer|Broken pipe)"
)


@version_independent
def test_a_killed_or_frozen_process_stops_the_other_naming_it(tmp_path):
    """Process 1 killed (SIGKILL), or frozen (SIGSTOP: its heartbeats stop
    too), in the middle of training, in two jobs run side by side: process 0
    ends within the heartbeat timeout it was started with (and a margin for
    a loaded machine), with JAX's message naming the lost process (task 1),
    or, killed only, with gloo's error of a transfer the kill broke (the
    guide's "When a process dies": a frozen process keeps its connections).
    The frozen process stays stopped until ended by its PID."""
    heartbeat = 5
    jobs = {}
    for how in ("killed", "frozen"):
        directory = tmp_path / how
        directory.mkdir()
        children, logs, _ = _start(
            2, 2, directory, STEPS="100000", HEARTBEAT_SECONDS=str(heartbeat)
        )
        jobs[how] = (directory, children, logs)
    took = {}
    try:
        for how, signal_number in (
            ("killed", signal.SIGKILL),
            ("frozen", signal.SIGSTOP),
        ):
            directory, children, _ = jobs[how]
            # Training has begun once process 0's first step has run.
            started = time.monotonic()
            while jax_processes.TRAINING not in (directory / "2-0.log").read_text():
                assert children[0].poll() is None and children[1].poll() is None
                assert time.monotonic() - started < BOUND_SECONDS, "never trained"
                time.sleep(0.5)
            time.sleep(2)
            assert children[0].poll() is None, f"{how}: process 0 ended first"
            os.kill(children[1].pid, signal_number)
            took[how] = time.monotonic()
        for how, (_, children, _) in jobs.items():
            children[0].wait(timeout=heartbeat + 60)
            took[how] = time.monotonic() - took[how]
    finally:
        texts = {
            how: _end(children, logs, 0) for how, (_, children, logs) in jobs.items()
        }
    for how, (_, children, _) in jobs.items():
        text = texts[how][0]
        assert children[0].returncode != 0, how
        assert took[how] < heartbeat + 60, (how, took[how])
        named = re.search(r"stopped sending heartbeats\):\s*1\b", text)
        broken = how == "killed" and re.search(BROKEN_TRANSFER, text)
        assert named or broken, (how, text[-3000:])


@same_in_the_jax_leg
def test_an_id_outside_a_table_is_refused_in_every_process(tmp_path):
    """2 processes of 2 devices, the table's rows sharded across them, a
    `jax.jit` step whose batch holds an id outside the table: every process
    raises the refusal, and the job trains on (tests/refused_ids_distributed.py).
    Before, one process raised it and the other failed 30 s later with
    gloo's error, naming no id."""
    children, logs, _ = _start(2, 2, tmp_path, script=REFUSER)
    texts = _end(children, logs, BOUND_SECONDS)
    refusal = (
        "refused rows: OutOfRangeIds: Embedding `table`: id 99 is outside the "
        "table, whose ids are [0, 40) (input_dim=40)."
    )
    for p, (child, text) in enumerate(zip(children, texts)):
        assert child.returncode == 0, f"process {p}:\n{text[-3000:]}"
        lines = text.splitlines()
        assert any(line.startswith(refusal) for line in lines), text[-3000:]
        assert "trained on rows: True" in lines, text[-3000:]


REFUSER = os.path.join(os.path.dirname(__file__), "refused_ids_distributed.py")

LOADER = os.path.join(os.path.dirname(__file__), "jax_processes_load.py")
# The tables of `jax_processes_load.py`'s model, and where each sits in the
# variable that holds it (a stacked table in its stack's rows).
SHAPES = {"table": (64, 4), "part_2": (40, 4), "part_3": (24, 4)}
HELD_IN = {
    "table": ("table/embeddings", 0),
    "part_2": ("stacked/stack_0/embeddings", 0),
    "part_3": ("stacked/stack_0/embeddings", 40),
}
# Engine slot -> the Keras variable it loads into, beside the table's.
SLOTS = {"accumulators": "accumulator", "momenta": "momentum", "velocities": "velocity"}


def _sources(directory):
    """Checkpoints of the loader's tables with their slots: a
    jax-tpu-embedding step (2 chips x 4 SparseCores, the two parts stacked),
    a step of Keras's `OrbaxCheckpoint` (stacked otherwise) and, with
    TensorFlow, a `TPUEmbedding` checkpoint; each with its own values.
    Returns the paths and the states."""
    from tf_tpu_embed_opt import checkpoints
    from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import (
        writer as jax_orbax_writer,
    )

    algorithms = {"table": "Adagrad", "part_2": "Adam", "part_3": "Adam"}
    slots = {"Adagrad": ("accumulators",), "Adam": ("momenta", "velocities")}

    def states(seed):
        rng = np.random.default_rng(seed)
        return {
            name: {
                key: rng.uniform(0.1, 1.0, shape).astype("float32")
                for key in ("parameters", *slots[algorithms[name]])
            }
            for name, shape in SHAPES.items()
        }

    stacks = {"parts": ["part_2", "part_3"]}
    spec = jax_orbax_writer.embedding_spec_for(
        SHAPES, num_devices=2, sparsecores_per_device=4, stacks=stacks
    )
    written = [
        (
            checkpoints.write_checkpoint(
                str(directory / "jax"),
                states(1),
                format="jax-tpu-embedding",
                step=5,
                embedding_spec=spec,
                algorithms=algorithms,
            ),
            states(1),
        )
    ]
    written.append(_keras_step(directory / "keras"))
    path = checkpoints.write_checkpoint(
        str(directory / "tpu" / "ckpt"), states(2), algorithms=algorithms
    )
    return [*written, (path, states(2))]


def _keras_step(directory):
    """A step of `keras.callbacks.OrbaxCheckpoint` of the loader's tables,
    stacked otherwise (`part_3` first), after one step of `fit` in this
    process; returns its path and the states the model holds."""
    import keras

    import tf_tpu_embed_opt as teo

    keras.utils.set_random_seed(3)
    ids = keras.Input((3,), dtype="int32")
    table = teo.layers.Embedding(
        64, 4, optimizer=teo.optimizers.Adagrad(0.2), name="table"
    )
    parts = [
        teo.layers.Embedding(
            rows, 4, optimizer=teo.optimizers.Adam(0.05, lazy=True), name=name
        )
        for name, rows in (("part_3", 24), ("part_2", 40))
    ]
    stacked = teo.layers.StackedEmbedding(parts, name="stacked")
    first, second = stacked([ids % 24, ids % 40])
    net = keras.Model(ids, table(ids) + first + second)
    net.compile(optimizer="sgd", loss="mse")
    x = np.random.default_rng(3).integers(0, 64, (16, 3)).astype("int32")
    callback = keras.callbacks.OrbaxCheckpoint(str(directory), save_freq=1)
    net.fit(
        x,
        np.ones((16, 3, 4), "float32"),
        batch_size=16,
        callbacks=[callback],
        verbose=0,
    )
    numpy = keras.ops.convert_to_numpy
    held = {
        "table": {
            "parameters": numpy(table.embeddings.value),
            **{key: numpy(slot.value) for key, slot in table.slots.items()},
        }
    }
    for name in ("part_2", "part_3"):
        rows = stacked.get_table(name)
        rows["parameters"] = rows.pop("embeddings")
        held[name] = rows
    return str(directory / "1"), held


@version_independent
def test_checkpoints_load_into_two_processes_each_reading_its_rows(tmp_path):
    """`load_into_keras` into the guide's tables split by rows over 2
    processes (and over the 4 devices of 1 process) loads every table and
    slot bit for bit, stacked ones too, from each format; each process
    reads only the rows its devices hold (verification and load: twice).
    Then both jobs write the tables as a jax-tpu-embedding step (the 2
    processes each their rows, the 1 process on the host): the same stacked
    arrays, bit for bit; the TPUEmbedding layout is refused across
    processes."""
    pytest.importorskip("tensorflow")  # the children read TensorFlow's layouts
    written = _sources(tmp_path)
    paths = [path for path, _ in written]
    one = _run(1, 4, tmp_path, "one", script=LOADER, arguments=paths)
    two = _run(2, 2, tmp_path, "two", script=LOADER, arguments=paths)
    try:
        one = one()
    finally:
        two = two()
    for got in (one, two):
        for index, (_, states) in enumerate(written):
            for name, state in states.items():
                path, first = HELD_IN[name]
                rows = slice(first, first + SHAPES[name][0])
                for key, want in state.items():
                    where = (
                        path
                        if key == "parameters"
                        else path.replace("embeddings", SLOTS[key])
                    )
                    what = f"{index}:{name}:{key}"
                    np.testing.assert_array_equal(
                        got[f"{index}:{where}"][rows], want, err_msg=what
                    )
    for process in (0, 1):
        found = json.loads((tmp_path / "two" / f"2.npz.{process}.json").read_text())
        (held,) = found["held"]
        assert held == [32 * process, 32 * process + 32]
        read = {}
        for index, name, key, start, stop in found["reads"]:
            assert start >= 0, f"process {process} read {name} {key} whole"
            read.setdefault((index, name, key), []).append((start, stop))
        for index in range(len(written)):
            for name, (_, first) in HELD_IN.items():
                # The table's rows in the held stack rows, read twice.
                start = max(held[0] - first, 0)
                stop = min(held[1] - first, SHAPES[name][0])
                for key in written[index][1][name]:
                    want = [(start, stop)] * 2 if start < stop else []
                    assert read.pop((index, name, key), []) == want, (
                        process,
                        index,
                        name,
                        key,
                    )
        assert not read, read
        # The TPUEmbedding layout is written by one process holding them whole.
        assert re.search(
            r"table '\w+' is spread over several JAX processes; format "
            r"'tpu-embedding' .*jax-tpu-embedding.*OrbaxCheckpoint",
            found["refused"],
        ), found["refused"]
        # `save_tpu_checkpoint` is refused alike. Both before anything was
        # written.
        assert len(re.findall(r"table '\w+' is spread", found["refused"])) == 2
        assert not (tmp_path / "two" / "2.npz.tpu").exists()
        assert not (tmp_path / "two" / "2.npz.saved").exists()
    one_refused = json.loads((tmp_path / "one" / "1.npz.0.json").read_text())
    assert one_refused["refused"] is None
    # Both jobs wrote the tables (the last source's) as a jax-tpu-embedding
    # step: 2 processes each its rows, 1 process on the host. They read as
    # those states, and their stacked arrays are the same, padding included.
    steps = [
        tmp_path / job / f"{n}.npz.jax" / "9" for job, n in (("one", 1), ("two", 2))
    ]
    for step in steps:
        source = checkpoints.open_checkpoint(step)
        for name, state in written[-1][1].items():
            for key, want in source.read(name).items():
                np.testing.assert_array_equal(want, state[key], err_msg=f"{name}/{key}")
    stored = [_stored_arrays(step) for step in steps]
    assert sorted(stored[0]) == sorted(stored[1]) and len(stored[0]) == 5
    for path, value in stored[0].items():
        np.testing.assert_array_equal(stored[1][path], value, err_msg=path)


# A table and its slot split over 2 devices by columns, loaded from a
# checkpoint (argv[1]); what it holds then is written to argv[2].
COLUMNS_SPLIT = """
import sys

import jax
import keras
import numpy as np

import tf_tpu_embed_opt as teo

mesh = keras.distribution.DeviceMesh(
    (1, 2), ("batch", "model"), np.array(jax.devices()).reshape(1, 2)
)
layouts = keras.distribution.LayoutMap(mesh)
layouts["t/embeddings"] = (None, "model")
keras.distribution.set_distribution(
    keras.distribution.ModelParallel(layout_map=layouts, batch_dim_name="batch")
)
ids = keras.Input((3,), dtype="int32")
table = teo.layers.Embedding(16, 4, optimizer=teo.optimizers.Adagrad(0.2), name="t")
net = keras.Model(ids, table(ids))
teo.load_into_keras(sys.argv[1], net, None)
held = {"parameters": table.embeddings, **table.slots}
np.savez(
    sys.argv[2],
    split=[not v.value.sharding.is_fully_replicated for v in held.values()],
    **{key: np.asarray(v.value) for key, v in held.items()},
)
"""


@version_independent
def test_a_table_split_by_columns_loads_bit_for_bit(tmp_path):
    """A table and its slot split by columns over 2 devices (a `LayoutMap`
    of `(None, "model")`) load from a TPUEmbedding checkpoint bit for bit:
    the way for arrays split over devices gives each device its columns."""
    pytest.importorskip("tensorflow")  # the TPUEmbedding layout
    rng = np.random.default_rng(5)
    state = {
        "parameters": rng.uniform(size=(16, 4)).astype("float32"),
        "accumulators": rng.uniform(0.1, 1.0, (16, 4)).astype("float32"),
    }
    path = checkpoints.write_checkpoint(
        str(tmp_path / "ckpt"), {"t": state}, algorithms={"t": "Adagrad"}
    )
    out = str(tmp_path / "held.npz")
    settings = {
        "KERAS_BACKEND": "jax",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
        "TF_CPP_MIN_LOG_LEVEL": "3",
    }
    done = subprocess.run(
        [sys.executable, "-c", COLUMNS_SPLIT, path, out],
        env=child_env(**settings),
        capture_output=True,
        text=True,
        timeout=BOUND_SECONDS,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    held = np.load(out)
    assert held["split"].tolist() == [True, True]
    for key, value in state.items():
        np.testing.assert_array_equal(held[key], value, err_msg=key)


def _stored_arrays(step):
    """Every stacked array of a jax-tpu-embedding step, as stored."""
    import jax

    from tf_tpu_embed_opt.checkpoints.shared import orbax_items

    directory = str(step / "model")
    tree = orbax_items.restore_tree(directory, orbax_items.item_tree(directory))
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {"/".join(map(str, orbax_items.keys_of(p))): v for p, v in leaves}
