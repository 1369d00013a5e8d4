"""`tf-tpu-embed-opt checkpoint inspect|convert`, end to end.

Oracle: TensorFlow's `TPUEmbeddingForServing` writes the checkpoints inspected
and restores the converted ones (`assert_existing_objects_matched`), and the
byte counts are rows x dim x 4 x (1 + slots).
"""

import errno
import io
import json
import os
import re
import sys

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.tpu.tpu_embedding_for_serving import TPUEmbeddingForServing

import tf_tpu_embed_opt as teo
from tf_tpu_embed_opt import checkpoints, cli

TFE = tf.tpu.experimental.embedding


def _serving(user_name="user"):
    user = TFE.TableConfig(5, 3, name=user_name, optimizer=teo.embedding.Adam(0.1))
    item = TFE.TableConfig(4, 2, name="item", optimizer=teo.embedding.FTRL(0.1))
    return TPUEmbeddingForServing(
        [TFE.FeatureConfig(table=user), TFE.FeatureConfig(table=item)], None
    )


@pytest.fixture(name="checkpoint")
def _checkpoint(tmp_path):
    serving = _serving()
    serving.build()
    rng = np.random.default_rng(0)
    for variables in serving._variables.values():
        for variable in variables.values():
            variable.assign(rng.uniform(0.1, 1.0, variable.shape).astype(np.float32))
    step = tf.Variable(17, dtype=tf.int64)
    prefix = tf.train.Checkpoint(embedding=serving, step=step).save(
        str(tmp_path / "tpu" / "ckpt")
    )
    return prefix, serving


def run(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_inspect_says_the_step_the_checkpoint_records(capsys, checkpoint, tmp_path):
    prefix, serving = checkpoint
    code, out, err = run(capsys, "checkpoint", "inspect", prefix)
    assert code == 0, err
    assert out.splitlines()[2] == "step: 17"
    code, out, _ = run(capsys, "checkpoint", "inspect", prefix, "--json")
    assert json.loads(out)["step"] == 17
    alone = tf.train.Checkpoint(embedding=serving).save(str(tmp_path / "alone" / "c"))
    code, out, err = run(capsys, "checkpoint", "inspect", alone)
    assert code == 0, err
    assert out.splitlines()[2] == "step: none recorded"
    assert checkpoints.describe_checkpoint(alone)["step"] is None


def test_inspect_reads_the_step_at_step_path(capsys, checkpoint, tmp_path):
    """A step saved elsewhere than `step` (e.g. a `global_step`) is shown
    with `--step-path`; without it none is recorded at `step`."""
    prefix, serving = checkpoint
    step = tf.Variable(5, dtype=tf.int64)
    saved = tf.train.Checkpoint(embedding=serving, global_step=step).save(
        str(tmp_path / "global" / "c")
    )
    code, out, err = run(capsys, "checkpoint", "inspect", saved)
    assert code == 0, err
    assert out.splitlines()[2] == "step: none recorded"
    code, out, err = run(
        capsys, "checkpoint", "inspect", saved, "--step-path", "global_step"
    )
    assert code == 0, err
    assert out.splitlines()[2] == "step: 5 (at global_step)"
    assert "user   5 x 3" in out
    code, out, err = run(
        capsys, "checkpoint", "inspect", saved, "--step-path", "global_step", "--json"
    )
    document = json.loads(out)
    assert (document["step"], document["step_path"]) == (5, "global_step")
    code, out, err = run(capsys, "checkpoint", "inspect", prefix, "--step-path", "x")
    assert (code, out) == (2, "")
    assert f"Checkpoint {prefix!r} has no variable at 'x'" in err


@pytest.mark.parametrize(
    "value, dtype, held",
    [
        (7.9, tf.float32, "float32 7.9"),
        ([3, 4], tf.int64, "int64 of shape (2,)"),
        (-2, tf.int64, "int64 -2"),
    ],
    ids=["float", "vector", "negative"],
)
def test_a_step_that_is_no_integer_is_refused_not_rounded(
    capsys, checkpoint, tmp_path, value, dtype, held
):
    """`int()` made 7 of a float step 7.9 (and failed on a vector with
    numpy's words): every reader of a step now refuses what is no step."""
    _, serving = checkpoint
    step = tf.Variable(value, dtype=dtype)
    saved = tf.train.Checkpoint(embedding=serving, step=step).save(
        str(tmp_path / "bad" / "c")
    )
    refusal = f"Checkpoint {saved!r}: the variable at 'step' is no step (an "
    refusal += f"integer >= 0): it holds {held}."
    with pytest.raises(ValueError) as refused:
        checkpoints.open_checkpoint(saved).step  # noqa: B018
    assert str(refused.value) == refusal
    with pytest.raises(ValueError, match=re.escape(refusal)):
        checkpoints.describe_checkpoint(saved)
    for argv in (
        ["inspect", saved],
        ["inspect", saved, "--step-path", "step"],
        ["convert", saved, tmp_path / "out" / "c"],
        ["convert", saved, tmp_path / "out" / "c", "--step-path", "step"],
    ):
        code, out, err = run(capsys, "checkpoint", *argv)
        assert (code, out) == (2, ""), argv
        assert err == f"tf-tpu-embed-opt: error: {refusal}\n", argv
    assert not (tmp_path / "out").exists()
    # --step sets the step instead.
    code, out, err = run(
        capsys, "checkpoint", "convert", saved, tmp_path / "out" / "c", "--step", 3
    )
    assert code == 0, err
    assert checkpoints.open_checkpoint(str(tmp_path / "out" / "c")).step == 3


def test_step_path_reads_the_step_where_it_was_saved(capsys, checkpoint, tmp_path):
    """`step_path` is read where the checkpoint is opened or described, so a
    `step` that is no step does not stop a `global_step` from being read:
    `inspect --step-path global_step` read `step` first and failed on it."""
    _, serving = checkpoint
    saved = tf.train.Checkpoint(
        embedding=serving,
        step=tf.Variable(7.9, dtype=tf.float32),
        global_step=tf.Variable(5, dtype=tf.int64),
    ).save(str(tmp_path / "both" / "c"))
    assert checkpoints.open_checkpoint(saved, step_path="global_step").step == 5
    document = checkpoints.describe_checkpoint(saved, step_path="global_step")
    assert (document["step"], document["step_path"]) == (5, "global_step")
    code, out, err = run(
        capsys, "checkpoint", "inspect", saved, "--step-path", "global_step"
    )
    assert code == 0, err
    assert out.splitlines()[2] == "step: 5 (at global_step)"
    argv = ["convert", saved, tmp_path / "out" / "c", "--step-path", "global_step"]
    code, out, err = run(capsys, "checkpoint", *argv)
    assert code == 0, err
    converted = checkpoints.open_checkpoint(str(tmp_path / "out" / "c"))
    assert converted.read_scalar("global_step") == 5
    # A step_path given names a variable: none there is refused at `.step`,
    # not taken for "no step recorded".
    with pytest.raises(
        ValueError, match=f"^Checkpoint {re.escape(repr(saved))} has no variable at 'x'"
    ):
        checkpoints.open_checkpoint(saved, step_path="x").step  # noqa: B018
    with pytest.raises(ValueError, match="has no variable at 'x'"):
        checkpoints.describe_checkpoint(saved, step_path="x")
    for function, value, error in (
        (checkpoints.open_checkpoint, 1, TypeError),
        (checkpoints.describe_checkpoint, "/", ValueError),
        (checkpoints.TPUCheckpointReader, ["step"], TypeError),
    ):
        refusal = (
            f"{function.__name__}: argument `step_path` must be a '/'-separated "
            "string such as 'global_step', or None (the step at 'step'); "
            f"received {value!r}."
        )
        with pytest.raises(error) as refused:
            function(saved, step_path=value)
        assert str(refused.value) == refusal


def test_convert_carries_the_step_where_it_is_recorded(capsys, checkpoint, tmp_path):
    """SRC's `step` goes to DST's `step`; with --step-path, the step at that
    path goes to the same path; --step 0 is a step."""
    prefix, serving = checkpoint
    code, _, err = run(capsys, "checkpoint", "convert", prefix, tmp_path / "a" / "c")
    assert code == 0, err
    assert checkpoints.open_checkpoint(str(tmp_path / "a" / "c")).step == 17
    step = tf.Variable(5, dtype=tf.int64)
    saved = tf.train.Checkpoint(embedding=serving, global_step=step).save(
        str(tmp_path / "global" / "c")
    )
    argv = ["convert", saved, tmp_path / "b" / "c", "--step-path", "global_step"]
    code, out, err = run(capsys, "checkpoint", *argv)
    assert code == 0, err
    assert out.rstrip().endswith(", step 5 at global_step")
    converted = checkpoints.open_checkpoint(str(tmp_path / "b" / "c"))
    assert (converted.step, converted.read_scalar("global_step")) == (None, 5)
    argv = ["convert", prefix, tmp_path / "z" / "c", "--step", 0]
    code, _, err = run(capsys, "checkpoint", *argv)
    assert code == 0, err
    assert checkpoints.open_checkpoint(str(tmp_path / "z" / "c")).step == 0


def test_convert_records_each_algorithm_it_knows(capsys, tmp_path):
    """DST records each table's algorithm where SRC's record or --algorithm
    says it, also where another table's slots fit several (it recorded none
    then); two --algorithm defaults are refused."""
    state = {
        "parameters": np.full((4, 2), 0.5, np.float32),
        "accumulators": np.full((4, 2), 0.1, np.float32),
    }
    states = {"a": state, "b": state}
    recorded = checkpoints.write_checkpoint(
        str(tmp_path / "rec" / "c"),
        states,
        algorithms=dict.fromkeys(states, "ProximalAdagrad"),
    )
    bare = checkpoints.write_checkpoint(str(tmp_path / "bare" / "c"), states)

    def converted(name, source, *options):
        code, _, err = run(
            capsys, "checkpoint", "convert", source, tmp_path / name, *options
        )
        assert code == 0, err
        opened = checkpoints.open_checkpoint(str(tmp_path / name))
        return {t: [d.name for d in opened.algorithms(t)] for t in sorted(states)}

    both = ["Adagrad", "ProximalAdagrad"]
    proximal = ["ProximalAdagrad"]
    assert converted("d1", recorded) == {"a": proximal, "b": proximal}
    assert converted("d2", bare) == {"a": both, "b": both}
    given = converted("d3", bare, "--algorithm", "a=proximaladagrad")
    assert given == {"a": proximal, "b": both}
    argv = ["convert", bare, tmp_path / "d4", "--algorithm", "adagrad"]
    code, out, err = run(capsys, "checkpoint", *argv, "--algorithm", "momentum")
    assert (code, out) == (2, "")
    assert err == (
        "tf-tpu-embed-opt: error: --algorithm: several defaults given: "
        "['adagrad', 'momentum'].\n"
    )
    assert not os.path.exists(tmp_path / "d4.index")


class _ClosedPipe(io.TextIOBase):
    """A stdout whose reader has gone (`... | head`): each write fails."""

    def __init__(self, fileno):
        self._fileno = fileno

    def write(self, text):
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))

    def fileno(self):
        return self._fileno


def test_inspect_into_a_closed_pipe_stops_without_an_error(
    capsys, checkpoint, tmp_path, monkeypatch
):
    """`inspect ... | head`: the command stops (status 1, as the command line
    does for every command) and reports no error, which would be its own."""
    prefix, _ = checkpoint
    with open(tmp_path / "stdout", "w") as stdout:
        monkeypatch.setattr(sys, "stdout", _ClosedPipe(stdout.fileno()))
        code = cli.main(["checkpoint", "inspect", str(prefix), "--json"])
        monkeypatch.undo()
    assert code == 1
    assert capsys.readouterr().err == ""


def test_inspect_lists_tables_slots_algorithms_and_bytes(capsys, checkpoint):
    prefix, _ = checkpoint
    code, out, err = run(capsys, "checkpoint", "inspect", prefix)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[1] == "object path: embedding"
    item = next(line for line in lines if line.startswith("item "))
    assert item.split() == [
        "item", "4", "x", "2", "float32", "accumulators,", "linears", "FTRL", "96"
    ]  # fmt: skip
    user = next(line for line in lines if line.startswith("user "))
    assert user.split()[5:] == ["momenta,", "velocities", "Adam", "180"]
    assert out.rstrip().endswith(f"total: 2 tables, {96 + 5 * 3 * 4 * 3:,} bytes")

    code, out, _ = run(capsys, "checkpoint", "inspect", prefix, "--json")
    assert code == 0
    report = json.loads(out)
    assert report["tables"][1] == {
        "table": "user",
        "shape": [5, 3],
        "dtype": "float32",
        "slots": ["momenta", "velocities"],
        "algorithms": ["Adam"],
        "bytes": 180,
    }
    assert report["bytes"] == 276


def test_convert_re_roots_renames_and_restores_in_tensorflow(
    capsys, checkpoint, tmp_path
):
    prefix, serving = checkpoint
    destination = tmp_path / "out" / "ckpt"
    code, out, err = run(
        capsys,
        "checkpoint",
        "convert",
        prefix,
        destination,
        "--to-object-path",
        "model/tpu_embedding",
        "--rename",
        "user=users",
        "--algorithm",
        "user=adam",
        "--algorithm",
        "ftrl",
        "--step-path",
        "step",
    )
    assert code == 0, err
    assert "2 tables, 276 bytes" in out and "step 17 at step" in out
    restored = _serving(user_name="users")
    inner = tf.train.Checkpoint(tpu_embedding=restored)
    step = tf.Variable(0, dtype=tf.int64)
    status = tf.train.Checkpoint(model=inner, step=step).restore(str(destination))
    restored.build()
    status.assert_existing_objects_matched()
    assert int(step.numpy()) == 17
    for name, variables in serving._variables.items():
        target = restored._variables["users" if name == "user" else name]
        for slot, variable in variables.items():
            np.testing.assert_array_equal(target[slot].numpy(), variable.numpy())


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--algorithm", "adagrad"], r"Table 'item': the checkpoint holds slots"),
        (["--algorithm", "nadam"], r"unknown algorithm 'nadam'"),
        (["--tables", "user,ads"], r"\['ads'\] are not in the checkpoint"),
        (["--rename", "user"], r"--rename: expected OLD=NEW"),
        (["--rename", "user=item"], r"two tables would be named alike"),
        # Each of these used to write: every table, or the last rename only.
        (["--tables", ""], r"--tables: expected table names, T1,T2; received ''"),
        (["--tables", "item,item"], r"--tables: \['item'\] named more than once"),
        (
            ["--rename", "user=a", "--rename", "user=b"],
            r"--rename: 'user' is given twice \(user=a and user=b\)",
        ),
        (
            ["--algorithm", "user=adagrad", "--algorithm", "user=proximaladagrad"],
            r"--algorithm: 'user' is given twice",
        ),
        (["--object-path", "model"], r"`object_path` 'model' does not exist"),
        (["--rename", "ads=x"], r"--rename: tables \['ads'\] are not being converted"),
        (
            ["--tables", "user", "--algorithm", "item=ftrl"],
            r"--algorithm: tables \['item'\] are not being converted",
        ),
        (
            ["--layouts-from", "sc", "--algorithm", "user=adam", "--step-path", "step"],
            r"--step-path: a SparseCore checkpoint written here holds the tables",
        ),
    ],
)
def test_convert_refusals_write_nothing(
    capsys, checkpoint, tmp_path, arguments, message
):
    prefix, _ = checkpoint
    destination = tmp_path / "refused" / "ckpt"
    code, _, err = run(capsys, "checkpoint", "convert", prefix, destination, *arguments)
    assert code == 2
    assert err.startswith("tf-tpu-embed-opt: error: ")
    assert len(err.strip().splitlines()) == 1
    assert re.search(message, err), err
    assert not tf.io.gfile.glob(str(destination) + "*")


def test_inspect_refuses_what_is_not_a_checkpoint(capsys, tmp_path):
    (tmp_path / "x.txt").write_text("hello")
    code, _, err = run(capsys, "checkpoint", "inspect", tmp_path / "x.txt")
    assert code == 2 and "is not a checkpoint: a file of 5 bytes" in err
    # Named as the command line names it (it said `open_checkpoint`'s `path`).
    assert err.startswith("tf-tpu-embed-opt: error: `PATH` '"), err
    code, _, err = run(capsys, "checkpoint", "convert", tmp_path / "x.txt", "out")
    assert code == 2 and err.startswith("tf-tpu-embed-opt: error: `SRC` '"), err
    assert len(err.strip().splitlines()) == 1
    code, _, err = run(capsys, "checkpoint", "inspect", tmp_path)
    assert code == 2 and "is not a checkpoint: a directory holding x.txt" in err
    assert "a directory with a `checkpoint` state file" in err
    (tmp_path / "ckpt-1.index").write_bytes(b"garbage")
    code, _, err = run(capsys, "checkpoint", "inspect", tmp_path / "ckpt-1")
    assert code == 2 and "is not a readable TensorFlow checkpoint" in err


def _destinations(tmp_path):
    """Destinations that name no writable checkpoint prefix (issue #29, 14)."""
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "a_dir").mkdir()
    return {
        "empty": ("", "must name a checkpoint prefix"),
        "trailing separator": (f"{tmp_path}/out/", "names a directory"),
        "existing directory": (str(tmp_path / "a_dir"), "names a directory"),
        "under a file": (str(tmp_path / "a_file" / "ckpt"), "is a file"),
        "under /proc": ("/proc/nope/ckpt", "/proc/nope"),
    }


HOSTILE = ("empty", "trailing separator", "existing directory", "under a file")


@pytest.mark.parametrize("case", [*HOSTILE, "under /proc"])
def test_convert_to_a_hostile_destination_is_one_line(
    capsys, checkpoint, tmp_path, monkeypatch, case
):
    prefix, _ = checkpoint
    destination, message = _destinations(tmp_path)[case]
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    code, out, err = run(capsys, "checkpoint", "convert", prefix, destination)
    assert code == 2, (out, err)
    assert err.startswith("tf-tpu-embed-opt: error: ")
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert message in err, err
    # Found before anything is read, naming DST; as root /proc passes that
    # check and fails when the writer makes the directory.
    assert "`DST`" in err or (
        case == "under /proc" and "cannot make the directory" in err
    )
    # Nothing written: no hidden `.index` in the working directory, nothing
    # beside or inside the directories given.
    assert os.listdir(work) == []
    assert sorted(os.listdir(tmp_path / "a_dir")) == []
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]


@pytest.mark.parametrize(
    "destination, arguments, message",
    [
        ("a_file", [], r"`DST` '.*a_file' is a file; it must be the orbax root"),
        ("a_file/root", [], r"`DST` '.*a_file/root' cannot be written: .* a file"),
        ("", [], r"`DST` is empty"),
        ("root", ["--step", "-1"], r"--step: a step is >= 0; received -1"),
    ],
)
def test_convert_to_jax_names_dst_and_step_as_the_command_line_does(
    capsys, checkpoint, tmp_path, destination, arguments, message
):
    """A `--to-jax` root is refused as `DST`, before anything is read (it
    was refused by the writer, as `write_jax_checkpoint`'s `directory`), and
    a negative `--step` as the option (it was `write_jax_checkpoint`'s
    `step`)."""
    pytest.importorskip("orbax.checkpoint")
    prefix, _ = checkpoint
    (tmp_path / "a_file").write_text("x")
    target = str(tmp_path / destination) if destination else ""
    code, out, err = run(
        capsys, "checkpoint", "convert", prefix, target, "--to-jax", "1x2", *arguments
    )
    assert code == 2 and not out, (out, err)
    assert len(err.strip().splitlines()) == 1, err
    assert re.search(message, err), err
    assert "write_" not in err
    assert sorted(os.listdir(tmp_path)) == ["a_file", "tpu"]


def test_a_failing_write_is_one_line(capsys, checkpoint, tmp_path, monkeypatch):
    # A write that fails half-way (here: TensorFlow cannot make the directory)
    # is TensorFlow's error class and first line, not a traceback.
    prefix, _ = checkpoint

    def refuse(path):
        raise tf.errors.PermissionDeniedError(None, None, f"{path}; Permission denied")

    monkeypatch.setattr(tf.io.gfile, "makedirs", refuse)
    destination = tmp_path / "denied" / "ckpt"
    code, _, err = run(capsys, "checkpoint", "convert", prefix, destination)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "cannot make the directory" in err and "PermissionDeniedError" in err


def test_a_stale_state_file_is_named(capsys, checkpoint, tmp_path):
    prefix, _ = checkpoint
    directory = os.path.dirname(prefix)
    for name in tf.io.gfile.glob(prefix + "*"):
        tf.io.gfile.remove(name)
    code, out, err = run(capsys, "checkpoint", "inspect", directory)
    assert code == 2 and not out
    assert len(err.strip().splitlines()) == 1, err
    assert "stale state file" in err and os.path.basename(prefix) in err
    assert "Couldn't match files" not in err


def test_convert_output_is_what_the_reader_reads(capsys, checkpoint, tmp_path):
    prefix, _ = checkpoint
    destination = str(tmp_path / "copy" / "ckpt")
    code, out, _ = run(
        capsys, "checkpoint", "convert", prefix, destination, "--tables", "item"
    )
    assert code == 0
    assert f"wrote {destination}: 1 table, " in out  # not "1 tables"
    reader = checkpoints.TPUCheckpointReader(destination)
    assert list(reader.tables) == ["item"]
    assert os.path.exists(destination + ".index")
