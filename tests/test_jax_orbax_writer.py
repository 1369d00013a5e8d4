"""jax-tpu-embedding orbax checkpoints written for any topology.

Oracle: jax-tpu-embedding's own code (`jax_checkpoints.py`). For a target
topology, its `stack_tables` + `prepare_feature_specs_for_training` +
`create_proto_from_feature_specs` give the spec that ours must equal, field
by field; its `stack_and_shard_tables` gives the stacked arrays that ours
must equal bit for bit (NaN padding included); its
`unshard_and_unstack_tables` reads what we write. Round trips are
bit-identical; refusals write nothing.
"""

# Runs without TensorFlow.

import os
import shutil

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("jax_tpu_embedding")
ocp = pytest.importorskip("orbax.checkpoint")

import jax_checkpoints  # noqa: E402
from conftest import benchmark_harness, same_in_the_jax_leg  # noqa: E402
from google.protobuf import text_format  # noqa: E402
from jax_checkpoints import TABLES, save_step, table_values  # noqa: E402
from jax_tpu_embedding.sparsecore.lib.nn import (  # noqa: E402
    embedding,
    embedding_spec,
    table_stacking,
)

from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import reader as jax_orbax  # noqa: E402
from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import spec_proto as jax_spec_proto  # noqa: E402
from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import writer as jax_orbax_writer  # noqa: E402
from tf_tpu_embed_opt.checkpoints.shared import stacks as sparsecore_stacks  # noqa: E402

pytestmark = pytest.mark.oracle("jax-tpu-embedding")

TOPOLOGIES = [(1, 4), (2, 4), (4, 2), (3, 2)]
ADAM = {name: "Adam" for name in TABLES}


def _their_spec(devices, cores, rotation=None):
    features = jax_checkpoints.feature_specs(devices, cores, rotation=rotation)
    proto = embedding.create_proto_from_feature_specs(features, devices, cores)
    return jax_spec_proto.parse(text_format.MessageToString(proto)), features


def _restored_model(step_dir):
    restored = ocp.PyTreeCheckpointer().restore(os.path.join(step_dir, "model"))
    return restored


@pytest.mark.parametrize("source", TOPOLOGIES)
@pytest.mark.parametrize("target", TOPOLOGIES)
def test_a_spec_retargeted_is_the_one_jax_tpu_embedding_makes(source, target):
    ours = jax_orbax_writer.retarget_embedding_spec(
        _their_spec(*source)[0], num_devices=target[0], sparsecores_per_device=target[1]
    )
    theirs, _ = _their_spec(*target)
    assert text_format.MessageToString(ours) == text_format.MessageToString(theirs)


@pytest.mark.parametrize("devices, cores", TOPOLOGIES)
def test_a_spec_from_table_shapes_has_jax_tpu_embeddings_geometry(devices, cores):
    ours = jax_orbax_writer.embedding_spec_for(
        TABLES,
        num_devices=devices,
        sparsecores_per_device=cores,
        stacks={"a_b_c": ["a", "b", "c"]},
    )
    _assert_same_geometry(ours, _their_spec(devices, cores)[0])


# An explicit rotation: none at all, one SparseCore, and more than a device
# has, as `stack_tables(rotation=...)` lays the stack out; the reader takes
# the spec as jax-tpu-embedding's.
@pytest.mark.parametrize("rotation", [0, 1, 5])
@pytest.mark.parametrize("devices, cores", [(2, 4), (3, 2)])
def test_a_spec_with_a_given_rotation_is_jax_tpu_embeddings(devices, cores, rotation):
    theirs, _ = _their_spec(devices, cores, rotation)
    retargeted = jax_orbax_writer.retarget_embedding_spec(
        _their_spec(1, 4)[0],
        num_devices=devices,
        sparsecores_per_device=cores,
        rotation=rotation,
    )
    assert text_format.MessageToString(retargeted) == text_format.MessageToString(
        theirs
    )
    ours = jax_orbax_writer.embedding_spec_for(
        TABLES,
        num_devices=devices,
        sparsecores_per_device=cores,
        stacks={"a_b_c": ["a", "b", "c"]},
        rotation=np.int64(rotation),
    )
    _assert_same_geometry(ours, theirs)
    layouts = {t.table_name: t for t in jax_orbax.layouts(ours)}
    shards = devices * cores
    assert [layouts[n].sparse_core_shard_rotation for n in "abc"] == [
        0,
        rotation % shards,
        2 * rotation % shards,
    ]


def _assert_same_geometry(ours, theirs):
    fields = (
        "vocab_size",
        "embedding_dim",
        "padded_vocab_size",
        "padded_embedding_dim",
        "row_offset_in_shard",
        "shard_rotation",
    )
    for mine, their in zip(ours.stacked_table_specs, theirs.stacked_table_specs):
        assert (mine.stack_name, mine.num_sparsecores) == (
            their.stack_name,
            their.num_sparsecores,
        )
        assert (mine.stack_vocab_size, mine.stack_embedding_dim) == (
            their.stack_vocab_size,
            their.stack_embedding_dim,
        )
        for a, b in zip(mine.table_specs, their.table_specs, strict=True):
            assert [getattr(a, f) for f in fields] == [getattr(b, f) for f in fields]


@pytest.mark.parametrize("block_rows", [None, 4])
@pytest.mark.parametrize("devices, cores", [(1, 4), (3, 2)])
def test_narrow_tables_shard_as_jax_tpu_embeddings_with_nan_columns(
    monkeypatch, devices, cores, block_rows
):
    """Tables narrower than their stack's padded width (5 and 3 columns,
    padded to 8) shard as `stack_and_shard_tables` shards them, bit for
    bit, their padding columns NaN (the tables above are multiples of 8
    wide: no column of theirs is padding). `block_rows`: a table placed 4
    rows at a time, as one of over 2**20 rows is placed in blocks."""
    if block_rows:
        monkeypatch.setattr(sparsecore_stacks, "_PLACE_BLOCK_ROWS", block_rows)
    shapes = {"m": (20, 5), "n": (37, 5), "w": (11, 3)}
    features = {
        name: embedding_spec.FeatureSpec(
            name=f"feature_{name}",
            table_spec=embedding_spec.TableSpec(
                name=name,
                vocabulary_size=vocabulary,
                embedding_dim=dim,
                initializer=jax.nn.initializers.zeros,
                optimizer=embedding_spec.SGDOptimizerSpec(learning_rate=0.1),
                combiner="sum",
            ),
            input_shape=(16, 1),
            output_shape=(16, dim),
        )
        for name, (vocabulary, dim) in shapes.items()
    }
    table_stacking.stack_tables(
        features, ["m", "n"], global_device_count=devices, num_sc_per_device=cores
    )
    embedding.prepare_feature_specs_for_training(
        features, global_device_count=devices, num_sc_per_device=cores
    )
    proto = embedding.create_proto_from_feature_specs(features, devices, cores)
    spec = jax_spec_proto.parse(text_format.MessageToString(proto))
    rng = np.random.default_rng(5)
    values = {n: rng.normal(size=s).astype(np.float32) for n, s in shapes.items()}
    theirs = table_stacking.stack_and_shard_tables(
        {name: f.table_spec for name, f in features.items()}, values, devices * cores
    )
    by_stack = {}
    for layout in jax_orbax.layouts(spec):
        by_stack.setdefault(layout.stacked_table_name, []).append(layout)
    assert sorted(by_stack) == sorted(theirs) == ["m_n", "w"]
    for stack, layouts in by_stack.items():
        ours = sparsecore_stacks.shard_tables(
            {layout.table_name: values[layout.table_name] for layout in layouts},
            layouts,
            pad_value=np.nan,
        )
        their = np.asarray(theirs[stack])
        their = their.reshape(-1, their.shape[-1])
        assert ours.shape[1] == 8 and np.isnan(ours[:, 5:]).any(), stack
        assert ours.view(np.uint32).tobytes() == their.view(np.uint32).tobytes(), stack


# spill_bytes=0: every stack assembled in memory-mapped files (how a table
# larger than memory is written).
@pytest.mark.parametrize(
    "source, target, spill_bytes", [((1, 4), (2, 4), None), ((4, 2), (1, 4), 0)]
)
def test_a_checkpoint_moved_to_another_topology_is_jax_tpu_embeddings_restack(
    tmp_path, source, target, spill_bytes
):
    values = table_values(seed=11)
    step, *_ = save_step(tmp_path / "src", *source, values)
    reader = jax_orbax.JaxCheckpointReader(step)
    spec = jax_orbax_writer.retarget_embedding_spec(
        jax_orbax.read_embedding_spec(step),
        num_devices=target[0],
        sparsecores_per_device=target[1],
    )
    written = jax_orbax_writer.write_jax_checkpoint(
        tmp_path / "dst",
        1000,
        ((name, reader.read(name)) for name in reader.tables),
        spec,
        ADAM,
        items_from=step,
        spill_bytes=spill_bytes,
    )
    assert written == os.path.join(tmp_path / "dst", "1000")
    assert os.listdir(tmp_path / "dst") == ["1000"]
    theirs, specs = jax_checkpoints.their_stacks(*target, values)
    model = _restored_model(written)
    stacks = model["embedding_layer"]["embedding_table"]["value"]
    jax_checkpoints.assert_same_bits(stacks, theirs)
    # jax-tpu-embedding's own unstacking reads the tables back.
    unstacked = table_stacking.unshard_and_unstack_tables(
        specs, {k: v["table"] for k, v in stacks.items()}, target[0] * target[1]
    )
    for name in TABLES:
        np.testing.assert_array_equal(
            np.asarray(unstacked[name]), values["table"][name]
        )
    # The dense layers and their optimizer state come along unchanged.
    np.testing.assert_array_equal(
        model["dense"]["kernel"], jax_checkpoints.DENSE_KERNEL
    )
    optimizer = ocp.PyTreeCheckpointer().restore(os.path.join(written, "optimizer"))
    np.testing.assert_array_equal(
        optimizer["mu"]["kernel"], jax_checkpoints.DENSE_OPTIMIZER_STATE["mu"]["kernel"]
    )
    # ... and orbax's CheckpointManager, as jax-tpu-embedding restores, finds
    # the step with all three items.
    manager = ocp.CheckpointManager(tmp_path / "dst")
    assert manager.latest_step() == 1000
    proto = manager.restore(
        1000,
        args=ocp.args.Composite(
            embedding_spec=ocp.args.ProtoRestore(
                jax_spec_proto.message_class("EmbeddingSpecProto")
            )
        ),
    ).embedding_spec
    assert proto.stacked_table_specs[0].num_sparsecores == target[0] * target[1]
    manager.close()


def test_a_round_trip_over_another_topology_is_bit_identical(tmp_path):
    values = table_values(seed=12)
    step, _, original, _ = save_step(tmp_path / "a", 2, 4, values)
    middle = _moved(step, tmp_path / "b", (4, 2))
    back = _moved(middle, tmp_path / "c", (2, 4))
    stacks = _restored_model(back)["embedding_layer"]["embedding_table"]["value"]
    jax_checkpoints.assert_same_bits(stacks, original)
    assert (
        open(os.path.join(back, "embedding_spec", "proto.pbtxt")).read()
        == open(os.path.join(step, "embedding_spec", "proto.pbtxt")).read()
    )


def _moved(step, root, topology):
    reader = jax_orbax.JaxCheckpointReader(step)
    spec = jax_orbax_writer.retarget_embedding_spec(
        jax_orbax.read_embedding_spec(step),
        num_devices=topology[0],
        sparsecores_per_device=topology[1],
    )
    return jax_orbax_writer.write_jax_checkpoint(
        root,
        1000,
        ((name, reader.read(name)) for name in reader.tables),
        spec,
        ADAM,
        items_from=step,
    )


def test_keras_state_is_written_for_a_tpu_job(tmp_path):
    keras = pytest.importorskip("keras")
    from jax_tpu_embedding.sparsecore.lib.nn import embedding_spec

    import tf_tpu_embed_opt as teo
    from tf_tpu_embed_opt.checkpoints.keras import tables as keras_tables

    values = table_values(seed=13)
    twin = teo.to_keras(embedding_spec.AdamOptimizerSpec(learning_rate=0.1))
    variables = {
        name: keras.Variable(values["table"][name], name=name) for name in TABLES
    }
    twin.build(list(variables.values()))
    for name, variable in variables.items():
        index = twin._get_variable_index(variable)
        twin._slot_variables["momenta"][index].assign(values["momentum"][name])
        twin._slot_variables["velocities"][index].assign(values["velocity"][name])
    tables = keras_tables.keras_tables(variables, twin)
    spec, _ = _their_spec(2, 4)
    written = jax_orbax_writer.write_jax_checkpoint(
        tmp_path,
        5,
        keras_tables.keras_table_states(tables),
        spec,
        {t.name: t.definition for t in tables},
    )
    theirs, _ = jax_checkpoints.their_stacks(2, 4, values)
    stacks = _restored_model(written)["embedding_layer"]["embedding_table"]["value"]
    for stack, variables_ in stacks.items():
        np.testing.assert_array_equal(
            jax_checkpoints.bits(variables_["slot"]["velocity"]),
            jax_checkpoints.bits(theirs["velocity"][stack]),
        )
    read = jax_orbax.read_jax_tables(written)
    for name in TABLES:
        np.testing.assert_array_equal(
            read[name].slots["momentum"], values["momentum"][name]
        )


def _states(values):
    return [
        (
            name,
            {
                "parameters": values["table"][name],
                "momenta": values["momentum"][name],
                "velocities": values["velocity"][name],
            },
        )
        for name in TABLES
    ]


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda s: s[:-1], r"Tables \['d'\] of the embedding spec are not given"),
        (lambda s: s + s[:1], r"Table 'a' is given twice"),
        (
            lambda s: [(n, {k: v[:-1] for k, v in t.items()}) for n, t in s],
            r"Table 'a', table: shape \(99, 8\); the spec says \(100, 8\)",
        ),
        (
            lambda s: [
                (n, {k: v for k, v in t.items() if k != "momenta"}) for n, t in s
            ],
            r"Table 'a': its state holds \['parameters', 'velocities'\]; Adam needs",
        ),
        (
            lambda s: [("zz", s[0][1])] + s[1:],
            r"Table 'zz' is not in the embedding spec",
        ),
    ],
)
def test_states_that_do_not_fit_are_refused_and_nothing_is_written(
    tmp_path, change, match
):
    spec = jax_orbax_writer.embedding_spec_for(
        TABLES, num_devices=1, sparsecores_per_device=4, stacks={"s": ["a", "b", "c"]}
    )
    with pytest.raises(ValueError, match=match):
        jax_orbax_writer.write_jax_checkpoint(
            tmp_path / "root", 1, change(_states(table_values())), spec, ADAM
        )
    assert not os.path.exists(tmp_path / "root")


def test_an_orbax_that_copies_what_it_writes_is_refused(tmp_path, monkeypatch, capsys):
    """Before 0.12.5 orbax copies every NumPy array it writes (no
    `deepcopy_host_arrays`): a step held twice in memory. Refused naming the
    version, before anything is written; the command line says it in one
    line. (Reading does not need it.)"""
    from tf_tpu_embed_opt import cli

    values = table_values(seed=16)
    step, *_ = save_step(tmp_path / "src", 1, 4, values)

    class OldNumpyHandler:  # orbax 0.11's signature
        def __init__(self, metadata_key=None):
            pass

    monkeypatch.setattr(ocp.type_handlers, "NumpyHandler", OldNumpyHandler)
    reader = jax_orbax.JaxCheckpointReader(step)
    with pytest.raises(ImportError, match="needs orbax-checkpoint 0.12.5 or later"):
        jax_orbax_writer.write_jax_checkpoint(
            tmp_path / "dst",
            1000,
            ((name, reader.read(name)) for name in reader.tables),
            jax_orbax.read_embedding_spec(step),
            ADAM,
        )
    assert not (tmp_path / "dst").exists()
    destination = str(tmp_path / "dst")
    argv = ["checkpoint", "convert", step, destination, "--to-jax", "2x4"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "orbax-checkpoint 0.12.5" in err, err
    assert not (tmp_path / "dst").exists()


def test_arguments_of_another_type_are_refused_by_name(tmp_path):
    """An `embedding_spec` that is no EmbeddingSpecProto failed on a missing
    attribute, `item=3` with "keywords must be strings", a `pad_value`
    string on float(); a `variables_path` string was taken letter by
    letter as the path of the stacks."""
    from tf_tpu_embed_opt import checkpoints

    spec = jax_orbax_writer.embedding_spec_for(
        TABLES, num_devices=1, sparsecores_per_device=4
    )
    states = _states(table_values())
    for kwargs, match in [
        ({"item": 3}, "`item` must be an orbax item's name"),
        ({"variables_path": "a/b"}, "`variables_path` must be a sequence of keys"),
        ({"variables_path": ("a", 1.5)}, "`variables_path` must be a sequence of"),
        ({"pad_value": "x"}, "`pad_value` must be a number"),
    ]:
        with pytest.raises(TypeError, match=match):
            jax_orbax_writer.write_jax_checkpoint(
                tmp_path, 1, states, spec, ADAM, **kwargs
            )
    with pytest.raises(TypeError, match="`embedding_spec` must be an EmbeddingSpec"):
        jax_orbax_writer.write_jax_checkpoint(tmp_path, 1, states, "spec", ADAM)
    assert list(tmp_path.iterdir()) == []
    step = jax_orbax_writer.write_jax_checkpoint(tmp_path, 1, states, spec, ADAM)
    for call in (checkpoints.open_checkpoint, checkpoints.describe_checkpoint):
        with pytest.raises(TypeError, match="`embedding_spec` must be an Embedding"):
            call(step, embedding_spec="spec")


def test_the_deprecated_writer_takes_the_tables_as_the_front_door(tmp_path):
    """`write_jax_checkpoint` takes a mapping name -> state, on which it
    failed with "string index out of range", and refuses an item that is no
    pair by showing it ("not enough values to unpack"); nothing is written
    then."""
    spec = jax_orbax_writer.embedding_spec_for(
        TABLES, num_devices=1, sparsecores_per_device=4
    )
    values = table_values()
    states = _states(values)
    with pytest.raises(
        TypeError,
        match=r"`tables` must give \(table name, state\) pairs; received an item "
        r"\('b',\)",
    ):
        jax_orbax_writer.write_jax_checkpoint(
            tmp_path, 1, states[:1] + [("b",)], spec, ADAM
        )
    assert list(tmp_path.iterdir()) == []
    step = jax_orbax_writer.write_jax_checkpoint(tmp_path, 1, dict(states), spec, ADAM)
    read = jax_orbax.read_jax_tables(step)
    for name in TABLES:
        np.testing.assert_array_equal(read[name].table, values["table"][name])
        np.testing.assert_array_equal(
            read[name].slots["velocity"], values["velocity"][name]
        )


def test_bad_arguments_are_refused_by_name(tmp_path):
    spec = jax_orbax_writer.embedding_spec_for(
        TABLES, num_devices=1, sparsecores_per_device=4, stacks={"s": ["a", "b", "c"]}
    )
    states = _states(table_values())
    with pytest.raises(ValueError, match=r"share stack 's'.*\['Adagrad', 'Adam'\]"):
        jax_orbax_writer.write_jax_checkpoint(
            tmp_path, 1, states, spec, dict(ADAM, b="Adagrad")
        )
    with pytest.raises(ValueError, match=r"has no algorithm for tables \['d'\]"):
        jax_orbax_writer.write_jax_checkpoint(
            tmp_path, 1, states, spec, {n: "Adam" for n in "abc"}
        )
    with pytest.raises(ValueError, match="`step` must be an int >= 0; received -1"):
        jax_orbax_writer.write_jax_checkpoint(tmp_path, -1, states, spec, ADAM)
    with pytest.raises(ValueError, match="`spill_bytes` must be an int >= 0"):
        jax_orbax_writer.write_jax_checkpoint(
            tmp_path, 1, states, spec, ADAM, spill_bytes=-1
        )
    with pytest.raises(ValueError, match="`naming` must be 'jax-tpu-embedding'"):
        jax_orbax_writer.write_jax_checkpoint(
            tmp_path, 1, states, spec, ADAM, naming="flax"
        )
    jax_orbax_writer.write_jax_checkpoint(tmp_path, 1, states, spec, ADAM)
    with pytest.raises(ValueError, match="exists already"):
        jax_orbax_writer.write_jax_checkpoint(tmp_path, 1, states, spec, ADAM)
    assert sorted(os.listdir(tmp_path)) == ["1"]  # no work directory is left
    for kwargs, match in [
        ({"num_devices": 0}, "`num_devices` must be a positive int; received 0"),
        ({"sparsecores_per_device": True}, "`sparsecores_per_device` must be"),
        ({"rotation": -1}, "`rotation` must be >= 0; received -1"),
        ({"rotation": 1.0}, "`rotation` must be an int >= 0 or None .*received 1.0"),
        ({"rotation": True}, "`rotation` must be an int >= 0 or None"),
    ]:
        arguments = {"num_devices": 1, "sparsecores_per_device": 4, **kwargs}
        with pytest.raises(ValueError, match=match):
            jax_orbax_writer.embedding_spec_for(TABLES, **arguments)
    with pytest.raises(ValueError, match=r"table 'a' is in stacks 's' and 't'"):
        jax_orbax_writer.embedding_spec_for(
            TABLES,
            num_devices=1,
            sparsecores_per_device=4,
            stacks={"s": ["a"], "t": ["a", "b"]},
        )
    for shape in [(10, 8, 1), 10, "ab"]:
        with pytest.raises(
            ValueError,
            match=r"`tables` maps 'a' to .*; expected \(vocabulary size, embedding",
        ):
            jax_orbax_writer.embedding_spec_for(
                {"a": shape}, num_devices=1, sparsecores_per_device=4
            )
    for stacks, match in [
        ({"s": []}, r"stack 's' lists no table"),
        (
            {"s": ["a", "zz"]},
            r"stack 's' lists 'zz', which is not in `tables` \(\['a', 'b', 'c', 'd'",
        ),
    ]:
        with pytest.raises(ValueError, match=match):
            jax_orbax_writer.embedding_spec_for(
                TABLES, num_devices=1, sparsecores_per_device=4, stacks=stacks
            )
    with pytest.raises(ValueError, match=r"stack names \['d'\] are taken twice"):
        jax_orbax_writer.embedding_spec_for(
            TABLES, num_devices=1, sparsecores_per_device=4, stacks={"d": ["a"]}
        )


def test_algorithms_and_slot_dtypes_are_checked_before_anything_is_written(
    tmp_path,
):
    """Through the front door: `algorithms` must be a mapping (one name for
    every table is the SparseCore writer's form, not this one's), and each
    slot must have its table's dtype; nothing is written then."""
    from tf_tpu_embed_opt import checkpoints

    spec = jax_orbax_writer.embedding_spec_for(
        TABLES, num_devices=1, sparsecores_per_device=4
    )
    states = _states(table_values())

    def write(tables, algorithms):
        return checkpoints.write_checkpoint(
            str(tmp_path / "out"),
            tables,
            format="jax-tpu-embedding",
            step=1,
            embedding_spec=spec,
            algorithms=algorithms,
        )

    with pytest.raises(
        TypeError,
        match=r"write_checkpoint: argument `algorithms` must map each table to "
        r"its algorithm; received str\.",
    ):
        write(states, "Adam")
    wider = [(name, dict(state)) for name, state in states]
    wider[1][1]["momenta"] = wider[1][1]["momenta"].astype(np.float64)
    with pytest.raises(
        ValueError,
        match=r"Table 'b', slot 'momenta': dtype float64; the table's is float32\.",
    ):
        write(wider, ADAM)
    assert list(tmp_path.iterdir()) == []


def test_checkpoint_convert_moves_a_step_to_another_topology(tmp_path, capsys):
    from tf_tpu_embed_opt import cli

    values = table_values(seed=14)
    step, *_ = save_step(tmp_path / "src", 1, 4, values)
    destination = str(tmp_path / "dst")
    assert (
        cli.main(["checkpoint", "convert", step, destination, "--to-jax", "4x2"]) == 0
    )
    out = capsys.readouterr().out
    assert "jax-tpu-embedding layout for 4 devices x 2 SparseCores, step 1000" in out
    theirs, _ = jax_checkpoints.their_stacks(4, 2, values)
    stacks = _restored_model(os.path.join(destination, "1000"))["embedding_layer"][
        "embedding_table"
    ]["value"]
    for stack, variables in stacks.items():
        np.testing.assert_array_equal(
            jax_checkpoints.bits(variables["table"]),
            jax_checkpoints.bits(theirs["table"][stack]),
        )
    # Inspect reads what convert wrote.
    assert cli.main(["checkpoint", "inspect", os.path.join(destination, "1000")]) == 0
    assert "over 8 SparseCores, slots momentum, velocity, fits Adam" in (
        capsys.readouterr().out
    )
    # A step directory not named by its number needs --step.
    renamed = str(tmp_path / "latest")
    shutil.copytree(os.path.join(destination, "1000"), renamed)
    assert cli.main(["checkpoint", "convert", renamed, str(tmp_path / "d2")]) == 2
    assert f"{renamed!r} is not named by its step" in capsys.readouterr().err


def test_relative_paths_are_read_and_written(tmp_path, monkeypatch, capsys):
    """Steps named relative to the working directory, as the guides' commands
    name them (`checkpoint convert job/1000 bigger --to-jax 4x4`): orbax reads
    no metadata at a relative path and refuses to write to one."""
    from tf_tpu_embed_opt import cli
    from tf_tpu_embed_opt.checkpoints import open_checkpoint

    values = table_values(seed=15)
    save_step(tmp_path / "job", 1, 4, values)
    monkeypatch.chdir(tmp_path)
    source = open_checkpoint(os.path.join("job", "1000"))
    for name in TABLES:
        parameters = source.read(name)["parameters"]
        np.testing.assert_array_equal(parameters, values["table"][name])
    assert (
        cli.main(["checkpoint", "convert", "job/1000", "bigger", "--to-jax", "2x4"])
        == 0
    )
    assert "wrote bigger/1000:" in capsys.readouterr().out
    written = jax_orbax_writer.write_jax_checkpoint(
        "again",
        1000,
        ((name, source.read(name)) for name in source.tables),
        jax_orbax.read_embedding_spec("bigger/1000"),
        ADAM,
        items_from="job/1000",
    )
    assert written == os.path.join("again", "1000")
    for step in ("bigger/1000", written):
        again = open_checkpoint(step)
        for name in TABLES:
            np.testing.assert_array_equal(
                again.read(name)["parameters"], values["table"][name]
            )


@pytest.mark.parametrize(
    "arguments, match",
    [
        (["--to-jax", "4"], "--to-jax: expected DEVICESxSPARSECORES"),
        (["--to-jax", "0x4"], "--to-jax: expected DEVICESxSPARSECORES"),
        (["--to-jax", "2x1"], "--to-jax: SPARSECORES must be 2 or 4"),
        (["--stack", "s=a,b"], "--stack goes with --to-jax"),
        (["--rotation", "0"], "--rotation goes with --to-jax"),
        (["--to-jax", "2x4", "--tables", "a"], "--tables and --rename change"),
        (
            ["--to-jax", "2x4", "--stack", "s=a,b", "--spec-from", "x"],
            "--stack and --spec-from: give one (the stacks of DST).",
        ),
        (["--to-jax", "2x4", "--layouts-from", "x"], "--layouts-from does not go"),
        (
            ["--to-jax", "2x4", "--step", "1", "--step-path", "step"],
            "--step and --step-path: give one (the step of DST).",
        ),
        (["--to-jax", "2x4", "--object-path", "e"], "has no object paths"),
        (["--to-jax", "2x4", "--stack", "s"], "--stack: expected NAME=T1,T2"),
        # The second one won without a word before.
        (
            ["--to-jax", "2x4", "--stack", "s=a,b", "--stack", "s=a"],
            "--stack: 's' is given twice (s=a,b and s=a); give it once.",
        ),
        (["--items-from", "job/0"], "--items-from goes with --to-jax"),
        (
            ["--to-jax", "2x4", "--items-from", "nowhere/0"],
            "--items-from: 'nowhere/0' is not an orbax step directory",
        ),
    ],
)
def test_checkpoint_convert_refuses_jax_options_by_name(
    tmp_path, capsys, arguments, match
):
    from tf_tpu_embed_opt import cli

    step, *_ = save_step(tmp_path / "src", 1, 4, table_values())
    destination = str(tmp_path / "dst")
    assert cli.main(["checkpoint", "convert", step, destination, *arguments]) == 2
    assert match in capsys.readouterr().err
    assert not os.path.exists(os.path.join(destination, "1000"))


@same_in_the_jax_leg
@benchmark_harness
def test_the_benchmark_reports_every_run():
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parent.parent
    if not (root / "benchmarks" / "jax_checkpoint_convert.py").is_file():
        pytest.skip("no benchmarks/ next to tests/")
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.jax_checkpoint_convert", "--quick"]
        + ["--repeats=1"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, KERAS_BACKEND="jax"),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    for run, base in (("read", "restore"), ("to_keras", "restore")):
        assert any(line.startswith(run) and line.endswith(base) for line in lines)
    assert any(line.startswith("convert") and "restore_save" in line for line in lines)


def test_restacked_otherwise_the_old_stacks_do_not_come_along(tmp_path, capsys):
    from tf_tpu_embed_opt import cli

    values = table_values(seed=15)
    step, *_ = save_step(tmp_path / "src", 2, 4, values)
    destination = str(tmp_path / "dst")
    arguments = ["checkpoint", "convert", step, destination, "--to-jax", "2x4"]
    assert cli.main([*arguments, "--stack", "ab=a,b"]) == 0, capsys.readouterr().err
    model = _restored_model(os.path.join(destination, "1000"))
    # a and b stacked anew, c and d alone; the source's a_b_c is gone, and
    # the dense layers came along.
    assert sorted(model["embedding_layer"]["embedding_table"]["value"]) == [
        "ab",
        "c",
        "d",
    ]
    np.testing.assert_array_equal(
        model["dense"]["kernel"], jax_checkpoints.DENSE_KERNEL
    )
    read = jax_orbax.read_jax_tables(os.path.join(destination, "1000"))
    for name in TABLES:
        np.testing.assert_array_equal(read[name].table, values["table"][name])


def test_stacks_written_elsewhere_leave_no_empty_node_and_no_stray_file(tmp_path):
    """Over `items_from` with another `variables_path`, the source's stacks
    are dropped with the nodes they leave empty (not written as `{}`), the
    other leaves come along, and only the source's items are copied: a file
    beside them is no item."""
    from tf_tpu_embed_opt.checkpoints import write_checkpoint

    values = table_values(seed=16)
    step, *_ = save_step(tmp_path / "src", 1, 4, values)
    with open(os.path.join(step, "notes.txt"), "w") as stray:
        stray.write("not an orbax item")
    reader = jax_orbax.JaxCheckpointReader(step)
    written = write_checkpoint(
        tmp_path / "dst",
        {name: reader.read(name) for name in reader.tables},
        format="jax-tpu-embedding",
        step=1000,
        embedding_spec=jax_orbax.read_embedding_spec(step),
        algorithms=ADAM,
        items_from=step,
        variables_path=("tables",),
    )
    model = _restored_model(written)
    assert sorted(model) == ["dense", "tables"], sorted(model)
    np.testing.assert_array_equal(
        model["dense"]["kernel"], jax_checkpoints.DENSE_KERNEL
    )
    assert "notes.txt" not in os.listdir(written)
    assert os.path.isdir(os.path.join(written, "optimizer"))
    read = jax_orbax.read_jax_tables(written)
    for name in TABLES:
        np.testing.assert_array_equal(read[name].table, values["table"][name])


def test_an_item_the_source_step_lacks_is_refused_before_anything_is_written(
    tmp_path,
):
    from tf_tpu_embed_opt.checkpoints import write_checkpoint

    step, *_ = save_step(tmp_path / "src", 1, 4, table_values())
    reader = jax_orbax.JaxCheckpointReader(step)
    with pytest.raises(ValueError, match=r"items_from: .* has no item 'params'"):
        write_checkpoint(
            tmp_path / "dst",
            {name: reader.read(name) for name in reader.tables},
            format="jax-tpu-embedding",
            step=1000,
            embedding_spec=jax_orbax.read_embedding_spec(step),
            algorithms=ADAM,
            items_from=step,
            item="params",
        )
    assert not os.path.exists(tmp_path / "dst" / "1000")


def test_topologies_are_those_jax_tpu_embedding_builds():
    """The SparseCores per device the writer takes are exactly those
    jax-tpu-embedding's own `get_num_sc_per_device` accepts (the oracle);
    others are refused naming the argument and the values allowed."""
    from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import (
        writer as jax_orbax_writer,
    )

    accepted = []
    for count in range(1, 9):
        try:
            embedding._get_num_sc_per_device(count)  # what its stacking calls
        except ValueError:
            continue
        accepted.append(count)
    assert accepted == list(jax_orbax_writer.JAX_SPARSECORES_PER_DEVICE)
    for count in (1, 3, 8):
        for make in (
            lambda: jax_orbax_writer.embedding_spec_for(
                TABLES, num_devices=2, sparsecores_per_device=count
            ),
            lambda: jax_orbax_writer.retarget_embedding_spec(
                _their_spec(2, 4)[0], num_devices=2, sparsecores_per_device=count
            ),
        ):
            with pytest.raises(ValueError, match=r"must be one of \[2, 4\]"):
                make()


def test_what_a_job_of_several_processes_cannot_write_is_refused_by_name():
    """The writer of tables spread over processes (`jax_orbax_processes`,
    tested across 2 processes in test_jax_processes.py) refuses the host
    writer's options, and a stack its devices do not divide, by name."""
    from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import (
        processes as jax_orbax_processes,
    )

    for option in ("items_from", "spill_bytes"):
        with pytest.raises(ValueError, match=f"`{option}` does not apply to tables"):
            jax_orbax_processes.refuse_options(**{option: 1})
    jax_orbax_processes.refuse_options(items_from=None, spill_bytes=None)
    spec = jax_orbax_writer.embedding_spec_for(
        {"t": (100, 8)}, num_devices=1, sparsecores_per_device=4
    )
    layouts = jax_orbax.layouts(spec)  # 128 rows
    stacks = {"t": layouts}
    with pytest.raises(ValueError, match=r"stack 't' has 128 rows, which the job's 3"):
        jax_orbax_processes._row_sharding(stacks, jax.devices() * 3)
    sharding = jax_orbax_processes._row_sharding(stacks, jax.devices())
    assert sharding.spec == jax.sharding.PartitionSpec("rows")


@pytest.mark.parametrize("devices, cores", [(2, 4), (4, 2), (3, 2)])
def test_stacks_built_on_the_jobs_devices_are_jax_tpu_embeddings(devices, cores):
    """What the processes of a job write (`jax_orbax_processes._stacked`:
    each table padded, transposed and rolled by XLA on the job's devices)
    is jax-tpu-embedding's `stack_and_shard_tables`, bit for bit, NaN
    padding included: a stack of three tables, offset and rotated, and a
    table alone (test_jax_processes.py writes one table across 2
    processes). The tables come in another order than the stack's."""
    import jax.numpy as jnp

    from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import (
        processes as jax_orbax_processes,
    )

    values = table_values(seed=24)
    theirs, _ = jax_checkpoints.their_stacks(devices, cores, values)
    by_stack = {
        stack: members[::-1]
        for stack, members in sparsecore_stacks.group_layouts(
            jax_orbax.layouts(_their_spec(devices, cores)[0])
        ).items()
    }
    assert [len(members) for members in by_stack.values()] == [3, 1]
    sharding = jax_orbax_processes._row_sharding(by_stack, jax.devices())
    for stack, members in by_stack.items():
        for part in theirs:
            ours = jax_orbax_processes._stacked(
                [jnp.asarray(values[part][m.table_name]) for m in members],
                members,
                np.nan,
                sharding,
            )
            np.testing.assert_array_equal(
                np.asarray(ours).view(np.uint32),
                theirs[part][stack].view(np.uint32),
                err_msg=f"{stack} {part}",
            )


def _their_converter():
    """jax-tpu-embedding's offline converter (0.2.0's
    `lib/flax/nnx/checkpoint_utils.py`), or a skip where the installed
    release has none (0.1.0)."""
    utils = pytest.importorskip(
        "jax_tpu_embedding.sparsecore.lib.flax.nnx.checkpoint_utils",
        reason="this jax-tpu-embedding has no offline checkpoint converter",
    )
    if not hasattr(utils, "convert_cross_topology_checkpoint"):
        pytest.skip("this jax-tpu-embedding has no convert_cross_topology_checkpoint")
    return utils


def _converted(utils, root, target, topology):
    utils.convert_cross_topology_checkpoint(
        input_checkpoint_path=root,
        output_checkpoint_path=target,
        target_topology=utils.TargetTopology(*topology),
    )
    return os.path.join(target, "1000")


def _bits(step_dir):
    stacks = _restored_model(step_dir)["embedding_layer"]["embedding_table"]["value"]
    return jax.tree_util.tree_map(lambda leaf: np.asarray(leaf).view(np.uint32), stacks)


@pytest.mark.parametrize("topology", [(4, 2), (1, 4), (3, 2)])
def test_jax_tpu_embeddings_converter_takes_the_packages_steps(tmp_path, topology):
    """jax-tpu-embedding's own offline converter (`convert_cross_topology_
    checkpoint`, which restores without a target and reads each stack's
    sharding) takes a step the package moved to `topology` back to the
    job's (2, 4): bit for bit what it makes of its own job's step moved
    there by itself, and the package reads every table and slot of it as
    they were. The package's move and the converter's agree on the spec and
    on every row of every table and slot; they pad differently (the
    converter pads slots with zeros, the package, as `stack_and_shard_tables`
    does, with NaN), rows no lookup reads."""
    utils = _their_converter()
    values = table_values(seed=12)
    source = tmp_path / "job"
    step, *_ = save_step(source, 2, 4, values, as_jax=True)
    ours = _moved(step, tmp_path / "ours", topology)
    theirs = _converted(utils, source, tmp_path / "theirs", topology)
    assert open(os.path.join(ours, "embedding_spec", "proto.pbtxt")).read() == (
        open(os.path.join(theirs, "embedding_spec", "proto.pbtxt")).read()
    )
    back = _converted(utils, tmp_path / "ours", tmp_path / "back", (2, 4))
    reference = _converted(utils, tmp_path / "theirs", tmp_path / "reference", (2, 4))
    got, want = _bits(back), _bits(reference)
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_array_equal(a, b)
    reader = jax_orbax.JaxCheckpointReader(back)
    names = {"parameters": "table", "momenta": "momentum", "velocities": "velocity"}
    assert sorted(reader.tables) == sorted(TABLES)
    for name in reader.tables:
        for key, value in reader.read(name).items():
            np.testing.assert_array_equal(
                np.asarray(value).view(np.uint32),
                values[names[key]][name].view(np.uint32),
                f"{name}/{key}",
            )


def test_stacks_are_written_as_jax_arrays_that_use_the_assembled_memory(tmp_path):
    """The stacks of a jax-tpu-embedding step are `jax.Array`s, as a job
    writes them: restored without a target (as jax-tpu-embedding's offline
    converter restores), each has a sharding. They are made from the
    assembled arrays in place (DLPack; no second copy of the step), in
    memory and in memory-mapped files alike."""
    from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import (
        assembly as stack_assembly,
    )

    step, *_ = save_step(tmp_path / "job", 2, 4, table_values(seed=3))
    moved = _moved(step, tmp_path / "moved", (4, 2))
    stacks = _restored_model(moved)["embedding_layer"]["embedding_table"]["value"]
    for leaf in jax.tree_util.tree_leaves(stacks):
        assert isinstance(leaf, jax.Array) and leaf.sharding is not None
    in_memory = stack_assembly._aligned_zeros((37, 8), np.float32)
    mapped = np.lib.format.open_memmap(
        str(tmp_path / "stack.npy"), mode="w+", dtype=np.float32, shape=(37, 8)
    )
    for array in (in_memory, mapped):
        (converted,) = jax.tree_util.tree_leaves(
            stack_assembly.as_jax_arrays({"s": {"table": array}})
        )
        assert converted.unsafe_buffer_pointer() == array.ctypes.data
