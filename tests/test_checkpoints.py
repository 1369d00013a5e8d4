"""Tables and optimizer state between the TPUEmbedding layout and Keras.

Oracles, none of them this package:

* TensorFlow's own `TPUEmbeddingForServing` (the CPU stand-in for
  `TPUEmbedding`, same object graph) writes the checkpoints that are read,
  and restores the ones this package writes with
  `assert_existing_objects_matched()`; its variables give the expected values.
* The keys TensorFlow writes for the same tables are the keys written here.
* After loading, K steps of the Keras twin on CPU equal K steps of the engine
  rule run in float32 NumPy on the rows the gradient looks up (at most 1 ulp
  per element; rows not looked up bit-identical), and stay within float32
  tolerance of TensorFlow's CPU training kernels (tests/test_convert.py).
"""

import os
import re
import subprocess
import sys
import types

import keras
import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf
from child_env import child_env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensorflow.python.tpu.tpu_embedding_for_serving import TPUEmbeddingForServing
from test_convert import _ORACLE_DEFAULTS
from test_convert import CASES as KERNEL_CASES

import tf_tpu_embed_opt as teo
from tf_tpu_embed_opt import checkpoints, embedding
from tf_tpu_embed_opt.checkpoints.keras import state as keras_state
from tf_tpu_embed_opt.definitions import registry, rules

TFE = tf.tpu.experimental.embedding

ROWS, DIM = 9, 3
# Ids of each step (with duplicates); rows 5, 6 and 8 are never looked up.
STEP_IDS = ((1, 4, 1, 7), (4, 4, 2, 0), (0, 7, 3, 0, 1))
# Slots that hold sums or averages of squares (the engine keeps them > 0).
POSITIVE_SLOTS = ("accumulators", "velocities", "ms", "v", "updates")
# Cases whose rule raises to a power other than ±1/2: neither TensorFlow's nor
# NumPy's float32 `pow` is correctly rounded, and FTRL's clamped difference
# amplifies their 1-ulp disagreement; these compare at float32 tolerance. So
# does every FTRL case: its clamped difference also amplifies the last bit of
# a square root, which TensorFlow's CPU kernels need not round as NumPy does
# (FTRL with multiply_linear_by_learning_rate was 27 ulp off on TensorFlow 2.16
# on a CPU with AVX-512, within 1 ulp elsewhere).
SLOT_NAMES = {s.name for d in registry.DEFINITIONS for s in d.slots}
TRANSCENDENTAL_CASES = (
    "AdagradMomentum-nesterov",
    "AdagradMomentum-sum",
    "FTRL",
    "FTRL-multiply-linear-by-lr",
)


def _kernel_case(case_id):
    return next(c for c in KERNEL_CASES if c.id == case_id)


def _serving(tables, global_optimizer=None):
    """A TPUEmbeddingForServing with one feature per (name, rows, dim, opt)."""
    features = {
        name: TFE.FeatureConfig(
            table=TFE.TableConfig(
                vocabulary_size=rows, dim=dim, name=name, optimizer=optimizer
            )
        )
        for name, rows, dim, optimizer in tables
    }
    return TPUEmbeddingForServing(features, global_optimizer)


def _random_state(serving, seed):
    """Assigns random engine state to every table and slot; returns it."""
    rng = np.random.default_rng(seed)
    serving.build()
    state = {}
    for table, variables in serving._variables.items():
        state[table] = {}
        for slot, variable in variables.items():
            if slot in POSITIVE_SLOTS:
                value = rng.uniform(0.2, 1.5, variable.shape)
            elif slot == "parameters":
                value = rng.normal(0.0, 1.0, variable.shape)
            else:
                value = rng.normal(0.0, 0.3, variable.shape)
            variable.assign(value.astype(np.float32))
            state[table][slot] = variable.numpy()
    return state


def _tensorflow_checkpoint(tmp_path, tables, seed=0):
    serving = _serving(tables)
    state = _random_state(serving, seed)
    prefix = tf.train.Checkpoint(embedding=serving).save(str(tmp_path / "tpu" / "ckpt"))
    return prefix, state


def _numpy_engine_steps(embedding_opt, state, steps):
    """The engine's rule in float32 NumPy, on the rows each step looks up."""
    definition = embedding.definition_of(embedding_opt)
    hypers = {h.name: getattr(embedding_opt, h.name) for h in definition.hypers}
    lazy = hypers.get("lazy_adam", True)
    w = state["parameters"].copy()
    slots = {k: v.copy() for k, v in state.items() if k != "parameters"}
    lr = np.float32(embedding_opt.learning_rate)
    for ids, values in steps:
        unique = np.unique(ids)
        summed = np.zeros((len(unique), w.shape[1]), np.float32)
        np.add.at(summed, np.searchsorted(unique, ids), values)
        if not lazy:
            dense = np.zeros_like(w)
            dense[unique] = summed
            unique, summed = np.arange(w.shape[0]), dense
        rows, new_slots = rules.tpu_step(
            definition,
            rules.NUMPY,
            w[unique],
            {k: v[unique] for k, v in slots.items()},
            summed,
            lr,
            hypers,
        )
        w[unique] = rows
        for name, value in new_slots.items():
            slots[name][unique] = value
    return {"parameters": w, **slots}


def _gradient_steps(seed, rows=ROWS, dim=DIM):
    rng = np.random.default_rng(seed)
    return [
        (np.asarray(ids), rng.normal(0.0, 1.0, (len(ids), dim)).astype(np.float32))
        for ids in STEP_IDS
    ]


def _apply(optimizer, variable, steps):
    for ids, values in steps:
        gradient = tf.IndexedSlices(
            tf.constant(values), tf.constant(ids, tf.int32), tf.constant(variable.shape)
        )
        optimizer.apply([gradient], [variable])


def _assert_within_one_ulp(actual, expected, message):
    actual = np.asarray(actual, np.float32)
    expected = np.asarray(expected, np.float32)
    assert actual.shape == expected.shape, message
    np.testing.assert_array_max_ulp(actual, expected, maxulp=1)


# --- TPU layout -> Keras ----------------------------------------------------


def test_reader_lists_tables_slots_and_algorithms(tmp_path):
    prefix, _ = _tensorflow_checkpoint(
        tmp_path,
        [
            ("user.ids", 7, 3, teo.embedding.Adam(0.1)),
            ("item/v2", 5, 2, teo.embedding.Adagrad(0.1)),
        ],
    )
    reader = checkpoints.TPUCheckpointReader(prefix)
    assert reader.object_path == ("embedding",)
    assert sorted(reader.tables) == ["item/v2", "user.ids"]
    # A directory means its latest checkpoint.
    assert checkpoints.TPUCheckpointReader(os.path.dirname(prefix)).prefix == prefix
    user = reader.tables["user.ids"]
    assert user.shape == (7, 3) and user.dtype == "float32"
    assert user.slots == ("momenta", "velocities")
    assert [d.name for d in user.algorithms] == ["Adam"]
    assert user.nbytes == 7 * 3 * 4 * 3
    assert [d.name for d in reader.tables["item/v2"].algorithms] == [
        "Adagrad",
        "ProximalAdagrad",
    ]


def test_read_rows_reads_a_row_range_and_refuses_bad_arguments(tmp_path):
    # TensorFlow's TPUEmbeddingForServing wrote the checkpoint (the oracle).
    prefix, state = _tensorflow_checkpoint(
        tmp_path, [("user", 7, 3, teo.embedding.Adam(0.1))]
    )
    reader = checkpoints.TPUCheckpointReader(prefix)
    for slot in ("parameters", "momenta", "velocities"):
        for rows in ((0, 7), (2, 5), (6, 7), (3, 3)):
            np.testing.assert_array_equal(
                reader.read_rows("user", slot, rows).numpy(),
                state["user"][slot][rows[0] : rows[1]],
            )
    with tf.device("/CPU:0"):
        on_host = reader.read_rows("user", "momenta", (1, 4), "/CPU:0")
    np.testing.assert_array_equal(on_host.numpy(), state["user"]["momenta"][1:4])
    for rows in ((-1, 2), (3, 2), (0, 8)):
        with pytest.raises(ValueError, match=r"`rows` must be \(start, stop\)"):
            reader.read_rows("user", "parameters", rows)
    with pytest.raises(KeyError, match="has no 'accumulators'"):
        reader.read_rows("user", "accumulators", (0, 1))
    with pytest.raises(KeyError, match="item"):
        reader.read_rows("item", "parameters", (0, 1))


@pytest.mark.parametrize("case", KERNEL_CASES, ids=lambda c: c.id)
def test_tpu_checkpoint_continues_on_keras_like_the_engine(tmp_path, case):
    table_opt = case.make(teo.embedding, case.lr)
    definition = embedding.definition_of(table_opt)
    prefix, state = _tensorflow_checkpoint(
        tmp_path, [("table", ROWS, DIM, table_opt)], seed=3
    )
    variable = keras.Variable(np.zeros((ROWS, DIM), np.float32), name="table")
    twin = teo.to_keras(table_opt)
    twin.build([variable])
    loaded = keras_state.load_into_keras(
        prefix, {"table": variable}, twin, object_path="embedding"
    )
    assert loaded["table"] is definition
    steps = _gradient_steps(seed=4)
    _apply(twin, variable, steps)
    expected = _numpy_engine_steps(table_opt, state["table"], steps)
    tables = keras_state.keras_tables({"table": variable}, twin)
    ((_, actual),) = keras_state.keras_table_states(tables)
    assert set(actual) == set(expected)
    for name, value in expected.items():
        if case.id in TRANSCENDENTAL_CASES:
            np.testing.assert_allclose(actual[name], value, 1e-5, 1e-6)
        else:
            _assert_within_one_ulp(actual[name], value, name)
    if case.lazy:
        untouched = [5, 6, 8]
        for name in expected:
            np.testing.assert_array_equal(
                actual[name][untouched], state["table"][name][untouched]
            )
    # TensorFlow's CPU kernels (or the formulas of tests/test_convert.py)
    # from the same state, keyed by the Keras slot names.
    kernel_state = {"w": state["table"]["parameters"].copy()}
    for slot in definition.slots:
        kernel_state[slot.keras_variable_name] = state["table"][slot.name].copy()
    hypers = {**_ORACLE_DEFAULTS, **case.hypers}
    for ids, values in steps:
        unique = np.unique(ids)
        summed = np.zeros((len(unique), DIM), np.float32)
        np.add.at(summed, np.searchsorted(unique, ids), values)
        case.oracle(kernel_state, unique.astype(np.int32), summed, case.lr, hypers)
    np.testing.assert_allclose(actual["parameters"], kernel_state["w"], 1e-5, 1e-6)
    for slot in definition.slots:
        np.testing.assert_allclose(
            actual[slot.name], kernel_state[slot.keras_variable_name], 1e-5, 1e-6
        )


class _OneTable:
    """A view of a table source with one of its tables."""

    def __init__(self, source, name):
        self._source = source
        self.tables = {name: source.tables[name]}

    def read(self, name):
        return self._source.read(name)


def _round_trip(tmp_path, tables, seed):
    """TPU checkpoint -> Keras twins -> TPU checkpoint; checks bit identity."""
    prefix, state = _tensorflow_checkpoint(tmp_path, tables, seed=seed)
    reader = checkpoints.TPUCheckpointReader(prefix, "embedding")
    states = {}
    for name, rows, dim, table_opt in tables:
        variable = keras.Variable(np.zeros((rows, dim), np.float32))
        twin = teo.to_keras(table_opt)
        twin.build([variable])
        keras_state.load_into_keras(_OneTable(reader, name), {name: variable}, twin)
        states.update(
            keras_state.keras_table_states(
                keras_state.keras_tables({name: variable}, twin)
            )
        )
    out = checkpoints.write_tpu_checkpoint(
        str(tmp_path / "back" / "ckpt"), iter(states.items())
    )
    # The keys TensorFlow writes for these tables.
    assert sorted(k for k, _ in tf.train.list_variables(out) if k != "step") == sorted(
        k for k, _ in tf.train.list_variables(prefix)
    )
    restored = _serving(tables)
    status = tf.train.Checkpoint(embedding=restored).restore(out)
    restored.build()
    status.assert_existing_objects_matched()
    return state, restored


def test_tpu_to_keras_to_tpu_is_bit_identical(tmp_path):
    tables = [
        (
            case.id.replace("-", "."),
            4 + i % 3,
            2 + i % 2,
            case.make(teo.embedding, case.lr),
        )
        for i, case in enumerate(KERNEL_CASES)
    ]
    tables.append(("tf/adam", 5, 3, TFE.Adam(0.1)))
    tables.append(("tf/ftrl", 5, 3, TFE.FTRL(0.1)))
    state, restored = _round_trip(tmp_path, tables, seed=5)
    assert set(restored._variables) == set(state)
    for name, variables in restored._variables.items():
        assert set(variables) == set(state[name])
        for slot, variable in variables.items():
            np.testing.assert_array_equal(
                variable.numpy(), state[name][slot], err_msg=f"{name}/{slot}"
            )


def test_rms_prop_without_momentum_writes_the_unread_mom_as_zero(tmp_path):
    # With momentum 0 the engine never reads `mom` and the twin (like Keras)
    # does not keep it; it goes back as its initial value.
    table_opt = teo.embedding.RMSProp(0.1, momentum=0.0)
    state, restored = _round_trip(tmp_path, [("t", 4, 2, table_opt)], seed=6)
    variables = restored._variables["t"]
    np.testing.assert_array_equal(
        variables["parameters"].numpy(), state["t"]["parameters"]
    )
    np.testing.assert_array_equal(variables["ms"].numpy(), state["t"]["ms"])
    np.testing.assert_array_equal(variables["mom"].numpy(), np.zeros((4, 2)))


# --- Refusals: the target is left exactly as before -------------------------


def _keras_target(tables, dtype="float32"):
    """Keras variables (of `dtype`) and twins for (name, rows, dim, table
    optimizer)."""
    variables, twins = {}, {}
    for name, rows, dim, table_opt in tables:
        variables[name] = keras.Variable(np.full((rows, dim), 0.25), dtype=dtype)
        twins[name] = teo.to_keras(table_opt)
        twins[name].build([variables[name]])
        twins[name].iterations.assign(3)
    return variables, twins


def _snapshot(variables, twins):
    values = {f"v/{k}": v.numpy().copy() for k, v in variables.items()}
    for name, twin in twins.items():
        for i, v in enumerate(twin.variables):
            values[f"o/{name}/{i}"] = v.numpy().copy()
    return values


def _assert_unchanged(before, variables, twins):
    after = _snapshot(variables, twins)
    assert after.keys() == before.keys()
    for key, value in before.items():
        np.testing.assert_array_equal(after[key], value, err_msg=key)


def _refused(source, tables, match, error=ValueError, dtype="float32", **kwargs):
    variables, twins = _keras_target(tables, dtype)
    (name,) = variables  # one table, one twin
    before = _snapshot(variables, twins)
    with pytest.raises(error, match=match):
        keras_state.load_into_keras(source, variables, twins[name], **kwargs)
    _assert_unchanged(before, variables, twins)


ADAM_TABLE = [("t", 4, 2, teo.embedding.Adam(0.1))]


def test_refuses_slots_of_another_algorithm(tmp_path):
    prefix, _ = _tensorflow_checkpoint(tmp_path, ADAM_TABLE)
    _refused(
        prefix,
        [("t", 4, 2, teo.embedding.Adagrad(0.1))],
        r"Table 't': the checkpoint holds slots \['momenta', 'velocities'\] "
        r"\(Adam\).*Adagrad \(\['accumulators'\]\); missing \['accumulators'\]",
    )


def test_refuses_a_missing_or_an_extra_table(tmp_path):
    prefix, _ = _tensorflow_checkpoint(
        tmp_path, ADAM_TABLE + [("u", 3, 2, teo.embedding.Adam(0.1))]
    )
    _refused(prefix, ADAM_TABLE, r"the source has tables \['u'\] without a target")
    prefix, _ = _tensorflow_checkpoint(tmp_path / "one", ADAM_TABLE)
    _refused(
        prefix,
        [("v", 4, 2, teo.embedding.Adam(0.1))],
        r"tables \['t'\] without a target; targets \['v'\] have no table",
    )


def test_refuses_arguments_of_another_type_by_name(tmp_path):
    """`verify` was taken for its truth, a `step_path` or `object_path` that
    is no string failed on `.split`, a string of `names` was read letter by
    letter and `algorithms` that are no mapping failed inside the writer."""
    prefix, _ = _tensorflow_checkpoint(tmp_path, ADAM_TABLE)
    for arguments, match in [
        ({"verify": "yes"}, "argument `verify` must be True or False; received 'yes'"),
        ({"step_path": 1}, "argument `step_path` must be a '/'-separated string"),
    ]:
        _refused(prefix, ADAM_TABLE, match, TypeError, **arguments)
    with pytest.raises(TypeError, match="argument `object_path` must be a '/'-sep"):
        checkpoints.open_checkpoint(prefix).read_scalar(1)
    variables, twins = _keras_target(ADAM_TABLE)
    with pytest.raises(TypeError, match="`engine` must be True or False; .*'no'"):
        keras_state.keras_tables(variables, twins["t"], engine="no")
    # A model's tables are found by the names given, and each is there.
    model = keras.Sequential(
        [keras.Input((1,), dtype="int32"), keras.layers.Embedding(4, 2, name="t")]
    )
    with pytest.raises(
        ValueError,
        match=r"^keras_tables: argument `names` must list the tables to find in "
        r"the keras\.Model '.+'; received None\.$",
    ):
        keras_state.keras_tables(model, twins["t"])
    with pytest.raises(
        ValueError,
        match=r"^Tables \['u'\] have no Embedding layer or variable \(path\) of "
        r"that name in model '.+'; pass a mapping",
    ):
        keras_state.keras_tables(model, twins["t"], ["t", "u"])
    # Two sub-models each with an Embedding "t" (Keras names layers uniquely
    # among siblings only): the first was taken, the other left out.
    ids = keras.Input((1,), dtype="int32")
    towers = [
        keras.Model(ids, keras.layers.Embedding(4, 2, name="t")(ids), name=tower)
        for tower in ("a", "b")
    ]
    both = keras.Model(ids, keras.layers.Concatenate()([t(ids) for t in towers]))
    with pytest.raises(
        ValueError,
        match=r"^Table 't': model '.+' holds 2 tables of that name \(Embedding "
        r"layers, or tables of a StackedEmbedding\); pass a mapping",
    ):
        keras_state.keras_tables(both, twins["t"], ["t"])
    # A layer not built has no table to save yet.
    with pytest.raises(
        ValueError,
        match=r"^Table 't': the Embedding layer 'late' is not built; call the "
        r"model once \(or `layer\.build\(\)`\) first\.$",
    ):
        keras_state.save_tpu_checkpoint(
            str(tmp_path / "late" / "ckpt"),
            {"t": keras.layers.Embedding(4, 2, name="late")},
            twins["t"],
        )
    assert not os.path.exists(tmp_path / "late")
    with pytest.raises(TypeError, match="`names` must be a list of table names"):
        keras_state.save_tpu_checkpoint(
            str(tmp_path / "out" / "ckpt"), variables, twins["t"], names="t"
        )
    # A name where a Definition goes failed with an AttributeError.
    with pytest.raises(TypeError, match=r"`definition` must be a Definition"):
        checkpoints.check_table_state("t", {"parameters": np.ones((4, 2))}, "Adam")
    # `names` with a mapping was ignored: every key was written.
    with pytest.raises(ValueError, match=r"`names` \['nope'\] are not tables of"):
        keras_state.save_tpu_checkpoint(
            str(tmp_path / "out" / "ckpt"), variables, twins["t"], names=["nope"]
        )
    written = keras_state.save_tpu_checkpoint(
        str(tmp_path / "picked" / "ckpt"), variables, twins["t"], names=["t"]
    )
    assert sorted(checkpoints.open_checkpoint(written).tables) == ["t"]
    # `save_tpu_checkpoint` calls its path `prefix`, `write_checkpoint` `path`.
    with pytest.raises(TypeError, match=r"^`prefix` must be a checkpoint prefix"):
        keras_state.save_tpu_checkpoint(3, variables, twins["t"])
    with pytest.raises(ValueError, match=r"^`prefix` '.*' names a directory"):
        keras_state.save_tpu_checkpoint(str(tmp_path), variables, twins["t"])
    state = {"parameters": np.ones((4, 2), np.float32)}
    with pytest.raises(TypeError, match=r"^`path` must be a checkpoint prefix"):
        checkpoints.write_checkpoint(3, {"t": state})
    with pytest.raises(TypeError, match="takes `algorithms` as a mapping"):
        checkpoints.write_checkpoint(
            str(tmp_path / "out" / "ckpt"), {"t": state}, algorithms="SGD"
        )
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


_ONES = np.ones((4, 2), np.float32)


@pytest.mark.parametrize(
    "state, arguments, error, message",
    [
        (
            [("parameters", _ONES)],
            {},
            TypeError,
            r"the table state must be a dict of arrays keyed by 'parameters' and "
            r"slot names; received list\.",
        ),
        (
            {"accumulators": _ONES},
            {},
            ValueError,
            r"the table state lacks 'parameters'; it has \['accumulators'\]\.",
        ),
        (
            {"parameters": _ONES, "momenta": _ONES, "velocities": _ONES},
            {"definition": "Adagrad"},
            ValueError,
            r"slots \['momenta', 'velocities'\] are not those of Adagrad "
            r"\(\['accumulators'\]\); missing \['accumulators'\], extra "
            r"\['momenta', 'velocities'\]\. Algorithms with these slots: Adam\.",
        ),
        (
            {"parameters": _ONES, "nope": _ONES},
            {"definition": "SGD"},
            ValueError,
            r"slots \['nope'\] are not those of SGD \(\[\]\); missing \[\], extra "
            r"\['nope'\]\. Algorithms with these slots: none\.",
        ),
        (
            # Keras's name of Adagrad's slot: written, no reader would find it.
            {"parameters": _ONES, "accumulator": _ONES},
            {},
            ValueError,
            r"slots \['accumulator'\] are no algorithm's; each algorithm's slots "
            r"are named as the engine names them: Adagrad \['accumulators'\]; "
            r"AdagradMomentum \['accumulators', 'momenta'\]; .*; ProximalYogi "
            r"\['v', 'm'\]\.",
        ),
        (
            {"parameters": _ONES},
            {"shape": (5, 2)},
            ValueError,
            r"'parameters' has shape \(4, 2\); expected \(5, 2\)\.",
        ),
        (
            {"parameters": np.ones(4, np.float32)},
            {},
            ValueError,
            r"'parameters' must have rank 2 \(vocabulary, dim\); received shape "
            r"\(4,\)\.",
        ),
        (
            {"parameters": np.ones((4, 2), np.int32)},
            {},
            ValueError,
            r"'parameters' has dtype int32; a table and its slots must be of a "
            r"floating dtype\.",
        ),
        (
            {"parameters": _ONES, "accumulators": _ONES.astype(np.float16)},
            {},
            ValueError,
            r"slot 'accumulators' has dtype float16; expected the table's "
            r"floating dtype float32\.",
        ),
        (
            {"parameters": _ONES, "accumulators": np.ones((4, 1), np.float32)},
            {},
            ValueError,
            r"slot 'accumulators' has shape \(4, 1\); the table has \(4, 2\)\.",
        ),
    ],
    ids=[
        "no-mapping",
        "no-parameters",
        "other-slots",
        "no-algorithm",
        "no-algorithm-given",
        "shape",
        "rank",
        "dtype",
        "slot-dtype",
        "slot-shape",
    ],
)
def test_check_table_state_refuses_by_name(state, arguments, error, message):
    if "definition" in arguments:
        arguments = {"definition": registry.BY_NAME[arguments["definition"]]}
    with pytest.raises(error, match=rf"^Table 't': {message}$"):
        checkpoints.check_table_state("t", state, **arguments)


def test_check_table_state_takes_what_tensorflow_takes_for_a_float():
    """bfloat16 (ml_dtypes', no NumPy float), tf.Tensors (whose shape and
    dtype are read without copying them) and nested lists of floats."""
    checkpoints.check_table_state("t", {"parameters": [[0.5, 1.5]] * 4}, shape=(4, 2))
    checkpoints.check_table_state(
        "t", {"parameters": _ONES.astype(ml_dtypes.bfloat16)}, shape=[4, 2]
    )
    adagrad = registry.BY_NAME["Adagrad"]
    state = {"parameters": tf.ones((4, 2)), "accumulators": tf.ones((4, 2))}
    checkpoints.check_table_state("t", state, adagrad, (4, 2))


def test_refuses_shape_and_dtype_mismatch(tmp_path):
    prefix, _ = _tensorflow_checkpoint(tmp_path, ADAM_TABLE)
    _refused(
        prefix,
        [("t", 5, 2, teo.embedding.Adam(0.1))],
        r"Table 't': the checkpoint's table has shape \(4, 2\); the Keras "
        r"variable .* has \(5, 2\)",
    )
    # TPUEmbedding's tables are float32: a float64 Keras table takes none
    # (saved back, it would round), a float16 one only values it holds.
    _refused(
        prefix,
        ADAM_TABLE,
        r"Table 't': the checkpoint's table has dtype float32; the Keras "
        r"variable .* has float64",
        dtype="float64",
    )
    _refused(
        prefix,
        ADAM_TABLE,
        r"^Table 't': 'parameters' holds .* at \(0, 0\), which float16 does "
        r"not hold exactly",
        dtype="float16",
    )


@pytest.mark.parametrize("dtype", ["float64", "float16"])
def test_the_tpu_embedding_layout_is_written_in_float32_only(tmp_path, dtype):
    """TPUEmbedding and TPUEmbeddingForServing create float32 tables and
    slots, and their restore fails on another dtype ("expected dtype float
    does not equal original dtype half"); the layout's writer refuses it, as
    the SparseCore and jax-tpu-embedding writers do, and leaves nothing."""
    state = {
        s: np.zeros((4, 2), dtype) for s in ("parameters", "momenta", "velocities")
    }
    with pytest.raises(
        ValueError,
        match=rf"Table 't': 'parameters' and its slots have dtype {dtype}; "
        r"TPUEmbedding stores float32 \(convert it explicitly\)",
    ):
        checkpoints.write_checkpoint(str(tmp_path / "c"), [("t", state)])
    assert not os.listdir(tmp_path)


def test_refuses_a_slot_whose_shape_differs(tmp_path):
    state = {
        "parameters": np.zeros((4, 2), np.float32),
        "momenta": np.zeros((4, 2), np.float32),
        "velocities": np.zeros((3, 2), np.float32),
    }
    with pytest.raises(ValueError, match=r"Table 't': slot 'velocities' has shape"):
        checkpoints.write_tpu_checkpoint(str(tmp_path / "c"), [("t", state)])
    assert not os.path.exists(tmp_path / "c.index")


def _two_table_checkpoint(tmp_path):
    """Tables a and b, each in its own data shard (as this package writes)."""
    tables = [
        ("a", 40, 8, teo.embedding.Adam(0.1)),
        ("b", 40, 8, teo.embedding.Adam(0.1)),
    ]
    serving = _serving(tables)
    state = _random_state(serving, 7)
    prefix = checkpoints.write_tpu_checkpoint(
        str(tmp_path / "c" / "ckpt"), iter(state.items())
    )
    return prefix, tables


def _load_two(prefix, tables, match):
    variables, twins = _keras_target(tables)
    optimizer = keras.optimizers.MultiOptimizer(
        keras.optimizers.OptimizerMap(
            keras.optimizers.SGD(),
            {re.escape(variables[n].path): twins[n] for n in variables},
        )
    )
    optimizer.build(list(variables.values()))
    optimizer.iterations.assign(3)
    before = _snapshot(variables, twins)
    with pytest.raises(ValueError, match=match):
        keras_state.load_into_keras(prefix, variables, optimizer)
    _assert_unchanged(before, variables, twins)
    assert int(optimizer.iterations.numpy()) == 3


@pytest.mark.skipif(
    not hasattr(keras.optimizers, "MultiOptimizer"),
    reason=f"Keras {keras.__version__} has no keras.optimizers.MultiOptimizer",
)
@pytest.mark.parametrize("damage", ["truncated", "corrupted"])
def test_refuses_a_damaged_data_file_and_changes_nothing(tmp_path, damage):
    prefix, tables = _two_table_checkpoint(tmp_path)
    # Table b's shard: table a reads intact, so a loader that assigned table
    # by table would have changed it already.
    data = prefix + ".data-00001-of-00003"
    assert checkpoints.TPUCheckpointReader(prefix).read("a")
    size = os.path.getsize(data)
    reader = checkpoints.TPUCheckpointReader(prefix)
    with open(data, "r+b") as f:
        if damage == "truncated":
            f.truncate(size - 200)
        else:
            f.seek(size - 100)
            byte = f.read(1)
            f.seek(size - 100)
            f.write(bytes([byte[0] ^ 0xFF]))
    assert reader.tables  # the index is intact
    _load_two(prefix, tables, r"Checkpoint .*: table 'b', slot '\w+' cannot be read")


def test_refuses_paths_that_are_not_checkpoints(tmp_path):
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    for path, match in [
        (str(tmp_path / "missing" / "ckpt"), "is not a checkpoint: nothing is there"),
        (str(tmp_path / "notes.txt"), "is not a checkpoint: a file of 16 bytes"),
        (str(tmp_path), "is not a checkpoint: a directory holding notes.txt"),
    ]:
        _refused(path, ADAM_TABLE, match)
    prefix, _ = _tensorflow_checkpoint(tmp_path / "ok", ADAM_TABLE)
    with open(prefix + ".index", "r+b") as f:
        f.seek(10)
        f.write(b"garbage")
    _refused(prefix, ADAM_TABLE, "is not a readable TensorFlow checkpoint")
    _refused(
        42, ADAM_TABLE, "argument `source` must be a checkpoint path", error=TypeError
    )
    # A table source has both `tables` and `read(name)`: half of one is none.
    reader = checkpoints.TPUCheckpointReader(
        _tensorflow_checkpoint(tmp_path / "half", ADAM_TABLE)[0]
    )
    for half in (
        types.SimpleNamespace(tables=reader.tables),
        types.SimpleNamespace(read=reader.read),
    ):
        _refused(
            half,
            ADAM_TABLE,
            r"table source \(with `tables` and `read\(name\)`\); received "
            r"namespace\(",
            error=TypeError,
        )

    # A table source of one's own whose tensors lack a column its tables say
    # they have: refused when read, before anything changes.
    class Cut:
        def __init__(self, source):
            self.tables, self.source = source.tables, source

        def read(self, name):
            return {k: v[:, :-1] for k, v in self.source.read(name).items()}

    _refused(
        Cut(reader),
        ADAM_TABLE,
        r"^Table 't': 'parameters' reads with shape \(4, 1\); expected \(4, 2\)\.$",
    )


def test_refuses_keras_optimizers_whose_slots_are_not_the_engines(tmp_path):
    prefix, _ = _tensorflow_checkpoint(tmp_path, ADAM_TABLE)
    variable = keras.Variable(np.zeros((4, 2), np.float32))
    for optimizer, error, match in [
        (keras.optimizers.Lion(), TypeError, "Table 't': the Keras optimizer must"),
        (
            keras.optimizers.Adam(amsgrad=True),
            ValueError,
            r"Table 't': Adam keeps slots \['velocity_hat'\]",
        ),
    ]:
        optimizer.build([variable])
        with pytest.raises(error, match=match):
            keras_state.load_into_keras(prefix, {"t": variable}, optimizer)
    momentum, _ = _tensorflow_checkpoint(
        tmp_path / "m", [("t", 4, 2, teo.embedding.Momentum(0.1, momentum=0.9))]
    )
    sgd = keras.optimizers.SGD(momentum=0.9)  # m <- μ·m − η·g: not the engine's
    sgd.build([variable])
    with pytest.raises(ValueError, match=r"Table 't': SGD keeps slots \['momentum'\]"):
        keras_state.load_into_keras(momentum, {"t": variable}, sgd)


def test_stock_slots_are_told_apart_by_their_variables_paths(tmp_path):
    # Keras names a slot `<path with '/' as '_'>_<slot>`: the table `user`'s
    # prefix `user_` also starts `user_bias_accumulator`, which is not its.
    table = keras.Variable(np.zeros((4, 2), np.float32), name="user")
    bias = keras.Variable(np.zeros((4, 2), np.float32), name="user_bias")
    adagrad = keras.optimizers.Adagrad(0.1)
    adagrad.build([table, bias])
    adagrad._accumulators[0].assign(np.full((4, 2), 0.25, np.float32))
    adagrad._accumulators[1].assign(np.full((4, 2), 0.75, np.float32))
    out = keras_state.save_tpu_checkpoint(
        str(tmp_path / "o" / "c"), {"user": table}, adagrad
    )
    saved = checkpoints.TPUCheckpointReader(out).read("user")
    np.testing.assert_array_equal(saved["accumulators"], np.full((4, 2), 0.25))
    prefix, state = _tensorflow_checkpoint(
        tmp_path / "in", [("user", 4, 2, teo.embedding.Adagrad(0.1))]
    )
    keras_state.load_into_keras(prefix, {"user": table}, adagrad)
    np.testing.assert_array_equal(
        adagrad._accumulators[0].numpy(), state["user"]["accumulators"]
    )
    np.testing.assert_array_equal(
        adagrad._accumulators[1].numpy(), np.full((4, 2), 0.75)
    )

    # A Keras-only slot stays the table's beside a variable named like it.
    velocity = keras.Variable(np.zeros((4, 2), np.float32), name="user_velocity")
    amsgrad = keras.optimizers.Adam(amsgrad=True)
    amsgrad.build([table, velocity])
    with pytest.raises(
        ValueError, match=r"Table 'user': Adam keeps slots \['velocity_hat'\]"
    ):
        keras_state.save_tpu_checkpoint(str(tmp_path / "a"), {"user": table}, amsgrad)

    # Two paths of one slot name: refused, saying why.
    with keras.name_scope("x"):
        scoped = keras.Variable(np.zeros((4, 2), np.float32), name="t")
    flat = keras.Variable(np.zeros((4, 2), np.float32), name="x_t")
    both = keras.optimizers.Adagrad(0.1)
    both.build([scoped, flat])
    with pytest.raises(
        ValueError,
        match=r"^Table 't': Adagrad has several slot variables named "
        r"'x_t_accumulator': .* two variables share",
    ):
        keras_state.save_tpu_checkpoint(str(tmp_path / "b"), {"t": scoped}, both)
    assert sorted(os.listdir(tmp_path)) == ["in", "o"]


def test_a_stock_optimizer_without_the_slot_its_settings_need_is_refused(tmp_path):
    # Built without momentum, then given one: the engine's momenta have no slot.
    variable = keras.Variable(np.zeros((4, 2), np.float32), name="t")
    rms = keras.optimizers.RMSprop(0.1)
    rms.build([variable])
    rms.momentum = 0.5
    with pytest.raises(
        ValueError,
        match=r"^Table 't': RMSprop has no slot 'momentum' for the engine's 'mom'\.$",
    ):
        keras_state.save_tpu_checkpoint(str(tmp_path / "c"), {"t": variable}, rms)
    assert os.listdir(tmp_path) == []


def test_clippy_adagrad_takes_the_engine_adagrad_accumulator(tmp_path):
    prefix, state = _tensorflow_checkpoint(
        tmp_path, [("t", 4, 2, teo.embedding.Adagrad(0.1))]
    )
    variable = keras.Variable(np.zeros((4, 2), np.float32))
    clippy = teo.optimizers.ClippyAdagrad(0.1)
    clippy.build([variable])
    loaded = keras_state.load_into_keras(prefix, {"t": variable}, clippy)
    assert loaded["t"].name == "Adagrad"
    np.testing.assert_array_equal(
        clippy._accumulators[0].numpy(), state["t"]["accumulators"]
    )
    adam, _ = _tensorflow_checkpoint(tmp_path / "adam", ADAM_TABLE)
    with pytest.raises(ValueError, match="keeps the state of Adagrad"):
        keras_state.load_into_keras(adam, {"t": variable}, clippy)
    # And back: an Adagrad table restores ClippyAdagrad's accumulator.
    clippy._accumulators[0].assign(np.full((4, 2), 0.75, np.float32))
    out = keras_state.save_tpu_checkpoint(
        str(tmp_path / "o" / "c"), {"t": variable}, clippy
    )
    restored = _serving([("t", 4, 2, teo.embedding.Adagrad(0.1))])
    status = tf.train.Checkpoint(embedding=restored).restore(out)
    restored.build()
    status.assert_existing_objects_matched()
    np.testing.assert_array_equal(
        restored._variables["t"]["accumulators"].numpy(), np.full((4, 2), 0.75)
    )


@pytest.mark.parametrize(
    "arguments, error, message",
    [
        ({"object_path": 3}, TypeError, "`object_path` must be a '/'-separated string"),
        ({"object_path": "/"}, ValueError, "`object_path` must name an object"),
        (
            {"step": 1, "step_path": 3},
            TypeError,
            "`step_path` must be a '/'-separated string",
        ),
        ({"step": 1, "step_path": "/"}, ValueError, "`step_path` must name where"),
        ({"step": -1}, ValueError, r"`step` must be an integer >= 0; received -1\."),
        ({"step": True}, ValueError, r"`step` must be an integer >= 0; received True"),
        ({"step": 1.5}, ValueError, r"`step` must be an integer >= 0; received 1\.5"),
        (
            {"step": 2**63},
            ValueError,
            r"`step` must be an integer >= 0; received 9223372036854775808, more "
            r"than the int64 step variable holds \(at most 9223372036854775807\)\.",
        ),
        ({"tables": []}, ValueError, "`tables` is empty"),
        ({"tables": ["t", "t"]}, ValueError, "Table 't' is given twice"),
        (
            {"algorithms": {"u": "Adagrad"}},
            ValueError,
            r"Table 't' has no entry in `algorithms` \(which lists \['u'\]\)",
        ),
        (
            {"algorithms": {"t": "Adagrad", "u": "Adagrad"}},
            ValueError,
            r"Tables \['u'\] are in `algorithms` but were not given",
        ),
    ],
)
def test_the_tpu_embedding_writer_refuses_its_arguments(
    tmp_path, arguments, error, message
):
    state = {"parameters": _ONES, "accumulators": _ONES}
    tables = [(name, state) for name in arguments.pop("tables", ["t"])]
    with pytest.raises(error, match=message):
        checkpoints.write_checkpoint(str(tmp_path / "c"), tables, **arguments)
    assert not os.listdir(tmp_path)


def test_the_tpu_embedding_writer_takes_the_largest_int64_step(tmp_path):
    """The last step the int64 variable holds is written and read back."""
    largest = 2**63 - 1
    state = {"parameters": _ONES, "accumulators": _ONES}
    path = checkpoints.write_checkpoint(str(tmp_path / "c"), {"t": state}, step=largest)
    assert checkpoints.open_checkpoint(path).step == largest
    assert tf.train.load_variable(path, "step/.ATTRIBUTES/VARIABLE_VALUE") == largest


def test_the_tpu_embedding_writer_refuses_slots_no_algorithm_has(tmp_path):
    """Without `algorithms`, a table whose slots are no algorithm's (a Keras
    slot name, a typo) was written, and `open_checkpoint` of that very
    checkpoint then found no table ("no object holds embedding tables with
    slots"). It is refused, and nothing is written."""
    tables = {
        "t": {"parameters": _ONES, "accumulators": _ONES},
        "u": {"parameters": _ONES, "velocity": _ONES},
    }
    with pytest.raises(ValueError, match=r"^Table 'u': slots \['velocity'\] are no"):
        checkpoints.write_checkpoint(str(tmp_path / "c"), tables)
    assert not os.listdir(tmp_path)
    # Slots that fit an algorithm, and none (SGD), write and read back.
    del tables["u"]["velocity"]
    prefix = checkpoints.write_checkpoint(str(tmp_path / "c"), tables)
    opened = checkpoints.open_checkpoint(prefix)
    assert sorted(opened.tables) == ["t", "u"]
    assert opened.tables["t"].slots == ("accumulators",)


def test_the_deprecated_tpu_writer_takes_the_tables_as_the_front_door(tmp_path):
    """`write_tpu_checkpoint` takes a mapping name -> state, which it had
    iterated as (name, state) pairs ("not enough values to unpack"), and
    refuses an item that is no pair by name; nothing is written then."""
    state = {"parameters": _ONES, "accumulators": _ONES + 1}
    prefix = checkpoints.write_tpu_checkpoint(str(tmp_path / "m" / "c"), {"t": state})
    read = checkpoints.open_checkpoint(prefix).read("t")
    assert sorted(read) == ["accumulators", "parameters"]
    for key in read:
        np.testing.assert_array_equal(read[key], state[key])
    with pytest.raises(
        TypeError,
        match=r"`tables` must give \(table name, state\) pairs; received an item "
        r"\('u',\)",
    ):
        checkpoints.write_tpu_checkpoint(
            str(tmp_path / "p" / "c"), [("t", state), ("u",)]
        )
    assert not os.path.exists(tmp_path / "p") or not os.listdir(tmp_path / "p")


def test_the_tpu_embedding_layout_restores_as_a_first_save(tmp_path):
    """TensorFlow's restore takes the step and the save counter where they
    are written: `step_path` in parts, the counter at 1, as the first
    `tf.train.Checkpoint.save` writes it (the next save is `ckpt-2`)."""
    state = {"parameters": _ONES, "accumulators": _ONES}
    out = checkpoints.write_checkpoint(
        str(tmp_path / "o" / "c"), {"t": state}, step=7, step_path="train/step"
    )
    restored = _serving([("t", 4, 2, teo.embedding.Adagrad(0.1))])
    train = tf.Module()
    train.step = tf.Variable(0, dtype=tf.int64)
    root = tf.train.Checkpoint(embedding=restored, train=train)
    status = root.restore(out)
    restored.build()
    status.assert_existing_objects_matched()
    assert int(train.step.numpy()) == 7
    assert int(root.save_counter.numpy()) == 1
    assert root.save(str(tmp_path / "next" / "ckpt")).endswith("ckpt-2")


# --- Writing: discoverable only once complete --------------------------------


def test_an_interrupted_write_leaves_no_checkpoint(tmp_path):
    prefix = str(tmp_path / "ckpt")
    good = {"parameters": np.ones((3, 2), np.float32)}
    checkpoints.write_tpu_checkpoint(prefix, [("t", good)], object_path="e")

    def tables():
        yield "t", {"parameters": np.full((3, 2), 2.0, np.float32)}
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError, match="killed"):
        checkpoints.write_tpu_checkpoint(prefix, tables(), object_path="e")
    # The earlier checkpoint at the same prefix is intact, no temporary left.
    assert sorted(os.listdir(tmp_path)) == [
        "ckpt.data-00000-of-00002",
        "ckpt.data-00001-of-00002",
        "ckpt.index",
    ]
    reader = checkpoints.TPUCheckpointReader(prefix, "e")
    np.testing.assert_array_equal(reader.read("t")["parameters"], good["parameters"])


def test_a_killed_writer_leaves_nothing_discoverable(tmp_path):
    prefix = str(tmp_path / "ckpt")
    script = (
        "import os, numpy as np\n"
        "from tf_tpu_embed_opt import checkpoints\n"
        "def tables():\n"
        "    yield 't', {'parameters': np.ones((3, 2), np.float32)}\n"
        "    os._exit(9)\n"
        f"checkpoints.write_tpu_checkpoint({prefix!r}, tables())\n"
    )
    env = child_env(TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run([sys.executable, "-c", script], env=env, timeout=300)
    assert result.returncode == 9
    assert not tf.io.gfile.glob(prefix + "*")
    with pytest.raises(ValueError, match="is not a readable TensorFlow checkpoint"):
        checkpoints.TPUCheckpointReader(prefix)


# --- Step state ---------------------------------------------------------------


@pytest.mark.parametrize("stock", [False, True], ids=["twin", "keras.optimizers.Adam"])
def test_iterations_travel_for_keras_adam_bias_correction(tmp_path, stock):
    # Keras Adam (bias correction) runs on the engine as non-lazy Adam whose
    # learning rate is a callable of the Keras optimizer's `iterations`
    # (`to_embedding`). After K TPU steps the CPU run must continue at K + 1.
    beta_1, beta_2, lr, steps_done = 0.8, 0.95, 0.02, 37
    keras_class = keras.optimizers.Adam if stock else teo.optimizers.Adam
    keras_adam = keras_class(lr, beta_1=beta_1, beta_2=beta_2, epsilon=1e-3)
    engine_adam = teo.to_embedding(keras_adam)
    assert engine_adam.lazy_adam is False
    table_opt = teo.embedding.Adam(
        lr, beta_1=beta_1, beta_2=beta_2, epsilon=1e-3, lazy_adam=False,
        sum_inside_sqrt=False,
    )  # fmt: skip
    prefix, state = _tensorflow_checkpoint(
        tmp_path, [("table", ROWS, DIM, table_opt)], seed=8
    )
    variable = keras.Variable(np.zeros((ROWS, DIM), np.float32))
    keras_adam.build([variable])
    keras_state.load_into_keras(
        prefix, {"table": variable}, keras_adam, step=steps_done
    )
    assert int(keras_adam.iterations.numpy()) == steps_done
    # The callable learning rate the TPU job evaluates reads the step too.
    t = steps_done + 1
    corrected = lr * np.sqrt(1 - beta_2**t) / (1 - beta_1**t)
    np.testing.assert_allclose(float(engine_adam.learning_rate()), corrected, 1e-6)

    ((ids, values),) = _gradient_steps(seed=9)[:1]
    if stock:
        # Keras's own Adam squares each duplicate id of a sparse gradient (the
        # bug this package's twins fix): give it the summed, dense gradient.
        dense = np.zeros((ROWS, DIM), np.float32)
        np.add.at(dense, ids, values)
        ids, values = np.arange(ROWS), dense
        keras_adam.apply([tf.constant(dense)], [variable])
    else:
        _apply(keras_adam, variable, [(ids, values)])
    step_opt = teo.embedding.Adam(
        float(np.float32(lr) * np.float32(np.sqrt(1 - beta_2**t) / (1 - beta_1**t))),
        beta_1=beta_1, beta_2=beta_2, epsilon=1e-3, lazy_adam=False,
        sum_inside_sqrt=False,
    )  # fmt: skip
    expected = _numpy_engine_steps(step_opt, state["table"], [(ids, values)])
    np.testing.assert_allclose(variable.numpy(), expected["parameters"], 2e-6, 1e-7)
    assert int(keras_adam.iterations.numpy()) == steps_done + 1


def test_step_is_written_and_read_back(tmp_path):
    table_opt = teo.embedding.Adagrad(0.1)
    prefix, _ = _tensorflow_checkpoint(tmp_path, [("t", 4, 2, table_opt)])
    variable = keras.Variable(np.zeros((4, 2), np.float32))
    twin = teo.to_keras(table_opt)
    twin.build([variable])
    keras_state.load_into_keras(prefix, {"t": variable}, twin, step=123)
    out = keras_state.save_tpu_checkpoint(
        str(tmp_path / "o" / "c"), {"t": variable}, twin
    )
    assert int(checkpoints.TPUCheckpointReader(out).read_scalar("step")) == 123
    other = keras.Variable(np.zeros((4, 2), np.float32))
    fresh = teo.to_keras(table_opt)
    fresh.build([other])
    keras_state.load_into_keras(out, {"t": other}, fresh, step_path="step")
    assert int(fresh.iterations.numpy()) == 123
    np.testing.assert_array_equal(other.numpy(), variable.numpy())


@pytest.mark.parametrize("verify", [True, False])
def test_a_tpu_checkpoint_loads_one_tensor_at_a_time(tmp_path, verify):
    """From a layout that reads each array on its own (`row_reads`), loading
    holds one tensor of a table at a time: the table state is never read
    whole, neither to verify nor to load."""
    table_opt = teo.embedding.Adam(0.1)
    prefix, state = _tensorflow_checkpoint(tmp_path, [("t", 6, 3, table_opt)])
    source = checkpoints.open_checkpoint(prefix)
    assert source.row_reads is not None
    read = []

    def whole(name):
        raise AssertionError(f"table {name!r} read whole")

    def one(name, key, read_tensor=source.reader.read_tensor):
        read.append(key)
        return read_tensor(name, key)

    source.reader.read, source.reader.read_tensor = whole, one
    variable = keras.Variable(np.zeros((6, 3), np.float32))
    twin = teo.to_keras(table_opt)
    twin.build([variable])
    keras_state.load_into_keras(source, {"t": variable}, twin, verify=verify)
    # Each array once to load, and once before to verify.
    assert sorted(read) == sorted(
        ["parameters", "momenta", "velocities"] * (1 + verify)
    )
    np.testing.assert_array_equal(variable.numpy(), state["t"]["parameters"])


def test_step_path_reads_the_step_where_it_was_written(tmp_path):
    """A step written elsewhere than the recorded `step` is read from
    `step_path`; `step` and `step_path` together are refused (`step_path`
    was dropped without a word) before anything loads."""
    table_opt = teo.embedding.Adagrad(0.1)
    variable = keras.Variable(np.full((4, 2), 0.5, np.float32))
    twin = teo.to_keras(table_opt)
    twin.build([variable])
    twin.iterations.assign(41)
    out = keras_state.save_tpu_checkpoint(
        str(tmp_path / "o" / "c"), {"t": variable}, twin, step_path="train/step"
    )
    assert checkpoints.open_checkpoint(out).step is None  # not at `step`
    other = keras.Variable(np.zeros((4, 2), np.float32))
    fresh = teo.to_keras(table_opt)
    fresh.build([other])
    with pytest.raises(ValueError) as refused:
        keras_state.load_into_keras(
            out, {"t": other}, fresh, step=5, step_path="train/step"
        )
    assert str(refused.value) == (
        "load_into_keras: `step` sets the step and `step_path` reads it from "
        "the checkpoint; give one of them (received step=5, "
        "step_path='train/step')."
    )
    np.testing.assert_array_equal(other.numpy(), np.zeros((4, 2)))
    keras_state.load_into_keras(out, {"t": other}, fresh, step_path="train/step")
    assert int(fresh.iterations.numpy()) == 41
    np.testing.assert_array_equal(other.numpy(), variable.numpy())


@pytest.mark.parametrize("step", [-1, True, 2.0, "3"])
def test_a_step_that_is_no_count_is_refused_and_nothing_loads(tmp_path, step):
    table_opt = teo.embedding.Adagrad(0.1)
    prefix, _ = _tensorflow_checkpoint(tmp_path, [("t", 4, 2, table_opt)])
    variable = keras.Variable(np.full((4, 2), 7.0, np.float32))
    twin = teo.to_keras(table_opt)
    twin.build([variable])
    with pytest.raises(
        ValueError, match=rf"`step` must be an integer >= 0; received {step!r}\."
    ):
        keras_state.load_into_keras(prefix, {"t": variable}, twin, step=step)
    np.testing.assert_array_equal(variable.numpy(), np.full((4, 2), 7.0))
    assert int(twin.iterations.numpy()) == 0


def test_a_step_path_at_no_integer_is_refused_and_nothing_loads(tmp_path):
    """`step_path` at a float variable: refused (`int()` made 2 of 2.5)."""
    table_opt = teo.embedding.Adagrad(0.1)
    serving = _serving([("t", 4, 2, table_opt)])
    _random_state(serving, 0)
    prefix = tf.train.Checkpoint(embedding=serving, at=tf.Variable(2.5)).save(
        str(tmp_path / "tpu" / "ckpt")
    )
    variable = keras.Variable(np.full((4, 2), 7.0, np.float32))
    twin = teo.to_keras(table_opt)
    twin.build([variable])
    with pytest.raises(ValueError) as refused:
        keras_state.load_into_keras(prefix, {"t": variable}, twin, step_path="at")
    assert str(refused.value) == (
        f"Checkpoint {prefix!r}: the variable at 'at' is no step (an integer "
        ">= 0): it holds float32 2.5."
    )
    np.testing.assert_array_equal(variable.numpy(), np.full((4, 2), 7.0))
    assert int(twin.iterations.numpy()) == 0


def test_an_object_path_for_a_checkpoint_open_already_is_refused(tmp_path):
    table_opt = teo.embedding.Adagrad(0.1)
    prefix, _ = _tensorflow_checkpoint(tmp_path, [("t", 4, 2, table_opt)])
    variable = keras.Variable(np.zeros((4, 2), np.float32))
    with pytest.raises(
        ValueError, match=r"argument `object_path` 'embedding' applies to a checkpoint"
    ):
        keras_state.load_into_keras(
            checkpoints.open_checkpoint(prefix),
            {"t": variable},
            teo.to_keras(table_opt),
            object_path="embedding",
        )


def _built(optimizer, variable):
    optimizer.build([variable])
    return optimizer


def _multi_built_for(variable):
    multi = keras.optimizers.MultiOptimizer(
        keras.optimizers.OptimizerMap(
            keras.optimizers.SGD(), {"o": teo.optimizers.Adagrad(0.1)}
        )
    )
    multi.build([variable])
    return multi


# save_tpu_checkpoint's refusals of tables and optimizers no test reached:
# (variables, optimizer) given the table variable `t` and another, `o`.
SAVE_REFUSALS = {
    "amsgrad": (
        lambda t, o: ({"t": t}, _built(teo.optimizers.Adam(0.1, amsgrad=True), t)),
        ValueError,
        r"^Table 't': Adam keeps Keras-only slots \['velocity_hat'\]",
    ),
    "multi built for others": (
        lambda t, o: ({"t": t}, _multi_built_for(o)),
        ValueError,
        r"^Table 't': variable 't' is not among the variables `optimizer`",
    ),
    "target of another kind": (
        lambda t, o: ({"t": 3}, _built(teo.optimizers.Adagrad(0.1), t)),
        TypeError,
        r"^Table 't': the target must be a keras.Variable.*received 3 of type int",
    ),
    "variables a list": (
        lambda t, o: ([t], _built(teo.optimizers.Adagrad(0.1), t)),
        TypeError,
        r"^`variables` must be a keras.Model or a mapping .*; received list",
    ),
    "optimizer not built": (
        lambda t, o: ({"t": t}, teo.optimizers.Adagrad(0.1, name="late")),
        ValueError,
        r"^`optimizer` 'late' is not built; call "
        r"`optimizer\.build\(model\.trainable_variables\)` first",
    ),
    "built for others": (
        lambda t, o: ({"t": t}, _built(teo.optimizers.Adagrad(0.1, name="ada"), o)),
        ValueError,
        r"^Table 't': variable 't' is not among the variables optimizer 'ada' "
        r"was built with\.$",
    ),
    "optimizer a name": (
        lambda t, o: ({"t": t}, "adagrad"),
        TypeError,
        r"^`optimizer` must be a keras.optimizers.Optimizer .*received 'adagrad'",
    ),
}


@pytest.mark.parametrize("case", sorted(SAVE_REFUSALS))
def test_save_refuses_tables_and_optimizers_it_cannot_write(tmp_path, case):
    if case.startswith("multi") and not hasattr(keras.optimizers, "MultiOptimizer"):
        pytest.skip(f"Keras {keras.__version__} has no keras.optimizers.MultiOptimizer")
    make, error, words = SAVE_REFUSALS[case]
    table = keras.Variable(np.zeros((4, 2), np.float32), name="t")
    other = keras.Variable(np.zeros((4, 2), np.float32), name="o")
    variables, optimizer = make(table, other)
    with pytest.raises(error, match=words):
        keras_state.save_tpu_checkpoint(str(tmp_path / "c"), variables, optimizer)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "shape, dtype, words",
    [
        (
            (4, 3),
            np.float32,
            r"has shape \(4, 3\) in the checkpoint; the table has "
            r"\(4, 2\)\.$",
        ),
        (
            (4, 2),
            np.float64,
            r"has dtype float64 in the checkpoint; its Keras "
            r"variable has float32\.$",
        ),
    ],
    ids=["shape", "dtype"],
)
def test_a_slot_unlike_its_table_is_refused_before_loading(
    tmp_path, shape, dtype, words
):
    """A checkpoint whose table matches the Keras variable but whose slot
    does not (written by hand: TensorFlow's engine writes none such) is
    refused naming the slot, and nothing loads."""
    embedding_object = tf.Module()
    embedding_object.t = tf.Variable(np.full((4, 2), 0.5, np.float32))
    setattr(embedding_object, "t/accumulators", tf.Variable(np.ones(shape, dtype)))
    prefix = tf.train.Checkpoint(embedding=embedding_object).save(str(tmp_path / "c"))
    variable = keras.Variable(np.zeros((4, 2), np.float32), name="t")
    adagrad = teo.optimizers.Adagrad(0.1)
    adagrad.build([variable])
    before = [v.numpy().copy() for v in adagrad.variables]
    with pytest.raises(ValueError, match=r"^Table 't': slot 'accumulators' " + words):
        teo.load_into_keras(prefix, {"t": variable}, adagrad)
    np.testing.assert_array_equal(variable.numpy(), np.zeros((4, 2)))
    for old, new in zip(before, adagrad.variables):
        np.testing.assert_array_equal(new.numpy(), old)


def test_refuses_a_sparse_core_layout(tmp_path):
    # TPUEmbeddingV2 records its stacking in `_sparse_core_table_layouts`, a
    # string variable of the embedding object next to the stacked tables.
    embedding_object = tf.Module()
    embedding_object.stacked = tf.Variable(np.zeros((8, 4), np.float32))
    embedding_object._sparse_core_table_layouts = tf.Variable(b"\n\x03abc")
    setattr(
        embedding_object,
        "stacked/accumulators",
        tf.Variable(np.ones((8, 4), np.float32)),
    )
    prefix = tf.train.Checkpoint(embedding=embedding_object).save(str(tmp_path / "c"))
    with pytest.raises(ValueError, match=r"SparseCore \(TPUEmbeddingV2\)"):
        checkpoints.TPUCheckpointReader(prefix, "embedding")


def test_reads_tables_saved_in_shards(tmp_path):
    # On a TPU pod TPUEmbedding's tables are ShardedVariables, saved as slices
    # of one checkpoint key; the reader assembles the whole table.
    from tensorflow.python.distribute.sharded_variable import ShardedVariable

    table = np.arange(14, dtype=np.float32).reshape(7, 2)
    embedding_object = tf.Module()
    for name, value in (("t", table), ("t/accumulators", table + 1)):
        shards = [tf.Variable(value[:4]), tf.Variable(value[4:])]
        setattr(embedding_object, name, ShardedVariable(shards))
    prefix = tf.train.Checkpoint(embedding=embedding_object).save(str(tmp_path / "c"))
    reader = checkpoints.TPUCheckpointReader(prefix)
    assert reader.tables["t"].shape == (7, 2)
    state = reader.read("t")
    np.testing.assert_array_equal(state["parameters"], table)
    np.testing.assert_array_equal(state["accumulators"], table + 1)


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_random_tables_restore_in_tensorflow(tmp_path_factory, data):
    # Random names (with '.' and '/', which the keys escape), shapes and
    # algorithms; TensorFlow's TPUEmbeddingForServing is the reader.
    names = data.draw(
        st.lists(
            st.from_regex(r"[a-z][a-z0-9._/]{0,6}[a-z0-9]", fullmatch=True).filter(
                # `T/<slot name>` is a slot of table T in TensorFlow's naming
                # too; such table names are ambiguous.
                lambda n: "//" not in n and n.split("/")[-1] not in SLOT_NAMES
            ),
            min_size=1,
            max_size=4,
            unique=True,
        )
    )
    tables = []
    for name in names:
        case = data.draw(st.sampled_from(KERNEL_CASES))
        rows = data.draw(st.integers(1, 6))
        dim = data.draw(st.integers(1, 4))
        tables.append((name, rows, dim, case.make(teo.embedding, case.lr)))
    rng = np.random.default_rng(len(names))
    states = {}
    for name, rows, dim, table_opt in tables:
        definition = embedding.definition_of(table_opt)
        states[name] = {
            key: rng.normal(size=(rows, dim)).astype(np.float32)
            for key in ("parameters", *(s.name for s in definition.slots))
        }
    prefix = str(tmp_path_factory.mktemp("random") / "ckpt")
    checkpoints.write_tpu_checkpoint(prefix, iter(states.items()))
    restored = _serving(tables)
    status = tf.train.Checkpoint(embedding=restored).restore(prefix)
    restored.build()
    status.assert_existing_objects_matched()
    for name, variables in restored._variables.items():
        assert set(variables) == set(states[name])
        for key, variable in variables.items():
            np.testing.assert_array_equal(variable.numpy(), states[name][key])
    reader = checkpoints.TPUCheckpointReader(prefix, "embedding")
    assert set(reader.tables) == set(names)


def test_refusal_leaves_an_unbuilt_optimizer_unbuilt(tmp_path):
    prefix, _ = _tensorflow_checkpoint(tmp_path, ADAM_TABLE)
    ids = keras.Input((1,), dtype="int32")
    model = keras.Model(ids, keras.layers.Embedding(4, 2, name="t")(ids))
    before = [v.numpy().copy() for v in model.weights]
    twin = teo.to_keras(teo.embedding.Adagrad(0.1))
    with pytest.raises(ValueError, match="keeps the state of Adagrad"):
        keras_state.load_into_keras(prefix, model, twin)
    assert not twin.built
    for variable, value in zip(model.weights, before):
        np.testing.assert_array_equal(variable.numpy(), value)
    # The right optimizer loads (and is built on the model's variables).
    adam = teo.to_keras(teo.embedding.Adam(0.1))
    keras_state.load_into_keras(prefix, model, adam)
    assert adam.built


@pytest.mark.parametrize(
    "keras_optimizer, table_opt",
    [
        (keras.optimizers.Adagrad(0.1), teo.embedding.Adagrad(0.1)),
        (keras.optimizers.Adam(0.1), teo.embedding.Adam(0.1)),
        (keras.optimizers.Ftrl(0.1), teo.embedding.FTRL(0.1)),
        (keras.optimizers.RMSprop(momentum=0.5), teo.embedding.RMSProp(momentum=0.5)),
        (
            keras.optimizers.RMSprop(momentum=0.5, centered=True),
            teo.embedding.CenteredRMSProp(momentum=0.5),
        ),
        (keras.optimizers.Adadelta(), teo.embedding.Adadelta()),
        (keras.optimizers.SGD(), teo.embedding.SGD(0.1)),
    ],
    ids=lambda x: type(x).__name__,
)
def test_keras_own_optimizers_hold_the_engine_state(
    tmp_path, keras_optimizer, table_opt
):
    # Keras names its slots as the definitions record (`Slot.keras_name`) and
    # they hold the engine's quantities: TPU -> Keras -> TPU is bit-identical.
    prefix, state = _tensorflow_checkpoint(tmp_path, [("t", 4, 2, table_opt)])
    variable = keras.Variable(np.zeros((4, 2), np.float32))
    keras_optimizer.build([variable])
    keras_state.load_into_keras(
        prefix, {"t": variable}, keras_optimizer, object_path="embedding"
    )
    out = keras_state.save_tpu_checkpoint(
        str(tmp_path / "o" / "c"), {"t": variable}, keras_optimizer
    )
    restored = _serving([("t", 4, 2, table_opt)])
    status = tf.train.Checkpoint(embedding=restored).restore(out)
    restored.build()
    status.assert_existing_objects_matched()
    for key, value in restored._variables["t"].items():
        np.testing.assert_array_equal(value.numpy(), state["t"][key], err_msg=key)


def test_a_stock_optimizer_without_an_optional_slot_writes_it_as_the_engine_starts_it(
    tmp_path,
):
    """Keras's RMSprop without momentum keeps no `momentum` slot; the
    engine's RMSProp (momentum 0) has `mom`, which a step with momentum 0
    overwrites before reading it: written as zeros, beside Keras's velocity
    as `ms`, read back by TensorFlow's own TPUEmbeddingForServing; and the
    checkpoint loads into a new RMSprop (`mom` read and checked, not kept)."""
    variable = keras.Variable(np.arange(8, dtype=np.float32).reshape(4, 2), name="t")
    rms = keras.optimizers.RMSprop(0.1)
    rms.build([variable])
    rms.apply([np.full((4, 2), 0.5, np.float32)], [variable])
    (velocity,) = [v for v in rms.variables if v.path.endswith("t_velocity")]
    out = keras_state.save_tpu_checkpoint(str(tmp_path / "c"), {"t": variable}, rms)
    restored = _serving([("t", 4, 2, teo.embedding.RMSProp(0.1, momentum=0.0))])
    status = tf.train.Checkpoint(embedding=restored).restore(out)
    restored.build()
    status.assert_existing_objects_matched()
    tables = restored._variables["t"]
    assert sorted(tables) == ["mom", "ms", "parameters"]
    np.testing.assert_array_equal(tables["parameters"].numpy(), variable.numpy())
    np.testing.assert_array_equal(tables["ms"].numpy(), velocity.numpy())
    np.testing.assert_array_equal(tables["mom"].numpy(), np.zeros((4, 2)))
    again = keras.Variable(np.zeros((4, 2), np.float32), name="t")
    fresh = keras.optimizers.RMSprop(0.1)
    fresh.build([again])
    keras_state.load_into_keras(out, {"t": again}, fresh, object_path="embedding")
    np.testing.assert_array_equal(again.numpy(), variable.numpy())
    (loaded,) = [v for v in fresh.variables if v.path.endswith("t_velocity")]
    np.testing.assert_array_equal(loaded.numpy(), velocity.numpy())


def test_a_checkpoint_without_an_object_graph_is_refused(tmp_path):
    """A bundle that `tf.train.Checkpoint` did not write (TensorFlow 1's
    `Saver`, a raw `SaveV2`) says nothing of where its tables belong."""
    prefix = str(tmp_path / "raw")
    tf.raw_ops.SaveV2(
        prefix=prefix,
        tensor_names=["embedding/t"],
        shape_and_slices=[""],
        tensors=[tf.ones((4, 2))],
    )
    with pytest.raises(
        ValueError,
        match=r"has no object graph \(_CHECKPOINTABLE_OBJECT_GRAPH\): it was not "
        r"written by tf\.train\.Checkpoint\.",
    ):
        checkpoints.open_checkpoint(prefix)


def test_an_empty_sparsecore_layouts_string_is_no_sparsecore_checkpoint(tmp_path):
    """TPUEmbeddingForServing tracks `_sparse_core_table_layouts` (empty
    unless it restored a SparseCore checkpoint) and drops it when empty at
    `build` (TensorFlow 2.21); an object that saved it empty holds per-table
    tables, which the TPUEmbedding reader reads, where a non-empty one is
    refused. (Detection, which looks at names only, takes either for
    SparseCore: the format is named here.)"""
    serving = _serving([("u", 8, 4, embedding.Adagrad(0.1))])
    state = _random_state(serving, 1)
    key = "_sparse_core_table_layouts"
    setattr(serving, key, tf.Variable("", dtype=tf.string))
    prefix = tf.train.Checkpoint(embedding=serving).save(str(tmp_path / "e" / "c"))
    assert any(key in name for name, _ in tf.train.list_variables(prefix))
    source = checkpoints.open_checkpoint(prefix, format="tpu-embedding")
    np.testing.assert_array_equal(
        source.read("u")["accumulators"], state["u"]["accumulators"]
    )
    getattr(serving, key).assign("layouts")
    prefix = tf.train.Checkpoint(embedding=serving).save(str(tmp_path / "s" / "c"))
    with pytest.raises(ValueError, match="holds SparseCore"):
        checkpoints.open_checkpoint(prefix, format="tpu-embedding")


def test_the_embedding_object_is_found_or_asked_for(tmp_path):
    """Without `object_path`, the one object holding tables with slots is
    the embedding; none (SGD keeps no slots) or several are refused, saying
    to pass `object_path`, which then chooses."""
    first = _serving([("u", 8, 4, embedding.Adagrad(0.1))])
    _random_state(first, 1)
    second = _serving([("v", 8, 4, embedding.Adam(0.1))])
    state = _random_state(second, 2)
    two = tf.train.Checkpoint(e1=first, e2=second).save(str(tmp_path / "two" / "c"))
    with pytest.raises(
        ValueError,
        match=r"several objects hold embedding tables: \['e1', 'e2'\]; pass "
        r"`object_path` \(e\.g\. 'embedding'\)\.",
    ):
        checkpoints.open_checkpoint(two)
    chosen = checkpoints.open_checkpoint(two, object_path="e2")
    assert list(chosen.tables) == ["v"]
    np.testing.assert_array_equal(
        chosen.read("v")["velocities"], state["v"]["velocities"]
    )
    sgd = _serving([("w", 8, 4, embedding.SGD(0.1))])
    state = _random_state(sgd, 3)
    slotless = tf.train.Checkpoint(embedding=sgd).save(str(tmp_path / "sgd" / "c"))
    with pytest.raises(
        ValueError,
        match=r"no object holds embedding tables with slots; pass `object_path`",
    ):
        checkpoints.open_checkpoint(slotless)
    chosen = checkpoints.open_checkpoint(slotless, object_path="embedding")
    np.testing.assert_array_equal(
        chosen.read("w")["parameters"], state["w"]["parameters"]
    )
    # Tables tracked by the root itself are named so.
    table = tf.Variable(np.ones((4, 2), np.float32))
    at_root = tf.train.Checkpoint(
        t=table, **{"t/accumulators": tf.Variable(table)}, e1=first
    ).save(str(tmp_path / "root" / "c"))
    with pytest.raises(ValueError, match=r"tables: \['<root>', 'e1'\]"):
        checkpoints.open_checkpoint(at_root)
    # The root's save counter beside them is no table (it was listed as one).
    chosen = checkpoints.open_checkpoint(at_root, object_path="")
    assert list(chosen.tables) == ["t"]
    np.testing.assert_array_equal(chosen.read("t")["accumulators"], table.numpy())
    with pytest.raises(ValueError, match=r"object '' holds no tables\."):
        checkpoints.open_checkpoint(two, object_path="")
    # An object_path that leads to an object without tables.
    empty = tf.train.Checkpoint(e1=first, empty=tf.Module()).save(
        str(tmp_path / "empty" / "c")
    )
    with pytest.raises(ValueError, match=r"object 'empty' holds no tables\."):
        checkpoints.open_checkpoint(empty, object_path="empty")
    for call in (checkpoints.open_checkpoint, checkpoints.describe_checkpoint):
        with pytest.raises(
            TypeError, match=r"`object_path` must be a '/'-separated string .*\['e1'\]"
        ):
            call(two, object_path=["e1"])


def test_tables_whose_names_hold_a_slash_read_and_are_named_when_lost(tmp_path):
    """TensorFlow escapes '/' in a table's name ('a/b' -> `a.Sb`), so that
    table 'a/b' and the slot 'b' of a table 'a' would differ only by the
    slot names the engine knows. TensorFlow's TPUEmbeddingForServing writes
    tables 'a', 'a/b' and 'c/d' (the oracle); each reads back as written,
    and a cut checkpoint's report names exactly the variables TensorFlow
    can no longer read, each by its table and slot."""
    prefix, state = _tensorflow_checkpoint(
        tmp_path,
        [
            ("a", 16, 4, embedding.Adagrad(0.1)),
            ("a/b", 16, 4, embedding.Adagrad(0.1)),
            ("c/d", 16, 4, embedding.Adam(0.1)),
        ],
    )
    source = checkpoints.open_checkpoint(prefix)
    assert sorted(source.tables) == ["a", "a/b", "c/d"]
    for table in source.tables:
        read = source.read(table)
        assert sorted(read) == sorted(state[table])
        for slot, value in read.items():
            np.testing.assert_array_equal(value, state[table][slot])
    (data,) = tf.io.gfile.glob(prefix + ".data-*")
    _assert_a_cut_names_what_is_lost(prefix, data, _report_names(source.tables))


def _report_names(tables):
    """Each variable's key -> how a damage report names it, from the tables'
    `TableInfo`s (read before the damage)."""
    names = {}
    for table, info in tables.items():
        for slot, key in info.keys.items():
            names[key] = (
                f"table {table!r} (under embedding)"
                if slot == "parameters"
                else f"table {table!r}, slot {slot!r} (under embedding)"
            )
    return names


def _assert_a_cut_names_what_is_lost(prefix, data, texts):
    """Cuts the data file `data` to a third; the refusal names exactly the
    variables TensorFlow can no longer read (`texts`: key -> its name in
    the report), TensorFlow's reader the oracle."""
    with open(data, "r+b") as f:
        f.truncate(os.path.getsize(data) // 3)
    reader = tf.train.load_checkpoint(prefix)
    lost = []
    for key in texts:
        try:
            reader.get_tensor(key)
        except Exception:  # noqa: BLE001 - TensorFlow's own, several kinds
            lost.append(texts[key])
    assert lost, "the cut lost nothing"
    with pytest.raises(ValueError) as error:
        checkpoints.open_checkpoint(prefix)
    message = str(error.value)
    named = re.findall(
        r"(?:table '[^']*'(?:, slot '[^']*')? \(under embedding\)|variable '[^']*')",
        message.split(" nor its object graph")[0],
    )
    assert sorted(named) == sorted(lost), message


def test_a_cut_checkpoint_of_the_package_names_only_variables(tmp_path):
    """The package's checkpoint also records the tables' algorithms and the
    step, written last with the object graph: a cut there names the
    variables lost (the step, the save counter), never the record."""
    rng = np.random.default_rng(0)
    tables = {
        name: {
            "parameters": rng.normal(size=(64, 8)).astype(np.float32),
            "accumulators": np.full((64, 8), 0.1, np.float32),
        }
        for name in ("a", "b")
    }
    prefix = checkpoints.write_checkpoint(
        str(tmp_path / "c"),
        tables,
        format="tpu-embedding",
        algorithms={"a": "Adagrad", "b": "Adagrad"},
        step=5,
    )
    texts = {
        "save_counter/.ATTRIBUTES/VARIABLE_VALUE": "variable 'save_counter'",
        "step/.ATTRIBUTES/VARIABLE_VALUE": "variable 'step'",
        **_report_names(checkpoints.open_checkpoint(prefix).tables),
    }
    assert set(texts) < set(
        tf.train.load_checkpoint(prefix).get_variable_to_shape_map()
    )
    # The smallest data file: the one the object graph is written to, last.
    data = min(tf.io.gfile.glob(prefix + ".data-*"), key=os.path.getsize)
    _assert_a_cut_names_what_is_lost(prefix, data, texts)


@pytest.mark.parametrize("cut", ["last byte", "half"])
def test_a_truncated_tensorflow_checkpoint_is_refused_naming_what_is_lost(
    tmp_path, cut
):
    """TensorFlow writes the object graph last: any cut loses it first."""
    prefix, _ = _tensorflow_checkpoint(
        tmp_path, [("user", 64, 8, embedding.Adagrad(0.1))]
    )
    (data,) = tf.io.gfile.glob(prefix + ".data-*")
    size = os.path.getsize(data)
    with open(data, "r+b") as f:
        f.truncate(size - 1 if cut == "last byte" else size // 2)
    model = keras.Sequential(
        [keras.Input((1,), dtype="int32"), keras.layers.Embedding(64, 8, name="user")]
    )
    optimizer = teo.optimizers.Adagrad(0.1, epsilon=0.0)
    optimizer.build(model.trainable_variables)
    before = [v.numpy().copy() for v in (*model.weights, *optimizer.variables)]
    with pytest.raises(ValueError) as error:
        teo.load_into_keras(prefix, model, optimizer)
    message = str(error.value).replace(prefix, "<prefix>")
    assert "is damaged" in message and "object graph" in message, message
    if cut == "half":
        assert "cannot read table 'user', slot 'accumulators'" in message, message
        assert "the checkpoint is truncated" in message, message
    else:
        assert "every variable the index names reads" in message, message
        assert "Read less bytes than requested" in message, message
    after = [v.numpy() for v in (*model.weights, *optimizer.variables)]
    for old, new in zip(before, after):
        np.testing.assert_array_equal(old, new)


def test_a_table_whose_values_the_checkpoint_lacks_is_refused(tmp_path):
    """The object graph names a table's slot that the data does not hold
    (the checkpoint rewritten without it): refused naming the table and the
    missing key, not read as a table without that slot."""
    prefix, _ = _tensorflow_checkpoint(
        tmp_path, [("user", 8, 4, embedding.Adagrad(0.1))]
    )
    lost = checkpoints.open_checkpoint(prefix).tables["user"].keys["accumulators"]
    reader = tf.train.load_checkpoint(prefix)
    kept = sorted(set(reader.get_variable_to_shape_map()) - {lost})
    rewritten = str(tmp_path / "rewritten" / "ckpt")
    tf.raw_ops.SaveV2(
        prefix=rewritten,
        tensor_names=kept,
        shape_and_slices=[""] * len(kept),
        tensors=[reader.get_tensor(key) for key in kept],
    )
    refusal = (
        f"table 'user' is in the object graph but its values {[lost]!r} are "
        "not in the checkpoint"
    )
    with pytest.raises(ValueError, match=re.escape(refusal)):
        checkpoints.open_checkpoint(rewritten)


def test_a_checkpoint_cut_to_what_its_variables_need_is_not_called_short(tmp_path):
    """Cut to exactly the bytes its variables need (the object graph, which
    TensorFlow writes last, lost): every variable reads, and the report
    does not say the files hold fewer bytes than the variables need."""
    prefix, _ = _tensorflow_checkpoint(
        tmp_path, [("user", 64, 8, embedding.Adagrad(0.1))]
    )
    (data,) = tf.io.gfile.glob(prefix + ".data-*")
    reader = tf.train.load_checkpoint(prefix)
    # The variables' bytes, as TensorFlow's reader gives them (the object
    # graph, a string, apart).
    needed = sum(
        np.asarray(reader.get_tensor(key)).nbytes
        for key, dtype in reader.get_variable_to_dtype_map().items()
        if dtype != tf.string
    )
    assert needed < os.path.getsize(data)
    with open(data, "r+b") as f:
        f.truncate(needed)
    with pytest.raises(ValueError) as error:
        checkpoints.open_checkpoint(prefix)
    message = str(error.value)
    assert "every variable the index names reads" in message, message
    assert "fewer than the" not in message, message
    with open(data, "r+b") as f:
        f.truncate(needed - 1)
    with pytest.raises(
        ValueError, match="fewer than the .* the checkpoint is truncated"
    ):
        checkpoints.open_checkpoint(prefix)


@pytest.mark.parametrize(
    "table_opt",
    [
        teo.embedding.Adam(0.05),
        teo.embedding.FTRL(0.1, l1_regularization_strength=0.01),
        teo.embedding.AdagradMomentum(0.05, momentum=0.8),
    ],
    ids=lambda o: type(o).__name__,
)
def test_row_sparse_layer_tables_go_where_the_tpu_layout_expects(tmp_path, table_opt):
    """A `layers.Embedding`'s table and slots (its own optimizer's) load from
    and save to the TPUEmbedding layout; TensorFlow's TPUEmbeddingForServing
    wrote the source and restores what is written."""
    prefix, state = _tensorflow_checkpoint(
        tmp_path, [("users", ROWS, DIM, table_opt)], seed=5
    )
    ids = keras.Input((2,), dtype="int32")
    layer = teo.layers.Embedding(ROWS, DIM, optimizer=table_opt, name="users")
    model = keras.Model(ids, keras.layers.Dense(1)(keras.layers.Flatten()(layer(ids))))
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    # The model's optimizer has no say on the table: None is enough.
    loaded = keras_state.load_into_keras(prefix, model, None, step=7)
    assert loaded == {"users": embedding.definition_of(table_opt)}
    assert int(layer.optimizer.iterations.numpy()) == 7
    np.testing.assert_array_equal(
        layer.embeddings.numpy(), state["users"]["parameters"]
    )
    assert set(layer.slots) == set(state["users"]) - {"parameters"}
    for slot, variable in layer.slots.items():
        np.testing.assert_array_equal(variable.numpy(), state["users"][slot], slot)
    model.fit(
        np.array([[1, 4], [4, 2]], "int32"), np.ones((2, 1)), verbose=0, batch_size=2
    )
    out = str(tmp_path / "out" / "ckpt")
    keras_state.save_tpu_checkpoint(out, {"users": layer}, None)
    serving = _serving([("users", ROWS, DIM, table_opt)])
    serving.build()
    tf.train.Checkpoint(embedding=serving).restore(out).expect_partial()
    for slot, variable in serving._variables["users"].items():
        mine = layer.embeddings if slot == "parameters" else layer.slots[slot]
        np.testing.assert_array_equal(variable.numpy(), mine.numpy(), slot)
    assert int(checkpoints.TPUCheckpointReader(out).read_scalar("step")) == 8
    # Tables whose counters differ have no one step: the first table's was
    # written, whichever came first.
    other = teo.layers.Embedding(ROWS, DIM, optimizer=table_opt, name="other")
    other.build()
    other.set_table_step(3)
    with pytest.raises(
        ValueError, match=r"count different steps \(\{'users': 8, 'other': 3\}\)"
    ):
        keras_state.save_tpu_checkpoint(
            str(tmp_path / "two" / "ckpt"), {"users": layer, "other": other}, None
        )
    assert not (tmp_path / "two").exists()
    # Loaded back, the step is the checkpoint's: the table's and the model
    # optimizer's, without `step=`.
    again = keras.Model(ids, keras.layers.Dense(1)(keras.layers.Flatten()(layer(ids))))
    again.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    layer.set_table_step(0)
    keras_state.load_into_keras(out, again, again.optimizer)
    assert int(layer.optimizer.iterations.numpy()) == 8
    assert int(again.optimizer.iterations.numpy()) == 8


def test_stacked_tables_go_where_the_tpu_layout_expects(tmp_path):
    """The tables of a `layers.StackedEmbedding` (two in one stack, one in
    another) load from and save to the TPUEmbedding layout table by table;
    TensorFlow's TPUEmbeddingForServing wrote the source and restores what
    is written."""
    adam, adagrad = teo.embedding.Adam(0.05), teo.embedding.Adagrad(0.1)
    specs = [("users", ROWS, DIM, adam), ("items", ROWS + 3, DIM, adam)]
    specs.append(("shops", ROWS, DIM, adagrad))
    prefix, state = _tensorflow_checkpoint(tmp_path, specs, seed=9)
    ids = keras.Input((2,), dtype="int32")
    tables = [
        teo.layers.Embedding(rows, dim, optimizer=opt, name=name)
        for name, rows, dim, opt in specs
    ]
    stacked = teo.layers.StackedEmbedding(tables, name="tables")
    pooled = keras.layers.Concatenate()(
        [keras.layers.Flatten()(v) for v in stacked([ids, ids, ids])]
    )
    model = keras.Model(ids, keras.layers.Dense(1)(pooled))
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    assert stacked.stacks == (("users", "items"), ("shops",))
    names = ["users", "items", "shops"]
    keras_state.load_into_keras(prefix, model, None, step=7)
    for name in names:
        got = stacked.get_table(name)
        np.testing.assert_array_equal(got.pop("embeddings"), state[name]["parameters"])
        assert set(got) == set(state[name]) - {"parameters"}
        for slot, value in got.items():
            np.testing.assert_array_equal(value, state[name][slot], slot)
    model.fit(
        np.array([[1, 4], [4, 2]], "int32"), np.ones((2, 1)), verbose=0, batch_size=2
    )
    out = str(tmp_path / "out" / "ckpt")
    keras_state.save_tpu_checkpoint(out, model, None, names=names)
    serving = _serving(specs)
    serving.build()
    tf.train.Checkpoint(embedding=serving).restore(out).expect_partial()
    for name in names:
        mine = stacked.get_table(name)
        for slot, variable in serving._variables[name].items():
            key = "embeddings" if slot == "parameters" else slot
            np.testing.assert_array_equal(variable.numpy(), mine[key], slot)
    assert int(checkpoints.TPUCheckpointReader(out).read_scalar("step")) == 8
    whole = stacked._stacks[0].embeddings
    with pytest.raises(ValueError, match="whole stack of the StackedEmbedding"):
        keras_state.save_tpu_checkpoint(out, {"users": whole}, None)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_16_bit_table_saves_as_the_float32_that_tpu_embedding_restores(
    tmp_path, dtype
):
    """TPUEmbedding keeps its tables and slots in float32, and its restore of
    another dtype fails ("expected dtype float does not equal original dtype
    half"): a table of bfloat16 (TensorFlow's other float, which NumPy does
    not count among its floats) or float16 and its slots are written as
    float32, which holds each value exactly, and TensorFlow's own
    `TPUEmbeddingForServing` restores them. Back, the table of that dtype
    takes the checkpoint bit for bit (each value checked exact before
    anything changes), as does a float32 one; a value that would round is
    refused, naming it, and nothing changes."""

    def layer(dtype):
        made = teo.layers.Embedding(
            ROWS, DIM, optimizer=teo.optimizers.Adagrad(0.1), name="users", dtype=dtype
        )
        made.build()
        return made

    trained = layer(dtype)
    trained.embeddings.assign(np.linspace(-1, 1, ROWS * DIM).reshape(ROWS, DIM))
    out = str(tmp_path / dtype / "ckpt")
    keras_state.save_tpu_checkpoint(out, {"users": trained}, None)
    widened = {
        "parameters": keras.ops.cast(trained.embeddings, "float32").numpy(),
        "accumulators": keras.ops.cast(
            trained.slots["accumulators"], "float32"
        ).numpy(),
    }
    read = checkpoints.open_checkpoint(out).read("users")
    assert {key: str(value.dtype) for key, value in read.items()} == {
        "parameters": "float32",
        "accumulators": "float32",
    }
    for key, value in widened.items():
        np.testing.assert_array_equal(read[key], value, err_msg=key)
    serving = _serving([("users", ROWS, DIM, teo.embedding.Adagrad(0.1))])
    serving.build()
    tf.train.Checkpoint(embedding=serving).restore(out).expect_partial()
    (table,) = serving.embedding_tables.values()
    np.testing.assert_array_equal(table.numpy(), widened["parameters"])

    def bits(variable):
        return keras.ops.convert_to_numpy(variable).tobytes()

    back = layer(dtype)
    keras_state.load_into_keras(out, {"users": back}, None)
    assert bits(back.embeddings) == bits(trained.embeddings)
    assert bits(back.slots["accumulators"]) == bits(trained.slots["accumulators"])
    loaded = layer("float32")
    keras_state.load_into_keras(out, {"users": loaded}, None)
    np.testing.assert_array_equal(loaded.embeddings.numpy(), widened["parameters"])
    np.testing.assert_array_equal(
        loaded.slots["accumulators"].numpy(), widened["accumulators"]
    )
    # One value of a slot that the 16-bit dtype does not hold: refused, with
    # the table and its other tensors as they were.
    read["accumulators"][3, 1] = 0.1
    inexact = str(tmp_path / dtype / "inexact")
    checkpoints.write_checkpoint(
        inexact, [("users", read)], algorithms={"users": "Adagrad"}
    )
    target = layer(dtype)
    before = [bits(v) for v in target.weights]
    narrow = getattr(ml_dtypes, dtype, dtype)  # NumPy has no bfloat16
    rounded = re.escape(str(np.float32(0.1).astype(narrow).astype(np.float32)))
    with pytest.raises(
        ValueError,
        match=rf"^Table 'users': 'accumulators' holds 0.1 at \(3, 1\), which "
        rf"{dtype} does not hold exactly \(it would round to {rounded}\).*; "
        "nothing was loaded",
    ):
        keras_state.load_into_keras(inexact, {"users": target}, None)
    # Checked only by reading each value before anything changes.
    with pytest.raises(
        ValueError, match="cannot be done here: `verify=False` reads each value"
    ):
        keras_state.load_into_keras(out, {"users": target}, None, verify=False)
    assert before == [bits(v) for v in target.weights]
    # A table with no slot (SGD; found at its object path, as tables without
    # slots are) is refused alike.
    plain = teo.layers.Embedding(
        ROWS, DIM, optimizer=teo.optimizers.SGD(0.1), name="users", dtype=dtype
    )
    plain.build()
    sgd = str(tmp_path / dtype / "sgd")
    checkpoints.write_checkpoint(
        sgd,
        [("users", {"parameters": read["parameters"]})],
        algorithms={"users": "SGD"},
    )
    with pytest.raises(
        ValueError,
        match=rf"^Table 'users': the checkpoint holds it as float32, which "
        rf"loads into its {dtype} variables only once .* `verify=False` reads",
    ):
        keras_state.load_into_keras(
            sgd, {"users": plain}, None, verify=False, object_path="embedding"
        )


def test_row_sparse_layer_refusals_name_the_table(tmp_path):
    prefix, _ = _tensorflow_checkpoint(
        tmp_path, [("users", ROWS, DIM, teo.embedding.Adam(0.05))]
    )
    layer = teo.layers.Embedding(
        ROWS, DIM, optimizer=teo.optimizers.Adagrad(0.1), name="users"
    )
    layer.build()
    before = layer.embeddings.numpy().copy()
    with pytest.raises(ValueError, match="Table 'users'.*Adagrad"):
        keras_state.load_into_keras(prefix, {"users": layer}, None)
    np.testing.assert_array_equal(layer.embeddings.numpy(), before)
    plain = keras.layers.Embedding(ROWS, DIM, name="users")
    plain.build()
    with pytest.raises(TypeError, match="Table 'users': `optimizer` is None"):
        keras_state.load_into_keras(prefix, {"users": plain}, None)
    # Nothing to write: a clear error, not an IndexError looking for the
    # first table's own step counter.
    with pytest.raises(ValueError, match="`variables` holds no table"):
        keras_state.save_tpu_checkpoint(str(tmp_path / "empty" / "ckpt"), {}, None)
    assert not (tmp_path / "empty").exists()
