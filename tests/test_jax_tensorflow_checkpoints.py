"""`checkpoint convert` between jax-tpu-embedding and TensorFlow's TPUEmbedding.

Oracles: a jax-tpu-embedding step written by its own code (`jax_checkpoints`);
TensorFlow's `TPUEmbeddingForServing`, which restores the TPUEmbedding
layout with its slots (`assert_existing_objects_matched`); jax-tpu-embedding's
`stack_and_shard_tables`, whose stacked arrays (NaN padding included) the
TensorFlow -> JAX direction must give bit for bit. JAX -> TensorFlow -> JAX is
bit-identical.
"""

import os

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
pytest.importorskip("jax_tpu_embedding")
ocp = pytest.importorskip("orbax.checkpoint")

from jax_checkpoints import SLOTS, TABLES, save_step, table_values  # noqa: E402
from tensorflow.python.tpu.tpu_embedding_for_serving import (  # noqa: E402
    TPUEmbeddingForServing,
)

import tf_tpu_embed_opt as teo  # noqa: E402
from tf_tpu_embed_opt import cli  # noqa: E402
from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import reader as jax_orbax  # noqa: E402

pytestmark = pytest.mark.oracle("jax-tpu-embedding")

TFE = tf.tpu.experimental.embedding
ENGINE_SLOTS = {"momentum": "momenta", "velocity": "velocities"}


def _serving():
    tables = [
        TFE.TableConfig(rows, dim, name=name, optimizer=teo.embedding.Adam(0.1))
        for name, (rows, dim) in TABLES.items()
    ]
    serving = TPUEmbeddingForServing([TFE.FeatureConfig(table=t) for t in tables], None)
    serving.build()
    return serving


def _convert(capsys, *argv):
    code = cli.main(["checkpoint", "convert", *map(str, argv)])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def test_a_jax_step_goes_to_tensorflow_and_back_bit_identical(tmp_path, capsys):
    values = table_values(seed=21)
    step, _, original, _ = save_step(tmp_path / "jax", 2, 4, values)
    prefix = tmp_path / "tpu" / "ckpt"
    out = _convert(capsys, step, prefix, "--step-path", "step")
    assert "4 tables" in out and "step 1000 at step" in out

    # TensorFlow's own TPUEmbedding object graph restores it, slots included.
    serving = _serving()
    counter = tf.Variable(0, dtype=tf.int64)
    status = tf.train.Checkpoint(embedding=serving, step=counter).restore(str(prefix))
    status.assert_existing_objects_matched()
    assert int(counter.numpy()) == 1000
    for name in TABLES:
        variables = serving._variables[name]
        np.testing.assert_array_equal(
            variables["parameters"].numpy(), values["table"][name]
        )
        for theirs, ours in ENGINE_SLOTS.items():
            np.testing.assert_array_equal(variables[ours].numpy(), values[theirs][name])

    # Back to the jax-tpu-embedding layout of the job that wrote it.
    back = tmp_path / "back"
    _convert(
        capsys,
        prefix,
        back,
        "--to-jax",
        "2x4",
        "--stack",
        "a_b_c=a,b,c",
        "--algorithm",
        "adam",
        "--step-path",
        "step",
    )
    restored = ocp.PyTreeCheckpointer().restore(os.path.join(back, "1000", "model"))
    stacks = restored["embedding_layer"]["embedding_table"]["value"]
    assert sorted(stacks) == sorted(original["table"])
    for stack, variables in stacks.items():
        for part, value in (("table", variables["table"]), *variables["slot"].items()):
            np.testing.assert_array_equal(
                np.asarray(value).view(np.uint32),
                original[part][stack].view(np.uint32),
                err_msg=f"{stack} {part}",
            )
    assert sorted(variables["slot"]) == sorted(SLOTS)


def test_tensorflow_to_jax_asks_for_the_algorithm_slots_do_not_name(tmp_path, capsys):
    values = table_values(seed=22)
    step, *_ = save_step(tmp_path / "jax", 1, 4, values)
    prefix = tmp_path / "tpu" / "ckpt"
    _convert(capsys, step, prefix)
    # TensorFlow's Adagrad and ProximalAdagrad both keep `accumulators`, and
    # jax-tpu-embedding names their slot differently: refused without a word
    # on which. Adam's slots name it.
    adagrad = tmp_path / "adagrad" / "ckpt"
    states = [
        (n, {"parameters": values["table"][n], "accumulators": values["velocity"][n]})
        for n in TABLES
    ]
    teo.checkpoints.write_tpu_checkpoint(str(adagrad), states)
    code = cli.main(
        [
            "checkpoint",
            "convert",
            str(adagrad),
            str(tmp_path / "x"),
            "--to-jax",
            "1x4",
            "--step",
            "1",
        ]
    )
    assert code == 2
    assert "fit ['Adagrad', 'ProximalAdagrad']; give --algorithm" in (
        capsys.readouterr().err
    )
    # Nor does it hold a step.
    argv = ["checkpoint", "convert", adagrad, tmp_path / "x", "--to-jax", "1x4"]
    assert cli.main([*map(str, argv), "--algorithm", "adagrad"]) == 2
    assert capsys.readouterr().err == (
        "tf-tpu-embed-opt: error: --to-jax: the step to write is not known; "
        "give --step N (or --step-path where SRC holds it).\n"
    )
    _convert(
        capsys,
        adagrad,
        tmp_path / "x",
        "--to-jax",
        "1x4",
        "--step",
        "1",
        "--algorithm",
        "adagrad",
    )
    read = jax_orbax.read_jax_tables(str(tmp_path / "x" / "1"))
    assert sorted(read["c"].slots) == ["accumulator"]
    np.testing.assert_array_equal(
        read["c"].slots["accumulator"], values["velocity"]["c"]
    )
    # A checkpoint that records its algorithms (as the package's writers
    # do) needs no --algorithm.
    recorded = teo.checkpoints.write_checkpoint(
        str(tmp_path / "recorded" / "ckpt"),
        states,
        algorithms=dict.fromkeys(TABLES, "Adagrad"),
    )
    _convert(capsys, recorded, tmp_path / "y", "--to-jax", "1x4", "--step", "1")
    read = jax_orbax.read_jax_tables(str(tmp_path / "y" / "1"))
    np.testing.assert_array_equal(
        read["c"].slots["accumulator"], values["velocity"]["c"]
    )


def test_a_sparsecore_checkpoint_goes_to_jax_and_back(tmp_path, capsys):
    from tf_tpu_embed_opt import sparsecore_layout

    values = table_values(seed=23)
    step, _, original, _ = save_step(tmp_path / "jax", 2, 4, values)
    features = {
        name: TFE.FeatureConfig(
            table=TFE.TableConfig(rows, dim, name=name), output_shape=[16], name=name
        )
        for name, (rows, dim) in TABLES.items()
    }
    layouts = sparsecore_layout.stack_layouts(
        features, TFE.Adam(0.1), num_replicas=2, sparse_cores_per_chip=4
    )
    states = {
        name: {
            "parameters": values["table"][name],
            **{ours: values[theirs][name] for theirs, ours in ENGINE_SLOTS.items()},
        }
        for name in TABLES
    }
    sparsecore = sparsecore_layout.write_checkpoint(
        str(tmp_path / "sc" / "ckpt"), layouts, states, "Adam"
    )
    _convert(
        capsys,
        sparsecore,
        tmp_path / "to_jax",
        "--algorithm",
        "adam",
        "--to-jax",
        "2x4",
        "--stack",
        "a_b_c=a,b,c",
        "--step",
        "1000",
    )
    restored = ocp.PyTreeCheckpointer().restore(
        os.path.join(tmp_path / "to_jax", "1000", "model")
    )
    stacks = restored["embedding_layer"]["embedding_table"]["value"]
    for stack, variables in stacks.items():
        np.testing.assert_array_equal(
            np.asarray(variables["table"]).view(np.uint32),
            original["table"][stack].view(np.uint32),
        )
    # And from the jax-tpu-embedding step into the SparseCore layouts.
    back = tmp_path / "back" / "ckpt"
    _convert(capsys, step, back, "--layouts-from", sparsecore, "--algorithm", "adam")
    for name, state in sparsecore_layout.read_tables(str(back), "Adam"):
        np.testing.assert_array_equal(state["parameters"], values["table"][name])
        np.testing.assert_array_equal(state["velocities"], values["velocity"][name])
