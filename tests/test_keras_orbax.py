"""A step of Keras's own `keras.callbacks.OrbaxCheckpoint`, read by the
package's reader (format `"keras"`): the tables of the row-sparse layers
(`layers.Embedding`, each table of a `layers.StackedEmbedding`) with their
slots by the engine's names, converted to the TPU layouts and loaded back.

The oracle is the model that saved the step: its variables, read through
Keras (`layer.embeddings`, `layer.slots`, `StackedEmbedding.get_table`),
after `fit` with the callback. Runs on the backend of the leg (TensorFlow or
JAX); orbax comes with the `[jax]` extra.
"""

# Runs without TensorFlow.

import json
import shutil

import numpy as np
import pytest
from reader_checks import assert_unknown_names_refused

pytest.importorskip("jax")
pytest.importorskip("orbax.checkpoint")
keras = pytest.importorskip("keras")

import tf_tpu_embed_opt as teo  # noqa: E402
from tf_tpu_embed_opt import checkpoints, cli  # noqa: E402

# `users` is large enough that orbax keeps its rows in the process's data
# files rather than inline in the step's index (the partial-step test).
SINGLE = {"users": (1024, teo.optimizers.Adagrad), "items": (40, "adam")}
STACKED = {"t0": (20, teo.optimizers.Adagrad), "t1": (30, teo.optimizers.Adagrad)}
STACKED_FTRL = {"f": (24, "ftrl")}
DIM = 8
STEPS = 2


def _optimizer(kind):
    if kind == "adam":
        return teo.optimizers.Adam(0.05, lazy=True)
    if kind == "ftrl":
        return teo.optimizers.Ftrl(0.05, lazy=True)
    return kind(0.1)


def _model(seed):
    keras.utils.set_random_seed(seed)
    ids = keras.Input((3,), dtype="int32", name="ids")
    layers = {
        name: teo.layers.Embedding(rows, DIM, optimizer=_optimizer(kind), name=name)
        for name, (rows, kind) in SINGLE.items()
    }
    stacked = [
        teo.layers.Embedding(rows, DIM, optimizer=_optimizer(kind), name=name)
        for name, (rows, kind) in {**STACKED, **STACKED_FTRL}.items()
    ]
    looked = [layers[name](ids % rows) for name, (rows, _) in SINGLE.items()]
    looked += teo.layers.StackedEmbedding(stacked, name="st")(
        [ids % rows for rows, _ in {**STACKED, **STACKED_FTRL}.values()]
    )
    total = keras.layers.Add()(looked)
    net = keras.Model(ids, keras.layers.Dense(1)(keras.layers.Flatten()(total)))
    net.compile(optimizer="sgd", loss="mse")
    return net


def _states(net):
    """Each table's rows and slots (engine names), as Keras holds them."""
    states = {name: _layer_state(net.get_layer(name)) for name in SINGLE}
    stacked = net.get_layer("st")
    for name in {**STACKED, **STACKED_FTRL}:
        states[name] = _engine_names(stacked.get_table(name))
    return states


def _layer_state(layer):
    """A `layers.Embedding`'s table and slots under the engine's names."""
    return {
        "parameters": keras.ops.convert_to_numpy(layer.embeddings.value),
        **{k: keras.ops.convert_to_numpy(v.value) for k, v in layer.slots.items()},
    }


def _engine_names(table):
    """A `StackedEmbedding.get_table` result under the engine's names (its
    `embeddings` as `parameters`)."""
    return {("parameters" if k == "embeddings" else k): v for k, v in table.items()}


def _assert_reads(source, states):
    """Each table `source` reads (a reader, or a mapping of table states)
    holds `states[name]` (engine names), bit for bit."""
    for name, state in states.items():
        read = source[name] if isinstance(source, dict) else source.read(name)
        assert sorted(read) == sorted(state), name
        for key, value in state.items():
            np.testing.assert_array_equal(read[key], value, err_msg=f"{name}/{key}")


def _fit(net, directory, **callback):
    rng = np.random.default_rng(7)
    ids = rng.integers(0, 1024, (16, 3)).astype("int32")
    labels = rng.normal(size=(16, 1)).astype("float32")
    saver = keras.callbacks.OrbaxCheckpoint(str(directory), save_freq=1, **callback)
    net.fit(ids, labels, batch_size=8, epochs=1, callbacks=[saver], verbose=0)


def _restore(net, directory):
    """Keras's restore of the latest step under `directory` into `net`,
    built first (its layers and its optimizer), as Keras needs."""
    net(np.zeros((1, 3), "int32"))
    net.optimizer.build(net.trainable_variables)
    net.load_weights(str(directory))


def _assert_step_refused(ids, total, directory, refusal, optimizer="sgd"):
    """Fits a model of `total` over `ids` with `optimizer`, its steps saved
    under `directory`: opening its last step is refused matching `refusal`."""
    net = keras.Model(ids, keras.layers.Dense(1)(keras.layers.Flatten()(total)))
    net.compile(optimizer=optimizer, loss="mse")
    _fit(net, directory)
    with pytest.raises(ValueError, match=refusal):
        checkpoints.open_checkpoint(directory / str(STEPS))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(the step directory, the model that saved it)."""
    directory = tmp_path_factory.mktemp("keras_orbax") / "run"
    net = _model(1)
    _fit(net, directory)
    return directory / str(STEPS), net


def test_a_keras_step_reads_as_the_tables_of_its_row_sparse_layers(saved):
    step, net = saved
    assert checkpoints.detect_format(step) == "keras"
    source = checkpoints.open_checkpoint(step)
    assert source.format == "keras" and source.row_reads == "caller"
    # The tables' optimizers' step counter, as Keras holds it.
    assert source.step == STEPS == int(net.get_layer("users").optimizer.iterations)
    assert sorted(source.tables) == sorted([*SINGLE, *STACKED, *STACKED_FTRL])
    expected = {"users": "Adagrad", "items": "Adam", "t0": "Adagrad", "f": "FTRL"}
    for name, algorithm in expected.items():
        assert source.algorithm(name).name == algorithm
    assert source.tables["items"].slots == ("momenta", "velocities")
    # Stacked tables are their rows of the stack.
    assert source.layout("t1").row_offset == STACKED["t0"][0]
    assert source.layout("t1").variables["parameters"][-2:] == ("stack_0", "embeddings")
    states = _states(net)
    _assert_reads(source, states)
    for name, state in states.items():
        rows = source.read_rows(name, "parameters", (3, 7))
        np.testing.assert_array_equal(rows, state["parameters"][3:7])
    assert_unknown_names_refused(source, "users")
    assert_unknown_names_refused(source.reader, "users")
    # The reader itself reads no row of the next table of a stack.
    rows = source.tables["t0"].shape[0]
    with pytest.raises(ValueError, match=f"outside its {rows} rows"):
        source.reader.read_rows("t0", "parameters", (rows - 1, rows + 1))
    streamed = source.stream("t1", "accumulators")
    blocks = [values for _, values in streamed.blocks()]
    np.testing.assert_array_equal(np.concatenate(blocks), states["t1"]["accumulators"])


def _converted(step, tmp_path, capsys):
    """`(format, checkpoint)` after `checkpoint convert` of `step` into the
    jax-tpu-embedding layout and, with TensorFlow, `TPUEmbedding`'s; the
    command's output is left in `capsys`."""
    targets = {"jax-tpu-embedding": (tmp_path / "jax", ["--to-jax", "2x4"])}
    try:
        import tensorflow  # noqa: F401
    except ImportError:
        pass
    else:
        targets["tpu-embedding"] = (tmp_path / "tpu" / "ckpt", [])
    for format, (destination, options) in targets.items():
        command = ["checkpoint", "convert", str(step), str(destination), *options]
        assert cli.main(command) == 0, capsys.readouterr().err
        if format == "jax-tpu-embedding":
            destination = destination / str(STEPS)
        yield format, destination


def test_a_keras_step_converts_to_the_tpu_layouts_and_loads_back(
    saved, tmp_path, capsys
):
    """`checkpoint convert` from the Keras step to the jax-tpu-embedding
    layout (and, with TensorFlow, to `TPUEmbedding`'s), then
    `load_into_keras` into a fresh model: every table and slot as saved."""
    step, net = saved
    want = _states(net)
    for format, destination in _converted(step, tmp_path, capsys):
        assert f"step {STEPS}" in capsys.readouterr().out
        converted = checkpoints.open_checkpoint(destination)
        assert converted.format == format
        fresh = _model(2)
        fresh.build((None, 3))
        teo.load_into_keras(converted, fresh, fresh.optimizer)
        for name, state in _states(fresh).items():
            for key, value in state.items():
                np.testing.assert_array_equal(
                    value, want[name][key], err_msg=f"{format}: {name}/{key}"
                )
        # The step the converted checkpoint records, by default.
        assert _steps(fresh) == {"model": STEPS, "tables": {STEPS}}, format


def test_a_keras_step_converts_its_step_to_the_step_path_given(saved, tmp_path, capsys):
    """A Keras step's step is its counters', not a variable: --step-path
    names where DST holds it (it is not read from SRC)."""
    pytest.importorskip("tensorflow")
    step, _ = saved
    destination = tmp_path / "tpu" / "ckpt"
    command = ["checkpoint", "convert", str(step), str(destination)]
    assert cli.main([*command, "--step-path", "global_step"]) == 0
    assert capsys.readouterr().out.endswith(f", step {STEPS} at global_step\n")
    converted = checkpoints.open_checkpoint(str(destination))
    assert (converted.step, converted.read_scalar("global_step")) == (None, STEPS)


def test_a_16_bit_keras_step_converts_to_float32_engine_layouts(tmp_path, capsys):
    """The engines' tables are float32 (TPUEmbedding's restore of another
    dtype fails, jax-tpu-embedding's stacks are float32): `checkpoint
    convert` writes a Keras step of a bfloat16 table as float32, which holds
    each of its values exactly, and says the bytes written."""
    keras.utils.set_random_seed(3)
    ids = keras.Input((3,), dtype="int32")
    layer = teo.layers.Embedding(
        1024, DIM, optimizer=teo.optimizers.Adagrad(0.1), dtype="bfloat16", name="users"
    )
    net = keras.Model(ids, keras.layers.Dense(1)(keras.layers.Flatten()(layer(ids))))
    net.compile(optimizer="sgd", loss="mse")
    _fit(net, tmp_path / "run")
    want = {
        "parameters": keras.ops.convert_to_numpy(layer.embeddings.value),
        "accumulators": keras.ops.convert_to_numpy(layer.slots["accumulators"].value),
    }
    assert {str(v.dtype) for v in want.values()} == {"bfloat16"}
    step = tmp_path / "run" / str(STEPS)
    for format, destination in _converted(step, tmp_path, capsys):
        assert f"1 table, {2 * 1024 * DIM * 4:,} bytes" in capsys.readouterr().out
        read = checkpoints.open_checkpoint(destination).read("users")
        for key, value in want.items():
            assert read[key].dtype == np.float32, (format, key)
            np.testing.assert_array_equal(
                read[key], value.astype(np.float32), err_msg=f"{format}: {key}"
            )


def _steps(net):
    """The model optimizer's step, and each row-sparse table's."""
    tables = {
        int(keras.ops.convert_to_numpy(layer.table_step))
        for layer in net._flatten_layers()
        if isinstance(layer, teo.layers.Embedding) and layer.built
    }
    model = int(keras.ops.convert_to_numpy(net.optimizer.iterations))
    return {"model": model, "tables": tables}


def test_load_into_keras_takes_the_step_the_checkpoint_records(saved):
    """By default the step of the Keras step (its tables' counters) becomes
    the model optimizer's and every table's; `step=` sets another;
    `keep_step=True` (deprecated) leaves them."""
    step, _ = saved
    fresh = _model(2)
    fresh.build((None, 3))
    teo.load_into_keras(step, fresh, fresh.optimizer)
    assert _steps(fresh) == {"model": STEPS, "tables": {STEPS}}
    teo.load_into_keras(step, fresh, fresh.optimizer, step=11)
    assert _steps(fresh) == {"model": 11, "tables": {11}}
    with pytest.warns(DeprecationWarning, match=r"keep_step=True\) leaves") as record:
        teo.load_into_keras(step, fresh, fresh.optimizer, keep_step=True)
    # Attributed to the caller's line, where the argument is to go.
    ours = [w for w in record if "keep_step=True" in str(w.message)]
    assert [w.filename for w in ours] == [__file__]
    assert _steps(fresh) == {"model": 11, "tables": {11}}
    with pytest.raises(ValueError, match="`keep_step=True` keeps .* and `step` sets"):
        teo.load_into_keras(step, fresh, fresh.optimizer, keep_step=True, step=3)
    with pytest.raises(TypeError, match="`keep_step` must be True or False; .*'yes'"):
        teo.load_into_keras(step, fresh, fresh.optimizer, keep_step="yes")


def test_a_step_whose_tables_counted_apart_is_refused_by_default(tmp_path):
    """A Keras step whose tables' step counters differ records no one step:
    loading it without `step=` is refused, naming each counter."""
    net = _model(1)
    net.build((None, 3))
    net.get_layer("users").set_table_step(40)
    _fit(net, tmp_path / "run")
    step = tmp_path / "run" / str(STEPS)
    assert checkpoints.open_checkpoint(step).step is None
    assert checkpoints.open_checkpoint(step).reader.steps["users"] == 42
    fresh = _model(2)
    fresh.build((None, 3))
    counters = (
        r"\(items: 2, st/stack_0: 2, st/stack_1: 2, users: 42, "
        r"model optimizer sgd\w*: 2\)"
    )
    with pytest.raises(ValueError, match="records no one step: .*" + counters):
        teo.load_into_keras(step, fresh, fresh.optimizer)
    teo.load_into_keras(step, fresh, fresh.optimizer, step=42)
    assert _steps(fresh) == {"model": 42, "tables": {42}}


def _mixed_float16_model(seed):
    """A row-sparse table under `mixed_float16`: `compile` wraps the model's
    optimizer in a LossScaleOptimizer."""
    policy = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_float16")
    try:
        keras.utils.set_random_seed(seed)
        ids = keras.Input((3,), dtype="int32")
        table = teo.layers.Embedding(
            40, DIM, optimizer=teo.optimizers.Adagrad(0.1), name="t", dtype="float32"
        )
        out = keras.layers.Dense(1)(keras.layers.Flatten()(table(ids % 40)))
        net = keras.Model(ids, out)
        net.compile(optimizer="sgd", loss="mse")
    finally:
        keras.config.set_dtype_policy(policy)
    return net


def test_a_mixed_float16_step_records_its_step(tmp_path):
    """The LossScaleOptimizer saves an `iteration` of its own that it never
    steps (its `iterations` are the inner optimizer's): counted as a model
    optimizer's step, it made the step record none (its 0 against the
    others'), and load_into_keras left every step as it was."""
    net = _mixed_float16_model(1)
    assert isinstance(net.optimizer, keras.optimizers.LossScaleOptimizer)
    _fit(net, tmp_path / "run")
    want = int(keras.ops.convert_to_numpy(net.optimizer.iterations))
    assert want > 0
    (step,) = (tmp_path / "run").iterdir()
    opened = checkpoints.open_checkpoint(step)
    assert opened.step == want
    assert sorted(opened.reader.steps.values()) == [want, want]
    fresh = _mixed_float16_model(2)
    fresh.build((None, 3))
    teo.load_into_keras(step, fresh, fresh.optimizer)
    assert int(keras.ops.convert_to_numpy(fresh.optimizer.iterations)) == want
    assert int(keras.ops.convert_to_numpy(fresh.get_layer("t").table_step)) == want


def test_a_table_that_two_features_read_is_one_table_of_the_step(tmp_path):
    """A `StackedEmbedding` holding one table under two features: the step's
    config names it twice, the reader finds one table "items" (its rows of
    the stack) beside "users", as the model holds them."""
    keras.utils.set_random_seed(3)
    items, users = (
        teo.layers.Embedding(rows, DIM, optimizer=_optimizer(kind), name=name)
        for name, rows, kind in (("items", 40, "adam"), ("users", 30, "adam"))
    )
    layer = teo.layers.StackedEmbedding(
        {"hist": items, "user": users, "target": items}, name="st"
    )
    ids = keras.Input((3,), dtype="int32", name="ids")
    looked = layer({"hist": ids % 40, "user": ids % 30, "target": (ids * 7) % 40})
    total = keras.layers.Add()(list(looked.values()))
    net = keras.Model(ids, keras.layers.Dense(1)(keras.layers.Flatten()(total)))
    net.compile(optimizer="sgd", loss="mse")
    _fit(net, tmp_path / "run")
    opened = checkpoints.open_checkpoint(tmp_path / "run" / str(STEPS))
    assert sorted(opened.tables) == ["items", "users"]
    _assert_reads(opened, {n: _engine_names(layer.get_table(n)) for n in opened.tables})


class _Ranker(keras.Model):
    """A subclassed model keeping its tables as attributes, as models keep
    their layers: its config holds its constructor's arguments, not them."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.users = teo.layers.Embedding(
            30, DIM, optimizer=_optimizer(teo.optimizers.Adagrad), name="users"
        )
        self.items = teo.layers.Embedding(
            40, DIM, optimizer=_optimizer("adam"), name="items"
        )
        self.stacked = teo.layers.StackedEmbedding(
            {"hist": self.items, "target": self.items}, name="st"
        )
        self.head = keras.layers.Dense(1, name="head")

    def call(self, ids, training=None):
        looked = {"hist": ids % 40, "target": (ids * 7) % 40}
        rows = self.stacked(looked, training=training)
        total = self.users(ids % 30, training=training) + rows["hist"] + rows["target"]
        return self.head(keras.ops.reshape(total, (-1, 3 * DIM)))


def test_a_subclassed_models_step_is_refused_saying_how_to_read_it(tmp_path):
    """Its config does not say which variables are tables: refused (it read
    "whose model has no table", which was false), and the way the message
    gives reads every table and slot as the model that saved them holds
    them."""
    keras.utils.set_random_seed(4)
    net = _Ranker(name="ranker")
    net.compile(optimizer="sgd", loss="mse")
    _fit(net, tmp_path / "run")
    step = tmp_path / "run" / str(STEPS)
    refusal = (
        r"holds row-sparse tables \(at \['ranker/st/stack_0', 'ranker/users'\]\)"
        r" that its model config does not list: .*"
        r"model.load_weights\(directory\).*keras_tables\(model, None, names\)"
    )
    with pytest.raises(ValueError, match=refusal):
        checkpoints.open_checkpoint(step)
    fresh = _Ranker(name="ranker")
    fresh.compile(optimizer="sgd", loss="mse")
    _restore(fresh, tmp_path / "run")
    kt = checkpoints.keras.tables
    states = dict(
        kt.keras_table_states(kt.keras_tables(fresh, None, ["users", "items"]))
    )
    assert sorted(states) == ["items", "users"]
    want = {"users": _layer_state(net.users)}
    want["items"] = _engine_names(net.stacked.get_table("items"))
    _assert_reads(states, want)


class _Tower(keras.layers.Layer):
    """A layer keeping a table as an attribute: its config, its
    constructor's arguments, does not list it."""

    def __init__(self, kind="Adagrad", **kwargs):
        super().__init__(**kwargs)
        optimizer = getattr(teo.optimizers, kind)(0.1)
        self.items = teo.layers.Embedding(40, DIM, optimizer=optimizer, name="items")

    def call(self, ids, training=None):
        return self.items(ids % 40, training=training)


@pytest.mark.parametrize("kind", ["Adagrad", "SGD"])
def test_a_step_whose_config_lists_some_of_its_tables_is_refused(kind, tmp_path):
    """A functional model whose config lists `users` but not the table a
    layer of its own keeps: the reader read `users` alone, so `checkpoint
    convert` would write a TPU checkpoint without `items`, without a word.
    Also where that table has no slot (SGD): its layer's node of the state
    holds its `embeddings` and `step` alone."""
    ids = keras.Input((3,), dtype="int32", name="ids")
    users = teo.layers.Embedding(30, DIM, optimizer=_optimizer("adam"), name="users")
    total = keras.layers.Add()([users(ids % 30), _Tower(kind, name="tower")(ids)])
    refusal = (
        r"holds row-sparse tables \(at \['tower/items'\]\) that its model "
        r"config does not list: .*its other tables alone would leave these out"
    )
    _assert_step_refused(ids, total, tmp_path / "run", refusal)


@pytest.mark.parametrize("stack", [False, True], ids=["tables", "stacked"])
def test_a_step_of_keras_rs_tables_made_row_sparse_reads_and_converts(
    stack, tmp_path, capsys
):
    """keras-rs's `DistributedEmbedding` after `row_sparse_tables` (its
    config holds its feature configs; its row-sparse layers, a table each or
    a stack, are its sublayers): the step was refused as "whose model has no
    table"; each table now reads with its slots as the model holds it, and
    converts to the TPU layouts."""
    keras_rs = pytest.importorskip("keras_rs")
    features = {}
    for name, rows in (("t", 40), ("u", 24)):
        table = keras_rs.layers.TableConfig(
            name=name,
            vocabulary_size=rows,
            embedding_dim=DIM,
            optimizer=_optimizer(teo.optimizers.Adagrad),
            placement="default_device",
        )
        features[name] = keras_rs.layers.FeatureConfig(
            name=name, table=table, input_shape=(8, 3), output_shape=(8, DIM)
        )
    layer = teo.layers.row_sparse_tables(
        keras_rs.layers.DistributedEmbedding(features, name="rs"), stack=stack
    )
    ids = keras.Input((3,), batch_size=8, dtype="int32", name="ids")
    looked = layer({"t": ids % 40, "u": ids % 24})
    total = keras.layers.Add()([looked["t"], looked["u"]])
    net = keras.Model(ids, keras.layers.Dense(1)(total))
    net.compile(optimizer="sgd", loss="mse")
    _fit(net, tmp_path / "run")
    if stack:
        want = {
            n: _engine_names(layer.default_device_stacks.get_table(n)) for n in "tu"
        }
    else:
        tables = {t.name: t for t in layer._flatten_layers(include_self=False)}
        want = {n: _layer_state(tables[n]) for n in "tu"}
    step = tmp_path / "run" / str(STEPS)
    source = checkpoints.open_checkpoint(step)
    assert source.format == "keras" and source.step == STEPS
    assert sorted(source.tables) == ["t", "u"]
    _assert_reads(source, want)
    for format, destination in _converted(step, tmp_path, capsys):
        _assert_reads(checkpoints.open_checkpoint(destination), want)


def _two_rates_model():
    ids = keras.Input((3,), dtype="int32", name="ids")
    tables = [
        teo.layers.Embedding(40, DIM, optimizer=teo.optimizers.Adagrad(rate), name=name)
        for name, rate in (("a", 0.1), ("b", 0.5))
    ]
    total = keras.layers.Add()([table(ids % 40) for table in tables])
    head = keras.layers.Dense(1, name="head")(keras.layers.Flatten()(total))
    net = keras.Model(ids, head, name="rates")
    net.compile(optimizer="sgd", loss="mse")
    return net


def test_a_restored_step_gives_each_table_its_own_learning_rate(tmp_path):
    """The table optimizer's learning rate is the layer's variable
    (`a/learning_rate`): under the optimizer's generated name
    (`adagrad_3/learning_rate`) a restore keyed by path, in a process that
    had made one more optimizer, gave table `a` table `b`'s rate (measured:
    0.5 for 0.1) or left a rate set since at its initial value."""
    net = _two_rates_model()
    net.get_layer("a").optimizer.learning_rate = 0.03
    _fit(net, tmp_path / "run")
    assert "a/learning_rate" in [w.path for w in net.get_layer("a").weights]
    teo.optimizers.Adagrad(0.2)  # one more, as the restoring process may make
    fresh = _two_rates_model()
    _restore(fresh, tmp_path / "run")
    for name, rate in (("a", 0.03), ("b", 0.5)):
        restored = keras.ops.convert_to_numpy(
            fresh.get_layer(name).optimizer.learning_rate
        )
        assert restored == np.float32(rate), name


def test_tables_sharing_an_optimizer_share_its_rate_under_the_first():
    """One optimizer object for two tables: one rate, named under the first
    table built; the optimizer keeps its variables (TensorFlow's
    checkpoints track that list, which must only grow)."""
    shared = teo.optimizers.Adagrad(0.1)
    before = list(shared.variables)
    ids = keras.Input((3,), dtype="int32", name="ids")
    a, b = (teo.layers.Embedding(40, DIM, optimizer=shared, name=n) for n in "ab")
    total = keras.layers.Add()([a(ids), b(ids)])
    net = keras.Model(ids, keras.layers.Flatten()(total))
    paths = [w.path for w in net.weights]
    assert "a/learning_rate" in paths and "b/learning_rate" not in paths
    assert [id(v) for v in shared.variables] == [id(v) for v in before]


def test_inspect_describes_a_keras_step(saved, capsys):
    step, _ = saved
    assert cli.main(["checkpoint", "inspect", str(step)]) == 0
    out = capsys.readouterr().out
    assert (
        "keras.callbacks.OrbaxCheckpoint step; the tables of the row-sparse "
        f"layers, step {STEPS}"
    ) in out
    assert "users  1024 x 8  float32  accumulators           Adagrad" in out
    assert "f      24 x 8    float32  accumulators, linears  FTRL" in out
    document = checkpoints.describe_checkpoint(step)
    assert document["format"] == "keras" and document["step"] == STEPS
    by_name = {table["table"]: table for table in document["tables"]}
    assert by_name["t1"]["row_offset"] == 20
    assert by_name["t1"]["layer"] == "trainable_variables/st/stack_0"
    assert document["bytes"] == sum(t["bytes"] for t in document["tables"])


def test_a_keras_step_named_relative_to_the_working_directory(saved, monkeypatch):
    """Orbax reads no metadata at a relative path: the step was taken for a
    damaged one."""
    step, net = saved
    monkeypatch.chdir(step.parent.parent)
    relative = f"{step.parent.name}/{step.name}"
    source = checkpoints.open_checkpoint(relative)
    assert source.format == "keras"
    np.testing.assert_array_equal(
        source.read("users")["parameters"], _states(net)["users"]["parameters"]
    )
    assert cli.main(["checkpoint", "inspect", relative]) == 0


def test_a_keras_step_reads_a_scalar_by_its_state_tree_path(saved):
    """`read_scalar` takes a path of `Model.get_state_tree` (the model
    optimizer's step here); a path that holds no variable is refused,
    naming it and the form of the paths."""
    step, net = saved
    source = checkpoints.open_checkpoint(step)
    path = f"optimizer_variables/{net.optimizer.name}/iteration"
    assert int(source.read_scalar(path)) == int(net.optimizer.iterations) == STEPS
    with pytest.raises(
        ValueError,
        match=r"has no variable 'optimizer_variables/nope' \(paths as in "
        r"Model\.get_state_tree, e\.g\. non_trainable_variables/<optimizer>/",
    ):
        source.read_scalar("optimizer_variables/nope")


def test_a_partial_keras_step_is_refused_naming_the_table(saved, tmp_path):
    """A step without one process's data files (here the only process's) is
    refused when a table is read, naming it; nothing is filled in."""
    step, _ = saved
    partial = tmp_path / str(STEPS)
    shutil.copytree(step, partial)
    shutil.rmtree(partial / "pytree" / "ocdbt.process_0")
    source = checkpoints.open_checkpoint(partial)
    refused = r"Table 'users', parameters: cannot be read .* partial"
    with pytest.raises(ValueError, match=refused):
        source.read("users")


@pytest.mark.parametrize(
    "drop, refusal",
    [
        (
            ("trainable_variables", "users", "accumulator"),
            r"Table 'users': trainable_variables/users/accumulator is not in .*, "
            r"although its layer's optimizer \(Adagrad\) keeps it\.",
        ),
        (
            ("trainable_variables", "users", "embeddings"),
            r"the model config has the row-sparse layer 'users', whose variables "
            r"\(`users/embeddings`\) are found 0 times in the step's state: \[\]\.",
        ),
    ],
    ids=["slot-missing", "layer-missing"],
)
def test_a_step_whose_state_lacks_what_its_config_names_is_refused(
    saved, tmp_path, drop, refusal
):
    """The model config names each row-sparse layer and its optimizer; the
    step's state (its metadata's key paths, one dropped here) must hold the
    layer's variables and every slot the optimizer keeps. (Keras itself
    refuses to save a model holding a variable path twice.)"""
    step, _ = saved
    edited = tmp_path / str(STEPS)
    shutil.copytree(step, edited)
    metadata_file = edited / "pytree" / "_METADATA"
    metadata = json.loads(metadata_file.read_text())
    del metadata["tree_metadata"][str(drop)]
    metadata_file.write_text(json.dumps(metadata))
    with pytest.raises(ValueError, match=refusal):
        checkpoints.open_checkpoint(edited)


def test_a_keras_step_without_its_model_config_is_refused(tmp_path):
    net = _model(3)
    _fit(net, tmp_path / "weights", save_weights_only=True)
    step = tmp_path / "weights" / str(STEPS)
    assert checkpoints.detect_format(step) == "keras"
    with pytest.raises(ValueError, match="save_weights_only=True"):
        checkpoints.open_checkpoint(step)


def test_a_keras_step_takes_no_layout_argument(saved):
    step, _ = saved
    with pytest.raises(ValueError, match="a keras checkpoint, which takes none"):
        checkpoints.open_checkpoint(step, embedding_spec=object())


def test_a_keras_step_without_row_sparse_tables_is_refused(tmp_path):
    ids = keras.Input((3,), dtype="int32")
    looked = keras.layers.Embedding(1024, DIM, name="plain")(ids)
    refusal = "no table of the package's row-sparse"
    _assert_step_refused(ids, looked, tmp_path / "plain", refusal, "adagrad")


def test_a_keras_step_of_two_tables_named_alike_is_refused(tmp_path):
    """A stacked table and a table of the model named alike (Keras names
    their variables apart, `st/stack_0/...` and `items/...`): the engines
    name tables uniquely, so the step is refused naming both places."""
    ids = keras.Input((3,), dtype="int32")
    items, users = (
        teo.layers.Embedding(30, DIM, optimizer=_optimizer("adam"), name=name)
        for name in ("items", "users")
    )
    looked = teo.layers.StackedEmbedding([items, users], name="st")([ids % 30] * 2)
    alike = teo.layers.Embedding(20, DIM, optimizer=_optimizer("adam"), name="items")
    total = keras.layers.Add()([alike(ids % 20), *looked])
    refusal = (
        r"two tables are named 'items' \(trainable_variables/items and "
        r"trainable_variables/st/stack_0\); the engines name tables uniquely"
    )
    _assert_step_refused(ids, total, tmp_path / "run", refusal)


def _row_wise_16_bit_model(seed):
    """A float16 `RowWiseAdagrad` table and a stack of two bfloat16 ones:
    tables of 16 bits, each with a float32 state of one value per row."""
    keras.utils.set_random_seed(seed)
    ids = keras.Input((3,), dtype="int32")
    single = teo.layers.Embedding(
        64, DIM, optimizer=teo.optimizers.RowWiseAdagrad(0.1), name="h", dtype="float16"
    )
    parts = [
        teo.layers.Embedding(
            rows,
            DIM,
            optimizer=teo.optimizers.RowWiseAdagrad(0.1),
            name=name,
            dtype="bfloat16",
        )
        for name, rows in (("b0", 20), ("b1", 30))
    ]
    looked = [single(ids % 64)] + teo.layers.StackedEmbedding(parts, name="st16")(
        [ids % 20, ids % 30]
    )
    total = keras.layers.Add()([keras.ops.cast(v, "float32") for v in looked])
    net = keras.Model(ids, keras.layers.Dense(1)(keras.layers.Flatten()(total)))
    net.compile(optimizer="sgd", loss="mse")
    return net


def test_16_bit_row_wise_tables_keep_their_float32_state_through_a_step(tmp_path):
    """A Keras step of 16-bit `RowWiseAdagrad` tables holds each table in its
    dtype and its state in float32, and loads back into another model bit
    for bit."""
    net = _row_wise_16_bit_model(1)
    _fit(net, tmp_path / "run")
    step = checkpoints.open_checkpoint(str(tmp_path / "run" / str(STEPS)))
    assert {n: (i.dtype, dict(i.slot_dtypes)) for n, i in step.tables.items()} == {
        "h": ("float16", {"momentum1": "float32"}),
        "b0": ("bfloat16", {"momentum1": "float32"}),
        "b1": ("bfloat16", {"momentum1": "float32"}),
    }
    other = _row_wise_16_bit_model(2)
    teo.load_into_keras(step, other, None)

    def state(model):
        single, stack = model.get_layer("h"), model.get_layer("st16")
        found = [keras.ops.convert_to_numpy(w).tobytes() for w in single.weights]
        for name in ("b0", "b1"):
            table = stack.get_table(name)
            found += [np.asarray(table[key]).tobytes() for key in sorted(table)]
        return found

    assert state(other) == state(net)


@pytest.mark.parametrize(
    "groups, keras_step",
    [
        (("trainable_variables", "non_trainable_variables"), True),
        (("trainable_variables",), True),
        # Only frozen variables (Keras 3.15 names both groups even then).
        (("non_trainable_variables",), True),
        (("params", "opt_state"), False),
    ],
)
def test_a_keras_step_is_told_by_either_group_of_layer_variables(
    tmp_path, groups, keras_step
):
    """The item's metadata names its tree's key paths; a step holding only
    non-trainable layer variables is a Keras step too (the metadata was
    read once per group, so only the first group was ever looked for)."""
    from tf_tpu_embed_opt.checkpoints.keras import orbax_reader

    (tmp_path / "pytree").mkdir()
    tree = {f"('{group}', 'users', 'embeddings')": {} for group in groups}
    (tmp_path / "pytree" / "_METADATA").write_text(json.dumps({"tree_metadata": tree}))
    assert orbax_reader.is_keras_step(str(tmp_path)) is keras_step
