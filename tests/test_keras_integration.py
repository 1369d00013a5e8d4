"""The Keras twins where users use them.

`model.compile(optimizer=...)` and `fit`; Keras serialization (registration,
`get_config`/`from_config`, `.keras` save and load restoring the optimizer
state exactly); custom training loops under `tf.distribute` (a
`MirroredStrategy` over two logical CPUs stands in for `TPUStrategy` and must
give the one-device result); `tf.function(jit_compile=True)` on the sparse and
the dense path; mixed precision as Keras handles it; empty sparse gradients and
ids at the table edges.

Every twin is used with non-default settings, including the TPU-engine keyword
options, so that the paths that differ from stock Keras are the ones exercised.
"""

import functools
import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from child_env import child_env
from conftest import every_optimizer, keras_face, requires_xla, xla_on_host

import tf_tpu_embed_opt as teo
from tf_tpu_embed_opt.definitions import registry

pytestmark = keras_face

# Where this process imported the package from (site-packages in CI).

VOCAB = 50
DIM = 8
SEQ = 4

# One constructor expression per twin (source text, so that the subprocess of
# the distribution test builds exactly the same optimizers). Settings are
# deliberately not the defaults.
TWIN_SOURCES = {
    "SGD": (
        "teo.optimizers.SGD(0.05, momentum=0.9, nesterov=True, lazy=True, "
        "clip_gradient_min=-2.0, clip_gradient_max=2.0)"
    ),
    "Adagrad": (
        "teo.optimizers.Adagrad(0.05, epsilon=0.0, clip_weight_min=-1.0, "
        "weight_decay_factor=0.01)"
    ),
    "AdagradMomentum": (
        "teo.optimizers.AdagradMomentum(0.05, momentum=0.5, use_nesterov=True, "
        "exponent=4.0, beta2=0.9, epsilon=1e-6)"
    ),
    "Adam-lazy": "teo.to_keras(teo.embedding.Adam(0.01, lazy_adam=True))",
    "Adam-amsgrad": (
        "teo.optimizers.Adam(0.01, beta_1=0.8, amsgrad=True, "
        "weight_decay_factor=0.01, "
        "multiply_weight_decay_factor_by_learning_rate=True)"
    ),
    "Ftrl": (
        "teo.optimizers.Ftrl(0.05, learning_rate_power=-0.6, "
        "l1_regularization_strength=0.001, l2_regularization_strength=0.01, "
        "beta=0.1, multiply_linear_by_learning_rate=True, lazy=True)"
    ),
    "Momentum": (
        "teo.optimizers.Momentum(0.02, momentum=0.8, use_nesterov=True, "
        "clip_weight_max=1.0)"
    ),
    "RMSprop": (
        "teo.optimizers.RMSprop(0.01, rho=0.8, momentum=0.5, centered=True, lazy=True)"
    ),
    "Adadelta": "teo.optimizers.Adadelta(1.0, rho=0.9, epsilon=1e-6, lazy=True)",
    "ProximalAdagrad": (
        "teo.optimizers.ProximalAdagrad(0.05, initial_accumulator_value=0.2, "
        "l1_regularization_strength=0.001, l2_regularization_strength=0.01, "
        "clip_gradient_max=1.0)"
    ),
    "ProximalYogi": (
        "teo.optimizers.ProximalYogi(0.05, beta_1=0.8, epsilon=0.01, "
        "l1_regularization_strength=0.001, l2_regularization_strength=0.001)"
    ),
    "LaProp": "teo.optimizers.LaProp(0.01, beta_1=0.8, beta_2=0.9, epsilon=1e-8)",
    "F2A": (
        "teo.optimizers.F2A(0.05, rho=0.4, l1_regularization_strength=0.001, "
        "l2_regularization_strength=0.01, max_lr_multiplier=10.0)"
    ),
    "ClippyAdagrad": (
        "teo.optimizers.ClippyAdagrad(0.1, variable_relative_threshold=0.5, "
        "export_clipping_factors=True, clip_accumulator_update=True)"
    ),
}
NAMES = sorted(TWIN_SOURCES)
# With a sparse gradient every twin here but non-lazy Adam touches looked-up rows
# only (the Keras-named ones with lazy=True).
LAZY = [name for name in NAMES if name != "Adam-amsgrad"]
# Where the older TensorFlow legs run the per-optimizer integration tests on
# a representative subset (conftest.every_optimizer): no slot, Adagrad's
# accumulator, lazy and non-lazy Adam, Ftrl's two slots, RMSprop's three,
# ClippyAdagrad's own class. Every optimizer runs in the TensorFlow 2.21 leg.
REPRESENTATIVE = [
    "Adagrad",
    "Adam-amsgrad",
    "Adam-lazy",
    "ClippyAdagrad",
    "Ftrl",
    "RMSprop",
    "SGD",
]
per_optimizer = every_optimizer("name", REPRESENTATIVE)


def make(name):
    """A fresh optimizer for the twin `name`."""
    return eval(TWIN_SOURCES[name], {"teo": teo})


def test_every_twin_is_covered():
    covered = {type(make(name)).__name__ for name in NAMES}
    twins = set(teo.optimizers.__all__) - {"TwinOptimizer", "deduplicate"}
    # A row-wise optimizer keeps one value per row and refuses the dense
    # layers of these models (tests/test_row_wise_adagrad.py trains it).
    row_wise = {
        d.keras.name
        for d in registry.ALL
        if d.keras is not None and any(slot.per_row for slot in d.slots)
    }
    assert covered == twins - row_wise
    assert set(REPRESENTATIVE) <= set(NAMES)
    assert make("Adam-lazy")._rows_only and not make("Adam-amsgrad")._rows_only


def _model():
    ids = keras.Input(shape=(SEQ,), dtype="int32")
    x = keras.layers.Embedding(VOCAB, DIM, name="embedding")(ids)
    x = keras.layers.GlobalAveragePooling1D()(x)
    return keras.Model(ids, keras.layers.Dense(1, name="dense")(x))


def _data(seed=0, rows=64, high=VOCAB - 10):
    """Ids below `high` only: rows `high..VOCAB-1` are never looked up."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, high, size=(rows, SEQ)).astype("int32")
    y = (x.mean(axis=1, keepdims=True) / high).astype("float32")
    return x, y


@functools.lru_cache(maxsize=None)
def _fitted(name, epochs=2, jit_compile=False):
    """A model fitted with the twin `name`, its initial table, losses and data.

    Cached: the fit and the save/load tests share the model (the latter trains
    it one step further on ids the former already saw).
    """
    keras.utils.set_random_seed(1)
    model = _model()
    model.compile(optimizer=make(name), loss="mse", jit_compile=jit_compile)
    x, y = _data()
    table = model.get_layer("embedding").embeddings.numpy().copy()
    history = model.fit(x, y, batch_size=16, epochs=epochs, shuffle=False, verbose=0)
    return model, table, history.history["loss"], x, y


# --------------------------------------------------------------------- 1. fit


@per_optimizer
@pytest.mark.parametrize("name", NAMES)
def test_compile_and_fit(name):
    model, before, losses, x, _ = _fitted(name)
    assert all(np.isfinite(losses)), losses
    # Training works: the second epoch's loss is below the first's (by 1% for
    # ClippyAdagrad, whose clipping slows it, to 85% for AdagradMomentum).
    assert losses[-1] < losses[0], losses
    after = model.get_layer("embedding").embeddings.numpy()
    used = np.unique(x)
    unused = np.setdiff1d(np.arange(VOCAB), used)
    assert unused.size >= 10
    assert not np.array_equal(after[used], before[used])
    if name in LAZY:
        np.testing.assert_array_equal(after[unused], before[unused])
        # The slots of untouched rows keep their initial value too.
        table = model.get_layer("embedding").embeddings
        fresh = make(name)
        fresh.build([table])
        for old, new in zip(
            _slot_arrays(model.optimizer, table), _slot_arrays(fresh, table)
        ):
            np.testing.assert_array_equal(old[unused], new[unused])
    else:
        # Non-lazy Adam updates every row (its weight decay moves them all).
        assert not np.array_equal(after[unused], before[unused])


# Keras does not use XLA on CPU by default ("auto"); on TPU it always does.
@requires_xla
@pytest.mark.parametrize("name", ["Adam-lazy", "ClippyAdagrad"])
def test_compile_and_fit_with_jit_compile(name):
    model, before, losses, x, _ = _fitted(name, epochs=1, jit_compile=True)
    assert model.jit_compile
    assert all(np.isfinite(losses)), losses
    after = model.get_layer("embedding").embeddings.numpy()
    used = np.unique(x)
    unused = np.setdiff1d(np.arange(VOCAB), used)
    assert not np.array_equal(after[used], before[used])
    np.testing.assert_array_equal(after[unused], before[unused])


def _slot_arrays(optimizer, variable):
    """The optimizer's slot variables of `variable` (same shape), as arrays."""
    shape = tuple(variable.shape)
    return [
        v.numpy()
        for v in optimizer.variables
        if tuple(v.shape) == shape and v is not variable
    ]


# ----------------------------------------------------------- 2. serialization


@pytest.mark.parametrize("name", NAMES)
def test_config_round_trip(name):
    optimizer = make(name)
    config = optimizer.get_config()
    again = type(optimizer).from_config(config)
    assert type(again) is type(optimizer)
    assert again.get_config() == config

    serialized = keras.optimizers.serialize(optimizer)
    assert serialized["registered_name"].startswith("tf_tpu_embed_opt>")
    json.dumps(serialized)
    restored = keras.optimizers.deserialize(json.loads(json.dumps(serialized)))
    assert type(restored) is type(optimizer)
    assert restored.get_config() == config
    # By the registered name alone, as a saved model refers to it.
    by_name = keras.saving.get_registered_object(serialized["registered_name"])
    assert by_name is type(optimizer)

    # The config carries every setting: the copies compute the same steps.
    states = []
    for copy in (optimizer, again, restored):
        variable = _variable()
        gradient = tf.IndexedSlices(
            tf.constant(_gradient_rows()), tf.constant(IDS), tf.constant([ROWS, 4])
        )
        for _ in range(2):
            copy.apply_gradients([(gradient, variable)])
            copy.apply_gradients([(tf.convert_to_tensor(gradient) * 0.5, variable)])
        states.append(_state(copy, variable))
    for state in states[1:]:
        _assert_states_equal(state, states[0])


# Keras's own saving code converts with `np.array`, which NumPy 2 warns about.
@pytest.mark.filterwarnings(
    "ignore:__array__ implementation doesn't accept a copy keyword:DeprecationWarning"
)
@per_optimizer
@pytest.mark.parametrize("name", NAMES)
def test_keras_file_restores_optimizer_state(name, tmp_path):
    model, _, _, x, y = _fitted(name)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)

    assert type(loaded.optimizer) is type(model.optimizer)
    assert loaded.optimizer.get_config() == model.optimizer.get_config()
    original = model.optimizer.variables
    restored = loaded.optimizer.variables
    assert len(restored) == len(original)
    for a, b in zip(original, restored):
        assert a.path == b.path
        assert np.array_equal(a.numpy(), b.numpy()), a.path
    for a, b in zip(model.weights, loaded.weights):
        assert np.array_equal(a.numpy(), b.numpy()), a.path

    model.train_on_batch(x[:16], y[:16])
    loaded.train_on_batch(x[:16], y[:16])
    for a, b in zip(model.weights, loaded.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)
    for a, b in zip(model.optimizer.variables, loaded.optimizer.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)


# ------------------------------------------------------------ 3. distribution

_DISTRIBUTED = """
import json
import os

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"

import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    cpu, [tf.config.LogicalDeviceConfiguration()] * 2
)

import keras  # noqa: E402

import tf_tpu_embed_opt as teo  # noqa: E402

SOURCES = {sources}
VOCAB, DIM, SEQ, BATCH, STEPS = {vocab}, {dim}, {seq}, 8, 3
# A kernel large enough for the compiled whole-variable update.
WIDE = teo.optimizers.XLA_MIN_ELEMENTS // DIM


def model():
    ids = keras.Input(shape=(SEQ,), dtype="int32")
    x = keras.layers.Embedding(VOCAB, DIM)(ids)
    x = keras.layers.GlobalAveragePooling1D()(x)
    x = keras.layers.Dense(WIDE, activation="tanh")(x)
    return keras.Model(ids, keras.layers.Dense(1)(x))


rng = np.random.default_rng(0)
batches = []
for _ in range(STEPS):
    x = rng.integers(0, 12, size=(BATCH, SEQ)).astype("int32")
    # The same ids in both replicas' halves: de-duplication must sum across
    # replicas, not only within one.
    x[BATCH // 2] = x[0]
    x[BATCH // 2 + 1, :2] = x[1, :2]
    x[:, -1] = VOCAB - 1
    y = rng.normal(size=(BATCH, 1)).astype("float32")
    batches.append((x, y))


def per_example_loss(model, x, y):
    return tf.reduce_sum(tf.square(model(x, training=True) - y), axis=1)


results = {{}}
logical = tf.config.list_logical_devices("CPU")
strategy = tf.distribute.MirroredStrategy([d.name for d in logical])
for name, source in SOURCES.items():
    keras.utils.set_random_seed(3)
    single = model()
    initial = [w.numpy() for w in single.weights]
    single_opt = eval(source, {{"teo": teo}})
    single_opt.build(single.trainable_variables)

    @tf.function
    def single_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(per_example_loss(single, x, y)) / BATCH
        grads = tape.gradient(loss, single.trainable_variables)
        single_opt.apply_gradients(zip(grads, single.trainable_variables))

    with strategy.scope():
        mirrored = model()
        mirrored.set_weights(initial)
        mirrored_opt = eval(source, {{"teo": teo}})
        # Built in the scope, as for any Keras optimizer: creating its slot
        # variables inside `strategy.run` fails in TensorFlow itself.
        mirrored_opt.build(mirrored.trainable_variables)

    traced = []

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(per_example_loss(mirrored, x, y)) / BATCH
        grads = tape.gradient(loss, mirrored.trainable_variables)
        traced.append(type(grads[0]).__name__)
        mirrored_opt.apply_gradients(zip(grads, mirrored.trainable_variables))

    @tf.function
    def mirrored_step(x, y):
        strategy.run(replica_step, args=(x, y))

    def half(context, array):
        size = BATCH // context.num_replicas_in_sync
        start = context.replica_id_in_sync_group * size
        return tf.constant(array[start : start + size])

    for x, y in batches:
        single_step(tf.constant(x), tf.constant(y))
        px = strategy.experimental_distribute_values_from_function(
            lambda context: half(context, x)
        )
        py = strategy.experimental_distribute_values_from_function(
            lambda context: half(context, y)
        )
        sizes = [int(t.shape[0]) for t in strategy.experimental_local_results(px)]
        mirrored_step(px, py)
    compiled = []
    for step, args in (
        (single_step, (tf.constant(x), tf.constant(y))),
        (mirrored_step, (px, py)),
    ):
        library = step.get_concrete_function(*args).graph.as_graph_def().library
        compiled.append(any(f.attr["_XlaMustCompile"].b for f in library.function))
    results[name] = {{
        "replicas": strategy.num_replicas_in_sync,
        "compiled": compiled,
        "sizes": sizes,
        "gradient_types": sorted(set(traced)),
        "single": [w.numpy().tolist() for w in single.weights],
        "mirrored": [w.numpy().tolist() for w in mirrored.weights],
        "single_slots": [v.numpy().tolist() for v in single_opt.variables],
        "mirrored_slots": [v.numpy().tolist() for v in mirrored_opt.variables],
        "initial": [w.tolist() for w in initial],
    }}
results["package"] = os.path.abspath(teo.__file__)
print("RESULT" + json.dumps(results))
"""

DISTRIBUTED = ["Adagrad", "Adam-lazy", "Ftrl", "ClippyAdagrad", "SGD", "RMSprop"]


@pytest.fixture(scope="module", autouse=True)
def _distributed_child(request, tmp_path_factory):
    """Starts the distribution child at the module's first test, if needed.

    It runs in the background (TensorFlow's devices must be configured before
    first use, so it needs a fresh process) while the other tests run.
    """
    if not any("test_mirrored_strategy" in item.name for item in request.session.items):
        yield None
        return
    code = _DISTRIBUTED.format(
        sources=repr({name: TWIN_SOURCES[name] for name in DISTRIBUTED}),
        vocab=VOCAB,
        dim=DIM,
        seq=SEQ,
    )
    # The child must test the package this process tests (the installed one
    # when CI runs `pytest tests`): the directory it was imported from goes
    # first on the child's path, and the child runs outside the checkout (a
    # `-c` child has its working directory on sys.path).
    env = child_env(TF_CPP_MIN_LOG_LEVEL="3")
    child = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path_factory.mktemp("distributed"),
    )
    try:
        yield child
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()


@pytest.fixture(scope="module")
def distributed_results(_distributed_child):
    assert _distributed_child is not None
    stdout, stderr = _distributed_child.communicate(timeout=300)
    assert _distributed_child.returncode == 0, stderr[-4000:]
    line = [x for x in stdout.splitlines() if x.startswith("RESULT")][-1]
    results = json.loads(line[len("RESULT") :])
    # The child tested the very package this process tests.
    assert results.pop("package") == os.path.abspath(teo.__file__)
    return results


@pytest.mark.parametrize("name", DISTRIBUTED)
def test_mirrored_strategy_equals_one_device(name, distributed_results):
    result = distributed_results[name]
    assert result["replicas"] == 2
    assert result["sizes"] == [4, 4]
    # Each replica's table gradient is row-sparse (the lazy path runs).
    assert result["gradient_types"] == ["IndexedSlices"]
    # The wide kernel's dense update is XLA-compiled where XLA can compile
    # (ClippyAdagrad's is not), in both the one-device and the mirrored step.
    expected = xla_on_host() and name != "ClippyAdagrad"
    assert result["compiled"] == [expected, expected]
    single = [np.array(w) for w in result["single"]]
    mirrored = [np.array(w) for w in result["mirrored"]]
    initial = [np.array(w) for w in result["initial"]]
    assert not np.array_equal(single[0], initial[0])

    # The table and its slots to float rounding. The dense layers' gradients
    # are batch sums added in another order by the replicas; where they cancel
    # to almost 0, Adam normalises the rounding into whole steps, which later
    # steps carry on (up to 1e-5 here).
    def atol(array):
        return 1e-7 if array.shape == single[0].shape else 2e-5

    for a, b in zip(single, mirrored):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=atol(a))
    assert len(result["single_slots"]) == len(result["mirrored_slots"])
    for a, b in zip(result["single_slots"], result["mirrored_slots"]):
        a, b = np.array(a), np.array(b)
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=atol(a))
    if name in LAZY:
        # Rows no replica looked up (ids 12..VOCAB-2) are untouched.
        np.testing.assert_array_equal(mirrored[0][12:-1], initial[0][12:-1])


# ----------------------------------------------------------------------- 4. XLA

ROWS = 10
IDS = np.array([1, 3, 1, 9, 0, 3, 3, 7], dtype="int32")


def _gradient_rows(seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(IDS.size, 4)).astype("float32")


def _variable(rows=ROWS):
    rng = np.random.default_rng(5)
    return keras.Variable(
        rng.normal(size=(rows, 4)).astype("float32") * 0.5, name="table"
    )


def _state(optimizer, variable):
    """The variable then every optimizer variable but `iterations`, in order."""
    state = [("variable", variable.numpy())]
    for v in optimizer.variables:
        if v is not optimizer.iterations:
            state.append((v.name, v.numpy()))
    return state


def _assert_states_close(got, want, rtol, atol=1e-7):
    assert [name for name, _ in got] == [name for name, _ in want]
    for (name, a), (_, b) in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=name)


@requires_xla
@per_optimizer
@pytest.mark.parametrize("sparse", [True, False], ids=["sparse", "dense"])
@pytest.mark.parametrize("name", NAMES)
def test_jit_compile_matches_eager(name, sparse):
    values = [_gradient_rows(seed) for seed in range(3)]
    shape = tf.constant([ROWS, 4], tf.int64)

    def gradient(rows):
        slices = tf.IndexedSlices(rows, tf.constant(IDS), shape)
        return slices if sparse else tf.convert_to_tensor(slices)

    eager_var, eager_opt = _variable(), make(name)
    eager_opt.build([eager_var])
    for rows in values:
        eager_opt.apply_gradients([(gradient(tf.constant(rows)), eager_var)])

    jit_var, jit_opt = _variable(), make(name)
    jit_opt.build([jit_var])

    @tf.function(jit_compile=True)
    def step(rows):
        jit_opt.apply_gradients([(gradient(rows), jit_var)])

    for rows in values:
        step(tf.constant(rows))
    # The step really compiled with XLA: it has HLO.
    hlo = step.experimental_get_compiler_ir(tf.constant(values[0]))(stage="hlo")
    assert "HloModule" in hlo

    _assert_states_close(_state(jit_opt, jit_var), _state(eager_opt, eager_var), 1e-6)
    assert int(jit_opt.iterations.numpy()) == len(values)


# Under XLA the rows are updated on the first 1/8, 1/4, 1/2 or all of the 16
# de-duplicated entries, whichever is the shortest holding every distinct id:
# one step for each distinct count at and around each boundary.
@requires_xla
@per_optimizer
@pytest.mark.parametrize("name", [n for n in LAZY if n != "ClippyAdagrad"])
def test_jit_sparse_step_for_any_number_of_distinct_ids(name):
    rng = np.random.default_rng(0)
    shape = tf.constant([ROWS, 4], tf.int64)
    steps = []
    for distinct in [1, 2, 3, 4, 5, 8, 9, 10]:
        ids = rng.permutation(np.resize(rng.permutation(ROWS)[:distinct], 16))
        steps.append((ids.astype("int32"), rng.normal(size=(16, 4)).astype("float32")))

    jit_var, jit_opt = _variable(), make(name)
    jit_opt.build([jit_var])

    @tf.function(jit_compile=True)
    def step(ids, value):
        jit_opt.apply_gradients([(tf.IndexedSlices(value, ids, shape), jit_var)])

    eager_var, eager_opt = _variable(), make(name)
    eager_opt.build([eager_var])
    for ids, value in steps:
        step(tf.constant(ids), tf.constant(value))
        gradient = tf.IndexedSlices(tf.constant(value), tf.constant(ids), shape)
        eager_opt.apply_gradients([(gradient, eager_var)])
        # Up to 16 N(0, 1) rows summed per id, in an order XLA chooses.
        _assert_states_close(
            _state(jit_opt, jit_var), _state(eager_opt, eager_var), 1e-6, 1e-6
        )
    assert step.experimental_get_tracing_count() == 1


def _compiled_functions(concrete):
    """Names of the functions in `concrete`'s graph that XLA must compile."""
    library = concrete.graph.as_graph_def().library.function
    return [f.signature.name for f in library if f.attr["_XlaMustCompile"].b]


# A twin's whole-variable update (dense gradient, or non-lazy Adam) inside a
# plain tf.function is compiled with XLA where this TensorFlow can; elsewhere
# (tensorflow-tpu without libtpu) it runs as TensorFlow ops. Same result.
@per_optimizer
@pytest.mark.parametrize("rows", [ROWS, teo.optimizers.XLA_MIN_ELEMENTS // 4])
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("name", [n for n in NAMES if n != "ClippyAdagrad"])
def test_graph_mode_matches_eager(name, sparse, rows):
    values = [_gradient_rows(seed) for seed in range(3)]
    shape = tf.constant([rows, 4], tf.int64)

    def gradient(rows):
        slices = tf.IndexedSlices(rows, tf.constant(IDS), shape)
        return slices if sparse else tf.convert_to_tensor(slices)

    eager_var, eager_opt = _variable(rows), make(name)
    eager_opt.build([eager_var])
    for value in values:
        eager_opt.apply_gradients([(gradient(tf.constant(value)), eager_var)])

    graph_var, graph_opt = _variable(rows), make(name)
    graph_opt.build([graph_var])

    @tf.function
    def step(value):
        graph_opt.apply_gradients([(gradient(value), graph_var)])

    for value in values:
        step(tf.constant(value))
    compiled = _compiled_functions(step.get_concrete_function(tf.constant(values[0])))
    whole_variable = not sparse or not graph_opt._rows_only
    large = rows * 4 >= teo.optimizers.XLA_MIN_ELEMENTS
    assert bool(compiled) == (whole_variable and large and xla_on_host()), compiled
    _assert_states_close(
        _state(graph_opt, graph_var), _state(eager_opt, eager_var), 1e-6
    )
    assert int(graph_opt.iterations.numpy()) == len(values)


@requires_xla
@pytest.mark.parametrize("size", [0, 1, 5, 16])
def test_deduplicate_compiles_with_static_shapes(size):
    rng = np.random.default_rng(size)
    ids = rng.integers(0, 4, size=size).astype("int32")
    rows = rng.normal(size=(size, 3)).astype("float32")
    compiled = tf.function(teo.optimizers.deduplicate, jit_compile=True)
    got_ids, got_rows = compiled(tf.constant(ids), tf.constant(rows))
    assert got_ids.shape == (size,) and got_rows.shape == (size, 3)
    dense = np.zeros((4, 3), "float32")
    np.add.at(dense, ids, rows)
    distinct = np.unique(ids)
    np.testing.assert_array_equal(got_ids.numpy()[: distinct.size], distinct)
    np.testing.assert_allclose(
        got_rows.numpy()[: distinct.size], dense[distinct], rtol=1e-6, atol=1e-6
    )


# ------------------------------------------------------------ 5. mixed precision


@pytest.fixture
def mixed_float16():
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy("float32")


@per_optimizer
@pytest.mark.parametrize("name", NAMES)
def test_mixed_precision_fit(name, mixed_float16):
    keras.utils.set_random_seed(2)
    model = _model()
    assert model.get_layer("embedding").compute_dtype == "float16"
    model.compile(optimizer=make(name), loss="mse")
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    x, y = _data(seed=4, rows=48)
    table = model.get_layer("embedding").embeddings.numpy().copy()
    history = model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    assert all(np.isfinite(history.history["loss"])), history.history["loss"]
    for weight in model.weights:
        assert weight.dtype == "float32", weight.path
        assert np.all(np.isfinite(weight.numpy())), weight.path
    inner = model.optimizer.inner_optimizer
    assert type(inner) is type(make(name))
    for variable in inner.variables:
        if variable is inner.iterations:
            continue
        assert variable.dtype == "float32", variable.path
    after = model.get_layer("embedding").embeddings.numpy()
    used = np.unique(x)
    assert not np.array_equal(after[used], table[used])
    if name in LAZY:
        unused = np.setdiff1d(np.arange(VOCAB), used)
        np.testing.assert_array_equal(after[unused], table[unused])


@per_optimizer
@pytest.mark.parametrize("name", NAMES)
def test_a_loss_scale_factor_trains_as_the_unscaled_loss(name):
    """`loss_scale_factor`: Keras scales the loss and divides each gradient by
    it with `/`, which failed on an Embedding's `tf.IndexedSlices` (stock
    Keras optimizers still fail). A power of two divides out exactly: the
    model trains as without it, bit for bit. Eagerly, where each operation
    runs as written: in a graph TensorFlow's optimizer may rewrite the
    dense layers' arithmetic apart in the two graphs (seen with LaProp)."""
    trained = []
    for scale in (None, 2.0**10):
        keras.utils.set_random_seed(1)
        model = _model()
        optimizer = make(name)
        optimizer.loss_scale_factor = scale
        model.compile(optimizer=optimizer, loss="mse", run_eagerly=True)
        x, y = _data()
        model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
        trained.append([w.numpy() for w in [*model.weights, *optimizer.variables]])
    for scaled, plain in zip(*trained):
        np.testing.assert_array_equal(scaled, plain)


# ------------------------------------------------- 6. empty and edge gradients


@per_optimizer
@pytest.mark.parametrize("name", LAZY)
def test_empty_sparse_gradient_is_a_no_op(name):
    variable, optimizer = _variable(), make(name)
    optimizer.build([variable])
    optimizer.apply_gradients(
        [(tf.IndexedSlices(tf.constant(_gradient_rows()), tf.constant(IDS)), variable)]
    )
    before = _state(optimizer, variable)
    empty = tf.IndexedSlices(
        tf.zeros([0, 4], tf.float32),
        tf.zeros([0], tf.int32),
        tf.constant([ROWS, 4], tf.int64),
    )
    optimizer.apply_gradients([(empty, variable)])
    _assert_unchanged(_state(optimizer, variable), before)
    if not xla_on_host():
        return

    @tf.function(jit_compile=True)
    def step():
        optimizer.apply_gradients([(empty, variable)])

    step()
    _assert_unchanged(_state(optimizer, variable), before)


def _assert_states_equal(got, want):
    assert [name for name, _ in got] == [name for name, _ in want]
    for (name, a), (_, b) in zip(got, want):
        np.testing.assert_array_equal(a, b, err_msg=name)


def _assert_unchanged(got, want):
    assert [name for name, _ in got] == [name for name, _ in want]
    for (name, a), (_, b) in zip(got, want):
        if "clipping_factor" in name:
            continue  # ClippyAdagrad's export describes the latest step.
        np.testing.assert_array_equal(a, b, err_msg=name)


@per_optimizer
@pytest.mark.parametrize("id_dtype", [tf.int32, tf.int64], ids=["int32", "int64"])
@pytest.mark.parametrize("name", NAMES)
def test_ids_at_the_table_edges(name, id_dtype):
    ids = tf.constant([0, ROWS - 1, 0, ROWS - 1, 0], id_dtype)
    rows = tf.constant(_gradient_rows()[:5])
    shape = tf.constant([ROWS, 4], tf.int64)
    sparse_var, sparse_opt = _variable(), make(name)
    dense_var, dense_opt = _variable(), make(name)
    initial = sparse_var.numpy()
    for _ in range(2):
        sparse_opt.apply_gradients([(tf.IndexedSlices(rows, ids, shape), sparse_var)])
        dense = tf.convert_to_tensor(tf.IndexedSlices(rows, ids, shape))
        dense_opt.apply_gradients([(dense, dense_var)])
    got, want = sparse_var.numpy(), dense_var.numpy()
    edges = [0, ROWS - 1]
    assert not np.array_equal(got[edges], initial[edges])
    np.testing.assert_allclose(got[edges], want[edges], rtol=1e-6, atol=1e-7)
    if name in LAZY:
        np.testing.assert_array_equal(got[1:-1], initial[1:-1])
    else:
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
