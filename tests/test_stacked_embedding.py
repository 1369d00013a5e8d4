"""`tf_tpu_embed_opt.layers.StackedEmbedding`: tables stacked as the TPU
engines stack them step exactly as the separate `layers.Embedding`s.

On the backend the suite runs on (TensorFlow, or JAX without TensorFlow). The
oracle is the separate layers, whose rows the other suites pin to
TensorFlow's kernels, Keras's optimizers and jax-tpu-embedding's updates.
"""

# Runs without TensorFlow.

import gc
import pathlib
import re
import warnings

import keras
import numpy as np
import pytest
import row_steps
from conftest import exact_tensorflow, keras_face, requires_xla

import tf_tpu_embed_opt as teo

pytestmark = keras_face

BACKEND = keras.backend.backend()
# (rows, dim, optimizer, out_of_range_ids): tables 0, 1 and 4 share a stack;
# 2 (another width) and 3 (another optimizer) have their own.
TABLES = (
    (7, 3, "adagrad", "error"),
    (13, 3, "adagrad", "error"),
    (5, 4, "adagrad", "error"),
    (11, 3, "adam", "error"),
    (6, 3, "adagrad", "zeros"),
)
BATCH, STEPS = 8, 4
_RNG = np.random.default_rng(3)
INITIAL = [_RNG.normal(size=(r, d)).astype("float32") for r, d, _, _ in TABLES]
# Ids with duplicates within and across examples; table 4's include ids
# outside it (read as zeros, stepping nothing).
IDS = [
    _RNG.integers(
        -2 if p == "zeros" else 0, r + 2 if p == "zeros" else r, (32, 3)
    ).astype("int32")
    for r, _, _, p in TABLES
]
LABELS = _RNG.normal(size=(32, 1)).astype("float32")


def _optimizer(kind):
    if kind == "adam":
        return teo.optimizers.Adam(0.05, beta_1=0.8, lazy=True)
    return teo.optimizers.Adagrad(0.1, epsilon=0.0)


def _tables(shared=None):
    """The tables of `TABLES`; `shared`: a dict kind -> one optimizer object
    that every table of that kind takes."""
    return [
        teo.layers.Embedding(
            rows,
            dim,
            optimizer=shared[kind] if shared else _optimizer(kind),
            out_of_range_ids=policy,
            embeddings_initializer=keras.initializers.Constant(INITIAL[i]),
            name=f"table_{i}",
        )
        for i, (rows, dim, kind, policy) in enumerate(TABLES)
    ]


def _model(stacked, jit_compile=False, keyed=False, widths=(3,) * 5, shared=None):
    inputs = [
        keras.Input((width,), dtype="int32", name=f"f{i}")
        for i, width in enumerate(widths)
    ]
    tables = _tables(shared)
    if stacked and keyed:
        layer = teo.layers.StackedEmbedding(
            {f"f{i}": t for i, t in enumerate(tables)}, name="stacked"
        )
        looked = layer({f"f{i}": x for i, x in enumerate(inputs)})
        outputs = [looked[f"f{i}"] for i in range(5)]
    elif stacked:
        outputs = teo.layers.StackedEmbedding(tables, name="stacked")(inputs)
    else:
        outputs = [table(x) for table, x in zip(tables, inputs)]
    return _compiled(inputs, outputs, jit_compile)


def _compiled(inputs, outputs, jit_compile=False):
    """The model of `inputs` whose head sums each of `outputs` over its ids."""
    pooled = keras.layers.Concatenate()([keras.ops.sum(o, axis=1) for o in outputs])
    prediction = keras.layers.Dense(1, kernel_initializer="ones")(pooled)
    model = keras.Model(inputs, prediction)
    model.compile(keras.optimizers.SGD(0.01), "mse", jit_compile=jit_compile)
    return model


def _table_state(model, stacked, names=tuple(f"table_{i}" for i in range(5))):
    if stacked:
        layer = model.get_layer("stacked")
        return [layer.get_table(name) for name in names]
    states = []
    for name in names:
        layer = model.get_layer(name)
        state = {"embeddings": keras.ops.convert_to_numpy(layer.embeddings)}
        state.update({k: keras.ops.convert_to_numpy(v) for k, v in layer.slots.items()})
        states.append(state)
    return states


def _assert_same(got, want, compiled=False):
    """Bit for bit; `compiled` (XLA), within `row_steps.assert_rows`' bound
    over the `STEPS` steps (values below 1 counted as 1): XLA:CPU may
    contract a multiply feeding an add into one FMA in one graph and not in
    the other, the stacked and the separate tables fusing apart (TensorFlow
    2.19 and 2.20; JAX from 0.12; with `XLA_FLAGS=--xla_cpu_max_isa=SSE4_2`,
    no FMA, they agree to the bit)."""
    for index, (g, w) in enumerate(zip(got, want)):
        assert sorted(g) == sorted(w)
        for key in w:
            row_steps.assert_rows(
                g[key],
                w[key],
                np.float32(1.0),
                STEPS,
                bounded=compiled,
                what=f"{index} {key}",
            )


# On TensorFlow also under XLA (where the host runs it: not tensorflow-tpu
# without a TPU).
JIT = [False] if BACKEND == "jax" else [False, pytest.param(True, marks=requires_xla)]


@pytest.mark.parametrize("jit_compile", JIT)
def test_stacked_steps_equal_the_separate_layers_to_the_last_bit(jit_compile):
    """To the last bit op by op; compiled, within the bound of an FMA that
    XLA may contract in one graph and not the other (`_assert_same`)."""
    with exact_tensorflow():
        separate = _model(False, jit_compile)
        stacked = _model(True, jit_compile)
        for model in (separate, stacked):
            model.fit(IDS, LABELS, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    want = _table_state(separate, False)
    _assert_same(_table_state(stacked, True), want, jit_compile)
    # Every table moved, and the stacks grouped as documented.
    for state, initial in zip(want, INITIAL):
        assert not np.array_equal(state["embeddings"], initial)
    layer = stacked.get_layer("stacked")
    assert layer.stacks == (
        ("table_0", "table_1", "table_4"),
        ("table_2",),
        ("table_3",),
    )
    # Every layer Keras sees is built (an unbuilt one makes Keras's trainer
    # trace the model again before each step).
    assert all(each.built for each in stacked._flatten_layers())
    # Each stack's optimizer stepped once per step, as each table's did.
    for stack in layer._stacks:
        assert int(keras.ops.convert_to_numpy(stack.table_step)) == len(IDS[0]) // BATCH
    row_steps.assert_rows(
        stacked.predict(IDS, verbose=0),
        separate.predict(IDS, verbose=0),
        np.float32(1.0),
        STEPS,
        bounded=jit_compile,
        what="predictions",
    )


@pytest.mark.parametrize("jit_compile", [False, True] if BACKEND == "jax" else JIT)
def test_features_of_no_ids_step_no_row(jit_compile):
    """A feature of length 0 (ids of shape `(batch, 0)`, as a padded batch of
    empty lists gives) looks nothing up: `keras.layers.Embedding` gives
    `(batch, 0, dim)`. Table 0 shares its stack with looked-up tables; table
    3 has a stack of its own, which then gets no id at all. Both keep their
    rows and slots to the last bit, as the engine leaves a table no id
    reaches; their step counters count the steps; the other tables step as
    the separate layers do. It failed on both backends: TensorFlow's id check
    took the `argmax` of no ids, JAX's step sorted an empty list."""
    widths = (0, 3, 3, 0, 3)
    ids = [x[:, :width] for x, width in zip(IDS, widths)]
    with exact_tensorflow():
        fresh = _table_state(_model(False, widths=widths), False)
        separate = _model(False, jit_compile, widths=widths)
        stacked = _model(True, jit_compile, widths=widths)
        for model in (separate, stacked):
            model.fit(ids, LABELS, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    steps = len(LABELS) // BATCH
    state = _table_state(separate, False)
    _assert_same([state[0], state[3]], [fresh[0], fresh[3]])
    for moved in (1, 2, 4):
        assert not np.array_equal(state[moved]["embeddings"], INITIAL[moved])
    for index in (0, 3):
        counter = separate.get_layer(f"table_{index}").optimizer.iterations
        assert int(keras.ops.convert_to_numpy(counter)) == steps
    for stack in stacked.get_layer("stacked")._stacks:
        assert int(keras.ops.convert_to_numpy(stack.table_step)) == steps
    got = _table_state(stacked, True)
    _assert_same([got[0], got[3]], [fresh[0], fresh[3]])
    _assert_same(got, state, jit_compile)


def test_keyed_tables_and_a_keras_file_continue_identically(tmp_path):
    with exact_tensorflow():
        model = _model(True, keyed=True)
        model.fit(IDS, LABELS, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        path = str(tmp_path / "stacked.keras")
        model.save(path)
        loaded = keras.models.load_model(path)
        assert isinstance(loaded.get_layer("stacked"), teo.layers.StackedEmbedding)
        for each in (model, loaded):
            each.fit(IDS, LABELS, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    _assert_same(_table_state(loaded, True), _table_state(model, True))


# Features sharing a table: a history of 3 items and a target item read
# table "items"; "users" shares their stack.
SHARED_IDS = {
    "hist": IDS[1],
    "user": IDS[0][:, :2],
    "target": _RNG.integers(0, TABLES[1][0], (32, 1)).astype("int32"),
}


def _shared_model(stacked, keyed=True):
    """Two features of table "items" and one of "users", looked up by a
    `StackedEmbedding` (the items table in two entries), or by one call of
    the items `layers.Embedding` on both features' ids together, as a model
    without a stack must (its refusal of a second call says so): each
    feature's ids flat, in the features' order, as the stack takes them,
    so that a row's gradients add in the same order."""
    inputs = {
        name: keras.Input(ids.shape[1:], BATCH, dtype="int32", name=name)
        for name, ids in SHARED_IDS.items()
    }
    items, users = (
        teo.layers.Embedding(
            TABLES[i][0],
            3,
            optimizer=_optimizer("adagrad"),
            embeddings_initializer=keras.initializers.Constant(INITIAL[i]),
            name=name,
        )
        for i, name in ((1, "items"), (0, "users"))
    )
    if stacked and keyed:
        layer = teo.layers.StackedEmbedding(
            {"hist": items, "user": users, "target": items}, name="stacked"
        )
        looked = layer(inputs)
    elif stacked:
        layer = teo.layers.StackedEmbedding([items, users, items], name="stacked")
        hist, user, target = layer([inputs[n] for n in ("hist", "user", "target")])
        looked = {"hist": hist, "user": user, "target": target}
    else:
        flat = [keras.ops.reshape(inputs[n], (-1,)) for n in ("hist", "target")]
        hist, target = keras.ops.split(items(keras.ops.concatenate(flat)), [3 * BATCH])
        looked = {
            "hist": keras.ops.reshape(hist, (BATCH, 3, 3)),
            "target": keras.ops.reshape(target, (BATCH, 1, 3)),
            "user": users(inputs["user"]),
        }
    return _compiled(inputs, [looked[n] for n in ("hist", "user", "target")])


def _shared_state(model, stacked):
    return _table_state(model, stacked, ("items", "users"))


def _fit_shared(*models):
    with exact_tensorflow():
        for model in models:
            model.fit(
                SHARED_IDS, LABELS, batch_size=BATCH, epochs=1, shuffle=False, verbose=0
            )


@pytest.mark.parametrize("keyed", [True, False], ids=["dict", "list"])
def test_features_sharing_a_table_step_it_once_with_all_their_gradients(keyed):
    """As TPUEmbedding steps a table that several `FeatureConfig`s name:
    each row once, with the gradient of every lookup of it."""
    separate, stacked = _shared_model(False), _shared_model(True, keyed)
    _fit_shared(separate, stacked)
    want = _shared_state(separate, False)
    _assert_same(_shared_state(stacked, True), want)
    for state, initial in zip(want, (INITIAL[1], INITIAL[0])):
        assert not np.array_equal(state["embeddings"], initial)
    layer = stacked.get_layer("stacked")
    assert layer.stacks == (("items", "users"),)
    # One stack of both tables' rows: "items" once.
    assert tuple(layer._stacks[0].embeddings.shape) == (TABLES[1][0] + TABLES[0][0], 3)
    again = teo.layers.StackedEmbedding.from_config(layer.get_config())
    assert again.stacks == layer.stacks
    assert again.get_config() == layer.get_config()


def test_a_shared_table_continues_identically_from_a_keras_file(tmp_path):
    model = _shared_model(True)
    _fit_shared(model)
    path = str(tmp_path / "shared.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert loaded.get_layer("stacked").stacks == (("items", "users"),)
    _fit_shared(model, loaded)
    _assert_same(_shared_state(loaded, True), _shared_state(model, True))


def test_a_table_of_a_stack_called_on_its_own_is_refused():
    # It made a second table "items", trained apart from the stack's.
    items = _adagrad_table("items")
    stacked = teo.layers.StackedEmbedding({"hist": items}, name="st")
    ids = keras.Input((1,), dtype="int32")
    message = "'items' is a table of the StackedEmbedding 'st'.*through 'st'"
    with pytest.raises(ValueError, match=message):
        items(ids)
    with pytest.raises(ValueError, match=message):
        items(np.array([[1]], "int32"))
    for use in (
        items.build,
        lambda: items.embeddings,
        lambda: items.slots,
        lambda: items.table_step,
        lambda: items.set_table_step(1),
        lambda: items.set_weights([np.zeros((4, 2), "float32")]),
    ):
        with pytest.raises(ValueError, match=message):
            use()
    # Nothing left to build, and no state: its rows are the stack's.
    assert items.built and items.weights == []
    stacked({"hist": ids})  # the stack itself builds
    assert stacked.get_table("items")["embeddings"].shape == (4, 2)
    lone = _adagrad_table("lone")
    teo.layers.StackedEmbedding({"hist": lone})  # and dropped
    gc.collect()
    with pytest.raises(ValueError, match="'lone' was given to a StackedEmbedding"):
        lone(np.array([[1]], "int32"))


@keras.saving.register_keras_serializable(package="test_stacked_embedding")
class _Towers(keras.Model):
    """A subclassed model that keeps its tables as attributes, as models
    keep their layers, besides the stack that holds their rows."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.items = _adagrad_table("items")
        self.users = _adagrad_table("users")
        self.stacked = teo.layers.StackedEmbedding(
            {"hist": self.items, "user": self.users, "target": self.items}
        )
        self.head = keras.layers.Dense(1, kernel_initializer="ones")

    def call(self, ids, training=None):
        rows = self.stacked(ids, training=training)
        flat = [keras.ops.reshape(rows[key], (-1, 4)) for key in sorted(rows)]
        return self.head(keras.ops.concatenate(flat, axis=-1))


TOWERS = ["items", "users"]
_TOWER_IDS = {
    "hist": np.array([[1, 2], [3, 0]] * 2, "int32"),
    "user": np.array([[1, 2], [3, 0]] * 2, "int32"),
    "target": np.array([[2, 2], [1, 3]] * 2, "int32"),
}


def test_a_model_holding_its_stacked_tables_as_attributes_is_built(tmp_path):
    """Keras saw the tables, never built, as unbuilt state: it warned that
    this "may cause failures down the line", and on JAX its trainer ran the
    model eagerly again before every `predict_on_batch` (4.1 ms against 0.1
    ms, measured) and traced it again in every `fit`, as it does while any
    layer is unbuilt. Saved and reloaded, it continues bit for bit."""
    ids, labels = _TOWER_IDS, np.ones((4, 1), "float32")
    model = _Towers(name="towers")
    model.compile(optimizer="sgd", loss="mse")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*unbuilt state")
        model.fit(ids, labels, batch_size=2, shuffle=False, verbose=0)
        model.predict_on_batch(ids)
    assert all(layer.built for layer in model._flatten_layers())
    assert [v.path for v in model.items.weights + model.users.weights] == []
    path = str(tmp_path / "towers.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    for each in (model, loaded):
        each.fit(ids, labels, batch_size=2, shuffle=False, verbose=0)
    _assert_same(*[[m.stacked.get_table(n) for n in TOWERS] for m in (loaded, model)])


def test_a_table_given_to_a_second_stack_is_refused_in_the_first():
    """Two towers, each stacking the `items` table it reads: the second
    stack took a copy of the rows, trained apart from the first's. The first
    is refused from then on (the last stack given a table holds it, as after
    running again the cell that made a stack); the way is one stack for both
    towers' features (test_features_sharing_a_table_step_it_once...)."""
    items = _adagrad_table("items")
    query = teo.layers.StackedEmbedding(
        {"hist": items, "user": _adagrad_table("users")}, name="query"
    )
    ids = {key: np.array([[1, 2]], "int32") for key in ("hist", "user", "item")}
    query({key: ids[key] for key in ("hist", "user")})  # alone, it works
    candidate = teo.layers.StackedEmbedding({"item": items}, name="candidate")
    message = (
        "StackedEmbedding 'query': its table 'items' has since been given to "
        "the StackedEmbedding 'candidate'.*every feature that reads 'items'"
    )
    with pytest.raises(ValueError, match=message):
        query({key: ids[key] for key in ("hist", "user")})
    candidate({"item": ids["item"]})  # the last stack given it holds it
    unbuilt = teo.layers.StackedEmbedding({"item": items}, name="unbuilt")
    again = teo.layers.StackedEmbedding({"item": items}, name="again")
    with pytest.raises(ValueError, match="'candidate': its table 'items'.*'again'"):
        candidate({"item": ids["item"]})
    with pytest.raises(ValueError, match="'unbuilt': its table 'items'.*'again'"):
        unbuilt.build()
    assert not unbuilt.built
    again({"item": ids["item"]})


def test_a_model_built_again_from_the_same_tables_refuses_the_first():
    """A training and a serving model each built by one function from the
    same `Embedding`s: each a stack of its own, so the serving model would
    never see the trained rows. The first is refused as it trains; the way
    is the one `StackedEmbedding` layer in both models."""

    def build(tables):
        ids = keras.Input((2,), dtype="int32")
        rows = teo.layers.StackedEmbedding([tables[0]])([ids])[0]
        return keras.Model(ids, keras.layers.Dense(1)(keras.layers.Flatten()(rows)))

    tables = [_adagrad_table("items")]
    training, serving = build(tables), build(tables)
    training.compile(optimizer="sgd", loss="mse")
    ids, labels = np.array([[1, 2]] * 4, "int32"), np.ones((4, 1), "float32")
    with pytest.raises(ValueError, match="its table 'items' has since been given"):
        training.fit(ids, labels, verbose=0)
    serving.compile(optimizer="sgd", loss="mse")
    serving.fit(ids, labels, verbose=0)


def test_an_id_outside_its_table_is_refused_naming_the_table():
    layer = teo.layers.StackedEmbedding(_tables(), name="stacked")
    ids = [keras.ops.convert_to_tensor(i[:4]) for i in IDS]
    layer(ids)
    before = layer.get_table("table_1")["embeddings"]
    bad = list(ids)
    bad[1] = keras.ops.convert_to_tensor(np.array([[0, 13, 1]] * 4, "int32"))
    with pytest.raises(teo.layers.OutOfRangeIds, match=r"`table_1`: id 13 and 3 more"):
        layer(bad)
    np.testing.assert_array_equal(layer.get_table("table_1")["embeddings"], before)
    # Table 4 reads zeros for its ids outside it.
    outside = keras.ops.convert_to_tensor(np.array([[-1, 6, 9]] * 4, "int32"))
    looked = layer([*ids[:4], outside])[4]
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(looked), 0.0)


def test_an_id_just_past_a_zeros_table_is_no_row_of_the_next_table():
    """In a stack the row after a table's last is the next table's first: an
    id at `input_dim` of a table that reads zeros for ids outside it reads
    zeros and steps no row of the next table (the last table of a stack, as
    table 4 above, has no next table to reach)."""
    tables = [
        teo.layers.Embedding(
            rows,
            2,
            optimizer=teo.optimizers.Adagrad(0.1),
            out_of_range_ids=policy,
            embeddings_initializer="ones",
            name=name,
        )
        for name, rows, policy in (("first", 4, "zeros"), ("second", 3, "error"))
    ]
    inputs = [keras.Input((1,), dtype="int32") for _ in tables]
    layer = teo.layers.StackedEmbedding(tables, name="stacked")
    flat = [keras.layers.Flatten()(v) for v in layer(inputs)]
    model = keras.Model(inputs, keras.layers.Concatenate()(flat))
    model.compile(optimizer="sgd", loss="mse")
    assert layer.stacks == (("first", "second"),)
    assert layer.place("second") == (0, 4, 7)
    x = [np.array([[4]], "int32"), np.array([[1]], "int32")]
    np.testing.assert_array_equal(model.predict(x, verbose=0), [[0, 0, 1, 1]])
    before = layer.get_table("second")["embeddings"]
    model.fit(x, np.zeros((1, 4), "float32"), batch_size=1, verbose=0)
    after = layer.get_table("second")["embeddings"]
    np.testing.assert_array_equal(after[[0, 2]], before[[0, 2]])
    assert (after[1] < before[1]).all()


def test_unsigned_ids_step_and_are_refused_as_the_ids_they_are():
    """uint32 ids beside int32 ones in one stack train as int32 ids do, and
    one past int32's range is refused, in a compiled step, as the id it is
    (on JAX without x64 the ids stay uint32: `layers.ids.integer_dtype`)."""

    def fit(dtypes, ids):
        keras.utils.set_random_seed(1)
        tables = [
            teo.layers.Embedding(rows, 4, optimizer=teo.optimizers.Adagrad(0.1), name=n)
            for n, rows in (("a", 7), ("b", 5))
        ]
        inputs = [keras.Input((2,), dtype=dtype) for dtype in dtypes]
        stack = teo.layers.StackedEmbedding(tables)
        vectors = [keras.layers.Flatten()(v) for v in stack(inputs)]
        model = keras.Model(inputs, keras.layers.Concatenate()(vectors))
        model.compile(optimizer="sgd", loss="mse")
        x = [i.astype(dtype) for i, dtype in zip(ids, dtypes)]
        model.fit(x, np.ones((8, 16), "float32"), shuffle=False, verbose=0)
        return [stack.get_table(n)["embeddings"] for n in ("a", "b")]

    rng = np.random.default_rng(0)
    ids = [rng.integers(0, 7, (8, 2)), rng.integers(0, 5, (8, 2))]
    unsigned = fit(["uint32", "int32"], ids)
    for mine, theirs in zip(unsigned, fit(["int32", "int32"], ids)):
        np.testing.assert_array_equal(mine, theirs)
    ids[0][3, 1] = 3_000_000_000
    with pytest.raises(Exception, match="`a`: id 3000000000 is outside the table"):
        fit(["uint32", "int32"], ids)


def test_a_stack_called_twice_in_a_step_is_refused():
    inputs = [keras.Input((3,), dtype="int32", name=f"f{i}") for i in range(5)]
    layer = teo.layers.StackedEmbedding(_tables(), name="stacked")
    twice = [layer(inputs), layer(inputs)]
    pooled = [keras.ops.sum(o, axis=1) for outputs in twice for o in outputs]
    model = keras.Model(inputs, keras.layers.Concatenate()(pooled))
    model.compile(keras.optimizers.SGD(0.01), "mse")
    with pytest.raises(
        ValueError,
        match="'stack_0' is called a second time.*"
        "call the StackedEmbedding once per step",
    ):
        model.fit(IDS, np.zeros((32, 32), "float32"), batch_size=BATCH, verbose=0)


def test_get_table_and_set_table():
    layer = teo.layers.StackedEmbedding(_tables(), name="stacked")
    with pytest.raises(ValueError, match="'stacked' is not built; call it once"):
        layer.get_table("table_1")
    layer.build()
    for index, initial in enumerate(INITIAL):
        state = layer.get_table(f"table_{index}")
        np.testing.assert_array_equal(state["embeddings"], initial)
    new = np.full((13, 3), 2.5, "float32")
    layer.set_table("table_1", {"embeddings": new, "accumulators": new + 1})
    np.testing.assert_array_equal(layer.get_table("table_1")["embeddings"], new)
    np.testing.assert_array_equal(layer.get_table("table_1")["accumulators"], new + 1)
    # Its neighbours in the stack are left as they were.
    np.testing.assert_array_equal(layer.get_table("table_0")["embeddings"], INITIAL[0])
    np.testing.assert_array_equal(layer.get_table("table_4")["embeddings"], INITIAL[4])
    with pytest.raises(KeyError, match="no table 'nope'"):
        layer.get_table("nope")
    with pytest.raises(ValueError, match=r"keys \['momenta'\]"):
        layer.set_table("table_1", {"momenta": new})
    # Every value is checked before any is written.
    wrong = re.escape(
        "set_table('table_1'): `values['accumulators']` must have shape (13, 3); "
        "received (2, 3)."
    )
    with pytest.raises(ValueError, match=wrong):
        layer.set_table("table_1", {"embeddings": new * 2, "accumulators": new[:2]})
    np.testing.assert_array_equal(layer.get_table("table_1")["embeddings"], new)
    # A value that is no mapping ("'int' object is not iterable" before).
    with pytest.raises(TypeError, match=r"`values` must be a mapping .*received int"):
        layer.set_table("table_1", 3)


def test_a_tables_rows_of_its_stack():
    """`table(name)` is the table as the checkpoint functions take it: its
    rows of the stack, read and written as a variable is."""
    layer = teo.layers.StackedEmbedding(_tables(), name="stacked")
    layer.build()
    rows = layer.table("table_1")
    assert rows.shape == (13, 3) and rows.dtype == "float32"
    assert rows.path.endswith("[7:20]")
    assert np.asarray(rows).dtype == np.float32
    np.testing.assert_array_equal(np.asarray(rows), INITIAL[1])
    wide = np.asarray(rows, dtype="float64")
    assert wide.dtype == np.float64
    np.testing.assert_array_equal(wide, INITIAL[1])
    rows.assign(np.full((13, 3), 4.0, "float32"))
    np.testing.assert_array_equal(layer.get_table("table_1")["embeddings"], 4.0)
    np.testing.assert_array_equal(layer.get_table("table_0")["embeddings"], INITIAL[0])
    shape = re.escape("[7:20]: the value must have shape (13, 3); received (7, 3).")
    with pytest.raises(ValueError, match=shape):
        rows.assign(INITIAL[0])
    np.testing.assert_array_equal(layer.get_table("table_1")["embeddings"], 4.0)
    np.testing.assert_array_equal(layer.get_table("table_4")["embeddings"], INITIAL[4])


@pytest.mark.parametrize("stacked", [False, True], ids=["separate", "stacked"])
def test_tables_sharing_one_optimizer_object_train_as_with_their_own(stacked):
    """One optimizer object for several tables (what a learning rate set on
    it reaches): each table, or stack, keeps its own step counter and slots,
    so they train as with an optimizer each; here one for the four Adagrad
    tables (two stacks when stacked) and one for the Adam table."""
    shared = {kind: _optimizer(kind) for kind in ("adagrad", "adam")}
    with exact_tensorflow():
        own, one = _model(stacked), _model(stacked, shared=shared)
        for model in (own, one):
            model.fit(IDS, LABELS, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    _assert_same(_table_state(one, stacked), _table_state(own, stacked))
    assert int(keras.ops.convert_to_numpy(shared["adam"].iterations)) == STEPS


def test_config_round_trip():
    layer = teo.layers.StackedEmbedding(
        {"a": _tables()[0], "b": _tables()[3]}, name="stacked"
    )
    again = teo.layers.StackedEmbedding.from_config(layer.get_config())
    assert again.stacks == (("table_0",), ("table_3",))
    assert again.get_config() == layer.get_config()


def _adagrad_table(name="t", **kwargs):
    return teo.layers.Embedding(4, 2, optimizer="adagrad", name=name, **kwargs)


@pytest.mark.parametrize(
    "tables, error, match",
    [
        ("t", TypeError, "`tables` must be a list or a dict"),
        ([], ValueError, "`tables` is empty"),
        ([keras.layers.Embedding(4, 2)], TypeError, "must be a tf_tpu_embed_opt"),
        ([_adagrad_table(), _adagrad_table()], ValueError, "two tables are named 't'"),
        ([_adagrad_table(mask_zero=True)], ValueError, "mask_zero=True"),
        # Its config would hold "1", and the reloaded layer refused {1: ids}.
        ({1: _adagrad_table()}, TypeError, "keys of `tables`.*received 1 of type int"),
    ],
)
def test_bad_tables_are_refused_by_name(tables, error, match):
    with pytest.raises(error, match=match):
        teo.layers.StackedEmbedding(tables)


def test_a_built_table_is_refused():
    table = _adagrad_table()
    table.build()
    with pytest.raises(ValueError, match="table 't' is built"):
        teo.layers.StackedEmbedding([table])
    # `weights` builds a table; set_table sets its rows in the stack.
    with pytest.raises(ValueError, match="given `weights`.*set_table"):
        teo.layers.StackedEmbedding(
            [_adagrad_table(weights=np.zeros((4, 2), "float32"))]
        )


def test_inputs_that_do_not_fit_the_tables_are_refused():
    listed = teo.layers.StackedEmbedding([_adagrad_table("a"), _adagrad_table("b")])
    with pytest.raises(ValueError, match="a list of 2 id arrays.*a list of 1"):
        listed([np.zeros((2,), "int32")])
    keyed = teo.layers.StackedEmbedding({"x": _adagrad_table("a")})
    with pytest.raises(ValueError, match=r"the keys of `tables`, \['x'\]"):
        keyed({"y": np.zeros((2,), "int32")})


def test_checkpoint_functions_refuse_a_stack_by_name():
    layer = teo.layers.StackedEmbedding(_tables(), name="stacked")
    layer.build()
    from tf_tpu_embed_opt.checkpoints.keras import tables as keras_tables

    with pytest.raises(ValueError, match="stack of the StackedEmbedding 'stacked'"):
        keras_tables._row_sparse_layer(layer._stacks[0].embeddings, None, "table_0")


def test_checkpoint_functions_refuse_two_stacked_tables_of_one_name():
    """Two stacks each holding a table "items" (distinct tables, as two
    towers may name theirs), or a stacked table beside an Embedding of its
    name: a model holds two tables of that name, which `keras_tables` (so
    `load_into_keras`, `save_tpu_checkpoint`) refuses rather than take one."""
    from tf_tpu_embed_opt.checkpoints.keras import tables as keras_tables

    ids = keras.Input((2,), dtype="int32", name="ids")
    first = teo.layers.StackedEmbedding([_adagrad_table("items")], name="s1")
    second = teo.layers.StackedEmbedding([_adagrad_table("items")], name="s2")
    alone = _adagrad_table("users")
    beside = teo.layers.StackedEmbedding([_adagrad_table("users")], name="s3")
    looked = [first([ids])[0], second([ids])[0], alone(ids), beside([ids])[0]]
    model = keras.Model(ids, keras.layers.Concatenate()(looked))
    for name in ("items", "users"):
        with pytest.raises(
            ValueError, match=rf"^Table '{name}': model '.+' holds 2 tables of that"
        ):
            keras_tables.keras_tables(model, None, [name])


def test_distinct_ids_are_jnp_unique():
    """The JAX lookup's dedup against `jnp.unique` (the oracle), on random
    multisets with the absent id (the row count) among them."""
    jax = pytest.importorskip("jax")
    from tf_tpu_embed_opt.layers.lookup_jax import distinct_ids

    rng = np.random.default_rng(11)
    for count, rows in ((1, 1), (9, 3), (64, 5), (64, 200), (300, 40)):
        mine = jax.jit(lambda flat, rows=rows: distinct_ids(flat, rows))
        oracle = jax.jit(
            lambda flat, count=count, rows=rows: jax.numpy.unique(
                flat, size=count, fill_value=rows, return_inverse=True
            )
        )
        for _ in range(12):
            flat = rng.integers(0, rows + 1, count).astype("int32")
            distinct, inverse = mine(flat)
            want_distinct, want_inverse = oracle(flat)
            np.testing.assert_array_equal(distinct, want_distinct)
            np.testing.assert_array_equal(inverse, np.reshape(want_inverse, -1))


def test_stacked_tables_to_a_jax_tpu_embedding_step_and_back(tmp_path):
    """The tables of a `StackedEmbedding` (as `TableRows`) are written as a
    jax-tpu-embedding step of another stacking by `write_checkpoint`, read
    back table by table by its reader, and loaded into a fresh stacked layer
    with `load_into_keras`: every table and slot bit for bit."""
    pytest.importorskip("orbax.checkpoint")
    from tf_tpu_embed_opt import checkpoints
    from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import (
        writer as jax_orbax_writer,
    )
    from tf_tpu_embed_opt.checkpoints.keras import tables as keras_tables

    rng = np.random.default_rng(21)
    layer = teo.layers.StackedEmbedding(_tables(), name="stacked")
    layer.build()
    names = [f"table_{i}" for i in range(len(TABLES))]
    want = {}
    for name in names:
        state = {
            key: rng.uniform(0.1, 1.0, np.shape(value)).astype("float32")
            for key, value in layer.get_table(name).items()
        }
        layer.set_table(name, state)
        want[name] = state
    tables = keras_tables.keras_tables({n: layer.table(n) for n in names}, None)
    # The job stacks otherwise than the layer (tables 0, 1 and 4): 1 and 4
    # together, the others alone.
    shapes = {name: tuple(np.shape(want[name]["embeddings"])) for name in names}
    spec = jax_orbax_writer.embedding_spec_for(
        shapes,
        num_devices=2,
        sparsecores_per_device=4,
        stacks={"a": ["table_1", "table_4"]},
    )
    step_dir = checkpoints.write_checkpoint(
        str(tmp_path / "job"),
        keras_tables.keras_table_states(tables),
        format="jax-tpu-embedding",
        step=3,
        embedding_spec=spec,
        algorithms={table.name: table.definition for table in tables},
    )
    back = checkpoints.open_checkpoint(step_dir)
    for name in names:
        read = back.read(name)
        np.testing.assert_array_equal(read.pop("parameters"), want[name]["embeddings"])
        assert set(read) == set(want[name]) - {"embeddings"}, name
        for key, value in read.items():
            np.testing.assert_array_equal(value, want[name][key], f"{name} {key}")
    fresh = teo.layers.StackedEmbedding(_tables(), name="stacked")
    fresh.build()
    teo.load_into_keras(step_dir, {n: fresh.table(n) for n in names}, None)
    for name in names:
        got = fresh.get_table(name)
        assert set(got) == set(want[name]), name
        for key, value in got.items():
            np.testing.assert_array_equal(value, want[name][key], f"{name} {key}")


def test_a_model_holding_its_stacked_tables_as_attributes_loads_a_step(tmp_path):
    """`load_into_keras` given such a model finds each table in its stack,
    not in the `Embedding` that holds nothing (which it read, and refused)."""
    pytest.importorskip("orbax.checkpoint")
    from tf_tpu_embed_opt import checkpoints
    from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import writer
    from tf_tpu_embed_opt.checkpoints.keras import tables as keras_tables

    trained, fresh = _Towers(name="trained"), _Towers(name="fresh")
    trained.compile(optimizer="sgd", loss="mse")
    trained.fit(_TOWER_IDS, np.ones((4, 1), "float32"), batch_size=2, verbose=0)
    fresh(_TOWER_IDS)
    tables = keras_tables.keras_tables(
        {n: trained.stacked.table(n) for n in TOWERS}, None
    )
    step_dir = checkpoints.write_checkpoint(
        str(tmp_path / "job"),
        keras_tables.keras_table_states(tables),
        format="jax-tpu-embedding",
        step=1,
        embedding_spec=writer.embedding_spec_for(
            {n: (4, 2) for n in TOWERS}, num_devices=1, sparsecores_per_device=2
        ),
        algorithms={table.name: table.definition for table in tables},
    )
    assert sorted(teo.load_into_keras(step_dir, fresh, None)) == TOWERS
    _assert_same(*[[m.stacked.get_table(n) for n in TOWERS] for m in (fresh, trained)])


def test_float_ids_under_mixed_bfloat16_keep_their_rows():
    """Keras casts a layer's float inputs to its compute dtype unless the
    layer says not (`autocast`), as Keras's `Embedding` does. Under
    `mixed_bfloat16` the stack cast float32 ids (Keras's default input
    dtype) to bfloat16, which holds integers exactly only up to 256: id 257
    stepped row 256, and id 999 was refused as 1,000."""
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        tables = [
            teo.layers.Embedding(
                1_000,
                2,
                optimizer=teo.optimizers.SGD(1.0),
                embeddings_initializer="zeros",
                name=name,
            )
            for name in ("a", "b")
        ]
        inputs = [keras.Input((1,)) for _ in tables]
        layer = teo.layers.StackedEmbedding(tables, name="stacked")
        outputs = [keras.layers.Flatten()(x) for x in layer(inputs)]
        model = keras.Model(inputs, keras.layers.Concatenate()(outputs))
        model.compile(keras.optimizers.SGD(1.0), "mse")
        ids = [np.array([[257.0]], "float32"), np.array([[999.0]], "float32")]
        model.fit(ids, np.ones((1, 4)), verbose=0)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    for name, row in (("a", 257), ("b", 999)):
        moved = layer.get_table(name)["embeddings"].any(axis=1)
        assert np.nonzero(moved)[0].tolist() == [row], name


def _saved_model():
    ids = keras.Input((2,), dtype="int32")
    tables = [
        teo.layers.Embedding(
            6, 3, optimizer=teo.optimizers.Adam(0.1, lazy=True), name=f"t{i}"
        )
        for i in range(2)
    ]
    first, second = teo.layers.StackedEmbedding(tables, name="stacked")(
        [ids[:, 0], ids[:, 1]]
    )
    single = teo.layers.Embedding(
        5, 3, optimizer=teo.optimizers.Adagrad(0.1), name="single"
    )(ids)
    out = keras.layers.Concatenate()([first, second, keras.layers.Flatten()(single)])
    return keras.Model(ids, keras.layers.Dense(1)(out))


def _saved_value(index, variable):
    size = int(np.prod(variable.shape))
    values = np.arange(size).reshape(variable.shape) * 0.5 + index
    return values.astype(variable.dtype)


def test_a_weights_file_of_an_earlier_version_loads_every_weight():
    """`data/row_sparse_layers_704d01e.weights.h5` was written by the package
    at 704d01e, before the stacks and slots became attributes for
    TensorFlow's checkpoints: `_saved_model()` with every weight `w[i]` set
    to `_saved_value(i, w[i])`, then `model.save_weights`. Keras's saving
    finds a layer by walking attributes in sorted order (private ones last)
    and files it under the first path it meets, so an attribute sorting
    before `_stacks` moved the stacks in the file: such a file then loaded
    their optimizers from nothing, with only a warning."""
    model = _saved_model()
    path = (
        pathlib.Path(__file__).parent / "data" / "row_sparse_layers_704d01e.weights.h5"
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.load_weights(str(path))
    skipped = [str(w.message) for w in caught if "Skipping" in str(w.message)]
    assert skipped == []
    assert len(model.weights) == 11
    for index, variable in enumerate(model.weights):
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(variable.value),
            _saved_value(index, variable),
            variable.path,
        )
