"""RowWiseAdagrad against FBGEMM's CPU kernels (issue #54).

`tests/data/fbgemm_golden.npz` holds what FBGEMM 1.9.0's own
`EXACT_ROWWISE_ADAGRAD` computed over 120 steps (`tests/fbgemm_golden.py`;
docs/tpu_semantics.md, "FBGEMM"). The Keras class, fed the same lookups as
row-sparse gradients, ends with the same float32 bits where FBGEMM applies no
weight decay (every pooled run: its pooled CPU kernel leaves the decay out;
unpooled runs without decay), and within a derived bound where FBGEMM fuses
the decayed update into one rounding.
"""

# Runs without TensorFlow.

import dataclasses
import importlib.util

import fbgemm_inputs
import fbgemm_reference
import keras
import ml_dtypes
import numpy as np
import pytest
from conftest import keras_face, keras_rs_or_skip
from keras import ops

import tf_tpu_embed_opt as teo
from tf_tpu_embed_opt.definitions import registry

# Keras's own variables from NumPy arrays warn under NumPy 2 (any optimizer).
pytestmark = pytest.mark.filterwarnings(
    "ignore:__array__ implementation:DeprecationWarning"
)
# FBGEMM's float32 tables and its FP16 ones (TorchRec's), which it steps in
# float32 with float32 state, as the class does (`NarrowTables`).
ROWWISE = [c for c in fbgemm_inputs.CONFIGS if c.optimizer == "EXACT_ROWWISE_ADAGRAD"]


def _dtype(config):
    """The table's dtype by name (`fbgemm_inputs.table_dtype`)."""
    return np.dtype(fbgemm_inputs.table_dtype(config)).name


BACKEND = keras.backend.backend()


@pytest.fixture(scope="module")
def golden():
    import pathlib

    path = pathlib.Path(__file__).resolve().parent / "data" / "fbgemm_golden.npz"
    with np.load(path) as data:
        return {name: data[name] for name in data.files}


def _optimizer(config):
    arguments = dict(
        learning_rate=config.learning_rate,
        epsilon=config.eps,
        sum_in_lanes=config.pooled,
    )
    if not config.pooled:  # FBGEMM's pooled CPU kernel applies no decay
        if config.weight_decay_mode == "L2":
            arguments["l2_regularization_strength"] = config.weight_decay
        elif config.weight_decay_mode == "DECOUPLE":
            arguments["decoupled_weight_decay"] = config.weight_decay
    return teo.optimizers.RowWiseAdagrad(**arguments)


def _lookups(config, ids, offsets, gradient):
    """Each lookup's id and output gradient, in lookup order."""
    bags = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    return ids, (gradient[bags] if config.pooled else gradient)


def _steps(config):
    """All the steps for dim 128, the first 10 for the others (the golden
    data records both): the arithmetic is the same for every dim, and the
    suite's time is kept for the runs that test a long accumulation."""
    return fbgemm_inputs.STEPS if config.dim == 128 else 10


def _train(config, sparse):
    optimizer = _optimizer(config)
    table = keras.Variable(fbgemm_inputs.initial_table(config), dtype=_dtype(config))
    optimizer.build([table])

    def apply(grad):
        optimizer.apply_gradients([(grad, table)])

    if BACKEND == "tensorflow":
        import tensorflow as tf

        # One graph for every step (the ids' count varies): as `fit` runs.
        apply = tf.function(apply, reduce_retracing=True)
    steps = fbgemm_inputs.steps(config)
    for _, (ids, offsets, gradient) in zip(range(_steps(config)), steps):
        ids, rows = _lookups(config, ids, offsets, gradient)
        if sparse:
            grad = tf.IndexedSlices(
                tf.constant(rows), tf.constant(ids), tf.constant(table.shape)
            )
        else:
            # Duplicates summed in lookup order, as FBGEMM and the sparse
            # path sum them.
            dense = np.zeros(table.shape, np.float32)
            np.add.at(dense, ids, rows)
            grad = ops.convert_to_tensor(dense)
        apply(grad)
    state = ops.convert_to_numpy(optimizer._accumulators[0])
    assert state.dtype == np.float32  # an FP16 table's too, as FBGEMM's
    # The FP16 table's values, exactly, as float32 (how the golden data
    # holds them).
    return ops.convert_to_numpy(table).astype(np.float32), state


def _assert_as_fbgemm(config, table, state, golden, fused=False):
    """`fused`: XLA on CPU computed the step (JAX's compiled training step),
    which fuses w − mult·g into one multiply-add."""
    prefix = f"{config.name}/step{_steps(config)}"
    np.testing.assert_array_equal(state[:, 0], golden[f"{prefix}/state0"])
    if not fused and (config.pooled or config.weight_decay_mode == "NONE"):
        np.testing.assert_array_equal(table, golden[f"{prefix}/table"])
        return
    # FBGEMM writes fma(c, w, -g·mult), one rounding; the class c·w - g·mult,
    # two (or, fused by XLA, FBGEMM two and the class one): one rounding more
    # or less per step, at most an ulp of max|w|. The
    # step's factor c <= 1 does not grow an earlier difference, and the state
    # (checked above) is the same bits, so after N steps the tables differ
    # by at most N ulps of the table's largest magnitude. A 16-bit table's
    # new rows round to its dtype after the float32 step: a float32 ulp
    # apart before it, they round at most one ulp of that dtype apart, which
    # the next steps carry as they carry a float32 one.
    expected = golden[f"{prefix}/table"]
    largest = np.abs(expected).max()
    eps = float(ml_dtypes.finfo(_dtype(config)).eps)
    bound = _steps(config) * eps * 2.0 ** np.floor(np.log2(largest))
    np.testing.assert_allclose(table, expected, rtol=0, atol=bound)


@keras_face
@pytest.mark.parametrize("config", ROWWISE, ids=[c.name for c in ROWWISE])
def test_row_sparse_gradients_step_as_fbgemm(config, golden):
    if BACKEND != "tensorflow":
        pytest.skip("tf.IndexedSlices: Keras's TensorFlow backend")
    _assert_as_fbgemm(config, *_train(config, sparse=True), golden)


@keras_face
@pytest.mark.parametrize(
    "config",
    [c for c in ROWWISE if c.weight_decay_mode == "NONE"],
    ids=lambda c: c.name,
)
def test_dense_gradients_step_as_fbgemm_on_every_backend(config, golden):
    """Without decay a row with no gradient does not move (w − 0·mult), so
    the dense gradient's step is FBGEMM's lazy one."""
    _assert_as_fbgemm(config, *_train(config, sparse=False), golden)


def test_state_is_one_float_per_row():
    table = keras.Variable(np.zeros((1000, 64), np.float32))
    optimizer = teo.optimizers.RowWiseAdagrad(0.1)
    optimizer.build([table])
    (slot,) = optimizer._accumulators
    assert tuple(slot.shape) == (1000, 1)
    assert slot.path.endswith("accumulator")


def test_a_variable_without_rows_is_refused_by_name():
    optimizer = teo.optimizers.RowWiseAdagrad(0.1)
    with pytest.raises(ValueError, match=r"one value per row.*shape \(4,\)"):
        optimizer.build([keras.Variable(np.zeros(4, np.float32), name="bias")])


# FBGEMM has no CPU kernel for a BF16 table: the FP16 runs' lookups on a
# bfloat16 table, held to the transcription (`fbgemm_reference`, bit for bit
# against FBGEMM's FP16 runs) with bfloat16 rounding.
BF16 = [
    dataclasses.replace(c, precision="BF16") for c in ROWWISE if c.precision == "FP16"
]


@keras_face
@pytest.mark.parametrize("sparse", [True, False], ids=["sparse", "dense"])
@pytest.mark.parametrize("config", BF16, ids=[c.name for c in BF16])
def test_a_bfloat16_table_steps_in_float32_as_an_fp16_one(config, sparse):
    """A bfloat16 table steps as FBGEMM steps an FP16 one: in float32, with
    float32 state, the squares summed in order on the pooled path too, only
    the new rows rounded (to nearest). In bfloat16 its 8-bit state would
    soon stop growing."""
    if sparse and BACKEND != "tensorflow":
        pytest.skip("tf.IndexedSlices: Keras's TensorFlow backend")
    table, state = _train(config, sparse)
    found = fbgemm_reference.run(config, recorded=(_steps(config),))
    expected_table, expected_state = found[_steps(config)]
    np.testing.assert_array_equal(state[:, 0], expected_state)
    np.testing.assert_array_equal(table, expected_table)


@keras_face
def test_a_float8_table_is_refused_by_name():
    """FBGEMM's row-wise step has no float8 table, and in float8 the state
    would not hold a mean square: refused before any variable is made."""
    table = keras.Variable(np.zeros((10, 4)), dtype="float8_e4m3fn", name="words")
    optimizer = teo.optimizers.RowWiseAdagrad(0.1)
    before = list(optimizer.variables)  # its step counter and learning rate
    with pytest.raises(
        ValueError,
        match=r"^RowWiseAdagrad: table 'words' is float8_e4m3fn; RowWiseAdagrad "
        r"steps tables of float32 or wider, and float16 or bfloat16 ones in "
        "float32 with float32 state",
    ):
        optimizer.build([table])
    assert not optimizer.built and optimizer.variables == before


@keras_face
@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16", "float64"])
def test_a_table_of_float32_or_wider_variables_steps(policy):
    layer = teo.layers.Embedding(
        10, 4, optimizer=teo.optimizers.RowWiseAdagrad(0.1), dtype=policy
    )
    layer.build()
    assert layer.embeddings.dtype == ("float64" if policy == "float64" else "float32")
    table = keras.Variable(np.ones((10, 4)), dtype=layer.embeddings.dtype)
    optimizer = teo.optimizers.RowWiseAdagrad(0.1)
    optimizer.apply([ops.ones((10, 4), table.dtype)], [table])
    (slot,) = optimizer._accumulators
    assert slot.dtype == table.dtype
    np.testing.assert_array_equal(ops.convert_to_numpy(slot), np.ones((10, 1)))


def test_no_engine_runs_it_and_says_why():
    definition = registry.BY_NAME["RowWiseAdagrad"]
    assert definition in registry.KERAS_ONLY
    assert "one value per row" in definition.engine_refusal
    engines = ["jax-tpu-embedding"]
    if importlib.util.find_spec("tensorflow") is not None:
        engines += ["TPUEmbedding", "TPUEmbeddingV2"]
    for engine in engines:
        with pytest.raises(TypeError, match="RowWiseAdagrad.*one value per row"):
            teo.to_embedding(teo.optimizers.RowWiseAdagrad(0.1), engine=engine)


@pytest.mark.parametrize(
    "arguments, fragments",
    [
        ({"epsilon": 0.0, "initial_accumulator_value": 0.0}, ["cannot both be 0"]),
        (
            {"l2_regularization_strength": 0.1, "decoupled_weight_decay": 0.1},
            ["Set at most one", "WeightDecayMode.L2"],
        ),
        ({"epsilon": -1.0}, [">= 0", "-1.0"]),
        ({"sum_in_lanes": 1}, ["True or False", "not a bool"]),
    ],
)
def test_bad_arguments_are_refused_by_name(arguments, fragments):
    with pytest.raises((TypeError, ValueError)) as raised:
        teo.optimizers.RowWiseAdagrad(**arguments)
    for fragment in [*arguments, *fragments]:
        assert fragment in str(raised.value)


def test_config_round_trip():
    optimizer = teo.optimizers.RowWiseAdagrad(
        0.05, epsilon=1e-6, decoupled_weight_decay=0.01, sum_in_lanes=False
    )
    clone = teo.optimizers.RowWiseAdagrad.from_config(optimizer.get_config())
    assert clone.get_config() == optimizer.get_config()
    assert repr(optimizer) == (
        "RowWiseAdagrad(learning_rate=0.05, epsilon=1e-06, "
        "decoupled_weight_decay=0.01, sum_in_lanes=False)"
    )


def test_keras_embedding_trains_with_it_through_a_multi_optimizer():
    """The tables get the row-wise optimizer, the dense layers another."""
    model = keras.Sequential(
        [
            keras.Input((3,), dtype="int32"),
            keras.layers.Embedding(50, 8, name="table"),
            keras.layers.Flatten(),
            keras.layers.Dense(1),
        ]
    )
    table = model.get_layer("table").embeddings
    if not hasattr(keras.optimizers, "MultiOptimizer"):
        pytest.skip("keras.optimizers.MultiOptimizer: Keras 3.15 and later")
    optimizer = keras.optimizers.MultiOptimizer(
        keras.optimizers.OptimizerMap(
            keras.optimizers.Adam(0.01),
            {table.path: teo.optimizers.RowWiseAdagrad(0.1)},
        )
    )
    model.compile(optimizer=optimizer, loss="mse")
    rng = np.random.default_rng(3)
    x = rng.integers(0, 20, size=(64, 3)).astype("int32")
    y = x.sum(axis=1, keepdims=True).astype("float32") / 30.0
    before = ops.convert_to_numpy(table).copy()
    history = model.fit(x, y, epochs=2, batch_size=16, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    after = ops.convert_to_numpy(table)
    # Rows never looked up do not move (no decay): 20..49.
    np.testing.assert_array_equal(after[20:], before[20:])
    assert not np.array_equal(after[:20], before[:20])


SGD = [c for c in fbgemm_inputs.CONFIGS if c.optimizer == "EXACT_SGD"]


@keras_face
@pytest.mark.parametrize("config", SGD, ids=[c.name for c in SGD])
def test_sgd_steps_as_fbgemm_exact_sgd_to_its_fused_rounding(config, golden):
    """FBGEMM's `EXACT_SGD` writes fma(−η, g, w), one rounding; `SGD`
    w − fl(η·g), two: at most an ulp of max|w| more per step, and SGD adds
    nothing to an earlier difference, so N ulps after N steps."""
    if BACKEND != "tensorflow":
        pytest.skip("tf.IndexedSlices: Keras's TensorFlow backend")
    import tensorflow as tf

    optimizer = teo.optimizers.SGD(config.learning_rate)
    table = keras.Variable(fbgemm_inputs.initial_table(config))
    optimizer.build([table])
    apply = tf.function(
        lambda grad: optimizer.apply_gradients([(grad, table)]),
        reduce_retracing=True,
    )
    steps = fbgemm_inputs.steps(config)
    for _, (ids, offsets, gradient) in zip(range(_steps(config)), steps):
        ids, rows = _lookups(config, ids, offsets, gradient)
        shape = tf.constant(table.shape)
        apply(tf.IndexedSlices(tf.constant(rows), tf.constant(ids), shape))
    expected = golden[f"{config.name}/step{_steps(config)}/table"]
    bound = _steps(config) * np.spacing(np.float32(np.abs(expected).max()))
    np.testing.assert_allclose(
        ops.convert_to_numpy(table), expected, rtol=0, atol=bound
    )


def test_describe_says_what_the_state_costs(capsys):
    from tf_tpu_embed_opt import cli

    argv = ["describe", "rowwiseadagrad", "--vocabulary-size", "1000000", "--dim", "64"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "accumulator  [rows, 1]" in out
    assert "slots  3.8 MiB (0.0156x the table)" in out
    assert "No engine runs RowWiseAdagrad" in out and "one value per row" in out


def test_an_engine_checkpoint_refuses_its_state_by_name(tmp_path):
    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("TPUEmbedding's checkpoint needs TensorFlow")
    table = keras.Variable(np.zeros((5, 4), np.float32), name="t")
    optimizer = teo.optimizers.RowWiseAdagrad(0.1)
    optimizer.build([table])
    with pytest.raises(
        ValueError, match=r"Table 't'.*RowWiseAdagrad.*one value per row"
    ):
        teo.save_tpu_checkpoint(str(tmp_path / "c"), {"t": table}, optimizer)


class _Dot(keras.losses.Loss):
    """Σ y_true·y_pred: its gradient with respect to the lookups' outputs is
    exactly the recorded output gradient."""

    def call(self, y_true, y_pred):
        return ops.sum(y_true * y_pred, axis=-1)


UNPOOLED = [c for c in ROWWISE + BF16 if not c.pooled and c.weight_decay_mode == "NONE"]


@keras_face
@pytest.mark.parametrize("config", UNPOOLED, ids=[c.name for c in UNPOOLED])
def test_the_row_sparse_layer_steps_as_fbgemm(config, golden):
    """`layers.Embedding` with the row-wise optimizer, one float of state per
    row, trained by `train_on_batch` on the recorded lookups: FBGEMM's
    unpooled run, bit for bit on TensorFlow; on JAX the state bit for bit
    and the table to one rounding per step (XLA fuses w − mult·g). A float16
    layer's gradients are float16 (its rows are looked up in float16): the
    FP16 run's are rounded so, and the transcription of FBGEMM
    (`fbgemm_reference`, bit for bit against its golden runs) given them is
    the oracle."""
    optimizer = teo.optimizers.RowWiseAdagrad(
        config.learning_rate, epsilon=config.eps, sum_in_lanes=False
    )
    dtype = _dtype(config)
    layer = teo.layers.Embedding(
        fbgemm_inputs.ROWS,
        config.dim,
        optimizer=optimizer,
        weights=fbgemm_inputs.initial_table(config),
        dtype=dtype,
    )
    ids = keras.Input((), dtype="int32")
    model = keras.Model(ids, layer(ids))
    model.compile(optimizer="sgd", loss=_Dot(reduction="sum"))
    steps = fbgemm_inputs.steps(config)
    for _, (ids, offsets, gradient) in zip(range(_steps(config)), steps):
        model.train_on_batch(ids.astype("int32"), gradient.astype(dtype))
    (slot,) = layer._slot_variables
    assert tuple(slot.shape) == (fbgemm_inputs.ROWS, 1)
    table = ops.convert_to_numpy(layer.embeddings)
    assert str(table.dtype) == dtype and slot.dtype == "float32"
    if config.precision != "FP32":
        prefix = f"{config.name}/step{_steps(config)}"
        found = fbgemm_reference.run(
            config, recorded=(_steps(config),), gradient_dtype=dtype
        )[_steps(config)]
        golden = {f"{prefix}/table": found[0], f"{prefix}/state0": found[1]}
    fused = BACKEND == "jax"
    table = table.astype(np.float32)
    _assert_as_fbgemm(config, table, ops.convert_to_numpy(slot), golden, fused)


@keras_face
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_stacked_tables_step_as_the_separate_ones(dtype):
    """Two tables in one `StackedEmbedding` (one [rows, 1] state for both,
    float32 for bfloat16 tables too) step as the same tables apart: the same
    bits, compiled as `fit` compiles them."""

    def tables():
        return [
            teo.layers.Embedding(
                rows,
                8,
                optimizer=teo.optimizers.RowWiseAdagrad(0.1),
                embeddings_initializer=keras.initializers.Constant(0.1),
                name=f"table_{name}",
                dtype=dtype,
            )
            for name, rows in (("a", 7), ("b", 5))
        ]

    def trained(stacked):
        ids = {n: keras.Input((2,), dtype="int32", name=n) for n in ("a", "b")}
        layers = tables()
        if stacked:
            stack = teo.layers.StackedEmbedding(layers)
            vectors = stack([ids["a"], ids["b"]])
        else:
            vectors = [layer(ids[layer.name[-1]]) for layer in layers]
        # The looked-up vectors are the output: a layer that reduces them
        # (a Dense) is compiled into each graph on its own, and XLA may
        # reduce in another order in the two (JAX 0.7.1 does), which would
        # feed the tables different gradients.
        flat = keras.layers.Concatenate()([keras.layers.Flatten()(v) for v in vectors])
        model = keras.Model(ids, flat)
        model.compile(optimizer="sgd", loss="mse")
        rng = np.random.default_rng(5)
        for _ in range(4):
            x = {"a": rng.integers(0, 7, (6, 2)), "b": rng.integers(0, 5, (6, 2))}
            model.train_on_batch(x, rng.normal(size=(6, 32)).astype("float32"))
        if stacked:
            return [stack.get_table(layer.name)["embeddings"] for layer in layers]
        return [ops.convert_to_numpy(layer.embeddings) for layer in layers]

    separate = trained(False)
    stacked = trained(True)
    for mine, theirs in zip(stacked, separate):
        np.testing.assert_array_equal(mine, theirs)


def _row_wise_model(seed):
    """A model of one `RowWiseAdagrad` table "t" (seeded where `seed` is)."""
    if seed is not None:
        keras.utils.set_random_seed(seed)
    inputs = keras.Input((3,), dtype="int32")
    table = teo.layers.Embedding(
        50, 8, optimizer=teo.optimizers.RowWiseAdagrad(0.1), name="t"
    )
    flat = keras.layers.Flatten()(table(inputs))
    model = keras.Model(inputs, keras.layers.Dense(1)(flat))
    model.compile(optimizer="sgd", loss="mse")
    return model


def _fit_and_save(model, directory):
    """Four steps of `fit` saved by `keras.callbacks.OrbaxCheckpoint` in
    `directory`; the step's path."""
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 50, (32, 3)).astype("int32")
    labels = rng.normal(size=(32, 1)).astype("float32")
    callback = keras.callbacks.OrbaxCheckpoint(str(directory))
    model.fit(ids, labels, batch_size=8, verbose=0, shuffle=False, callbacks=[callback])
    return str(directory / "0")


def test_a_keras_step_holds_the_state_and_an_engine_refuses_it(tmp_path, capsys):
    """A step of `keras.callbacks.OrbaxCheckpoint` holds the [rows, 1] state
    (Keras's own format): `open_checkpoint` reads it back as the layer holds
    it, with its bytes; converting it to an engine's layout is refused by the
    algorithm's name, before anything is written."""
    pytest.importorskip("orbax.checkpoint")
    from tf_tpu_embed_opt import checkpoints, cli, errors

    model = _row_wise_model(None)
    table = model.get_layer("t")
    step = _fit_and_save(model, tmp_path / "steps")

    source = checkpoints.open_checkpoint(step)
    assert source.algorithm("t") is registry.BY_NAME["RowWiseAdagrad"]
    assert source.tables["t"].slot_shapes == {"momentum1": (50, 1)}
    assert source.tables["t"].nbytes == 50 * 8 * 4 + 50 * 4
    state = source.read("t")
    np.testing.assert_array_equal(
        state["parameters"], ops.convert_to_numpy(table.embeddings)
    )
    np.testing.assert_array_equal(
        state["momentum1"], ops.convert_to_numpy(table.slots["momentum1"])
    )

    target = tmp_path / "engine"
    argv = ["checkpoint", "convert", step, str(target), "--to-jax", "1x2"]
    assert cli.main(argv) != 0
    error = " ".join(capsys.readouterr().err.split())
    assert "'t']" in error or "Table 't'" in error
    assert "RowWiseAdagrad's state has no place in an engine's checkpoint" in error
    assert "one value per row" in error
    assert not target.exists()
    # TensorFlow's layout: refused by name; without TensorFlow, the error
    # says what is missing (a ModuleNotFoundError of its own).
    refused = (
        (ValueError, r"RowWiseAdagrad's state has no place")
        if importlib.util.find_spec("tensorflow")
        else (
            errors.TensorFlowNotInstalled,
            r"write_checkpoint\(format='tpu-embedding'\)",
        )
    )
    with pytest.raises(refused[0], match=refused[1]):
        checkpoints.write_checkpoint(
            str(tmp_path / "tpu"), {"t": state}, algorithms={"t": "RowWiseAdagrad"}
        )
    assert not (tmp_path / "tpu.index").exists()


def test_a_keras_step_loads_back_into_a_row_wise_model(tmp_path):
    """`load_into_keras` from a step of Keras's own `OrbaxCheckpoint` (which
    holds the [rows, 1] state) into a fresh model: every array read, checked
    with its own shape and loaded bit for bit, the step with them. Only an
    engine's checkpoint refuses the algorithm (it cannot hold the state)."""
    pytest.importorskip("orbax.checkpoint")
    from tf_tpu_embed_opt import checkpoints

    trained = _row_wise_model(1)
    step = _fit_and_save(trained, tmp_path / "steps")

    source = checkpoints.open_checkpoint(step)
    source.verify("t", "momentum1")  # checked as [rows, 1], not the table's shape
    stream = source.stream("t", "momentum1")
    assert stream.shape == (50, 1)
    fresh = _row_wise_model(2)
    loaded = teo.load_into_keras(step, fresh, None)
    assert loaded == {"t": registry.BY_NAME["RowWiseAdagrad"]}
    mine, theirs = fresh.get_layer("t"), trained.get_layer("t")
    for got, want in [
        (mine.embeddings, theirs.embeddings),
        (mine.slots["momentum1"], theirs.slots["momentum1"]),
        (mine.optimizer.iterations, theirs.optimizer.iterations),
    ]:
        np.testing.assert_array_equal(
            ops.convert_to_numpy(got), ops.convert_to_numpy(want)
        )
    assert int(ops.convert_to_numpy(mine.optimizer.iterations)) == 4


@pytest.mark.parametrize("stack", [False, True], ids=["tables", "stacked"])
def test_keras_rs_tables_keep_one_float_per_row(stack):
    """A keras-rs `DistributedEmbedding` table on the default device, made
    row-sparse by `row_sparse_tables`, keeps the [rows, 1] state and steps as
    `layers.Embedding` with the same optimizer: the same bits. One id per
    sample (duplicates across samples), so that keras-rs's combiner (a mean)
    adds no rounding of its own."""
    keras_rs = keras_rs_or_skip()
    initial = keras.initializers.Constant(0.1)

    def trained(kind):
        inputs = keras.Input((1,), batch_size=8, dtype="int32")
        if kind == "keras_rs":
            table = keras_rs.layers.TableConfig(
                name="items",
                vocabulary_size=10,
                embedding_dim=4,
                optimizer=teo.optimizers.RowWiseAdagrad(0.1),
                initializer=initial,
                placement="default_device",
            )
            feature = keras_rs.layers.FeatureConfig(
                name="f", table=table, input_shape=(8, 1), output_shape=(8, 4)
            )
            embedding = teo.layers.row_sparse_tables(
                keras_rs.layers.DistributedEmbedding({"f": feature}), stack=stack
            )
            vectors = embedding({"f": inputs})["f"]
        else:
            embedding = teo.layers.Embedding(
                10,
                4,
                optimizer=teo.optimizers.RowWiseAdagrad(0.1),
                embeddings_initializer=initial,
            )
            vectors = embedding(inputs)[:, 0]
        dense = keras.layers.Dense(1, kernel_initializer="ones")
        model = keras.Model(inputs, dense(vectors))
        model.compile(optimizer="sgd", loss="mse")
        rng = np.random.default_rng(11)
        for _ in range(3):
            ids = rng.integers(0, 10, (8, 1)).astype("int32")
            model.train_on_batch(ids, rng.normal(size=(8, 1)).astype("float32"))
        weights = {w.path.split("/")[-1]: w for w in embedding.weights}
        return {
            k: ops.convert_to_numpy(weights[k]) for k in ("embeddings", "accumulator")
        }

    theirs = trained("layer")
    mine = trained("keras_rs")
    assert mine["accumulator"].shape == (10, 1)
    for key in theirs:
        np.testing.assert_array_equal(mine[key], theirs[key])


def _lane_sums(squares, lanes):
    """A row's squares summed one float32 addition at a time: element d into
    lane d mod `lanes`, each lane in order, then the lanes in adjacent pairs
    (an odd one out carried to the next round)."""
    sums = []
    for lane in range(min(lanes, squares.shape[-1])):
        total = squares[:, lane]
        for column in range(lane + lanes, squares.shape[-1], lanes):
            total = total + squares[:, column]
        sums.append(total)
    while len(sums) > 1:
        paired = [a + b for a, b in zip(sums[0::2], sums[1::2])]
        sums = paired + sums[len(paired) * 2 :]
    return sums[0][:, None]


def _namespaces():
    """Each array namespace the rule runs on here, as a function of NumPy."""
    from tf_tpu_embed_opt.definitions.rules import NUMPY

    found = {"numpy": lambda rule, g: rule(NUMPY, g)}
    if importlib.util.find_spec("tensorflow"):
        import tensorflow as tf

        from tf_tpu_embed_opt.optimizers.tensorflow_twin import TENSORFLOW

        def traced(rule, g):
            # In a graph with an unknown batch, where grappler rewrites it.
            function = tf.function(
                lambda x: rule(TENSORFLOW, x),
                input_signature=[tf.TensorSpec([None, g.shape[1]], tf.float32)],
            )
            return function(tf.constant(g)).numpy()

        found["tensorflow"] = lambda rule, g: rule(TENSORFLOW, tf.constant(g)).numpy()
        found["tf.function"] = traced
    if keras.backend.backend() == "jax":
        import jax

        from tf_tpu_embed_opt.optimizers.backend import KERAS_OPS

        found["jax.jit"] = lambda rule, g: np.asarray(
            jax.jit(lambda x: rule(KERAS_OPS, x))(g)
        )
    return found


@keras_face
@pytest.mark.parametrize("lanes", [8, 1], ids=["pooled", "unpooled"])
def test_a_rows_sum_of_squares_adds_in_fbgemms_order_on_every_namespace(lanes):
    """The rule's sum of a row's squares is, bit for bit, the one float32
    addition at a time of FBGEMM's order (its golden dims among these), on
    NumPy, on TensorFlow eagerly and in a traced graph (whose optimizer
    regroups additions), and compiled by XLA on JAX from 16 wide on: each
    namespace's `split`/`sum_in_order` keeps the order, in runs of any
    length."""
    from tf_tpu_embed_opt.definitions.algorithms import row_wise_adagrad

    rng = np.random.default_rng(9)
    for name, run in _namespaces().items():
        for dim in [*range(1, 41), 64, 72, 80, 100, 128, 136]:
            g = rng.standard_normal((7, dim)) * 10.0 ** rng.integers(-3, 3, (7, 1))
            g = g.astype(np.float32)
            summed = run(
                lambda xp, x: row_wise_adagrad._sum_of_squares(xp, x, lanes), g
            )
            assert summed.dtype == np.float32 and summed.shape == (7, 1)
            expected = _lane_sums(g * g, lanes)
            if name == "jax.jit" and dim < 16:
                # XLA's CPU compiler contracts a square into the addition
                # after it (one rounding instead of two) in rows narrower
                # than 16 (JAX 0.10 and 0.12). Each result is a sum of `dim`
                # non-negative terms within (dim − 1)·u of the exact one
                # (u = 2⁻²⁴), whatever each step rounds: 2·dim·u apart.
                np.testing.assert_allclose(summed, expected, rtol=2 * dim * 2**-24)
                continue
            np.testing.assert_array_equal(
                summed, expected, err_msg=f"{name}, dim {dim}"
            )


@keras_face
def test_a_loss_scale_leaves_the_row_wise_step_as_it_is():
    """Under `LossScaleOptimizer` (the model's optimizer; its dynamic scale
    a power of two), the layer's row-wise step is the unscaled one, bit for
    bit; the table optimizer's own EMA and gradient accumulation, which Keras
    applies outside its step, are refused by name."""

    def trained(wrap):
        keras.utils.set_random_seed(1)
        ids = keras.Input((3,), dtype="int32")
        table = teo.layers.Embedding(
            20, 8, optimizer=teo.optimizers.RowWiseAdagrad(0.1), name="t"
        )
        flat = keras.layers.Flatten()(table(ids))
        model = keras.Model(ids, keras.layers.Dense(1)(flat))
        dense = keras.optimizers.SGD(0.01)
        if wrap:
            dense = keras.optimizers.LossScaleOptimizer(dense)
        model.compile(optimizer=dense, loss="mse")
        rng = np.random.default_rng(0)
        for _ in range(3):
            x = rng.integers(0, 20, (8, 3)).astype("int32")
            model.train_on_batch(x, rng.normal(size=(8, 1)).astype("float32"))
        return [
            ops.convert_to_numpy(v)
            for v in (table.embeddings, table.slots["momentum1"])
        ]

    for plain, scaled in zip(trained(False), trained(True)):
        np.testing.assert_array_equal(scaled, plain)
    for setting in ({"use_ema": True}, {"gradient_accumulation_steps": 2}):
        name = next(iter(setting))
        with pytest.raises(ValueError, match=rf"`{name}` is applied by Keras outside"):
            teo.layers.Embedding(
                20, 8, optimizer=teo.optimizers.RowWiseAdagrad(0.1, **setting)
            )


@keras_face
def test_a_16_bit_tables_duplicate_ids_are_summed_in_float32():
    """A float16 table's sparse gradient (float16 values, as its own model
    gives) has its duplicate ids summed in float32, where the table steps:
    as the dense gradient summed in float32, bit for bit. 1 + 2⁻¹¹ + 2⁻¹¹
    is 1 summed in float16 (each addition a tie, rounded to even) and
    1 + 2⁻¹⁰ in float32."""
    if BACKEND not in ("tensorflow", "jax"):
        pytest.skip("row-sparse gradients: TensorFlow's and JAX's")
    import row_steps

    ids = [1, 3, 1, 1]
    values = np.array([1.0, 0.5, 2.0**-11, 2.0**-11], np.float16)[:, None]
    values = np.repeat(values, 4, axis=1)
    dense = np.zeros((5, 4), np.float32)
    np.add.at(dense, ids, values.astype(np.float32))
    assert dense[1, 0] == np.float32(1 + 2.0**-10)
    results = []
    for gradient in (
        row_steps.sparse_gradient(BACKEND, ids, values, (5, 4)),
        ops.convert_to_tensor(dense),
    ):
        table = keras.Variable(np.full((5, 4), 0.25), dtype="float16")
        optimizer = teo.optimizers.RowWiseAdagrad(0.1)
        optimizer.apply_gradients([(gradient, table)])
        state = optimizer._accumulators[0]
        results.append([ops.convert_to_numpy(v).tobytes() for v in (table, state)])
    assert results[0] == results[1]
