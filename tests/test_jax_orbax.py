"""jax-tpu-embedding's orbax checkpoints, read table by table with their slots.

Oracle: jax-tpu-embedding's own code. Its `stack_tables`,
`prepare_feature_specs_for_training` and `create_proto_from_feature_specs`
lay out the tables (stacked, padded, mod-sharded, rotated) and write the
`EmbeddingSpecProto`; its `stack_and_shard_tables` puts known values into that
layout and `unshard_and_unstack_tables` takes them out. The checkpoint is
saved with orbax as jax-tpu-embedding's flax examples save theirs (a
`model` item holding each stack's `EmbeddingVariables`, an `embedding_spec`
item holding the proto). `read_jax_tables` must give back the values, bit for
bit, from any topology, and refuse what contradicts the layout.
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
from jax_checkpoints import SLOTS, TABLES, save_step, table_values  # noqa: E402
from jax_tpu_embedding.sparsecore.lib.nn import (  # noqa: E402
    embedding_spec,
    table_stacking,
)

from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import reader as jax_orbax  # noqa: E402

pytestmark = pytest.mark.oracle("jax-tpu-embedding")


@pytest.mark.parametrize("devices, cores", [(1, 4), (2, 4), (4, 2)])
def test_tables_and_slots_come_back_as_jax_tpu_embedding_unstacks_them(
    tmp_path, devices, cores
):
    values = table_values()
    step, specs, stacked, shards = save_step(tmp_path, devices, cores, values)
    assert jax_orbax.is_jax_checkpoint(step)
    read = jax_orbax.read_jax_tables(step)
    assert list(read) == list(TABLES)
    for part in ("table", *SLOTS):
        theirs = table_stacking.unshard_and_unstack_tables(
            specs, {k: v for k, v in stacked[part].items()}, shards
        )
        for name in TABLES:
            ours = read[name].table if part == "table" else read[name].slots[part]
            np.testing.assert_array_equal(ours, np.asarray(theirs[name]))
            np.testing.assert_array_equal(ours, values[part][name])
    assert {d.name for d in read["a"].algorithms} == {"Adam"}
    # Stacked tables carry their offsets and rotations.
    assert {read[n].layout.stacked_table_name for n in "abc"} == {"a_b_c"}
    assert len({read[n].layout.sparse_core_shard_row_offset for n in "abc"}) == 3


@pytest.mark.parametrize("devices, cores", [(2, 4), (4, 2)])
def test_a_two_table_stack_rotated_comes_back(tmp_path, devices, cores):
    # The stack's rotation step is its second table's rotation: with two
    # tables nothing else says it (three-table stacks check it on the third).
    values = table_values(seed=4)
    step, *_ = save_step(tmp_path, devices, cores, values, stacked=("a", "b"))
    proto = jax_orbax.read_embedding_spec(step)
    stacks = {s.stack_name: s for s in proto.stacked_table_specs}
    assert [t.table_name for t in stacks["a_b"].table_specs] == ["a", "b"]
    assert [t.shard_rotation for t in stacks["a_b"].table_specs] == [0, cores]
    read = jax_orbax.read_jax_tables(step)
    assert read["b"].layout.sparse_core_shard_rotation == cores
    for name in TABLES:
        np.testing.assert_array_equal(read[name].table, values["table"][name])
        for slot in SLOTS:
            np.testing.assert_array_equal(read[name].slots[slot], values[slot][name])


def test_reading_a_step_logs_nothing_missing(tmp_path):
    """An orbax item has no step metadata file of its own: reading and
    describing a step must not log that one is missing (issue #56; orbax's
    `Checkpointer.metadata` on an item's directory did, through absl)."""
    import logging

    from tf_tpu_embed_opt import checkpoints

    step, *_ = save_step(tmp_path, 1, 4, table_values(seed=3))
    messages = []

    class Kept(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    kept = Kept(logging.WARNING)
    logger = logging.getLogger("absl")
    logger.addHandler(kept)
    try:
        opened = checkpoints.open_checkpoint(step)
        for name in opened.tables:
            opened.read(name)
        checkpoints.describe_checkpoint(step)
    finally:
        logger.removeHandler(kept)
    assert [m for m in messages if "does not exist" in m] == []


def test_the_same_tables_from_two_topologies(tmp_path):
    values = table_values(seed=3)
    one, *_ = save_step(tmp_path / "one", 1, 4, values)
    eight, *_ = save_step(tmp_path / "eight", 2, 4, values)
    a, b = jax_orbax.read_jax_tables(one), jax_orbax.read_jax_tables(eight)
    assert a["c"].layout.num_sparse_cores == 4
    assert b["c"].layout.num_sparse_cores == 8
    for name in TABLES:
        np.testing.assert_array_equal(a[name].table, b[name].table)
        for slot in SLOTS:
            np.testing.assert_array_equal(a[name].slots[slot], b[name].slots[slot])


def test_one_table_only(tmp_path):
    step, *_ = save_step(tmp_path, 1, 4, table_values())
    assert list(jax_orbax.read_jax_tables(step, tables=["d"])) == ["d"]
    with pytest.raises(ValueError, match=r"`tables` names \['zz'\]"):
        jax_orbax.read_jax_tables(step, tables=["zz"])


def test_jax_slot_name_names_each_slot_and_refuses_the_table(tmp_path):
    """The engine's slot names to jax-tpu-embedding's (Adam's, `SLOTS`);
    `"parameters"` has none, and was a bare `KeyError('parameters')`."""
    step, *_ = save_step(tmp_path, 1, 4, table_values())
    reader = jax_orbax.JaxCheckpointReader(step)
    slots = reader.tables["a"].slots
    assert sorted(slots) == ["momenta", "velocities"]
    assert sorted(reader.jax_slot_name("a", k) for k in slots) == sorted(SLOTS)
    assert reader.jax_slot_name("a", "momenta") == "momentum"
    with pytest.raises(
        KeyError,
        match=r"Table 'a' of .*: 'parameters' is the table itself, not a slot; "
        r"its slots are \['momenta', 'velocities'\]",
    ):
        reader.jax_slot_name("a", "parameters")


def test_a_wrong_shape_is_refused_naming_table_and_slot(tmp_path):
    def cut(variables):
        velocity = variables["d"]["slot"]["velocity"]
        variables["d"]["slot"]["velocity"] = velocity[:-8]

    step, *_ = save_step(tmp_path, 1, 4, table_values(), tamper=cut)
    with pytest.raises(ValueError, match=r"Table 'd', velocity: stored with shape"):
        jax_orbax.read_jax_tables(step)


def test_slots_that_fit_no_algorithm_are_refused_naming_them(tmp_path):
    def rename(variables):
        slots = variables["d"]["slot"]
        slots["mystery"] = slots.pop("velocity")

    step, *_ = save_step(tmp_path, 1, 4, table_values(), tamper=rename)
    with pytest.raises(ValueError, match=r"slots \['momentum', 'mystery'\] fit no"):
        jax_orbax.read_jax_tables(step, tables=["d"])


def test_a_missing_spec_or_stack_is_refused(tmp_path):
    step, *_ = save_step(tmp_path, 1, 4, table_values())
    with pytest.raises(ValueError, match="not a jax-tpu-embedding checkpoint step"):
        jax_orbax.read_jax_tables(os.path.join(step, "model"))
    proto = jax_orbax.read_embedding_spec(step)
    shutil.rmtree(os.path.join(step, "model"))
    with pytest.raises(ValueError, match=r"names stacks \['a_b_c', 'd'\].*items\.$"):
        jax_orbax.read_jax_tables(step)
    # A spec given for the step is named as the likely cause.
    with pytest.raises(
        ValueError,
        match=r"names stacks \['a_b_c', 'd'\].* items \(the spec given: are the "
        r"feature configs and the `table_stacking` the job's\?\)\.$",
    ):
        jax_orbax.JaxCheckpointReader(step, proto)


def test_a_damaged_spec_is_refused(tmp_path):
    step, *_ = save_step(tmp_path, 1, 4, table_values())
    path = os.path.join(step, "embedding_spec", "proto.pbtxt")
    with open(path, "a", encoding="utf-8") as handle:
        handle.write("stacked_table_specs { num_sparsecores: 3 stack_vocab_size: 64 ")
    with pytest.raises(ValueError, match="not an EmbeddingSpecProto"):
        jax_orbax.read_jax_tables(step)


# Edits of the spec that keep every size consistent, so that without the
# stacking check each would read other rows (a, b, c share stack a_b_c over
# 2 x 4 SparseCores, stacked in that order, rotated by 4 each).
@pytest.mark.parametrize(
    "edit, match",
    [
        # b moved up by one row: its rows read shifted, a's last row lost.
        (
            lambda t: {"b": {"row_offset_in_shard": t["b"].row_offset_in_shard - 1}},
            r"table 'b' has row_offset_in_shard \d+ and shard_rotation 4; "
            r"jax-tpu-embedding stacks it at \d+, rotated by 4 \(after \['a'\]",
        ),
        # a and b swap places: each would read the other's rows.
        (
            lambda t: {
                "a": {"row_offset_in_shard": t["b"].row_offset_in_shard},
                "b": {"row_offset_in_shard": t["a"].row_offset_in_shard},
            },
            r"table 'b' has row_offset_in_shard 0 and shard_rotation 4; "
            r"jax-tpu-embedding stacks it at 0, rotated by 0 \(after \[\]",
        ),
        # c rotated otherwise than the stack's rotation step says.
        (
            lambda t: {"c": {"shard_rotation": 1}},
            r"table 'c' has row_offset_in_shard \d+ and shard_rotation 1; "
            r"jax-tpu-embedding stacks it at \d+, rotated by 0 \(after \['a', "
            r"'b'\], rotation step 4\)",
        ),
        # d, alone in its stack, rotated at all.
        (
            lambda t: {"d": {"shard_rotation": 1}},
            r"table 'd' has row_offset_in_shard 0 and shard_rotation 1; "
            r"jax-tpu-embedding stacks it at 0, rotated by 0",
        ),
    ],
)
def test_a_spec_edited_consistently_is_refused(tmp_path, edit, match):
    from google.protobuf import text_format

    step, *_ = save_step(tmp_path, 2, 4, table_values())
    path = os.path.join(step, "embedding_spec", "proto.pbtxt")
    proto = jax_orbax.read_embedding_spec(step)
    tables = {t.table_name: t for s in proto.stacked_table_specs for t in s.table_specs}
    for name, fields in edit(tables).items():
        for field, value in fields.items():
            setattr(tables[name], field, value)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text_format.MessageToString(proto))
    with pytest.raises(ValueError, match=match + r".*Was the embedding spec edited"):
        jax_orbax.read_jax_tables(step)


@pytest.mark.parametrize(
    "edit, match",
    [
        (
            lambda stack: setattr(stack, "num_sparsecores", 0),
            r"stack 'd': stack_vocab_size \d+ is not a multiple of num_sparsecores 0",
        ),
        (
            lambda stack: setattr(
                stack, "stack_vocab_size", stack.stack_vocab_size + 1
            ),
            r"stack 'd': stack_vocab_size \d+ is not a multiple of num_sparsecores 8",
        ),
        (lambda stack: stack.ClearField("table_specs"), r"stack 'd' holds no table"),
        (
            lambda stack: setattr(
                stack.table_specs[0],
                "padded_embedding_dim",
                stack.stack_embedding_dim + 8,
            ),
            r"stack 'd': table 'd' has padded_embedding_dim \d+, the stack \d+",
        ),
        # The table's own layout, checked as a SparseCore layout is, names the
        # stack too.
        (
            lambda stack: setattr(stack.table_specs[0], "padded_vocab_size", 8),
            r"stack 'd': SparseCore layout of table 'd': unsharded_padded_shape "
            r"must be two sizes at least unsharded_shape \[50, 16\]",
        ),
        (
            lambda stack: setattr(
                stack.table_specs[0],
                "padded_vocab_size",
                stack.stack_vocab_size + 8,
            ),
            r"stack 'd': SparseCore layout of table 'd': its rows \[0, \d+\) in "
            r"each SparseCore shard exceed total_rows_per_sparse_core_shard",
        ),
    ],
)
def test_a_stack_whose_sizes_contradict_is_refused_naming_it(tmp_path, edit, match):
    from google.protobuf import text_format

    step, *_ = save_step(tmp_path, 2, 4, table_values())
    path = os.path.join(step, "embedding_spec", "proto.pbtxt")
    proto = jax_orbax.read_embedding_spec(step)
    (stack,) = [s for s in proto.stacked_table_specs if s.stack_name == "d"]
    edit(stack)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text_format.MessageToString(proto))
    with pytest.raises(ValueError, match=match):
        jax_orbax.read_jax_tables(step)


def test_the_newer_message_keeps_every_field_of_the_installed_one():
    from jax_tpu_embedding.sparsecore.lib.proto import embedding_spec_pb2

    from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import (
        spec_proto as jax_spec_proto,
    )

    def same_fields(ours, theirs):
        assert ours.full_name == theirs.full_name
        for field in theirs.fields:
            mine = ours.fields_by_name[field.name]
            assert (mine.number, mine.type, mine.is_repeated) == (
                field.number,
                field.type,
                field.is_repeated,
            ), field.full_name
        # Nested messages too: a map's entries (key 1, value 2 on the wire).
        for nested in theirs.nested_types:
            same_fields(ours.nested_types_by_name[nested.name], nested)

    for name, theirs in embedding_spec_pb2.DESCRIPTOR.message_types_by_name.items():
        same_fields(jax_spec_proto.message_class(name).DESCRIPTOR, theirs)


ADAM_RECORD = (
    'type: ADAM learning_rate: 0.1 float_params { key: "beta_1" value: 0.9 } '
    'float_params { key: "beta_2" value: 0.999 } '
    'float_params { key: "epsilon" value: 1e-08 }'
)


def test_a_newer_spec_with_optimizer_records_is_read(tmp_path):
    values = table_values(seed=2)
    step, *_ = save_step(tmp_path, 2, 4, values, record=ADAM_RECORD)
    with open(os.path.join(step, "embedding_spec", "proto.pbtxt")) as handle:
        assert "combiner" in handle.read()
    read = jax_orbax.read_jax_tables(step)
    for name in TABLES:
        assert [d.name for d in read[name].algorithms] == ["Adam"]
        np.testing.assert_array_equal(
            read[name].slots["velocity"], values["velocity"][name]
        )
    (stack,) = [
        s for s in jax_orbax.describe_jax_checkpoint(step) if s["stacked_table"] == "d"
    ]
    assert stack["optimizer_records"] == ["ADAM"]


def test_a_record_the_slots_contradict_is_refused(tmp_path):
    def no_slots(variables):
        for stack in variables.values():
            stack["slot"] = {}

    # jax-tpu-embedding writes LaProp and custom specs as CUSTOM and reads
    # CUSTOM back as SGD; here CUSTOM with no slots (SGD's) is refused.
    step, *_ = save_step(tmp_path / "c", 1, 4, table_values(), no_slots, "type: CUSTOM")
    with pytest.raises(
        ValueError, match=r"record says CUSTOM .*slots \[\] fit \['SGD'\]"
    ):
        jax_orbax.read_jax_tables(step)
    step, *_ = save_step(tmp_path / "a", 1, 4, table_values(), record="type: ADAGRAD")
    with pytest.raises(
        ValueError, match=r"Table 'a' .*record says ADAGRAD \(Adagrad\).*fit \['Adam'\]"
    ):
        jax_orbax.read_jax_tables(step)


def test_a_custom_record_with_laprop_slots_is_laprop(tmp_path):
    def laprop(variables):
        for stack in variables.values():
            slots = stack["slot"]
            stack["slot"] = {"mu": slots["momentum"], "nu": slots["velocity"]}

    step, *_ = save_step(tmp_path, 1, 4, table_values(), laprop, "type: CUSTOM")
    read = jax_orbax.read_jax_tables(step, tables=["d"])
    assert [d.name for d in read["d"].algorithms] == ["LaProp"]


def test_algorithms_from_slot_names():
    names = {d.name for d in jax_orbax.algorithms_for_jax_slots(["accumulator"])}
    assert names == {"Adagrad"}
    assert {d.name for d in jax_orbax.algorithms_for_jax_slots(["mu", "nu"])} == {
        "LaProp"
    }
    # A RuleOptimizerSpec names its slots as TensorFlow's engines do.
    names = {d.name for d in jax_orbax.algorithms_for_jax_slots(["ms", "mom", "mg"])}
    assert names == {"CenteredRMSProp"}
    assert jax_orbax.algorithms_for_jax_slots([]) != ()  # SGD


def test_inspect_says_the_step_of_an_orbax_step(tmp_path, capsys):
    """An orbax step's step is its directory's number (`Checkpoint.step`);
    a directory named otherwise records none."""
    from tf_tpu_embed_opt import checkpoints, cli

    step, *_ = save_step(tmp_path / "job", 1, 4, table_values())
    for name, said in (("12", "step: 12"), ("best", "step: none recorded")):
        copy = shutil.copytree(step, tmp_path / "copies" / name)
        assert cli.main(["checkpoint", "inspect", str(copy)]) == 0
        assert capsys.readouterr().out.splitlines()[2] == said
        opened = checkpoints.open_checkpoint(copy)
        assert checkpoints.describe_checkpoint(copy)["step"] == opened.step
    assert opened.step is None
    # Its number is no variable: --step-path (a TensorFlow one's) is refused.
    assert cli.main(["checkpoint", "inspect", str(copy), "--step-path", "s"]) == 2
    out, err = capsys.readouterr()
    assert not out and err == (
        f"tf-tpu-embed-opt: error: --step-path: {str(copy)!r} is a "
        "jax-tpu-embedding orbax step, whose step is its directory's number, "
        "not a variable; leave --step-path out.\n"
    )


def test_checkpoint_inspect_shows_tables_slots_algorithms_and_layout(tmp_path, capsys):
    import json

    from tf_tpu_embed_opt import cli

    step, *_ = save_step(tmp_path, 2, 4, table_values())
    assert cli.main(["checkpoint", "inspect", step]) == 0
    out = capsys.readouterr().out
    assert "layout: jax-tpu-embedding" in out
    assert "stacked table a_b_c (item model): " in out
    assert "over 8 SparseCores, slots momentum, velocity, fits Adam" in out
    assert "  b: 37 x 8, row offset " in out
    assert cli.main(["checkpoint", "inspect", step, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    stacks = {s["stacked_table"]: s for s in document["stacked_tables"]}
    assert stacks["d"]["tables"]["d"]["shape"] == [50, 16]
    assert stacks["a_b_c"]["algorithms"] == ["Adam"]
    assert document["bytes"] == sum(s["bytes"] for s in stacks.values())


def test_load_into_keras_gives_the_twin_its_tables_and_slots(tmp_path):
    keras = pytest.importorskip("keras")
    import tf_tpu_embed_opt as teo

    values = table_values(seed=5)
    step, *_ = save_step(tmp_path, 2, 4, values)
    reader = jax_orbax.JaxCheckpointReader(step)
    assert reader.tables["b"].slots == ("momenta", "velocities")  # the engine's
    twin = teo.to_keras(embedding_spec.AdamOptimizerSpec(learning_rate=0.1))
    variables = {
        name: keras.Variable(np.zeros(shape, "float32"), name=name)
        for name, shape in TABLES.items()
    }
    twin.build(list(variables.values()))
    # The step directory itself is a source, as a TensorFlow checkpoint is.
    found = teo.load_into_keras(step, variables, twin, step=7)
    assert {name: d.name for name, d in found.items()} == dict.fromkeys(TABLES, "Adam")
    assert int(keras.ops.convert_to_numpy(twin.iterations.value)) == 7
    for name, variable in variables.items():
        np.testing.assert_array_equal(_numpy(keras, variable), values["table"][name])
        index = twin._get_variable_index(variable)
        for ours, theirs in (("momenta", "momentum"), ("velocities", "velocity")):
            slot = twin._slot_variables[ours][index]
            np.testing.assert_array_equal(_numpy(keras, slot), values[theirs][name])
    with pytest.raises(ValueError, match="pass `step` instead of `step_path`"):
        teo.load_into_keras(reader, variables, twin, step_path="step")
    with pytest.raises(
        ValueError, match="`object_path` 'embedding' does not apply to .* a jax-tpu"
    ):
        teo.load_into_keras(step, variables, twin, object_path="embedding")


def _numpy(keras, variable):
    return keras.ops.convert_to_numpy(variable.value)


def test_training_continues_in_row_sparse_layers_as_the_engine_steps(tmp_path):
    """Loaded into `layers.Embedding`s, the tables and slots step on as
    jax-tpu-embedding's own Adagrad row update steps them (its lowering, run
    on the CPU by `jte_oracle`): bit for bit, since the twin runs the
    lowering's operations in its order and the gradient reaching each row is
    exact (distinct ids; the loss's 1/batch is a power of two). The step runs
    op by op (`run_eagerly`), as the oracle does: compiled, XLA's
    simplifications may round the rule's operations apart."""
    keras = pytest.importorskip("keras")
    import jte_oracle
    import row_steps

    import tf_tpu_embed_opt as teo

    values = table_values(seed=6)
    values["accumulator"] = {
        name: np.abs(v) + np.float32(0.1) for name, v in values.pop("momentum").items()
    }
    del values["velocity"]
    spec = embedding_spec.AdagradOptimizerSpec(learning_rate=0.25)
    step, *_ = save_step(tmp_path, 2, 4, values, optimizer=spec)
    layers = {
        name: teo.layers.Embedding(rows, dim, optimizer=teo.to_keras(spec), name=name)
        for name, (rows, dim) in TABLES.items()
        if name in ("a", "d")
    }
    for layer in layers.values():
        layer.build((None,))
    with pytest.raises(ValueError, match=r"source has tables \['b', 'c'\] without"):
        teo.load_into_keras(step, layers, None)
    reader = _only(jax_orbax.JaxCheckpointReader(step), layers)
    found = teo.load_into_keras(reader, layers, None, step=3)
    assert {n: d.name for n, d in found.items()} == {"a": "Adagrad", "d": "Adagrad"}

    batch = 4
    ids = np.array([[5], [0], [17], [49]], "int32")
    rng = np.random.default_rng(9)
    for name, layer in layers.items():
        dim = TABLES[name][1]
        upstream = rng.normal(size=(batch, 1, dim)).astype("float32")
        inputs = keras.Input((1,), dtype="int32")
        model = keras.Model(inputs, layer(inputs))
        model.compile(
            optimizer=keras.optimizers.SGD(0.5),
            loss=lambda y, p: keras.ops.sum(y * p, axis=(1, 2)),
            run_eagerly=True,
        )
        model.fit(ids, upstream, batch_size=batch, epochs=1, shuffle=False, verbose=0)
        row_gradients = {
            int(i): upstream[k, 0] / np.float32(batch) for k, i in enumerate(ids[:, 0])
        }
        table, slots = jte_oracle.step(
            spec,
            values["table"][name],
            {"accumulator": values["accumulator"][name]},
            row_gradients,
            3,
        )
        row_steps.assert_rows(
            _numpy(keras, layer.embeddings),
            table,
            values["table"][name],
            1,
            bounded=False,
            what=f"table {name}",
        )
        np.testing.assert_array_equal(
            _numpy(keras, layer.slots["accumulators"]), slots["accumulator"]
        )


class _only:
    """A table source that offers only some tables of another."""

    def __init__(self, source, names):
        self._source = source
        self.tables = {n: source.tables[n] for n in names}

    def read(self, name):
        return self._source.read(name)

    def read_tensor(self, name, key):
        return self._source.read_tensor(name, key)


# None: stacked arrays read whole once, tables cut from them; 0: every read
# takes only the rows it needs (how a table larger than memory streams).
@pytest.mark.parametrize("cache_bytes", [None, 0])
def test_rows_are_read_range_by_range(tmp_path, cache_bytes):
    values = table_values(seed=7)
    step, *_ = save_step(tmp_path, 4, 2, values)
    reader = jax_orbax.JaxCheckpointReader(step, cache_bytes=cache_bytes)
    rng = np.random.default_rng(0)
    for name, (rows, _) in TABLES.items():
        for _ in range(20):
            start = int(rng.integers(0, rows + 1))
            stop = int(rng.integers(start, rows + 1))
            np.testing.assert_array_equal(
                reader.read_rows(name, "velocities", (start, stop)),
                values["velocity"][name][start:stop],
            )
    with pytest.raises(ValueError, match=r"Table 'b': rows \(0, 38\) are not within"):
        reader.read_rows("b", "parameters", (0, 38))
    with pytest.raises(KeyError, match="has no 'accumulators'"):
        reader.read_rows("b", "accumulators", (0, 1))
    with pytest.raises(ValueError, match="`cache_bytes` must be an int >= 0"):
        jax_orbax.JaxCheckpointReader(step, cache_bytes=-1)
    # Checked before the step is read (a missing step is not what is said),
    # and a NumPy int is an int, as for the other sizes.
    with pytest.raises(ValueError, match="`cache_bytes` must be an int >= 0"):
        jax_orbax.JaxCheckpointReader(str(tmp_path / "none"), cache_bytes="1")
    assert jax_orbax.JaxCheckpointReader(step, cache_bytes=np.int64(0)).tables


def _cached_bytes(reader):
    # White-box: the bound `cache_bytes` promises is on what the reader keeps.
    return sum(array.nbytes for array in reader._cache.values())


# The stack a_b_c holds three arrays of 16,384 bytes (table, momentum,
# velocity), the stack d three of 4,096: budgets below one array, one of each
# stack, two of a_b_c (where taking a third would break the bound) and all of
# a_b_c exactly.
@pytest.mark.parametrize("cache_bytes", [4096, 20480, 32768, 49152])
def test_the_cache_never_holds_more_than_cache_bytes(tmp_path, cache_bytes):
    values = table_values(seed=10)
    step, *_ = save_step(tmp_path, 4, 2, values)
    reader = jax_orbax.JaxCheckpointReader(step, cache_bytes=cache_bytes)
    parts = {"parameters": "table", "momenta": "momentum", "velocities": "velocity"}
    for name in ("a", "d", "c", "d", "b", "a", "d"):
        for key, part in parts.items():
            np.testing.assert_array_equal(
                reader.read_tensor(name, key), values[part][name]
            )
            assert _cached_bytes(reader) <= cache_bytes
    # A stack that fits is read whole at its first read; the next stack's
    # arrays are read together too, as far as they fit, older arrays leaving
    # as far as they must.
    reader = jax_orbax.JaxCheckpointReader(step, cache_bytes=cache_bytes)
    reader.read_tensor("a", "momenta")
    assert _cached_bytes(reader) == min(cache_bytes // 16384, 3) * 16384
    reader.read_tensor("d", "parameters")
    d_arrays = [key for key in reader._cache if "d" in key[1]]
    assert len(d_arrays) == (3 if cache_bytes >= 3 * 4096 else 1)
    # An array of a_b_c left only if keeping it would break the bound.
    assert cache_bytes - 16384 < _cached_bytes(reader) <= cache_bytes


# None: load_into_keras verifies by reading the stacks into the cache; 0: by
# streaming each array.
@pytest.mark.parametrize("cache_bytes", [None, 0])
def test_a_damaged_array_is_refused_naming_table_and_slot(tmp_path, cache_bytes):
    keras = pytest.importorskip("keras")
    import tf_tpu_embed_opt as teo

    step, *_ = save_step(tmp_path, 1, 4, table_values(seed=8))
    reader = jax_orbax.JaxCheckpointReader(step, cache_bytes=cache_bytes)
    files = jax_checkpoints.cut_data_file(step)
    with pytest.raises(ValueError, match=r"Table '\w', \w+: cannot be read from"):
        jax_orbax.read_jax_tables(step)
    # Verifying reads each array through (streamed where it is not cached).
    damaged = set()
    for name, info in reader.tables.items():
        for key in ("parameters", *info.slots):
            try:
                reader.verify_tensor(name, key)
            except ValueError as error:
                assert f"Table {name!r}, " in str(error), str(error)
                damaged.add(name)
    assert damaged
    # load_into_keras reads every array before it changes anything.
    twin = teo.to_keras(embedding_spec.AdamOptimizerSpec(learning_rate=0.1))
    variables = {
        name: keras.Variable(np.full(shape, 3.0, "float32"), name=name)
        for name, shape in TABLES.items()
    }
    twin.build(list(variables.values()))
    with pytest.raises(ValueError, match="cannot be read"):
        teo.load_into_keras(reader, variables, twin)
    for variable in variables.values():
        assert np.all(keras.ops.convert_to_numpy(variable.value) == 3.0)
    # With orbax's index gone too, the item itself is refused.
    for name in files:
        with open(name, "r+b") as handle:
            handle.truncate(os.path.getsize(name) // 2)
    with pytest.raises(ValueError, match="orbax reads no metadata of this item"):
        jax_orbax.read_jax_tables(step)


def _bfloat16_values(seed):
    """`table_values` that bfloat16 holds exactly, as float32 (what
    `save_tpu_checkpoint` and `checkpoint convert` write of a bfloat16
    table), and a copy with one value that bfloat16 does not hold."""
    import ml_dtypes

    values = {
        part: {n: v.astype(ml_dtypes.bfloat16).astype(np.float32) for n, v in p.items()}
        for part, p in table_values(seed).items()
    }
    inexact = {part: {n: v.copy() for n, v in p.items()} for part, p in values.items()}
    inexact["velocity"]["c"][250, 3] = 0.1
    return values, inexact


# None: verified through the reader's cache; 0: each array streamed.
@pytest.mark.parametrize("cache_bytes", [None, 0])
def test_a_bfloat16_table_takes_the_float32_values_it_holds(tmp_path, cache_bytes):
    """A float32 step loads into bfloat16 variables where each value is a
    bfloat16 value, bit for bit; one that would round is refused, naming
    it, before anything changes."""
    keras = pytest.importorskip("keras")
    import tf_tpu_embed_opt as teo

    values, inexact = _bfloat16_values(seed=9)
    exact_step, *_ = save_step(tmp_path / "exact", 2, 4, values)
    inexact_step, *_ = save_step(tmp_path / "inexact", 2, 4, inexact)
    twin = teo.to_keras(embedding_spec.AdamOptimizerSpec(learning_rate=0.1))
    variables = {
        name: keras.Variable(np.full(shape, 3.0), dtype="bfloat16", name=name)
        for name, shape in TABLES.items()
    }
    twin.build(list(variables.values()))

    def state():
        return [
            keras.ops.convert_to_numpy(v).tobytes()
            for v in (*variables.values(), *twin.variables)
        ]

    before = state()
    with pytest.raises(
        ValueError,
        match=r"^Table 'c': 'velocities' holds 0.1 at \(250, 3\), which bfloat16 "
        r"does not hold exactly \(it would round to 0.100097656\).*nothing was loaded",
    ):
        teo.load_into_keras(
            jax_orbax.JaxCheckpointReader(inexact_step, cache_bytes=cache_bytes),
            variables,
            twin,
        )
    assert state() == before
    teo.load_into_keras(
        jax_orbax.JaxCheckpointReader(exact_step, cache_bytes=cache_bytes),
        variables,
        twin,
    )
    for name, variable in variables.items():
        index = twin._get_variable_index(variable)
        for ours, part in (
            (variable, "table"),
            (twin._slot_variables["momenta"][index], "momentum"),
            (twin._slot_variables["velocities"][index], "velocity"),
        ):
            loaded = keras.ops.convert_to_numpy(ours)
            assert str(loaded.dtype) == "bfloat16"
            np.testing.assert_array_equal(loaded.astype(np.float32), values[part][name])


# A table split by rows over the devices of one process: each range of rows
# read and checked before anything changes; over several processes (each
# reads only its rows) refused by name.
_SPLIT_LOAD = """
import sys
import jax, keras, numpy as np
import tf_tpu_embed_opt as teo
from tf_tpu_embed_opt.checkpoints.keras import state
tables = {"a": (100, 8), "b": (37, 8), "c": (300, 8), "d": (50, 16)}
mesh = keras.distribution.DeviceMesh((2,), ("model",), jax.devices())
layout_map = keras.distribution.LayoutMap(mesh)
split = ("a", "c", "d")  # "b"'s 37 rows do not split in two: whole on each
for name in split:
    layout_map[name + "/embeddings"] = ("model", None)
distribution = keras.distribution.ModelParallel(layout_map=layout_map)
keras.distribution.set_distribution(distribution)
layers = {}
for name, (rows, dim) in tables.items():
    layers[name] = teo.layers.Embedding(
        rows, dim, optimizer=teo.optimizers.Adam(0.1, lazy=True), name=name,
        dtype="bfloat16")
    layers[name].build()
    replicated = layers[name].embeddings.value.sharding.is_fully_replicated
    assert replicated == (name not in split), name
def numpy(variable):
    return keras.ops.convert_to_numpy(variable)
def state_bytes():
    return [numpy(w).tobytes() for layer in layers.values() for w in layer.weights]
before = state_bytes()
try:
    teo.load_into_keras(sys.argv[2], layers, None)
except ValueError as error:
    print("REFUSED", error)
assert state_bytes() == before
teo.load_into_keras(sys.argv[1], layers, None)
saved = {}
for name, layer in layers.items():
    saved[name + "/table"] = numpy(layer.embeddings).astype("float32")
    for slot in ("momenta", "velocities"):
        saved[name + "/" + slot] = numpy(layer.slots[slot]).astype("float32")
np.savez(sys.argv[3], **saved)
class Cut:
    # A table source of one's own whose tensors lack a column its tables
    # say they have: found when the rows a device holds are read.
    def __init__(self, source):
        self.tables, self.source = source.tables, source
    def read(self, name):
        return {key: value[:, :-1] for key, value in self.source.read(name).items()}
loaded = state_bytes()
try:
    teo.load_into_keras(Cut(teo.checkpoints.open_checkpoint(sys.argv[1])), layers, None)
except ValueError as error:
    print("CUT", error)
assert state_bytes() == loaded
state._processes = lambda: 2
try:
    teo.load_into_keras(sys.argv[1], layers, None)
except ValueError as error:
    print("PROCESSES", error)
"""


def test_a_bfloat16_table_split_over_devices_takes_the_values_it_holds(tmp_path):
    import subprocess
    import sys

    from child_env import child_env

    values, inexact = _bfloat16_values(seed=10)
    exact_step, *_ = save_step(tmp_path / "exact", 2, 4, values)
    inexact_step, *_ = save_step(tmp_path / "inexact", 2, 4, inexact)
    out = tmp_path / "loaded.npz"
    result = subprocess.run(
        [sys.executable, "-c", _SPLIT_LOAD, exact_step, inexact_step, str(out)],
        env=child_env(
            KERAS_BACKEND="jax", XLA_FLAGS="--xla_force_host_platform_device_count=2"
        ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    refused, cut, processes = result.stdout.strip().splitlines()
    # Rows 250:300 of table "c" are the second device's.
    assert refused.startswith(
        "REFUSED Table 'c': 'velocities' (rows 150:300) holds 0.1 at (100, 3), "
        "which bfloat16 does not hold exactly"
    ), refused
    assert processes.startswith(
        "PROCESSES Table 'a': the checkpoint holds it as float32, which loads "
        "into its bfloat16 variables only once every value is found"
    ), processes
    assert "each JAX process reads only the rows it holds" in processes
    assert cut == (
        "CUT Table 'a': 'parameters' rows 0:50 read with shape (50, 7); "
        "expected (50, 8)."
    ), cut
    loaded = np.load(out)
    for name in TABLES:
        for key, part in (
            ("table", "table"),
            ("momenta", "momentum"),
            ("velocities", "velocity"),
        ):
            np.testing.assert_array_equal(loaded[f"{name}/{key}"], values[part][name])
