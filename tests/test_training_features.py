"""A table meets Keras's own training features: exact, or refused before
anything trains (`layers/model_optimizer.py`).

The matrix: each feature of the model's optimizer (loss scaling, skipped
steps, `mixed_float16`, clipping, weight decay, EMA, gradient accumulation,
`steps_per_execution`, `jit_compile`, `keras.optimizers.MultiOptimizer`) on
the backend the suite runs on, with a `layers.Embedding`, a
`StackedEmbedding` and keras-rs tables (`row_sparse_tables`).

The reference, where the feature must not change training: the same model
trained without it, bit for bit. Where it does (a skipped step, clipping,
weight decay, EMA, float16 compute): the same model with
`keras.layers.Embedding` tables, which Keras's own `MultiOptimizer` hands to
the table's twin (`tf_tpu_embed_opt.optimizers.*`) while the model
optimizer, with the feature, trains the dense weights. That is TPUEmbedding's
contract written with Keras's own machinery: the model optimizer's features
act on the dense weights (Keras applies a `LossScaleOptimizer`'s unscaling
and skip to every sub-optimizer), the table optimizer steps the tables. The
twin sums an `IndexedSlices`' duplicate ids in order, as the row-sparse
lookup does, so on TensorFlow the two are equal bit for bit; on JAX the
table's gradient is dense, whose scatter adds the duplicates of an id in an
order of XLA's, so each batch holds an id at most twice (two numbers add the
same in either order), and no id twice where float16 sums them.
"""

# Runs without TensorFlow.

import contextlib
import importlib.util

import keras
import numpy as np
import pytest
import row_steps
from conftest import keras_face

import tf_tpu_embed_opt as teo

pytestmark = keras_face

BACKEND = keras.backend.backend()
ROWS, DIM, BATCH = 20, 4, 4
_RNG = np.random.default_rng(11)
W0 = {name: _RNG.normal(0.0, 0.5, (ROWS, DIM)).astype("float32") for name in "ab"}
KERNEL = _RNG.normal(0.0, 0.5, (2 * 3 * DIM, 1)).astype("float32")


def _ids(batches, twice=True):
    """`batches` batches of `BATCH` x 3 ids per table, each id at most twice
    in a batch (`twice=False`: once)."""
    rng = np.random.default_rng(5)
    tables = {}
    for name in "ab":
        parts = []
        for _ in range(batches):
            pool = np.repeat(np.arange(ROWS), 2 if twice else 1)
            parts.append(rng.permutation(pool)[: BATCH * 3].reshape(BATCH, 3))
        tables[name] = np.concatenate(parts).astype("int32")
    return tables


IDS = _ids(6)
Y = np.linspace(-1.0, 1.0, len(IDS["a"])).astype("float32")[:, None]


@pytest.fixture(autouse=True)
def _no_rsqrt_rewrite():
    """On TensorFlow, without Grappler's arithmetic optimizer, which rewrites
    Adagrad's g/√a as g·rsqrt(a), whose vectorized approximation depends on
    where an element sits in its array: a stack and its separate tables (of
    other shapes) would then differ in the last bit for that reason alone,
    with or without a feature. Both sides of each comparison run alike."""
    if BACKEND != "tensorflow":
        yield
        return
    import tensorflow as tf

    before = tf.config.optimizer.get_experimental_options()
    tf.config.optimizer.set_experimental_options({"arithmetic_optimization": False})
    yield
    tf.config.optimizer.set_experimental_options(
        {"arithmetic_optimization": before.get("arithmetic_optimization", True)}
    )


def _adagrad():
    return teo.optimizers.Adagrad(0.2)


def _adam():
    return teo.optimizers.Adam(0.05, lazy=True)


def _keras_rs_runs():
    """Whether keras-rs's layer runs here: on the TensorFlow backend it
    imports its TensorFlow layer, which needs SparseCore configs (TensorFlow
    >= 2.17; on 2.16 its import fails)."""
    if importlib.util.find_spec("keras_rs") is None:
        return False
    if BACKEND != "tensorflow":
        return True
    import tensorflow as tf

    return hasattr(tf.tpu.experimental.embedding, "SparseCoreEmbeddingConfig")


KINDS = ["embedding", "stacked", *(["keras-rs"] if _keras_rs_runs() else [])]


def _tables(kind, table_optimizer, reference):
    """The model's two tables `a` and `b` (of `kind`), and a function of the
    inputs giving their outputs."""
    if kind == "keras-rs":
        return _keras_rs_tables(table_optimizer, reference)
    if reference:
        layers = {
            name: keras.layers.Embedding(
                ROWS,
                DIM,
                embeddings_initializer=keras.initializers.Constant(W0[name]),
                name=name,
            )
            for name in "ab"
        }
        return lambda inputs: [layers[n](inputs[n]) for n in "ab"]
    layers = {
        name: teo.layers.Embedding(
            ROWS,
            DIM,
            optimizer=table_optimizer(),
            embeddings_initializer=keras.initializers.Constant(W0[name]),
            name=name,
        )
        for name in "ab"
    }
    if kind == "embedding":
        return lambda inputs: [layers[n](inputs[n]) for n in "ab"]
    stacked = teo.layers.StackedEmbedding([layers["a"], layers["b"]], name="stacked")
    return lambda inputs: stacked([inputs["a"], inputs["b"]])


def _keras_rs_tables(table_optimizer, reference):
    """keras-rs default-device tables (the mean of each sample's 3 rows):
    row-sparse (`row_sparse_tables`), or as keras-rs trains them, with the
    model's optimizer (the reference's `MultiOptimizer`)."""
    import keras_rs

    tables = {
        name: keras_rs.layers.TableConfig(
            name=name,
            vocabulary_size=ROWS,
            embedding_dim=DIM,
            optimizer=table_optimizer(),
            placement="default_device",
            initializer=keras.initializers.Constant(W0[name]),
        )
        for name in "ab"
    }
    features = {
        name: keras_rs.layers.FeatureConfig(
            name=name, table=table, input_shape=(BATCH, 3), output_shape=(BATCH, DIM)
        )
        for name, table in tables.items()
    }
    embedding = keras_rs.layers.DistributedEmbedding(features)
    if not reference:
        embedding = teo.layers.row_sparse_tables(embedding)

    def outputs(inputs):
        looked_up = embedding(inputs)
        return [looked_up[n] for n in "ab"]

    return outputs


def _model(kind, table_optimizer=_adagrad, reference=False, scope=None):
    """The model; its layers made in `scope` (a context), if given."""
    # Each input keyed by its own name (Keras 3.16 warns otherwise), which is
    # not its table's: a functional model's layer names are unique.
    inputs = {
        f"ids_{name}": keras.Input(
            (3,), batch_size=BATCH, dtype="int32", name=f"ids_{name}"
        )
        for name in "ab"
    }
    with scope or contextlib.nullcontext():
        tables = _tables(kind, table_optimizer, reference)
        outputs = tables({name: inputs[f"ids_{name}"] for name in "ab"})
        flat = [keras.layers.Flatten()(o) for o in outputs]
        joined = keras.layers.Concatenate()(flat)
        head = keras.layers.Dense(
            1,
            kernel_initializer=lambda shape, dtype=None: KERNEL[: shape[0]],
            name="head",
        )
        output = keras.layers.Activation("linear", dtype="float32")(head(joined))
    return keras.Model(inputs, output)


def _reference_optimizer(dense, table_optimizer=_adagrad):
    """Keras's MultiOptimizer: the tables to their twins, the rest to
    `dense`."""
    if not hasattr(keras.optimizers, "MultiOptimizer"):
        # Keras 3.10 to 3.12, what Python 3.9 and 3.10 get.
        pytest.skip(f"Keras {keras.__version__} has no MultiOptimizer (3.15 has)")
    return keras.optimizers.MultiOptimizer(
        keras.optimizers.OptimizerMap(
            dense, {f"(.*/)?{n}/embeddings": table_optimizer() for n in "ab"}
        )
    )


# Against the reference, bit for bit where each operation rounds once: on
# TensorFlow, and on JAX step by step (`jit_compile=False`). Compiled, XLA:CPU
# contracts a multiply feeding an add into one fused multiply-add inside the
# fusions it forms, and the reference's graph (a dense gradient over the
# whole table) fuses otherwise than the layer's (gathered rows): from JAX
# 0.12, and in TensorFlow 2.19 and 2.20, the two then round apart in the last
# bit (`_assert_close` bounds it; test_compiled_or_not_the_tables_step_as_their_twins
# runs both ways, compiled within the bound on both backends).
AS_WRITTEN = {"jit_compile": False} if BACKEND == "jax" else {}


def _inputs(ids):
    """Table name -> ids, as the model's inputs are keyed."""
    return {f"ids_{name}": values for name, values in ids.items()}


def _fit(model, optimizer, ids=IDS, y=Y, callbacks=None, **kwargs):
    """`model` compiled with `optimizer` (and `kwargs`) and fitted one epoch,
    with `callbacks`."""
    model.compile(optimizer=optimizer, loss="mse", **kwargs)
    model.fit(
        _inputs(ids),
        y,
        batch_size=BATCH,
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=callbacks,
    )
    return model


def _state(model):
    """Every value a step writes, by name: each table's rows and slots
    (whatever layer holds them), the dense weights."""
    state = {}
    for layer in model._flatten_layers():
        if isinstance(layer, teo.layers.StackedEmbedding):
            for name in (n for names in layer.stacks for n in names):
                state[name] = layer.get_table(name)
        elif isinstance(layer, teo.layers.Embedding) and layer.name in "ab":
            state[layer.name] = {
                "embeddings": keras.ops.convert_to_numpy(layer.embeddings),
                **{k: keras.ops.convert_to_numpy(v) for k, v in layer.slots.items()},
            }
    return {**state, **_dense(model)}


def _dense(model):
    return {
        v.path: keras.ops.convert_to_numpy(v)
        for v in model.weights
        if v.path.startswith("head/")
    }


def _paths(model):
    return {v.path: v for v in model.weights}


def _reference_state(model):
    state = {}
    optimizer = model.optimizer
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        optimizer = optimizer.inner_optimizer
    for name in "ab":
        (variable,) = [
            v
            for path, v in _paths(model).items()
            if path.endswith(f"{name}/embeddings")
        ]
        twin = optimizer._optimizer_map(variable)
        index = twin._get_variable_index(variable)
        state[name] = {
            "embeddings": keras.ops.convert_to_numpy(variable),
            **{
                slot: keras.ops.convert_to_numpy(variables[index])
                for slot, variables in twin._slot_variables.items()
            },
        }
    return {**state, **_dense(model)}


def _table_steps(model):
    """Each table's step counter (a stack's for a stacked table)."""
    steps = {}
    for layer in model._flatten_layers():
        if isinstance(layer, teo.layers.Embedding) and layer.built:
            steps[layer.name] = int(keras.ops.convert_to_numpy(layer.table_step))
    return steps


def _pairs(got, want):
    """`(label, got value, wanted value)` of every value of two states
    (`_state`), whose names and keys must agree."""
    assert got.keys() == want.keys()
    for name in want:
        if isinstance(want[name], dict):
            assert got[name].keys() == want[name].keys(), name
            for key in want[name]:
                yield f"{name}/{key}", got[name][key], want[name][key]
        else:
            yield name, got[name], want[name]


def _assert_equal(got, want):
    for label, a, b in _pairs(got, want):
        np.testing.assert_array_equal(a, b, label)


def _assert_close(got, want, steps):
    """`got` equals `want` within what rounding a·b + c once instead of twice
    can move: `row_steps.assert_rows`'s bound (each fused operation within an
    ulp of either rounding, moving a value by a few ulps of the largest value
    it is computed from, added up over the `steps` steps), with values below
    1 counted as 1."""
    for label, a, b in _pairs(got, want):
        row_steps.assert_rows(a, b, np.float32(1.0), steps, bounded=True, what=label)


def _steps(optimizer):
    return int(keras.ops.convert_to_numpy(optimizer.iterations))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "scaled",
    [
        lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1)),
        lambda: keras.optimizers.SGD(0.1, loss_scale_factor=2.0**10),
    ],
    ids=["LossScaleOptimizer", "loss_scale_factor"],
)
def test_a_scaled_loss_steps_the_tables_as_the_unscaled_one(kind, scaled):
    """A power-of-two loss scale divides out exactly: the model trains as
    without it, bit for bit (tables, slots, step counters, dense weights)."""
    plain = _fit(_model(kind), keras.optimizers.SGD(0.1))
    wrapped = _fit(_model(kind), scaled())
    _assert_equal(_state(wrapped), _state(plain))
    assert _table_steps(wrapped) == _table_steps(plain)
    assert set(_table_steps(plain).values()) == {len(Y) // BATCH}


@pytest.mark.parametrize("kind", KINDS)
def test_a_step_the_loss_scale_optimizer_skips_leaves_the_tables(kind):
    """Batches whose targets are NaN give non-finite gradients: the
    LossScaleOptimizer skips their steps (halving its scale), and the model
    trains as if those batches were not there; the tables' Adam counts only
    the steps applied (its bias correction reads the counter)."""
    skipped = [1, 3]
    y = Y.copy()
    for batch in skipped:
        y[batch * BATCH : (batch + 1) * BATCH] = np.nan
    optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1))
    wrapped = _fit(_model(kind, _adam), optimizer, IDS, y)
    assert float(keras.ops.convert_to_numpy(optimizer.dynamic_scale)) == 2.0**13
    kept = np.concatenate(
        [
            np.arange(b * BATCH, (b + 1) * BATCH)
            for b in range(len(Y) // BATCH)
            if b not in skipped
        ]
    )
    applied = {name: ids[kept] for name, ids in IDS.items()}
    plain = _fit(_model(kind, _adam), keras.optimizers.SGD(0.1), applied, Y[kept])
    _assert_equal(_state(wrapped), _state(plain))
    steps = _table_steps(wrapped)
    assert steps == _table_steps(plain)
    assert set(steps.values()) == {_steps(optimizer)} == {len(kept) // BATCH}


@pytest.mark.parametrize("kind", ["embedding", "stacked"])
@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_steps_float32_tables_with_the_unscaled_gradient(kind, policy):
    """16-bit compute, float32 tables, slots and learning rate, and under
    `mixed_float16` the LossScaleOptimizer that `compile` adds: as Keras
    trains `keras.layers.Embedding` tables with their twins under the same
    policy (each id once a batch: the reference sums an id's rows in 16 bits,
    the layer in float32)."""
    ids = _ids(6, twice=False)
    keras.config.set_dtype_policy(policy)
    try:
        ours = _fit(_model(kind), keras.optimizers.SGD(0.1), ids)
        reference = _fit(
            _model(kind, reference=True),
            _reference_optimizer(keras.optimizers.SGD(0.1)),
            ids,
        )
    finally:
        keras.config.set_dtype_policy("float32")
    scaled = isinstance(ours.optimizer, keras.optimizers.LossScaleOptimizer)
    assert scaled == (policy == "mixed_float16")
    for layer in ours._flatten_layers():
        if isinstance(layer, teo.layers.Embedding):
            assert layer.compute_dtype == policy.split("_")[1]
            assert all(v.dtype == "float32" for v in layer.weights)
    if BACKEND == "jax":
        # Compiled: 16-bit values are rounded where XLA's fusions end, which
        # differ between the two graphs; step by step, where each operation
        # rounds, Keras's float16 unscaling of the reference's gradient rounds
        # where the layer's float32 division does not.
        _assert_close(_state(ours), _reference_state(reference), len(Y) // BATCH)
    else:
        _assert_equal(_state(ours), _reference_state(reference))


DENSE_FEATURES = {
    "clipnorm": lambda: keras.optimizers.SGD(0.1, clipnorm=0.05),
    "global_clipnorm": lambda: keras.optimizers.SGD(0.1, global_clipnorm=0.05),
    "clipvalue": lambda: keras.optimizers.SGD(0.1, clipvalue=0.01),
    "weight_decay": lambda: keras.optimizers.Adam(0.05, weight_decay=0.3),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("feature", sorted(DENSE_FEATURES))
def test_clipping_and_weight_decay_act_on_the_dense_weights_alone(kind, feature):
    """As on a TPU: the model optimizer clips and decays the dense weights
    (a global norm over theirs alone); the tables step unclipped."""
    make = DENSE_FEATURES[feature]
    ours = _fit(_model(kind), make(), **AS_WRITTEN)
    reference = _fit(
        _model(kind, reference=True), _reference_optimizer(make()), **AS_WRITTEN
    )
    _assert_equal(_state(ours), _reference_state(reference))


@pytest.mark.parametrize("kind", KINDS)
def test_ema_averages_the_dense_weights_alone(kind):
    """use_ema: on JAX the dense weights end at their moving average and the
    tables train as without it (Keras keeps no average of a variable it
    overwrites); on TensorFlow, where Keras's optimizer would assign the
    tables a missing average, it is refused before anything trains."""

    def dense():
        return keras.optimizers.SGD(0.1, use_ema=True, ema_momentum=0.5)

    if BACKEND == "tensorflow":
        _assert_refused(kind, dense(), "use_ema=True.*Leave use_ema off")
        return
    ours = _fit(_model(kind), dense(), **AS_WRITTEN)
    reference = _fit(
        _model(kind, reference=True), _reference_optimizer(dense()), **AS_WRITTEN
    )
    _assert_equal(_state(ours), _reference_state(reference))


@pytest.mark.skipif(BACKEND != "jax", reason="use_ema is refused on TensorFlow")
@pytest.mark.parametrize("kind", KINDS)
def test_a_second_fit_with_ema_runs_once_the_weights_are_copied(kind):
    """The row-sparse guide's way past Keras's own failure on JAX (a `fit`
    with use_ema leaves each weight and its moving average one array, which
    the next compiled step donates twice): copied between the two calls, the
    second `fit` trains the tables on as the reference's, compiled both."""

    def twice(model, optimizer):
        _fit(model, optimizer)
        for variable in model.trainable_variables:
            variable.assign(keras.ops.convert_to_numpy(variable))
        model.fit(_inputs(IDS), Y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        return model

    def dense():
        return keras.optimizers.SGD(0.1, use_ema=True, ema_momentum=0.5)

    ours = twice(_model(kind), dense())
    reference = twice(_model(kind, reference=True), _reference_optimizer(dense()))
    assert set(_table_steps(ours).values()) <= {2 * (len(Y) // BATCH)}
    _assert_close(_state(ours), _reference_state(reference), 2 * (len(Y) // BATCH))


def _assert_refused(kind, optimizer, match):
    """`fit` refuses `optimizer`, naming its setting, before anything
    trains: the model is as it was, and trains once compiled without it."""
    model = _model(kind)
    before = _state(model)
    with pytest.raises(
        ValueError,
        match=f"the model's optimizer {type(optimizer).__name__} has {match}",
    ):
        _fit(model, optimizer)
    _assert_equal(_state(model), before)
    assert set(_table_steps(model).values()) == {0}
    trained = _fit(model, keras.optimizers.SGD(0.1))
    _assert_equal(
        _state(trained), _state(_fit(_model(kind), keras.optimizers.SGD(0.1)))
    )


_SHARED = (
    r"its optimizer Adam '.*' is also a model's optimizer \(the same object, "
    r"built on the model's variables\)\. .* the dense layers would step at the "
    r"table's step count, one ahead .* Embedding\(\.\.\., "
    r"optimizer=Adam\.from_config\(optimizer\.get_config\(\)\)\)"
)


@pytest.mark.parametrize("kind", KINDS)
def test_the_tables_optimizer_as_the_models_is_refused(kind):
    """One twin as the tables' optimizer and the model's ("one definition"):
    its `iterations` are the tables' steps, so the dense weights stepped one
    step ahead (Adam's bias correction) on TensorFlow, without a word, and
    on JAX the step failed with "Attempt to donate the same buffer twice"
    (the learning rate, state of the layer and of the optimizer). Refused
    before anything trains; an optimizer of the same definition of its own
    (the way the refusal names) trains as two twins do."""
    shared = _adam()
    model = _model(kind, lambda: shared)
    if kind == "keras-rs":
        # `row_sparse_tables` gives keras-rs's tables twins of their own.
        _assert_equal(
            _state(_fit(model, shared)), _state(_fit(_model(kind, _adam), _adam()))
        )
        return
    before = _state(model)
    with pytest.raises(ValueError, match=_SHARED):
        _fit(model, shared)
    _assert_equal(_state(model), before)
    assert set(_table_steps(model).values()) == {0}
    own = teo.optimizers.Adam.from_config(shared.get_config())
    trained = _fit(model, own)
    _assert_equal(_state(trained), _state(_fit(_model(kind, _adam), _adam())))


def test_a_models_optimizer_is_refused_as_a_tables():
    """The other order: an optimizer already built on a model's variables
    is refused when the table it is given to is built."""
    shared = _adam()
    shared.build([keras.Variable(np.zeros((3,), "float32"))])
    with pytest.raises(ValueError, match=_SHARED):
        _model("embedding", lambda: shared)


@pytest.mark.parametrize("kind", KINDS)
def test_ema_overwrite_frequency_is_refused(kind):
    optimizer = keras.optimizers.SGD(0.1, use_ema=True, ema_overwrite_frequency=2)
    match = "use_ema=True" + (
        "" if BACKEND == "tensorflow" else " with ema_overwrite_frequency=2"
    )
    _assert_refused(kind, optimizer, match)


@pytest.mark.parametrize("kind", KINDS)
def test_gradient_accumulation_is_refused(kind):
    optimizer = keras.optimizers.Adam(0.1, gradient_accumulation_steps=2)
    _assert_refused(
        kind, optimizer, r"gradient_accumulation_steps=2.*a batch 2 times larger"
    )


@pytest.mark.parametrize("kind", KINDS)
def test_a_loss_scale_optimizer_around_a_refused_feature_is_refused(kind):
    inner = keras.optimizers.SGD(0.1, gradient_accumulation_steps=3)
    with pytest.raises(ValueError, match="SGD has gradient_accumulation_steps=3"):
        _fit(_model(kind), keras.optimizers.LossScaleOptimizer(inner))


@pytest.mark.parametrize("kind", KINDS)
def test_steps_per_execution_trains_as_one_step_at_a_time(kind):
    one = _fit(_model(kind, _adam), keras.optimizers.Adam(0.05))
    three = _fit(
        _model(kind, _adam), keras.optimizers.Adam(0.05), steps_per_execution=3
    )
    _assert_equal(_state(three), _state(one))
    assert _table_steps(three) == _table_steps(one)


def _rows_of(state):
    """Each table's rows (`embeddings`) in a `_state`."""
    return {name: state[name]["embeddings"] for name in "ab"}


@pytest.mark.parametrize("kind", KINDS)
def test_a_learning_rate_callback_sets_the_dense_weights_rate_alone(kind):
    # Keras's learning-rate callbacks set the model optimizer's rate: the
    # table keeps its own optimizer's, as on a TPU.
    zero = keras.callbacks.LearningRateScheduler(lambda epoch, rate: 0.0)
    ours = _fit(_model(kind), keras.optimizers.SGD(0.1), callbacks=[zero])
    reference = _fit(_model(kind), keras.optimizers.SGD(0.0))
    _assert_equal(_state(ours), _state(reference))
    kernel = _dense(ours)["head/kernel"]
    np.testing.assert_array_equal(kernel, KERNEL[: len(kernel)])
    assert all(np.any(rows != W0[n]) for n, rows in _rows_of(_state(ours)).items())


class _StopTablesAfter(keras.callbacks.Callback):
    """Sets each table optimizer's learning rate to 0 after batch `batch`,
    through `self.model` (on JAX that brings the model's state back to its
    variables first, as for any variable a callback sets)."""

    def __init__(self, batch):
        super().__init__()
        self.batch = batch

    def on_train_batch_end(self, batch, logs=None):
        if batch != self.batch:
            return
        for layer in self.model._flatten_layers():
            if isinstance(layer, teo.layers.Embedding) and layer.built:
                layer.optimizer.learning_rate = 0.0


@pytest.mark.parametrize("kind", ["embedding", "stacked"])
def test_a_callback_sets_a_tables_learning_rate_during_fit(kind):
    stop = _StopTablesAfter(1)
    model = _fit(_model(kind, _adam), keras.optimizers.SGD(0.1), callbacks=[stop])
    # Two batches, then the tables' rows stand (Adam's slots go on: a rate
    # of 0 moves no row) while the dense weights go on.
    first = {name: values[: 2 * BATCH] for name, values in IDS.items()}
    two = _fit(
        _model(kind, _adam), keras.optimizers.SGD(0.1), ids=first, y=Y[: 2 * BATCH]
    )
    _assert_equal(_rows_of(_state(model)), _rows_of(_state(two)))
    assert np.any(_dense(model)["head/kernel"] != _dense(two)["head/kernel"])
    assert all(np.any(rows != W0[n]) for n, rows in _rows_of(_state(two)).items())


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("jit_compile", [True, False])
def test_compiled_or_not_the_tables_step_as_their_twins(kind, jit_compile):
    ours = _fit(_model(kind), keras.optimizers.SGD(0.1), jit_compile=jit_compile)
    reference = _fit(
        _model(kind, reference=True),
        _reference_optimizer(keras.optimizers.SGD(0.1)),
        jit_compile=jit_compile,
    )
    if jit_compile:
        _assert_close(_state(ours), _reference_state(reference), len(Y) // BATCH)
    else:
        _assert_equal(_state(ours), _reference_state(reference))


@pytest.mark.skipif(
    not hasattr(keras.optimizers, "MultiOptimizer"),
    reason="keras.optimizers.MultiOptimizer is Keras 3.15's",
)
@pytest.mark.parametrize("kind", KINDS)
def test_a_multi_optimizer_trains_the_dense_weights_around_the_tables(kind):
    """The model's optimizer a Keras MultiOptimizer (the head's kernel to
    Adam, the rest to SGD, which is handed the tables and writes them as
    they stepped)."""

    def optimizers(**tables):
        return keras.optimizers.MultiOptimizer(
            keras.optimizers.OptimizerMap(
                keras.optimizers.SGD(0.1),
                {"head/kernel": keras.optimizers.Adam(0.05), **tables},
            )
        )

    ours = _fit(_model(kind), optimizers(), **AS_WRITTEN)
    reference = _fit(
        _model(kind, reference=True),
        optimizers(**{f"(.*/)?{n}/embeddings": _adagrad() for n in "ab"}),
        **AS_WRITTEN,
    )
    _assert_equal(_state(ours), _reference_state(reference))


# Keras's TensorFlow backend rematerializes with `tf.recompute_grad`, which
# takes keyword arguments (a layer's `training`) only eagerly: a model built in
# a RematScope fails to compile there, tables or not (Keras's own error).
EAGER_REMAT = {"run_eagerly": True} if BACKEND == "tensorflow" else {}


@pytest.mark.parametrize("kind", KINDS)
def test_a_remat_scope_rematerializes_the_layers_around_the_tables(kind):
    """Built in `keras.RematScope(mode="full")`, the other layers are
    rematerialized and the row-sparse ones are not (their backward pass
    steps the rows their forward pass read): the model trains as built
    without the scope, bit for bit (what the others recompute is copies of
    the tables' rows, which the head's backward pass reads)."""
    rematerialized = _model(kind, scope=keras.RematScope(mode="full"))
    # Keras rematerializes a layer whose `rematerialized_call` wraps its call.
    head = rematerialized.get_layer("head")
    assert head.rematerialized_call(head.call) != head.call
    row_sparse = [
        layer
        for layer in rematerialized._flatten_layers(include_self=False)
        if isinstance(layer, (teo.layers.Embedding, teo.layers.StackedEmbedding))
        or type(layer).__name__ == "RowSparseDistributedEmbedding"
    ]
    assert row_sparse
    for layer in row_sparse:
        assert layer.rematerialized_call(layer.call) == layer.call, layer
    ours = _fit(rematerialized, keras.optimizers.SGD(0.1), **EAGER_REMAT)
    plain = _fit(_model(kind), keras.optimizers.SGD(0.1), **EAGER_REMAT)
    _assert_equal(_state(ours), _state(plain))
    assert set(_table_steps(ours).values()) == {len(Y) // BATCH}


class _Tower(keras.layers.Layer):
    """A layer that calls a row-sparse table, handing it its `training` or
    leaving Keras to."""

    def __init__(self, hands_training, **kwargs):
        super().__init__(**kwargs)
        self.hands_training = hands_training
        self.table = teo.layers.Embedding(
            ROWS,
            DIM,
            optimizer=_adagrad(),
            embeddings_initializer=keras.initializers.Constant(W0["a"]),
            name="a",
        )

    def call(self, ids, training=None):
        if self.hands_training:
            return self.table(ids, training=training)
        return self.table(ids)


_REMATERIALIZED = (
    r"Embedding: table '[ab]': it is called inside a rematerialized function "
    r"\(a model or layer that keras.RematScope rematerializes, .* Build the "
    r"model, and the layers that call the table, outside the RematScope"
)


@pytest.mark.parametrize("hands_training", [True, False], ids=["handed", "keras"])
def test_a_table_called_inside_a_rematerialized_layer_is_refused(hands_training):
    """Its forward pass would run again in the backward pass: on JAX the
    step failed (a traced `training`, a leaked tracer), on TensorFlow the
    table trained wrong without a word, or was refused as untrained. Refused
    naming the table, before anything trains (on JAX Keras's trainer raises
    it as it builds the model)."""
    ids = keras.Input((3,), batch_size=BATCH, dtype="int32")
    with keras.RematScope(mode="full"):
        tower = _Tower(hands_training)
        rows = keras.layers.Flatten()(tower(ids))
    model = keras.Model(ids, keras.layers.Dense(1)(rows))
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", **EAGER_REMAT)
    with pytest.raises((ValueError, RuntimeError), match=_REMATERIALIZED):
        model.fit(IDS["a"], Y, batch_size=BATCH, epochs=1, verbose=0)
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(tower.table.embeddings), W0["a"]
    )
    assert int(keras.ops.convert_to_numpy(tower.table.table_step)) == 0


def test_a_model_made_in_a_remat_scope_is_refused():
    """Keras then rematerializes the model's whole call, tables and all."""
    with keras.RematScope(mode="full"):
        model = _model("embedding")
    with pytest.raises((ValueError, RuntimeError), match=_REMATERIALIZED):
        _fit(model, keras.optimizers.SGD(0.1), **EAGER_REMAT)
    assert set(_table_steps(model).values()) == {0}
