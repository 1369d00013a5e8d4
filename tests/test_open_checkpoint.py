"""`checkpoints.open_checkpoint` and `write_checkpoint`: one way to open and
one way to write every format, one protocol.

Each format is written by its own writer (TensorFlow's `TPUEmbedding`
layout by `write_tpu_checkpoint`, SparseCore's by TensorFlow's stacker and
`sparsecore_layout.write_checkpoint`, jax-tpu-embedding's by its own
`stack_and_shard_tables` and orbax) from known arrays, which are the oracle:
the opened checkpoint's `read`, `read_tensor`, `read_rows` and `stream` give
them back bit for bit. Paths that hold no checkpoint are refused by what is
there, without TensorFlow.
"""

# Runs without TensorFlow.

import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest
from conftest import needs_tensorflow
from reader_checks import assert_unknown_names_refused

from tf_tpu_embed_opt.checkpoints import reader as checkpoint_reader
from tf_tpu_embed_opt.checkpoints.reader import open_checkpoint

HAS_TENSORFLOW = importlib.util.find_spec("tensorflow") is not None
ROOT = pathlib.Path(__file__).resolve().parents[1]


def _child(tmp_path, script, *arguments):
    """`script` run in a fresh process (the installed package, as a user has
    it, where CI tests the wheel)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    if not os.environ.get("TF_TPU_EMBED_OPT_EXPECT_INSTALLED"):
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p
        )
    return subprocess.run(
        [sys.executable, "-c", script, *map(str, arguments)],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(tmp_path),
        timeout=300,
    )


def _assert_protocol(checkpoint, expected):
    """`expected`: {table: {key: array}}; every read of the protocol gives
    them back."""
    assert sorted(checkpoint.tables) == sorted(expected)
    for name, state in expected.items():
        got = checkpoint.read(name)
        assert sorted(got) == sorted(state)
        for key, want in state.items():
            assert np.asarray(got[key]).tobytes() == want.tobytes(), (name, key)
            tensor = np.asarray(checkpoint.read_tensor(name, key))
            assert tensor.tobytes() == want.tobytes(), (name, key)
            rows = np.asarray(checkpoint.read_rows(name, key, (1, 3)))
            assert rows.tobytes() == want[1:3].tobytes(), (name, key)
            streamed = np.full_like(want, np.nan)
            seen = 0
            for indices, values in checkpoint.stream(name, key).blocks():
                streamed[indices] = values
                seen += len(indices)
            assert seen == len(want)
            assert streamed.tobytes() == want.tobytes(), (name, key)
            checkpoint.verify(name, key)
        assert set(checkpoint.streams(name)) == set(state)
    name = sorted(expected)[0]
    assert_unknown_names_refused(checkpoint, name)
    assert_unknown_names_refused(checkpoint.reader, name)
    with pytest.raises(ValueError, match="outside its"):
        checkpoint.read_rows(name, "parameters", (0, 10**6))
    # Nor is a float cut to an int, nor a row of one table read from another
    # (the format's reader refuses as the front door does).
    with pytest.raises(TypeError, match=r"`rows` must be \(start, stop\), two ints"):
        checkpoint.read_rows(name, "parameters", (0.5, 2.7))
    count = checkpoint.tables[name].shape[0]
    with pytest.raises((TypeError, ValueError), match="rows"):
        checkpoint.reader.read_rows(name, "parameters", (0, count + 1))
    with pytest.raises(TypeError, match="two ints"):
        checkpoint.reader.read_rows(name, "parameters", (0, 1.5))


def _states(shapes, slots, seed=0):
    rng = np.random.default_rng(seed)
    return {
        name: {
            key: rng.standard_normal(shape).astype(np.float32)
            for key in ("parameters", *slots)
        }
        for name, shape in shapes.items()
    }


@needs_tensorflow
def test_tpu_embedding_layout(tmp_path):
    from tf_tpu_embed_opt import checkpoints
    from tf_tpu_embed_opt.definitions import registry

    states = _states({"a": (6, 4), "b": (9, 2)}, ("accumulators",))
    prefix = checkpoints.write_tpu_checkpoint(
        str(tmp_path / "ckpt"),
        states.items(),
        algorithms=dict.fromkeys(states, registry.BY_NAME["Adagrad"]),
        step=12,
    )
    assert checkpoint_reader.detect_format(prefix) == "tpu-embedding"
    checkpoint = open_checkpoint(prefix)
    assert checkpoint.format == "tpu-embedding" and checkpoint.row_reads == "device"
    _assert_protocol(checkpoint, states)
    assert int(checkpoint.read_scalar("step")) == 12
    # The step the package wrote where its readers look for it.
    assert checkpoint.step == 12
    # Adagrad and ProximalAdagrad keep the same slots: the package records
    # which it wrote.
    assert checkpoint.algorithms("a") == (registry.BY_NAME["Adagrad"],)
    assert checkpoint.algorithm("b").name == "Adagrad"
    # Without the record (TensorFlow's own checkpoints, or no `algorithms`
    # given) the slots cannot say which, and `algorithm` says so rather than
    # guess.
    unrecorded = checkpoints.write_tpu_checkpoint(
        str(tmp_path / "ckpt2"), states.items()
    )
    checkpoint = open_checkpoint(unrecorded)
    assert checkpoint.step is None
    assert {d.name for d in checkpoint.algorithms("a")} == {
        "Adagrad",
        "ProximalAdagrad",
    }
    with pytest.raises(ValueError, match="the checkpoint does not say which"):
        checkpoint.algorithm("a")
    assert checkpoint.layout("a").keys["parameters"]
    with pytest.raises(ValueError, match="`embedding_spec` .* does not apply"):
        open_checkpoint(prefix, embedding_spec=object())
    document = checkpoint_reader.describe_checkpoint(prefix)
    assert document["format"] == "tpu-embedding"
    assert [t["table"] for t in document["tables"]] == ["a", "b"]
    assert document["tables"][1]["shape"] == [9, 2]
    assert document["bytes"] == (6 * 4 + 9 * 2) * 4 * 2  # parameters, slot
    with pytest.raises(ValueError, match="describe_checkpoint: argument `embed"):
        checkpoint_reader.describe_checkpoint(prefix, embedding_spec=object())


@needs_tensorflow
@pytest.mark.parametrize(
    "record, match",
    [
        ('{"a": "Adam", "b": "Adagrad"}', "records Adam for table 'a', whose slots"),
        ('{"b": "Adagrad"}', r"cannot be read for tables \['a', 'b'\]"),
        ("not json", "cannot be read"),
    ],
)
def test_a_damaged_algorithm_record_is_refused(tmp_path, record, match):
    """The record the package writes is checked against the slots: one that
    names another algorithm, leaves a table out or is no record is refused
    as damage, naming it."""
    import tensorflow as tf

    from tf_tpu_embed_opt import checkpoints
    from tf_tpu_embed_opt.checkpoints.tpu_embedding.reader import ALGORITHMS_KEY

    states = _states({"a": (6, 4), "b": (9, 2)}, ("accumulators",))
    prefix = checkpoints.write_checkpoint(
        str(tmp_path / "ckpt"), states, algorithms=dict.fromkeys(states, "Adagrad")
    )
    stored = tf.train.load_checkpoint(prefix)
    names = sorted(stored.get_variable_to_shape_map())
    values = [stored.get_tensor(n) for n in names]
    values[names.index(f"{ALGORITHMS_KEY}/embedding")] = record
    damaged = str(tmp_path / "damaged")
    tf.raw_ops.SaveV2(
        prefix=damaged,
        tensor_names=names,
        shape_and_slices=[""] * len(names),
        tensors=[tf.constant(v) for v in values],
    )
    with pytest.raises(ValueError, match=f"is damaged: .*{match}"):
        open_checkpoint(damaged)


@needs_tensorflow
def test_an_algorithm_not_known_is_recorded_as_not_known(tmp_path):
    """`None` for a table in `algorithms`: the others' are recorded, its
    slots tell what they can; a table left out is still refused."""
    from tf_tpu_embed_opt import checkpoints

    states = _states({"a": (6, 4), "b": (9, 2)}, ("accumulators",))
    prefix = checkpoints.write_checkpoint(
        str(tmp_path / "ckpt"), states, algorithms={"a": "ProximalAdagrad", "b": None}
    )
    opened = open_checkpoint(prefix)
    assert opened.algorithm("a").name == "ProximalAdagrad"
    assert [d.name for d in opened.algorithms("b")] == ["Adagrad", "ProximalAdagrad"]
    with pytest.raises(ValueError, match=r"Table 'b' has no entry in `algorithms`"):
        checkpoints.write_checkpoint(
            str(tmp_path / "other"), states, algorithms={"a": None}
        )


@needs_tensorflow
def test_sparsecore_layout(tmp_path):
    import tensorflow as tf
    from test_sparsecore_layout import random_states, tensorflow_layouts

    from tf_tpu_embed_opt.checkpoints import sparsecore as sparsecore_layout

    E = tf.tpu.experimental.embedding
    layouts = tensorflow_layouts([("x", 40, 8, E.Adam(0.1)), ("y", 17, 8, E.Adam(0.1))])
    states = random_states(layouts, ["momenta", "velocities"])
    path = sparsecore_layout.write_checkpoint(
        str(tmp_path / "ckpt"), layouts, states, "Adam"
    )
    assert checkpoint_reader.detect_format(path) == "sparsecore"
    with pytest.raises(ValueError, match="pass `algorithms`"):
        open_checkpoint(path)
    checkpoint = open_checkpoint(path, algorithms="Adam")
    assert checkpoint.format == "sparsecore" and checkpoint.row_reads is None
    _assert_protocol(checkpoint, states)
    assert checkpoint.algorithm("x").name == "Adam"
    assert checkpoint.layout("y").table_name == "y"
    document = checkpoint_reader.describe_checkpoint(path)
    assert (document["format"], document["layout"]) == ("sparsecore", "TPUEmbeddingV2")
    (stack,) = document["stacked_tables"]
    assert stack["tables"] == {"x": [40, 8], "y": [17, 8]}


@needs_tensorflow
def test_a_sparsecore_table_streams_and_verifies_from_one_unsharding(
    tmp_path, monkeypatch
):
    """SparseCore's stacks are read whole: a stream cuts its blocks from one
    unsharded array, and `verify` and `read_tensor` unshard only the array
    asked for (each block unsharded the table and every slot again)."""
    import tensorflow as tf
    from test_sparsecore_layout import random_states, tensorflow_layouts

    from tf_tpu_embed_opt import checkpoints
    from tf_tpu_embed_opt.checkpoints import protocol
    from tf_tpu_embed_opt.checkpoints.sparsecore import reader as sparsecore_reader

    E = tf.tpu.experimental.embedding
    layouts = tensorflow_layouts(
        [("x", 400, 8, E.Adam(0.1)), ("y", 17, 8, E.Adam(0.1))]
    )
    states = random_states(layouts, ["momenta", "velocities"])
    path = checkpoints.write_checkpoint(
        str(tmp_path / "ckpt"),
        states,
        format="sparsecore",
        layouts=layouts,
        algorithms="Adam",
    )
    unsharded = []
    unshard = sparsecore_reader.unshard_table

    def counted(value, layout):
        unsharded.append(layout.table_name)
        return unshard(value, layout)

    monkeypatch.setattr(sparsecore_reader, "unshard_table", counted)
    # Blocks of 50 rows: the table of 400 rows streams in 8.
    monkeypatch.setattr(protocol, "STREAM_BLOCK_BYTES", 50 * 8 * 4)
    checkpoint = open_checkpoint(path, algorithms="Adam")
    stream = checkpoint.stream("x", "momenta")
    blocks = list(stream.blocks())
    assert len(blocks) == 8 and unsharded == ["x"]
    np.testing.assert_array_equal(
        np.concatenate([values for _, values in blocks]), states["x"]["momenta"]
    )
    unsharded.clear()
    for key in ("parameters", "momenta", "velocities"):
        checkpoint.verify("x", key)
    assert unsharded == ["x"] * 3


def test_jax_tpu_embedding_step(tmp_path):
    pytest.importorskip("orbax.checkpoint")
    pytest.importorskip("jax_tpu_embedding")
    import jax_checkpoints

    values = jax_checkpoints.table_values()
    step, *_ = jax_checkpoints.save_step(tmp_path, 2, 4, values)
    assert checkpoint_reader.detect_format(step) == "jax-tpu-embedding"
    checkpoint = open_checkpoint(step, cache_bytes=0)
    assert checkpoint.format == "jax-tpu-embedding"
    assert checkpoint.row_reads == "caller" and checkpoint.step == 1000
    engine = {"table": "parameters", "momentum": "momenta", "velocity": "velocities"}
    expected = {
        name: {engine[part]: values[part][name] for part in values}
        for name in jax_checkpoints.TABLES
    }
    _assert_protocol(checkpoint, expected)
    assert checkpoint.algorithm("a").name == "Adam"
    assert checkpoint.layout("b").stacked_table_name
    with pytest.raises(ValueError, match="`object_path` 'embedding' does not apply"):
        open_checkpoint(step, object_path="embedding")
    document = checkpoint_reader.describe_checkpoint(step)
    assert document["format"] == document["layout"] == "jax-tpu-embedding"
    described = {
        table for stack in document["stacked_tables"] for table in stack["tables"]
    }
    assert described == set(jax_checkpoints.TABLES)
    with pytest.raises(ValueError, match="`object_path` 'e' does not apply"):
        checkpoint_reader.describe_checkpoint(step, object_path="e")
    # Its step is its directory's number, not a variable.
    with pytest.raises(ValueError, match="`step_path` 'step' does not apply .* a jax"):
        open_checkpoint(step, step_path="step")


def test_the_refusal_and_the_help_name_every_format(tmp_path, capsys, monkeypatch):
    """What was looked for, and what `checkpoint` and `checkpoint convert`
    say they read and write, are the formats' words (`formats`): each format
    the reader detects, and each the writer writes."""
    from tf_tpu_embed_opt import cli
    from tf_tpu_embed_opt.checkpoints import formats

    assert checkpoint_reader.FORMATS == tuple(formats.READ)
    with pytest.raises(ValueError) as refused:
        open_checkpoint(tmp_path / "missing")
    monkeypatch.setenv("COLUMNS", "10000")  # argparse's help unwrapped
    assert cli.main(["checkpoint", "--help"]) == 0
    help_text = capsys.readouterr().out
    for words in formats.READ.values():
        assert words in str(refused.value)
        assert words in help_text
    assert cli.main(["checkpoint", "convert", "--help"]) == 0
    convert_help = capsys.readouterr().out
    assert set(formats.WRITE) == {"tpu-embedding", "sparsecore", "jax-tpu-embedding"}
    # Its common cases (issue #56): one per format written, keras-rs's too.
    for words in (
        "SRC DST                                  TPUEmbedding's layout (the default)",
        "--layouts-from CKPT --algorithm adam",
        "SparseCore's layout",
        "SRC ROOT --to-jax 4x4                    a jax-tpu-embedding step",
        "a keras-rs job's step",
    ):
        assert words in convert_help


def test_paths_that_hold_no_checkpoint_are_named(tmp_path):
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    (tmp_path / "empty.bin").write_bytes(b"")
    (tmp_path / "empty").mkdir()
    for path, found in [
        (tmp_path / "missing", "nothing is there"),
        (tmp_path / "notes.txt", "a file of 16 bytes"),
        (tmp_path / "empty.bin", "an empty file"),
        (tmp_path / "empty", "an empty directory"),
        (tmp_path, "a directory holding empty, empty.bin, notes.txt"),
    ]:
        with pytest.raises(ValueError, match=f"is not a checkpoint: {found}"):
            open_checkpoint(path)
    # An orbax root: its steps (numbered directories with orbax's marker).
    root = tmp_path / "root"
    for step in ("5", "12"):
        (root / step).mkdir(parents=True)
        (root / step / "_CHECKPOINT_METADATA").write_text("{}")
    (root / "7").mkdir()
    latest = str(root / "12")
    with pytest.raises(
        ValueError,
        match=re.escape(
            "is not a checkpoint: an orbax root directory whose steps are 5, 12: "
            f"pass a step's directory, e.g. {latest!r}."
        ),
    ):
        open_checkpoint(root)
    # Long listings are cut at five: a directory's first entries, a root's
    # newest steps.
    many = tmp_path / "many"
    for i in range(5):
        (many / f"f{i}").mkdir(parents=True)
    for more in ("", ", ..."):
        with pytest.raises(
            ValueError,
            match=re.escape(f"a directory holding f0, f1, f2, f3, f4{more}."),
        ):
            open_checkpoint(many)
        (many / "f5").mkdir(exist_ok=True)
    for step in range(2, 7):
        (root / str(step * 10)).mkdir()
        (root / str(step * 10) / "_CHECKPOINT_METADATA").write_text("{}")
    with pytest.raises(
        ValueError, match=re.escape("whose steps are 20, 30, 40, 50, 60: pass")
    ):
        open_checkpoint(root)
    with pytest.raises(TypeError, match="argument `path` must be a checkpoint"):
        open_checkpoint(3)
    with pytest.raises(ValueError, match="argument `format` must be one of"):
        open_checkpoint(tmp_path, format="hdf5")


def test_keras_files_are_named_with_the_way_to_their_tables(tmp_path):
    """A `.keras` file and a `model.save_weights` file hold a model, which
    `open_checkpoint` does not read: the refusal says which file it is and
    how its tables get to a format it reads. A zip or a file that only ends
    in `.h5` is not taken for one."""
    import zipfile

    import keras

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.save(tmp_path / "model.keras")
    model.save_weights(tmp_path / "model.weights.h5")
    with zipfile.ZipFile(tmp_path / "other.zip", "w") as archive:
        archive.writestr("config.json", "{}")
    (tmp_path / "text.h5").write_text("not HDF5")
    way = (
        "which is not read here: load it into its model (keras.saving.load_model, "
        "or model.load_weights) and write the tables with "
        "tf_tpu_embed_opt.save_tpu_checkpoint, or save the model's steps with "
        "keras.callbacks.OrbaxCheckpoint"
    )
    for name, found in [
        ("model.keras", f"a Keras model file (.keras), {way}"),
        (
            "model.weights.h5",
            f"an HDF5 file (as Keras's model.save_weights writes), {way}",
        ),
        ("other.zip", "a file of "),
        ("text.h5", "a file of 8 bytes"),
    ]:
        with pytest.raises(ValueError) as refused:
            open_checkpoint(tmp_path / name)
        assert f"is not a checkpoint: {found}" in str(refused.value), name


def test_a_tensorflow_checkpoint_without_tensorflow_says_what_it_needs(tmp_path):
    if HAS_TENSORFLOW:
        pytest.skip("TensorFlow is installed here")
    from tf_tpu_embed_opt.errors import TensorFlowNotInstalled

    (tmp_path / "ckpt-1.index").write_bytes(b"\0")
    with pytest.raises(TensorFlowNotInstalled, match="ckpt-1' needs TensorFlow"):
        open_checkpoint(tmp_path / "ckpt-1")


def test_a_format_names_what_it_lacks_and_raises_any_other_missing_module():
    """An import that fails while a format is read or written is named as
    what the user lacks for that format (the `[jax]` extra for an orbax
    step, TensorFlow for a TensorFlow checkpoint); a module of the other
    stack, or of neither, is raised as it is, and a refusal already naming
    TensorFlow is not named twice."""
    from tf_tpu_embed_opt import errors
    from tf_tpu_embed_opt.checkpoints import formats

    def missing(name):
        return ModuleNotFoundError(f"No module named {name!r}", name=name)

    for format in formats.FORMATS:
        needed = "orbax.checkpoint" if format.orbax else "tensorflow.python"
        named = (
            errors.JaxNotInstalled if format.orbax else errors.TensorFlowNotInstalled
        )
        with pytest.raises(named, match=r"^reading it needs "):
            format.raise_missing(missing(needed), "reading it")
        for error in (
            missing("tensorflow" if format.orbax else "jax"),
            missing("zstandard"),
            errors.TensorFlowNotInstalled("reading it"),
        ):
            with pytest.raises(ModuleNotFoundError) as raised:
                format.raise_missing(error, "reading it")
            assert raised.value is error, (format.name, error)


_WITHOUT_JAX = """
import sys
for name in ("jax", "orbax", "orbax.checkpoint", "tensorstore"):
    sys.modules[name] = None  # as on an install without the [jax] extra
from tf_tpu_embed_opt import cli
from tf_tpu_embed_opt.checkpoints.reader import open_checkpoint
from tf_tpu_embed_opt.errors import JaxNotInstalled

try:
    open_checkpoint(sys.argv[1])
except JaxNotInstalled as error:
    print("open_checkpoint:", error)
sys.exit(cli.main(["checkpoint", "inspect", sys.argv[1]]))
"""


def test_an_orbax_step_without_jax_says_which_extra(tmp_path):
    """Without the `[jax]` extra an orbax step is answered in one line naming
    the extra (was a traceback ending in `No module named 'jax'`)."""
    step = tmp_path / "1000"
    (step / "embedding_spec").mkdir(parents=True)
    (step / "embedding_spec" / "proto.pbtxt").write_text("")
    result = _child(tmp_path, _WITHOUT_JAX, step)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "open_checkpoint: reading the jax-tpu-embedding step" in result.stdout
    assert "[jax]" in result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "`[jax]` extra" in lines[0], result.stderr


# --- write_checkpoint: every format written the same way, read back --------


def _write(path, tables, fmt, **kwargs):
    from tf_tpu_embed_opt.checkpoints import write_checkpoint

    return write_checkpoint(path, tables, format=fmt, **kwargs)


@needs_tensorflow
def test_write_checkpoint_tpu_embedding_round_trip(tmp_path):
    states = _states({"a": (6, 4), "b": (9, 2)}, ("momenta", "velocities"), seed=3)
    prefix = _write(
        str(tmp_path / "ckpt"),
        states,  # a mapping, as well as pairs
        "tpu-embedding",
        algorithms=dict.fromkeys(states, "Adam"),
        step=5,
    )
    checkpoint = open_checkpoint(prefix)
    assert checkpoint.format == "tpu-embedding"
    _assert_protocol(checkpoint, states)
    assert int(checkpoint.read_scalar("step")) == 5
    assert checkpoint.algorithm("b").name == "Adam"


@needs_tensorflow
def test_write_checkpoint_sparsecore_round_trip(tmp_path):
    import tensorflow as tf
    from test_sparsecore_layout import random_states, tensorflow_layouts

    E = tf.tpu.experimental.embedding
    layouts = tensorflow_layouts(
        [("x", 40, 8, E.Adagrad(0.1)), ("y", 17, 8, E.Adagrad(0.1))]
    )
    states = random_states(layouts, ["accumulators"])
    path = _write(
        str(tmp_path / "ckpt"),
        states.items(),
        "sparsecore",
        layouts=layouts,
        algorithms="Adagrad",
    )
    checkpoint = open_checkpoint(path, algorithms="Adagrad")
    assert checkpoint.format == "sparsecore"
    _assert_protocol(checkpoint, states)


def test_write_checkpoint_jax_tpu_embedding_round_trip(tmp_path):
    pytest.importorskip("orbax.checkpoint")
    from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import (
        writer as jax_orbax_writer,
    )

    states = _states({"a": (40, 8), "b": (17, 8), "c": (9, 16)}, ("accumulators",), 4)
    spec = jax_orbax_writer.embedding_spec_for(
        {name: state["parameters"].shape for name, state in states.items()},
        num_devices=2,
        sparsecores_per_device=4,
        stacks={"ab": ["a", "b"]},
    )
    step_dir = _write(
        str(tmp_path / "root"),
        ((name, state) for name, state in states.items()),
        "jax-tpu-embedding",
        step=7,
        embedding_spec=spec,
        algorithms=dict.fromkeys(states, "Adagrad"),
    )
    checkpoint = open_checkpoint(step_dir)
    assert checkpoint.format == "jax-tpu-embedding" and checkpoint.step == 7
    _assert_protocol(checkpoint, states)
    assert checkpoint.layout("b").stacked_table_name == "ab"


def test_write_checkpoint_refuses_arguments_by_name(tmp_path):
    from tf_tpu_embed_opt.checkpoints import write_checkpoint

    path = str(tmp_path / "ckpt")
    with pytest.raises(ValueError, match="argument `format` must be one of"):
        write_checkpoint(path, {}, format="keras-rs")
    with pytest.raises(ValueError, match="`layouts` does not apply to format"):
        write_checkpoint(path, {}, format="tpu-embedding", layouts=object())
    with pytest.raises(ValueError, match="'sparsecore' needs argument `algorithms`"):
        write_checkpoint(path, {}, format="sparsecore", layouts=object())
    with pytest.raises(ValueError, match="needs argument `embedding_spec`"):
        write_checkpoint(path, {}, format="jax-tpu-embedding", step=1, algorithms={})
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("fmt", ["tpu-embedding", "sparsecore", "jax-tpu-embedding"])
def test_write_checkpoint_refuses_tables_that_are_no_pairs_by_name(tmp_path, fmt):
    """The front door checks every `(name, state)` pair as it comes, for
    every format (they failed inside the writers with an AttributeError or
    an IndexError)."""
    from tf_tpu_embed_opt.checkpoints import write_checkpoint

    arguments = {
        "tpu-embedding": {},
        "sparsecore": {"layouts": object(), "algorithms": "SGD"},
        "jax-tpu-embedding": {"step": 1, "embedding_spec": object(), "algorithms": {}},
    }[fmt]
    path = str(tmp_path / "ckpt")
    for tables, error, match in [
        ("t", TypeError, "`tables` must be \\(name, state\\) pairs or a mapping"),
        (["t"], TypeError, "must give \\(name, state\\) pairs.*an item 't'"),
        ({"t": [1, 2]}, TypeError, "table 't': its state must be a mapping"),
        # Written before, in the TPUEmbedding layout, as a key no job restores.
        ({"": {"parameters": 1}}, ValueError, "a table named ''; a table's name"),
    ]:
        with pytest.raises(error, match=match):
            write_checkpoint(path, tables, format=fmt, **arguments)
    assert list(tmp_path.iterdir()) == []


def test_write_checkpoint_names_its_own_arguments_for_jax_tpu_embedding(tmp_path):
    """Through the front door, the jax-tpu-embedding writer's refusals name
    `write_checkpoint` and its `path` (they named the deprecated
    `write_jax_checkpoint` and its `directory`), a bad `variables_path` or
    `items_from` by name (a bare TypeError, or a FileNotFoundError, before),
    and an algorithm that is none as a TypeError also without TensorFlow
    (a ModuleNotFoundError before)."""
    pytest.importorskip("orbax.checkpoint")
    import warnings

    from tf_tpu_embed_opt.checkpoints import write_checkpoint
    from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import writer

    spec = _one_table_spec("t")
    state = {k: np.ones((16, 8), np.float32) for k in ("parameters", "accumulators")}
    (tmp_path / "file").write_text("")
    good = {"step": 1, "embedding_spec": spec, "algorithms": {"t": "Adagrad"}}
    for given, error, match in [
        (
            {"path": tmp_path / "file"},
            ValueError,
            r"argument `path` '.*file' is a file",
        ),
        ({"path": ""}, ValueError, r"argument `path` is empty"),
        ({"path": 3}, TypeError, r"argument `path` must be a path; received 3"),
        ({"step": -1}, ValueError, r"argument `step` must be an int >= 0"),
        ({"variables_path": 3}, TypeError, r"argument `variables_path` must be a"),
        ({"items_from": 3}, TypeError, r"argument `items_from` must be the dir"),
        ({"items_from": tmp_path / "none"}, ValueError, r"`items_from` must be"),
        ({"algorithms": {"t": 3}}, TypeError, r"`algorithms\['t'\]`: .*received 3"),
        (
            {"algorithms": {"t": "adagrad"}},
            ValueError,
            r"unknown algorithm 'adagrad' \(names are case-sensitive: 'Adagrad'\)",
        ),
    ]:
        arguments = {"path": tmp_path / "root", **good, **given}
        with pytest.raises(error, match=f"^write_checkpoint: .*{match}"):
            write_checkpoint(
                arguments.pop("path"),
                {"t": state},
                format="jax-tpu-embedding",
                **arguments,
            )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]
    # The deprecated writer, for its last release, still names itself.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(ValueError, match="^write_jax_checkpoint: argument `dir"):
            writer.write_jax_checkpoint(
                tmp_path / "file", 1, [], spec, good["algorithms"]
            )


@needs_tensorflow
def test_write_checkpoint_names_its_own_arguments_for_the_tensorflow_layouts(
    tmp_path,
):
    """The `TPUEmbedding` writer's refusals of the path name `path` (they
    named `prefix`), and a `step` with nowhere to go is refused (an empty
    `step_path` dropped it without a word); SparseCore's name `algorithms`
    (they named `optimizer`), in `open_checkpoint` too, and refuse layouts
    and an object path of the wrong type as such."""
    import tensorflow as tf
    from test_sparsecore_layout import random_states, tensorflow_layouts

    from tf_tpu_embed_opt.checkpoints import write_checkpoint

    state = {k: np.ones((6, 4), np.float32) for k in ("parameters", "accumulators")}
    with pytest.raises(ValueError, match=r"^`path` '.*' names a directory"):
        write_checkpoint(str(tmp_path), {"t": state})
    with pytest.raises(ValueError, match=r"`step_path` must name where `step` goes"):
        write_checkpoint(str(tmp_path / "c"), {"t": state}, step=3, step_path="/")
    assert list(tmp_path.iterdir()) == []
    # So does the writer's staging, which makes the directory (it said
    # `prefix` too).
    import unittest.mock

    def refuse(path):
        raise tf.errors.PermissionDeniedError(None, None, f"{path}: denied")

    with unittest.mock.patch.object(tf.io.gfile, "makedirs", refuse):
        with pytest.raises(ValueError, match=r"^`path` '.*': cannot make the dir"):
            write_checkpoint(str(tmp_path / "new" / "c"), {"t": state})

    E = tf.tpu.experimental.embedding
    layouts = tensorflow_layouts([("x", 40, 8, E.Adagrad(0.1))])
    states = random_states(layouts, ["accumulators"])
    sparsecore = {"format": "sparsecore", "layouts": layouts}
    for given, error, match in [
        ({"algorithms": {"y": "Adagrad"}}, ValueError, r"^`algorithms` names tables"),
        ({"algorithms": {"x": 3}}, TypeError, r"^`algorithms` of table 'x': .*3"),
        ({"layouts": 3}, TypeError, r"SparseCore layouts must be a .*received 3"),
        ({"object_path": 3}, TypeError, r"^`object_path` must be local names"),
    ]:
        arguments = {**sparsecore, "algorithms": "Adagrad", **given}
        with pytest.raises(error, match=match):
            write_checkpoint(str(tmp_path / "c"), states, **arguments)
    assert list(tmp_path.iterdir()) == []
    path = write_checkpoint(
        str(tmp_path / "c"), states, algorithms="Adagrad", **sparsecore
    )
    with pytest.raises(ValueError, match=r"^`algorithms` names tables \['y'\]"):
        open_checkpoint(path, algorithms={"x": "Adagrad", "y": "Adagrad"})
    # An object path that is no string, as the TPUEmbedding layout refuses it
    # (an AttributeError before).
    with pytest.raises(TypeError, match=r"^`object_path` must be a '/'-separated"):
        open_checkpoint(path, algorithms="Adagrad", object_path=3)
    with pytest.raises(TypeError, match=r"^`object_path` must be a '/'-separated"):
        checkpoint_reader.describe_checkpoint(path, object_path=3)


def _one_table_spec(name):
    """A jax-tpu-embedding layout of one 16 x 8 table `name` (1 device x 2
    SparseCores)."""
    from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import specs

    return specs.embedding_spec_for(
        {name: (16, 8)}, num_devices=1, sparsecores_per_device=2
    )


def _adagrad_step(root):
    """A jax-tpu-embedding step of one Adagrad table `t`, written at `root`."""
    from tf_tpu_embed_opt.checkpoints import write_checkpoint

    state = {k: np.ones((16, 8), np.float32) for k in ("parameters", "accumulators")}
    return write_checkpoint(
        root,
        {"t": state},
        format="jax-tpu-embedding",
        step=1,
        embedding_spec=_one_table_spec("t"),
        algorithms={"t": "Adagrad"},
    )


def test_describe_checkpoint_claims_no_algorithm_for_a_stack_it_lacks(tmp_path):
    """A spec naming a stack the step does not hold describes it as missing:
    no item, shape, slots or algorithms (its absent slots read as SGD's)."""
    pytest.importorskip("orbax.checkpoint")
    from tf_tpu_embed_opt.checkpoints import describe_checkpoint

    step = _adagrad_step(tmp_path)
    (held,) = describe_checkpoint(step)["stacked_tables"]
    assert (held["item"], held["algorithms"], held["bytes"]) == (
        "model",
        ["Adagrad"],
        1024,
    )
    other = _one_table_spec("u")
    (missing,) = describe_checkpoint(step, embedding_spec=other)["stacked_tables"]
    assert missing["stacked_table"] == "u"
    assert (missing["item"], missing["shape"], missing["slots"]) == (None, None, [])
    assert (missing["algorithms"], missing["bytes"]) == ([], 0)


def test_a_format_forced_on_another_orbax_step_is_refused_by_what_is_there(
    tmp_path,
):
    """`format="keras"` on a jax-tpu-embedding step called it "a damaged or
    partial checkpoint"; `format="keras-rs"` called it "a keras-rs step"
    (open) or described it with no stacks (describe). Each says what the
    step lacks."""
    pytest.importorskip("orbax.checkpoint")
    from tf_tpu_embed_opt.checkpoints import describe_checkpoint

    step = _adagrad_step(tmp_path)
    keras_refusal = r"is no step of keras.callbacks.OrbaxCheckpoint: its `pytree`"
    keras_rs_refusal = r"holds no keras-rs stack weights \(`var:<stack>:table`"
    for call in (open_checkpoint, describe_checkpoint):
        with pytest.raises(ValueError, match=keras_refusal):
            call(step, format="keras")
        with pytest.raises(ValueError, match=keras_rs_refusal):
            call(step, format="keras-rs")


def test_the_key_and_slot_helpers_refuse_a_string_read_letter_by_letter():
    """`checkpoint_key("embedding", "t")` gave the key of `e/m/b/.../t`, and
    `algorithms_for_slots("accumulators")` fit no algorithm, without a word."""
    from tf_tpu_embed_opt.checkpoints import algorithms_for_slots
    from tf_tpu_embed_opt.checkpoints.shared.keys import checkpoint_key

    for bad in ("embedding", 3):
        with pytest.raises(TypeError, match="`object_path` must be a sequence of"):
            checkpoint_key(bad, "t")
    assert checkpoint_key(["embedding"], "t") == checkpoint_key(("embedding",), "t")
    for bad in ("accumulators", 3):
        with pytest.raises(TypeError, match="`slot_names` must be slot names"):
            algorithms_for_slots(bad)
    assert [d.name for d in algorithms_for_slots(["accumulators"])] == [
        "Adagrad",
        "ProximalAdagrad",
    ]


def test_wrapping_and_detect_format_refuse_by_their_own_names(tmp_path):
    """`Checkpoint.wrapping` of what is no table source failed with an
    AttributeError (or later, on a `tables` entry that is no `TableInfo`);
    `detect_format` and `describe_checkpoint` named `open_checkpoint`."""
    from tf_tpu_embed_opt.checkpoints import describe_checkpoint, detect_format

    class Source:
        tables = {"t": 1}

        def read(self, name):
            return {}

    for source in (3, {"t": 1}, Source()):
        with pytest.raises(TypeError, match=r"^Checkpoint.wrapping: argument `sou"):
            checkpoint_reader.Checkpoint.wrapping(source)
    with pytest.raises(TypeError, match=r"^detect_format: argument `path` must"):
        detect_format(3)
    missing = str(tmp_path / "nope")
    for call in (detect_format, describe_checkpoint, open_checkpoint):
        with pytest.raises(ValueError, match=rf"^{call.__name__}: argument `path` "):
            call(missing)


def test_a_wrapped_table_source_is_named_by_its_path_or_prefix():
    """A table source of one's own, wrapped, is named in the refusals of
    reads by its `path` (as the orbax readers have), else its `prefix` (as
    the TensorFlow readers have), else as Python shows it."""
    from tf_tpu_embed_opt.checkpoints import TableInfo

    info = TableInfo("t", (2, 2), "float32", (), {"parameters": "t"}, {}, {})

    def source(**names):
        def read(self, name):
            return {"parameters": np.zeros((2, 2), np.float32)}

        return type("Source", (), dict(names, tables={"t": info}, read=read))()

    unnamed = source()
    for given, named in [
        (source(path="/data/step", prefix="/data/other"), "/data/step"),
        (source(prefix="/data/ckpt"), "/data/ckpt"),
        (unnamed, repr(unnamed)),
    ]:
        checkpoint = checkpoint_reader.Checkpoint.wrapping(given)
        assert checkpoint.path == named
        with pytest.raises(
            KeyError, match=re.escape(f"Checkpoint {named!r} has no table 'u'")
        ):
            checkpoint.read("u")


def test_a_wrapped_table_source_reads_rows_and_verifies_shapes():
    """A table source of one's own, wrapped, reads rows of its tables within
    their rows (an empty range too), and `verify` finds a tensor that reads
    with another shape than its table says."""
    from tf_tpu_embed_opt.checkpoints import TableInfo

    table = np.arange(10, dtype=np.float32).reshape(5, 2)
    info = TableInfo("t", (5, 2), "float32", (), {"parameters": "t"}, {}, {})

    class Source:
        tables = {"t": info}
        columns = 2

        def read(self, name):
            return {"parameters": table[:, : self.columns]}

    checkpoint = checkpoint_reader.Checkpoint.wrapping(Source())
    np.testing.assert_array_equal(
        checkpoint.read_rows("t", "parameters", (1, 5)), table[1:5]
    )
    assert checkpoint.read_rows("t", "parameters", (3, 3)).shape == (0, 2)
    with pytest.raises(ValueError, match=r"rows \(4, 6\) are outside its 5 rows"):
        checkpoint.read_rows("t", "parameters", (4, 6))
    checkpoint.verify("t", "parameters")
    Source.columns = 1
    with pytest.raises(
        ValueError,
        match=r"^Table 't': 'parameters' reads with shape \(5, 1\); "
        r"expected \(5, 2\)\.$",
    ):
        checkpoint.verify("t", "parameters")


@needs_tensorflow
def test_write_checkpoint_refuses_a_later_pair_and_leaves_nothing(tmp_path):
    from tf_tpu_embed_opt.checkpoints import write_checkpoint

    good = {"parameters": np.ones((4, 2), np.float32)}
    with pytest.raises(TypeError, match="table 'u': its state must be a mapping"):
        write_checkpoint(str(tmp_path / "ckpt"), [("t", good), ("u", 3)])
    assert list(tmp_path.iterdir()) == []
    # A pair given as a list of two is a pair, as the writers always took it.
    prefix = write_checkpoint(str(tmp_path / "ckpt"), [["t", good]])
    assert sorted(open_checkpoint(prefix, object_path="embedding").tables) == ["t"]


@needs_tensorflow
def test_write_checkpoint_refuses_what_no_format_holds_by_name(tmp_path):
    """A table of integers is refused naming its dtype (TensorFlow's layout
    takes a floating one; jax-tpu-embedding's stacks are float32, and JAX
    would cut a float64 to it without a word)."""
    from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import specs

    spec = specs.embedding_spec_for(
        {"t": (40, 8)}, num_devices=1, sparsecores_per_device=4
    )
    for dtype in (np.int32, np.float64):
        state = {key: np.ones((40, 8), dtype) for key in ("parameters", "accumulators")}
        if dtype is np.int32:
            with pytest.raises(ValueError, match="must be of a floating dtype"):
                _write(str(tmp_path / "tpu" / "ckpt"), {"t": state}, "tpu-embedding")
        if importlib.util.find_spec("orbax") is None:
            continue
        with pytest.raises(ValueError, match=f"dtype {np.dtype(dtype).name}; jax"):
            _write(
                str(tmp_path / "jax"),
                {"t": state},
                "jax-tpu-embedding",
                step=1,
                embedding_spec=spec,
                algorithms={"t": "Adagrad"},
            )
    assert not (tmp_path / "jax").exists() or not list((tmp_path / "jax").iterdir())


_BAD_PATH = """
import sys
from tf_tpu_embed_opt import cli
code = cli.main(["checkpoint", "inspect", sys.argv[1]])
print(code, "tensorflow" in sys.modules)
"""


def test_a_path_without_a_checkpoint_is_answered_before_tensorflow(tmp_path):
    """`checkpoint inspect` of what holds no checkpoint answers without
    importing TensorFlow (it took 3.2-3.4 s, importing it first), in one
    line about the path."""
    result = _child(tmp_path, _BAD_PATH, tmp_path / "missing")
    assert result.stdout.split() == ["2", "False"], result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "is not a checkpoint: nothing is there" in lines[0]
