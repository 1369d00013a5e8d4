"""keras-rs's JAX `DistributedEmbedding` orbax checkpoints, read and moved.

A `DistributedEmbedding` on SparseCore needs a TPU, so the checkpoint is made
as the job makes it, from its parts: keras-rs's own conversion of the feature
configs and jax-tpu-embedding's `auto_stack_tables`,
`prepare_feature_specs_for_training` and `stack_and_shard_tables` (what
`sparsecore_build` and `set_embedding_tables` run) give the stacked arrays;
a Keras layer holding them as weights named as keras-rs names them
(`var:<stack>:table`, `var:<stack>:table:slot:<name>`) is saved by
`keras.callbacks.OrbaxCheckpoint`, Keras's own writer. The tables must come
back bit for bit from the topology given, be refused from a topology whose
shapes differ, and move to another topology as jax-tpu-embedding restacks.

keras-rs's own `DistributedEmbedding` is also built on CPU with its tables
placed on SparseCore (only the hardware probes answered): its own
`set_embedding_tables` and `get_embedding_tables` are the oracle for what is
read from, and written into, the step Keras's `OrbaxCheckpoint` saves of it,
restored by Keras's `load_weights`.
"""

# Runs without TensorFlow.

import copy
import os
import shutil

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("jax_tpu_embedding")
pytest.importorskip("orbax.checkpoint")
keras_rs = pytest.importorskip("keras_rs")
keras = pytest.importorskip("keras")

from jax_checkpoints import stacked_arrays  # noqa: E402
from jax_tpu_embedding.sparsecore.lib.nn import (  # noqa: E402
    embedding,
    table_stacking,
)
from keras_rs.src.layers.embedding.jax import config_conversion  # noqa: E402
from reader_checks import assert_unknown_names_refused  # noqa: E402

from tf_tpu_embed_opt import checkpoints  # noqa: E402
from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import keras_rs as keras_rs_orbax  # noqa: E402
from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import reader as jax_orbax  # noqa: E402
from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import writer as jax_orbax_writer  # noqa: E402

pytestmark = [
    pytest.mark.oracle("jax-tpu-embedding"),
    pytest.mark.skipif(
        keras.backend.backend() != "jax", reason="keras-rs's JAX checkpoints"
    ),
]

TABLES = {"a": (100, 8), "b": (37, 8), "c": (300, 8), "d": (50, 16)}


def _feature_configs():
    return {
        f"feature_{name}": keras_rs.layers.FeatureConfig(
            name=f"feature_{name}",
            table=keras_rs.layers.TableConfig(
                name=name,
                vocabulary_size=rows,
                embedding_dim=dim,
                optimizer="adagrad",
            ),
            input_shape=(16, 1),
            output_shape=(16, dim),
        )
        for name, (rows, dim) in TABLES.items()
    }


def _values(seed):
    rng = np.random.default_rng(seed)
    return {
        part: {
            name: rng.normal(size=shape).astype(np.float32)
            for name, shape in TABLES.items()
        }
        for part in ("table", "accumulator")
    }


def _job_stacks(devices, cores, values):
    """The stacked arrays of a job of `devices` x `cores`, as keras-rs's
    `sparsecore_build` + `set_embedding_tables` lay them out."""
    features = config_conversion.keras_to_jte_feature_configs(
        copy.deepcopy(_feature_configs())
    )
    table_stacking.auto_stack_tables(features, devices, cores)
    embedding.prepare_feature_specs_for_training(features, devices, cores)
    specs = embedding.get_table_specs(features)
    return stacked_arrays(specs, values, devices * cores)


class _Stacks(keras.layers.Layer):
    """Weights named as keras-rs's JAX `DistributedEmbedding` names them
    (`_add_table_variable`): each stack's table and Adagrad slot."""

    def __init__(self, shapes, **kwargs):
        super().__init__(**kwargs)
        self.shapes = {k: tuple(v) for k, v in shapes.items()}

    def build(self, input_shape):
        for stack, shape in self.shapes.items():
            for name in (f"var:{stack}:table", f"var:{stack}:table:slot:accumulator"):
                self.add_weight(name=name, shape=shape, initializer="zeros")
        self.add_weight(name="iteration", shape=(), initializer="zeros")

    def call(self, inputs):
        return keras.ops.cast(inputs, "float32")

    def get_config(self):
        return {**super().get_config(), "shapes": self.shapes}


def _states(values):
    """Each table's Adagrad state, as the writer takes it."""
    return [
        (
            name,
            {
                "parameters": values["table"][name],
                "accumulators": values["accumulator"][name],
            },
        )
        for name in TABLES
    ]


def _jax_step(directory, values):
    """A jax-tpu-embedding step of 1 x 4 SparseCores, each table alone."""
    spec = jax_orbax_writer.embedding_spec_for(
        TABLES, num_devices=1, sparsecores_per_device=4
    )
    return jax_orbax_writer.write_jax_checkpoint(
        directory, 3, _states(values), spec, dict.fromkeys(TABLES, "Adagrad")
    )


def _assert_read(step, spec, values):
    """Every table and accumulator read from `step` in `spec`'s layout is
    `values`'s, and fits Adagrad."""
    read = jax_orbax.read_jax_tables(step, embedding_spec=spec)
    for name in TABLES:
        np.testing.assert_array_equal(read[name].table, values["table"][name])
        np.testing.assert_array_equal(
            read[name].slots["accumulator"], values["accumulator"][name]
        )
        assert [d.name for d in read[name].algorithms] == ["Adagrad"]


def _assert_stacks(arrays, expected):
    """Each stack's `var:<stack>:table` and its accumulator in `arrays`
    (name -> array) equal `expected` (`{part: {stack: array}}`) bit for
    bit."""
    for stack in expected["table"]:
        for key, part in (
            (f"var:{stack}:table", "table"),
            (f"var:{stack}:table:slot:accumulator", "accumulator"),
        ):
            np.testing.assert_array_equal(
                np.asarray(arrays[key]).view(np.uint32),
                expected[part][stack].view(np.uint32),
                err_msg=key,
            )


def _moved(step, source, target, directory):
    """`step`'s tables, read in `source`'s layout, written in `target`'s as
    step 0 of `directory` with the rest of `step`."""
    reader = jax_orbax.JaxCheckpointReader(step, source)
    return jax_orbax_writer.write_jax_checkpoint(
        directory,
        0,
        ((name, reader.read(name)) for name in reader.tables),
        target,
        dict.fromkeys(TABLES, "Adagrad"),
        items_from=step,
    )


def _keras_rs_checkpoint(directory, stacks):
    inputs = keras.Input((1,), dtype="int32")
    layer = _Stacks(
        {k: v.shape for k, v in stacks["table"].items()}, name="distributed_embedding"
    )
    model = keras.Model(inputs, layer(inputs))
    for weight in layer.weights:
        name = weight.name
        if name.startswith("var:"):
            stack = name.split(":")[1]
            part = "accumulator" if ":slot:" in name else "table"
            weight.assign(stacks[part][stack])
    # A learning rate of 0: the weights are saved as they were set.
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
    callback = keras.callbacks.OrbaxCheckpoint(
        os.fspath(directory), save_on_background=False
    )
    model.fit(
        np.zeros((2, 1), "int32"),
        np.zeros((2, 1), "float32"),
        epochs=1,
        callbacks=[callback],
        verbose=0,
    )
    callback.wait_until_finished()
    return os.path.join(directory, "0")


def _stacks(spec):
    """The spec's stacks, each its tables' names, sorted."""
    return sorted(
        sorted(t.table_name for t in s.table_specs) for s in spec.stacked_table_specs
    )


def test_the_spec_is_the_jobs_stacking():
    spec = keras_rs_orbax.embedding_spec(
        _feature_configs(), num_devices=2, sparsecores_per_device=4
    )
    # keras-rs's "auto" stacks tables of one padded width and optimizer.
    assert _stacks(spec) == [["a", "b", "c"], ["d"]]
    assert {s.num_sparsecores for s in spec.stacked_table_specs} == {8}
    spec = keras_rs_orbax.embedding_spec(
        _feature_configs(), num_devices=2, sparsecores_per_device=4, table_stacking=None
    )
    assert len(spec.stacked_table_specs) == 4


def test_tables_and_slots_come_back_from_the_topology_given(tmp_path):
    values = _values(seed=31)
    step = _keras_rs_checkpoint(tmp_path / "job", _job_stacks(2, 4, values))
    spec = keras_rs_orbax.embedding_spec(
        _feature_configs(), num_devices=2, sparsecores_per_device=4
    )
    _assert_read(step, spec, values)
    checkpoint = checkpoints.open_checkpoint(step, embedding_spec=spec)
    assert checkpoint.format == "keras-rs"
    assert_unknown_names_refused(checkpoint, "a")
    assert_unknown_names_refused(checkpoint.reader, "a")
    # A topology whose stacks have other shapes is refused.
    other = keras_rs_orbax.embedding_spec(
        _feature_configs(), num_devices=4, sparsecores_per_device=4
    )
    with pytest.raises(ValueError, match="is its topology the job's"):
        jax_orbax.read_jax_tables(step, embedding_spec=other)
    unstacked = keras_rs_orbax.embedding_spec(
        _feature_configs(), num_devices=2, sparsecores_per_device=4, table_stacking=None
    )
    with pytest.raises(ValueError, match="are the feature configs and the"):
        jax_orbax.read_jax_tables(step, embedding_spec=unstacked)


def test_a_keras_rs_step_needs_its_spec_and_is_told_from_a_rewritten_one(tmp_path):
    """A step keras-rs's job saved holds no spec: it is a keras-rs step, and
    reading it asks for one. A step this package rewrote keeps keras-rs's
    names and holds its spec: it is none."""
    values = _values(seed=36)
    step = _keras_rs_checkpoint(tmp_path / "job", _job_stacks(2, 4, values))
    assert keras_rs_orbax.is_keras_rs_checkpoint(step)
    assert not keras_rs_orbax.is_keras_rs_checkpoint(str(tmp_path / "missing"))
    assert not keras_rs_orbax.is_keras_rs_checkpoint(
        _jax_step(tmp_path / "jax", values)
    )
    with pytest.raises(
        ValueError,
        match="is a keras-rs step, which does not record which table is where: "
        "pass `embedding_spec`",
    ):
        checkpoints.open_checkpoint(step)
    spec = keras_rs_orbax.embedding_spec(
        _feature_configs(), num_devices=2, sparsecores_per_device=4
    )
    written = _moved(step, spec, spec, tmp_path / "rewritten")
    assert not keras_rs_orbax.is_keras_rs_checkpoint(written)
    _assert_read(written, None, values)


def test_a_checkpoint_moves_to_another_topology_keeping_keras_names(tmp_path):
    values = _values(seed=32)
    step = _keras_rs_checkpoint(tmp_path / "job", _job_stacks(2, 4, values))
    source = keras_rs_orbax.embedding_spec(
        _feature_configs(), num_devices=2, sparsecores_per_device=4
    )
    target = keras_rs_orbax.embedding_spec(
        _feature_configs(), num_devices=4, sparsecores_per_device=2
    )
    written = _moved(step, source, target, tmp_path / "moved")
    import orbax.checkpoint as ocp

    tree = ocp.PyTreeCheckpointer().restore(os.path.join(written, "pytree"))
    layer = tree["trainable_variables"]["distributed_embedding"]
    _assert_stacks(layer, _job_stacks(4, 2, values))
    # The rest of the model's state and its config come along.
    assert float(layer["iteration"]) == 0.0
    assert "optimizer_variables" in tree
    assert os.path.isdir(os.path.join(written, "model_config"))
    read = jax_orbax.read_jax_tables(written, embedding_spec=target)
    np.testing.assert_array_equal(read["c"].table, values["table"]["c"])


def test_tables_from_elsewhere_go_into_a_keras_rs_jobs_step(tmp_path):
    # Tables of a jax-tpu-embedding step of another topology, stacked
    # otherwise (each table alone), written into the step of a keras-rs job
    # of 2 x 4 (e.g. its first): keras-rs's names and layout, the rest of
    # the model's state as the job had it; Keras's loader restores it.
    values = _values(seed=34)
    source = _jax_step(tmp_path / "source", values)
    job = _keras_rs_checkpoint(tmp_path / "job", _job_stacks(2, 4, _values(seed=35)))
    target = keras_rs_orbax.embedding_spec(
        _feature_configs(), num_devices=2, sparsecores_per_device=4
    )
    reader = jax_orbax.JaxCheckpointReader(source)
    jax_orbax_writer.write_jax_checkpoint(
        tmp_path / "into_job",
        0,
        ((name, reader.streams(name)) for name in reader.tables),
        target,
        dict.fromkeys(TABLES, "Adagrad"),
        items_from=job,
    )
    model = keras.saving.load_model(
        tmp_path / "into_job", custom_objects={"_Stacks": _Stacks}
    )
    weights = {
        w.name: keras.ops.convert_to_numpy(w.value)
        for w in model.get_layer("distributed_embedding").weights
    }
    expected = _job_stacks(2, 4, values)
    _assert_stacks(weights, expected)
    assert sorted(w for w in weights if w.startswith("var:")) == sorted(
        f"var:{stack}:table{slot}"
        for stack in expected["table"]
        for slot in ("", ":slot:accumulator")
    )


def test_table_stacking_is_read_as_distributed_embedding_reads_it():
    """keras-rs's `sparsecore_build`: a list of names is one stack, a list of
    lists one stack each; anything else that is no string (an empty list, a
    tuple) stacks nothing. Tables of placement 'default_device' are plain
    Keras weights, not in the spec."""

    def spec(stacking, configs=None):
        return keras_rs_orbax.embedding_spec(
            configs or _feature_configs(),
            num_devices=2,
            sparsecores_per_device=4,
            table_stacking=stacking,
        )

    assert _stacks(spec(["a", "c"])) == [["a", "c"], ["b"], ["d"]]
    assert _stacks(spec([["a", "b"], ["c", "d"]])) == [["a", "b"], ["c", "d"]]
    for nothing in ([], ("a", "b", "c"), None):
        assert _stacks(spec(nothing)) == [["a"], ["b"], ["c"], ["d"]]
    configs = _feature_configs()
    configs["feature_d"].table.placement = "default_device"
    configs["feature_b"].table.placement = "sparsecore"
    assert _stacks(spec("auto", configs)) == [["a", "b", "c"]]


def test_bad_arguments_are_refused_by_name():
    for value in (0, 2.0, True):
        with pytest.raises(
            ValueError, match=f"`num_devices` must be a positive int; received {value}"
        ):
            keras_rs_orbax.embedding_spec(
                _feature_configs(), num_devices=value, sparsecores_per_device=4
            )
    with pytest.raises(ValueError, match="`table_stacking` must be None, 'auto', a"):
        keras_rs_orbax.embedding_spec(
            _feature_configs(),
            num_devices=1,
            sparsecores_per_device=4,
            table_stacking=[1, 2],
        )
    configs = _feature_configs()
    configs["feature_c"].table.placement = "tpu"
    with pytest.raises(
        ValueError, match="feature 'feature_c' has placement 'tpu'; keras-rs allows"
    ):
        keras_rs_orbax.embedding_spec(configs, num_devices=1, sparsecores_per_device=4)
    for feature in configs.values():
        feature.table.placement = "default_device"
    with pytest.raises(ValueError, match="places no table on SparseCore"):
        keras_rs_orbax.embedding_spec(configs, num_devices=1, sparsecores_per_device=4)
    with pytest.raises(ValueError, match="`table_stacking` must be None, 'auto'"):
        keras_rs_orbax.embedding_spec(
            _feature_configs(),
            num_devices=1,
            sparsecores_per_device=4,
            table_stacking="all",
        )


# streamed: the tables read shard by shard and the stacks assembled in
# memory-mapped files, written as zarr chunk files (not OCDBT).
@pytest.mark.parametrize("streamed", [False, True])
def test_keras_loads_a_rewritten_step_and_the_spec_travels_with_it(tmp_path, streamed):
    values = _values(seed=33)
    stacks = _job_stacks(2, 4, values)
    step = _keras_rs_checkpoint(tmp_path / "job", stacks)
    spec = keras_rs_orbax.embedding_spec(
        _feature_configs(), num_devices=2, sparsecores_per_device=4
    )
    reader = jax_orbax.JaxCheckpointReader(step, spec)
    jax_orbax_writer.write_jax_checkpoint(
        tmp_path / "again",
        0,
        (
            (name, reader.streams(name) if streamed else reader.read(name))
            for name in reader.tables
        ),
        spec,
        dict.fromkeys(TABLES, "Adagrad"),
        items_from=step,
        spill_bytes=0 if streamed else None,
    )
    # Keras's own orbax loader (what restores a keras-rs model) reads it.
    model = keras.saving.load_model(
        tmp_path / "again", custom_objects={"_Stacks": _Stacks}
    )
    weights = {w.name: w for w in model.get_layer("distributed_embedding").weights}
    for stack in stacks["table"]:
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(weights[f"var:{stack}:table"].value).view(
                np.uint32
            ),
            stacks["table"][stack].view(np.uint32),
        )
    # The rewritten step records its layout: no feature configs needed now.
    read = jax_orbax.read_jax_tables(os.path.join(tmp_path, "again", "0"))
    np.testing.assert_array_equal(read["b"].table, values["table"]["b"])


def test_checkpoint_inspect_lists_the_stacks_and_says_what_it_needs(tmp_path, capsys):
    import json

    from tf_tpu_embed_opt import cli

    step = _keras_rs_checkpoint(tmp_path / "job", _job_stacks(2, 4, _values(34)))
    assert cli.main(["checkpoint", "inspect", step]) == 0
    out = capsys.readouterr().out
    assert "layout: keras-rs" in out
    assert (
        "stacked table d (item pytree, trainable_variables/distributed_embedding): "
        "64 x 16, slots accumulator, fits Adagrad, 8,192 bytes"
    ) in out
    assert "jax_tpu_embedding.keras_rs.embedding_spec" in out
    assert cli.main(["checkpoint", "inspect", step, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert {s["stacked_table"] for s in document["stacked_tables"]} == set(
        _job_stacks(2, 4, _values(34))["table"]
    )


def test_inspect_says_the_step_of_a_keras_rs_step(tmp_path, capsys):
    """A keras-rs step's step is its directory's number, with the feature
    configs and without."""
    from tf_tpu_embed_opt import cli

    step = _keras_rs_checkpoint(tmp_path / "job", _job_stacks(2, 4, _values(36)))
    copy = str(shutil.copytree(step, tmp_path / "copies" / "7"))
    layout = ["--keras-rs-features", "test_keras_rs_orbax:_feature_configs"]
    for given in ([], [*layout, "--keras-rs-topology", "2x4"]):
        assert cli.main(["checkpoint", "inspect", copy, *given]) == 0
        assert capsys.readouterr().out.splitlines()[2] == "step: 7"
    assert checkpoints.describe_checkpoint(copy)["step"] == 7


def test_the_command_line_reads_and_moves_a_keras_rs_step(tmp_path, capsys):
    from tf_tpu_embed_opt import cli

    values = _values(seed=35)
    step = _keras_rs_checkpoint(tmp_path / "job", _job_stacks(2, 4, values))
    layout = [
        "--keras-rs-features",
        "test_keras_rs_orbax:_feature_configs",
        "--keras-rs-topology",
        "2x4",
    ]
    assert cli.main(["checkpoint", "inspect", step, *layout]) == 0
    out = capsys.readouterr().out
    assert "layout: jax-tpu-embedding" in out
    assert "over 8 SparseCores, slots accumulator, fits Adagrad" in out
    assert "  b: 37 x 8, row offset " in out
    destination = tmp_path / "moved"
    command = ["checkpoint", "convert", step, str(destination), *layout]
    assert cli.main([*command, "--to-jax", "4x2"]) == 0, capsys.readouterr().err
    target = keras_rs_orbax.embedding_spec(
        _feature_configs(), num_devices=4, sparsecores_per_device=2
    )
    read = jax_orbax.read_jax_tables(
        os.path.join(destination, "0"), embedding_spec=target
    )
    for name in TABLES:
        np.testing.assert_array_equal(read[name].table, values["table"][name])
    # keras-rs's names and place are kept.
    import orbax.checkpoint as ocp

    tree = ocp.PyTreeCheckpointer().restore(os.path.join(destination, "0", "pytree"))
    assert (
        "var:d:table:slot:accumulator"
        in tree["trainable_variables"]["distributed_embedding"]
    )


JOB_LAYOUT = [
    "--keras-rs-features",
    "test_keras_rs_orbax:_feature_configs",
    "--keras-rs-topology",
    "2x4",
]


def test_the_command_line_writes_a_keras_rs_jobs_step(tmp_path, capsys):
    # SRC is no keras-rs step: the keras-rs options describe DST, written
    # over the job's step (--items-from) with keras-rs's names and layout.
    from tf_tpu_embed_opt import cli

    values = _values(seed=37)
    source = _jax_step(tmp_path / "source", values)
    job = _keras_rs_checkpoint(tmp_path / "job", _job_stacks(2, 4, _values(38)))
    destination = tmp_path / "into_job"
    command = ["checkpoint", "convert", source, str(destination), "--to-jax", "2x4"]
    command += ["--items-from", job, "--step", "0", *JOB_LAYOUT]
    assert cli.main(command) == 0, capsys.readouterr().err
    model = keras.saving.load_model(destination, custom_objects={"_Stacks": _Stacks})
    weights = {
        w.name: keras.ops.convert_to_numpy(w.value)
        for w in model.get_layer("distributed_embedding").weights
    }
    _assert_stacks(weights, _job_stacks(2, 4, values))


@pytest.mark.parametrize(
    "arguments, match",
    [
        ([*JOB_LAYOUT], "describe DST, which needs --to-jax"),
        (["--to-jax", "4x2", *JOB_LAYOUT], "--keras-rs-topology 2x4 and --to-jax"),
        (["--to-jax", "2x4", *JOB_LAYOUT], "give --items-from a step of the job"),
        (
            ["--to-jax", "2x4", "--stack", "s=a,b", *JOB_LAYOUT],
            "--stack and the keras-rs options",
        ),
    ],
)
def test_keras_rs_options_for_dst_are_refused_by_name(
    tmp_path, capsys, arguments, match
):
    from tf_tpu_embed_opt import cli

    source = _jax_step(tmp_path / "source", _values(seed=39))
    destination = str(tmp_path / "dst")
    assert cli.main(["checkpoint", "convert", source, destination, *arguments]) == 2
    assert match in capsys.readouterr().err
    assert not os.path.exists(destination)


@pytest.mark.parametrize(
    "arguments, match",
    [
        (["--keras-rs-topology", "2x4"], "give both"),
        (
            ["--keras-rs-features", "nowhere", "--keras-rs-topology", "2x4"],
            "expected MODULE:NAME",
        ),
        (
            [
                "--keras-rs-features",
                "test_keras_rs_orbax:_nothing",
                "--keras-rs-topology",
                "2x4",
            ],
            "has no '_nothing'",
        ),
        (
            [
                "--keras-rs-features",
                "test_keras_rs_orbax:_feature_configs",
                "--keras-rs-topology",
                "2x4",
                "--keras-rs-table-stacking",
                "a,b;",
            ],
            "--keras-rs-table-stacking: expected auto, none or",
        ),
    ],
)
def test_the_keras_rs_options_are_refused_by_name(tmp_path, capsys, arguments, match):
    from tf_tpu_embed_opt import cli

    step = _keras_rs_checkpoint(tmp_path / "job", _job_stacks(2, 4, _values(36)))
    assert cli.main(["checkpoint", "inspect", step, *arguments]) == 2
    assert match in capsys.readouterr().err


def _distributed_embedding_model(monkeypatch):
    """A model around keras-rs's own JAX `DistributedEmbedding`, its tables
    placed on SparseCore as on a TPU of 1 device x 4 SparseCores: only the
    hardware probes (`_has_sparsecore`, jax-tpu-embedding's
    `num_sparsecores_per_device`) are answered; keras-rs's `sparsecore_build`
    stacks, pads and makes the variables (its lookups need a TPU and are not
    run)."""
    from keras_rs.src.layers.embedding import base_distributed_embedding
    from keras_rs.src.layers.embedding.jax import distributed_embedding

    monkeypatch.setattr(
        base_distributed_embedding.DistributedEmbedding,
        "_has_sparsecore",
        lambda self: True,
    )
    monkeypatch.setattr(
        distributed_embedding.jte_utils,
        "num_sparsecores_per_device",
        lambda device=None: 4,
    )
    features = _feature_configs()
    inputs = {
        name: keras.Input(batch_shape=(16, 1), dtype="int32", name=name)
        for name in features
    }
    layer = keras_rs.layers.DistributedEmbedding(features, name="distributed_embedding")
    model = keras.Model(inputs, layer(inputs))
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
    model.optimizer.build(model.trainable_variables)
    return model, layer


def test_a_real_distributed_embedding_is_read_and_restores_what_is_written(
    tmp_path, monkeypatch
):
    model, layer = _distributed_embedding_model(monkeypatch)
    weights = {w.name: w for w in layer.weights}
    # The fixture's layout is keras-rs's own: the stacks it made have the
    # shapes `_job_stacks` gives.
    values = _values(seed=40)
    expected = _job_stacks(1, 4, values)
    assert sorted(n for n in weights if n.startswith("var:")) == sorted(
        f"var:{stack}:table{slot}"
        for stack in expected["table"]
        for slot in ("", ":slot:accumulator")
    )
    # Tables through keras-rs's own `set_embedding_tables`; the accumulators
    # (which it has no setter for) as jax-tpu-embedding stacks them.
    layer.set_embedding_tables(values["table"])
    for stack, value in expected["accumulator"].items():
        weights[f"var:{stack}:table:slot:accumulator"].assign(value)
    callback = keras.callbacks.OrbaxCheckpoint(
        os.fspath(tmp_path / "job"), save_on_background=False
    )
    callback.set_model(model)
    callback.on_epoch_end(0, logs={})
    callback.wait_until_finished()
    step = os.path.join(tmp_path, "job", "0")
    spec = keras_rs_orbax.embedding_spec(
        _feature_configs(), num_devices=1, sparsecores_per_device=4
    )
    _assert_read(step, spec, values)
    # Other tables and slots written over the job's step come back through
    # Keras's own orbax restore into a new DistributedEmbedding of 1 x 4,
    # and keras-rs's own `get_embedding_tables` unstacks them.
    new = _values(seed=41)
    jax_orbax_writer.write_jax_checkpoint(
        tmp_path / "new",
        0,
        _states(new),
        spec,
        dict.fromkeys(TABLES, "Adagrad"),
        items_from=step,
    )
    restored, restored_layer = _distributed_embedding_model(monkeypatch)
    restored.load_weights(tmp_path / "new")
    for name, table in restored_layer.get_embedding_tables().items():
        np.testing.assert_array_equal(np.asarray(table), new["table"][name])
    stacks = _job_stacks(1, 4, new)
    restored_weights = {w.name: w for w in restored_layer.weights}
    for stack, value in stacks["accumulator"].items():
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(
                restored_weights[f"var:{stack}:table:slot:accumulator"].value
            ).view(np.uint32),
            value.view(np.uint32),
        )
