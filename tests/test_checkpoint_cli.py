"""`tf-tpu-embed-opt checkpoint inspect|convert`, end to end.

Oracle: TensorFlow's `TPUEmbeddingForServing` writes the checkpoints inspected
and restores the converted ones (`assert_existing_objects_matched`), and the
byte counts are rows x dim x 4 x (1 + slots).
"""

import json
import os
import re

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
        (["--object-path", "model"], r"`object_path` 'model' does not exist"),
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
    assert code == 2 and "is not a readable TensorFlow checkpoint" in err
    code, _, err = run(capsys, "checkpoint", "inspect", tmp_path)
    assert code == 2 and "directory without a `checkpoint` state file" in err


def test_convert_output_is_what_the_reader_reads(capsys, checkpoint, tmp_path):
    prefix, _ = checkpoint
    destination = str(tmp_path / "copy" / "ckpt")
    assert (
        run(capsys, "checkpoint", "convert", prefix, destination, "--tables", "item")[0]
        == 0
    )
    reader = checkpoints.TPUCheckpointReader(destination)
    assert list(reader.tables) == ["item"]
    assert os.path.exists(destination + ".index")
