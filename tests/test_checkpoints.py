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

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.tpu.tpu_embedding_for_serving import TPUEmbeddingForServing
from test_convert import CASES as KERNEL_CASES

import tf_tpu_embed_opt as teo
from tf_tpu_embed_opt import checkpoints, embedding, keras_state, rules

TFE = tf.tpu.experimental.embedding

ROWS, DIM = 9, 3
# Ids of each step (with duplicates); rows 5, 6 and 8 are never looked up.
STEP_IDS = ((1, 4, 1, 7), (4, 4, 2, 0), (0, 7, 3, 0, 1))
# Slots that hold sums or averages of squares (the engine keeps them > 0).
POSITIVE_SLOTS = ("accumulators", "velocities", "ms", "v", "updates")


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
    user = reader.tables["user.ids"]
    assert user.shape == (7, 3) and user.dtype == "float32"
    assert user.slots == ("momenta", "velocities")
    assert [d.name for d in user.algorithms] == ["Adam"]
    assert user.nbytes == 7 * 3 * 4 * 3
    assert [d.name for d in reader.tables["item/v2"].algorithms] == [
        "Adagrad",
        "ProximalAdagrad",
    ]


@pytest.mark.parametrize(
    "case_id", ["Adagrad", "Adam-lazy", "Adam-non-lazy", "Adam-sum-inside-sqrt"]
)
def test_tpu_checkpoint_continues_on_keras_like_the_engine(tmp_path, case_id):
    case = _kernel_case(case_id)
    table_opt = case.make(teo.embedding, case.lr)
    prefix, state = _tensorflow_checkpoint(
        tmp_path, [("table", ROWS, DIM, table_opt)], seed=3
    )
    variable = keras.Variable(np.zeros((ROWS, DIM), np.float32), name="table")
    twin = teo.to_keras(table_opt)
    twin.build([variable])
    loaded = keras_state.load_into_keras(prefix, {"table": variable}, twin)
    assert loaded["table"] is embedding.definition_of(table_opt)
    steps = _gradient_steps(seed=4)
    _apply(twin, variable, steps)
    expected = _numpy_engine_steps(table_opt, state["table"], steps)
    tables = keras_state.keras_tables({"table": variable}, twin)
    ((_, actual),) = keras_state.keras_table_states(tables)
    for name, value in expected.items():
        _assert_within_one_ulp(actual[name], value, name)
    if case.lazy:
        untouched = [5, 6, 8]
        for name in expected:
            np.testing.assert_array_equal(
                actual[name][untouched], state["table"][name][untouched]
            )


def test_tpu_to_keras_to_tpu_is_bit_identical(tmp_path):
    tables = [
        ("user", 6, 3, teo.embedding.Adam(0.1)),
        ("item.v2", 4, 2, teo.embedding.RMSProp(0.1, momentum=0.5)),
        ("ad/id", 5, 4, teo.embedding.FTRL(0.1)),
    ]
    prefix, state = _tensorflow_checkpoint(tmp_path, tables, seed=5)
    variables = {
        name: keras.Variable(
            np.zeros((rows, dim), np.float32), name=name.replace("/", "_")
        )
        for name, rows, dim, _ in tables
    }
    optimizers = {name: teo.to_keras(opt) for name, _, _, opt in tables}
    for name, opt in optimizers.items():
        opt.build([variables[name]])
    # One optimizer per table (without MultiOptimizer, which TF 2.16's Keras
    # lacks): a view of the checkpoint with one table for each.
    reader = checkpoints.TPUCheckpointReader(prefix)

    class OneTable:
        def __init__(self, name):
            self.tables = {name: reader.tables[name]}

        def read(self, name):
            return reader.read(name)

    for name in variables:
        keras_state.load_into_keras(
            OneTable(name), {name: variables[name]}, optimizers[name]
        )

    states = {}
    for name in variables:
        tables_ = keras_state.keras_tables({name: variables[name]}, optimizers[name])
        states.update(keras_state.keras_table_states(tables_))
    out = checkpoints.write_tpu_checkpoint(
        str(tmp_path / "back" / "ckpt"), iter(states.items())
    )
    # The keys TensorFlow writes for these tables, and bit-identical values.
    assert sorted(k for k, _ in tf.train.list_variables(out)) == sorted(
        k for k, _ in tf.train.list_variables(prefix)
    )
    restored = _serving(tables)
    status = tf.train.Checkpoint(embedding=restored).restore(out)
    restored.build()
    status.assert_existing_objects_matched()
    for name, variables_ in restored._variables.items():
        for slot, variable in variables_.items():
            np.testing.assert_array_equal(variable.numpy(), state[name][slot])
