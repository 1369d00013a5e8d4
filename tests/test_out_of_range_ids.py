"""Ids outside a `tf_tpu_embed_opt.layers.Embedding` table are refused.

One rule on both backends: an id below 0 or at or past `input_dim` is
refused before anything is looked up or stepped, with an error naming the
layer, the id and the range, in `fit` and in custom loops, eagerly and
compiled. Before, on JAX an id past the table trained into NaN and -1
wrapped to the last row; on TensorFlow the refusal was the CPU gather's,
naming neither the layer nor the range (and a GPU gather reads zeros).
Under XLA on TensorFlow nothing can stop a step: such ids read zeros and
step no row, and tracing warns (tested where TensorFlow can JIT on the
host).
"""

# Runs without TensorFlow.

import os
import re
import subprocess
import sys

import keras
import numpy as np
import pytest
from child_env import child_env
from conftest import keras_face

import tf_tpu_embed_opt as teo
from tf_tpu_embed_opt.layers import ids as ids_module

pytestmark = keras_face

BACKEND = keras.backend.backend()
ROWS = 10
GOOD = np.array([[1, 2], [3, 4]], "int32")


def _refusal(first, more=None, total=4):
    """The message's text, as a pattern."""
    others = f" and {more} more of the {total} ids in the batch are" if more else " is"
    return re.escape(
        f"Embedding `items`: id {first}{others} outside the table, whose ids "
        f"are [0, {ROWS}) (input_dim={ROWS})."
    )


def _compiled_errors():
    """What a refusal inside a compiled step is raised as: JAX's, from the
    host callback (a `JaxRuntimeError` from the call that compiles the step, a
    `ValueError` from JAX's C++ dispatch of later calls), TensorFlow's from
    the assertion."""
    if BACKEND == "jax":
        import jax

        return (jax.errors.JaxRuntimeError, ValueError)
    import tensorflow as tf

    return (tf.errors.InvalidArgumentError,)


def _model(jit_compile="auto"):
    inputs = keras.Input((2,), dtype="int32")
    layer = teo.layers.Embedding(
        ROWS, 3, optimizer=teo.optimizers.Adagrad(0.1), name="items"
    )
    outputs = keras.layers.Dense(1)(keras.layers.Flatten()(layer(inputs)))
    model = keras.Model(inputs, outputs)
    model.compile(optimizer="sgd", loss="mse", jit_compile=jit_compile)
    return model, layer


def _state(layer):
    return [keras.ops.convert_to_numpy(v) for v in layer.weights]


@pytest.mark.parametrize(
    "bad",
    [ROWS, -1, 10**6],  # one past: NaN on JAX before; -1 wrapped to the last row
)
def test_fit_and_predict_refuse_an_id_outside_the_table(bad):
    x = GOOD.copy()
    x[1, 0] = bad
    # A model each: on JAX an error inside a step leaves Keras's model
    # without its arrays (the guide's Limits).
    jit_compile = False if BACKEND == "tensorflow" else "auto"
    with pytest.raises(_compiled_errors(), match=_refusal(bad)):
        _model(jit_compile)[0].predict(x, verbose=0)
    with pytest.raises(_compiled_errors(), match=_refusal(bad)):
        _model(jit_compile)[0].fit(x, np.ones((2, 1)), verbose=0, shuffle=False)


def test_a_refused_step_steps_nothing():
    """On TensorFlow the steps before the refused one are kept and the
    refused one moved nothing (neither the table's step counter nor the
    model optimizer's): the model equals one that trained on the good batch
    alone."""
    x = np.array([[1, 2], [3, 4], [5, ROWS], [6, 7]], "int32")
    y = np.ones((4, 1))
    keras.utils.set_random_seed(3)
    good, good_layer = _model(jit_compile=False if BACKEND == "tensorflow" else "auto")
    keras.utils.set_random_seed(3)
    refused, refused_layer = _model(
        jit_compile=False if BACKEND == "tensorflow" else "auto"
    )
    good.fit(x[:2], y[:2], batch_size=2, verbose=0, shuffle=False)
    with pytest.raises(_compiled_errors(), match=_refusal(ROWS)):
        refused.fit(x, y, batch_size=2, verbose=0, shuffle=False)
    if BACKEND == "jax":
        # Keras's JAX trainer donates the model's arrays to each step, so an
        # error inside a step (any error) leaves them deleted; the guide's
        # Limits say so. Nothing of the refused step was kept.
        return
    for was, now in zip(
        good.weights + good_layer.weights, refused.weights + refused_layer.weights
    ):
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(now), keras.ops.convert_to_numpy(was)
        )
    for model, layer in ((good, good_layer), (refused, refused_layer)):
        steps = model.optimizer.iterations, layer.optimizer.iterations
        assert [int(keras.ops.convert_to_numpy(s)) for s in steps] == [1, 1]


@pytest.mark.skipif(
    BACKEND != "jax", reason="on TensorFlow the check is the step's assertion"
)
def test_on_jax_a_good_batch_is_not_checked_on_the_host(monkeypatch):
    """The compiled step hands the ids to the host (the refusal's callback)
    only for a batch with one outside the table: a callback in every step
    cost a 26-table model 40% of its step (`lookup_jax.checked_tables`)."""
    checked, check_ids = [], ids_module.check_ids
    monkeypatch.setattr(
        ids_module, "check_ids", lambda *a: checked.append(a) or check_ids(*a)
    )
    model, _ = _model()
    model.fit(GOOD, np.ones((2, 1)), batch_size=1, epochs=2, verbose=0)
    assert checked == []
    with pytest.raises(_compiled_errors(), match=_refusal(ROWS)):
        model.fit(np.array([[1, ROWS]]), np.ones((1, 1)), verbose=0)
    assert len(checked) == 1


# Batches whose first id outside the table is 12, with how many more are
# outside: "1 more" is the edge of the one-id message.
OTHERS_OUTSIDE = (([[12, 2], [3, 11]], 1), ([[12, 2], [-3, 11]], 2))


@pytest.mark.parametrize("x, more", OTHERS_OUTSIDE)
def test_the_message_counts_the_other_ids_outside(x, more):
    model, _ = _model(jit_compile=False if BACKEND == "tensorflow" else "auto")
    x = np.array(x, "int32")
    with pytest.raises(_compiled_errors(), match=_refusal(12, more=more)):
        model.fit(x, np.ones((2, 1)), verbose=0, shuffle=False)


def test_eager_calls_raise_the_refusal_itself():
    """A custom loop that calls the layer eagerly gets `OutOfRangeIds`, a
    `ValueError`, at the call: nothing is looked up."""
    _, layer = _model()
    assert keras.ops.convert_to_numpy(layer(GOOD)).shape == (2, 2, 3)
    for bad in (ROWS, -1):
        x = GOOD.copy()
        x[0, 1] = bad
        with pytest.raises(ids_module.OutOfRangeIds, match=_refusal(bad)):
            layer(x, training=True)
        with pytest.raises(ValueError, match="Map ids into the table"):
            layer(x)
    for x, more in OTHERS_OUTSIDE:
        with pytest.raises(ids_module.OutOfRangeIds, match=_refusal(12, more)):
            layer(np.array(x, "int32"), training=True)


def test_a_compiled_custom_loop_refuses():
    model, layer = _model()
    x = GOOD.copy()
    x[1, 1] = ROWS
    if BACKEND == "jax":
        import jax

        @jax.jit
        def forward(trainable, non_trainable, ids):
            outputs, _ = model.stateless_call(trainable, non_trainable, ids)
            return outputs

        trainable = [v.value for v in model.trainable_variables]
        non_trainable = [v.value for v in model.non_trainable_variables]
        forward(trainable, non_trainable, GOOD).block_until_ready()
        with pytest.raises(_compiled_errors(), match=_refusal(ROWS)):
            forward(trainable, non_trainable, x).block_until_ready()
    else:
        import tensorflow as tf

        @tf.function(jit_compile=False)
        def step(ids):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(model(ids, training=True))
            gradients = tape.gradient(loss, model.trainable_variables)
            model.optimizer.apply(gradients, model.trainable_variables)
            return loss

        model.optimizer.build(model.trainable_variables)
        step(GOOD)
        before = _state(layer)
        with pytest.raises(_compiled_errors(), match=_refusal(ROWS)):
            step(x)
        for was, now in zip(before, _state(layer)):
            np.testing.assert_array_equal(now, was)


@pytest.mark.skipif(BACKEND != "jax", reason="JAX's dispatch")
def test_on_jax_the_check_adds_no_effect_and_refuses_under_vmap():
    """A program with an effect (`jax.debug.callback`'s) loses JAX's C++
    dispatch, which cost a step about 4 ms with 120 arrays of state
    (docs/benchmarks.md): the check's callback is a pure one, kept by its
    result. Under `jax.vmap` its branch runs for every batch and still
    refuses only ids outside the table."""
    import jax

    from tf_tpu_embed_opt.layers import lookup_jax

    def check(ids):
        return lookup_jax.checked_ids(ids, ROWS, False, "items")

    assert not jax.make_jaxpr(check)(GOOD).effects
    assert "pure_callback" in str(jax.make_jaxpr(check)(GOOD))
    np.testing.assert_array_equal(jax.jit(jax.vmap(check))(GOOD), GOOD)
    x = GOOD.copy()
    x[1, 0] = -1
    with pytest.raises(_compiled_errors(), match=_refusal(-1)):
        jax.jit(jax.vmap(check))(x).block_until_ready()


def test_no_lookup_id_of_keras_rs_tables_is_allowed_and_only_it():
    """keras-rs's padded entries use the id `input_dim` (no lookup)."""
    ids_module.check_ids(np.array([0, ROWS]), ROWS, True, "t")
    with pytest.raises(ids_module.OutOfRangeIds, match=r"\[0, 10\) or 10 \(no"):
        ids_module.check_ids(np.array([0, ROWS + 1]), ROWS, True, "t")
    with pytest.raises(ids_module.OutOfRangeIds, match="id 10 is outside"):
        ids_module.check_ids(np.array([0, ROWS]), ROWS, False, "t")


@pytest.mark.skipif(BACKEND != "tensorflow", reason="TensorFlow's XLA")
@pytest.mark.requires_xla
def test_under_xla_on_tensorflow_outside_ids_read_zeros_and_step_nothing():
    """XLA compiles assertions away: there the rule cannot refuse, so it
    makes such ids harmless and says so when the step is traced."""
    model, layer = _model(jit_compile=True)
    before = _state(layer)
    x = np.array([[1, ROWS], [-1, 1]], "int32")
    with pytest.warns(UserWarning, match="under XLA .* not refused there"):
        model.fit(x, np.ones((2, 1)), verbose=0, shuffle=False)
    after = _state(layer)
    changed = np.flatnonzero((after[0] != before[0]).any(axis=1))
    assert changed.tolist() == [1]  # only the row looked up in range
    import tensorflow as tf

    with pytest.warns(UserWarning, match="under XLA"):
        outputs = tf.function(layer, jit_compile=True)(x).numpy()
    np.testing.assert_array_equal(outputs[0, 1], 0.0)
    np.testing.assert_array_equal(outputs[1, 0], 0.0)
    np.testing.assert_array_equal(outputs[0, 0], after[0][1])


@pytest.mark.parametrize("jit_compile", [False, True])
def test_out_of_range_ids_zeros_reads_zeros_and_steps_no_row(jit_compile):
    """The explicit alternative: such ids read zeros and step no row, in
    `fit`, compiled or not, without a warning."""
    if jit_compile and BACKEND == "tensorflow":
        from conftest import xla_on_host

        if not xla_on_host():
            pytest.skip("this TensorFlow cannot JIT-compile on the host")
    inputs = keras.Input((2,), dtype="int32")
    layer = teo.layers.Embedding(
        ROWS,
        3,
        optimizer=teo.optimizers.Adagrad(0.1),
        name="items",
        out_of_range_ids="zeros",
    )
    outputs = keras.layers.Dense(1)(keras.layers.Flatten()(layer(inputs)))
    model = keras.Model(inputs, outputs)
    model.compile(optimizer="sgd", loss="mse", jit_compile=jit_compile)
    before = _state(layer)
    x = np.array([[1, ROWS], [-1, 4], [10**6, 1]], "int32")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        model.fit(x, np.ones((3, 1)), verbose=0, shuffle=False)
    after = _state(layer)
    for was, now in zip(before[:2], after[:2]):  # the table, its accumulator
        changed = np.flatnonzero((now != was).any(axis=1)).tolist()
        assert changed == [1, 4]
    looked_up = keras.ops.convert_to_numpy(layer(x))
    np.testing.assert_array_equal(looked_up[[0, 1, 2], [1, 0, 0]], 0.0)
    np.testing.assert_array_equal(looked_up[0, 0], after[0][1])


def test_out_of_range_ids_is_an_argument_kept_in_the_config():
    layer = teo.layers.Embedding(
        ROWS, 3, optimizer="adagrad", out_of_range_ids="zeros", name="t"
    )
    config = layer.get_config()
    assert config["out_of_range_ids"] == "zeros"
    assert teo.layers.Embedding.from_config(config).out_of_range_ids == "zeros"
    assert teo.layers.Embedding(ROWS, 3, optimizer="sgd").out_of_range_ids == "error"
    with pytest.raises(
        ValueError, match=r"`out_of_range_ids` must be one of 'error', 'zeros'"
    ):
        teo.layers.Embedding(ROWS, 3, optimizer="sgd", out_of_range_ids="clip")


def test_after_a_refused_step_the_model_says_how_to_go_on(tmp_path):
    """On JAX a refused step inside `fit` takes the model's arrays with it
    (Keras donates them to the step): the refusal and then every use of the
    model say so, naming the way out, and the weights saved last bring it
    back: it trains on as a model that never met the refused batch. On
    TensorFlow the refused step changes nothing and the model trains on."""
    x = np.array([[1, 2], [3, 4], [5, 6], [7, 8]], "int32")
    y = np.ones((4, 1))
    bad = x.copy()
    bad[3, 1] = ROWS
    jit_compile = False if BACKEND == "tensorflow" else "auto"
    keras.utils.set_random_seed(3)
    model, _ = _model(jit_compile)
    keras.utils.set_random_seed(3)
    reference, _ = _model(jit_compile)
    saved = str(tmp_path / "last.weights.h5")
    for net in (model, reference):
        net.fit(x, y, batch_size=2, verbose=0, shuffle=False)
    model.save_weights(saved)
    with pytest.raises(_compiled_errors(), match=_refusal(ROWS)) as refused:
        model.fit(bad, y, batch_size=2, verbose=0, shuffle=False)
    if BACKEND == "jax":
        assert "restore its weights (model.load_weights" in str(refused.value)
        for use in (
            lambda: model.fit(x, y, batch_size=2, verbose=0),
            lambda: model.predict(x, verbose=0),
            lambda: model(x),
        ):
            with pytest.raises(teo.layers.LostArrays, match="Restore the model's"):
                use()
    model.load_weights(saved)
    for net in (model, reference):
        net.fit(x, y, batch_size=2, verbose=0, shuffle=False)
    for ours, theirs in zip(model.weights, reference.weights):
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(ours), keras.ops.convert_to_numpy(theirs)
        )


@pytest.mark.skipif(BACKEND != "jax", reason="Keras's JAX trainer donates")
def test_after_a_refused_predict_the_model_names_the_step_it_lost_them_to():
    """`predict` and `evaluate` give the model's arrays to their compiled
    step as `fit` does: after a refusal there, the next use names those
    steps, not training alone."""
    x = np.array([[1, 2], [3, 4]], "int32")
    bad = x.copy()
    bad[1, 1] = ROWS
    for refused in (
        lambda model: model.predict(bad, verbose=0),
        lambda model: model.evaluate(bad, np.ones((2, 1)), verbose=0),
    ):
        model, _ = _model("auto")
        model.fit(x, np.ones((2, 1)), verbose=0)
        with pytest.raises(_compiled_errors(), match=_refusal(ROWS)):
            refused(model)
        with pytest.raises(
            teo.layers.LostArrays,
            match=r"gave them to a compiled step \(fit, evaluate or predict\) "
            "that failed",
        ):
            model(x)


@pytest.mark.skipif(BACKEND != "jax", reason="the JAX backend's table variable")
def test_a_table_not_yet_initialized_has_lost_no_arrays():
    """Only an array a compiled step took counts as lost: a table whose
    variables a stateless scope made and left uninitialized reads as any
    Keras variable then reads (its initializer's values), as do its slots,
    and initialized later it looks up."""
    layer = teo.layers.Embedding(
        ROWS, 3, optimizer="adagrad", embeddings_initializer="ones", name="t"
    )
    with keras.StatelessScope(initialize_variables=False):
        layer.build()
    assert layer.embeddings._value is None
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(layer.embeddings.value), np.ones((ROWS, 3))
    )
    # Keras's Adagrad starts its accumulator at 0.1, in the slot's float32.
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(layer.slots["accumulators"].value),
        np.full((ROWS, 3), 0.1, "float32"),
    )
    # Leaving a scope that initializes variables (the default) initializes
    # every one left pending, as Keras's public API does it.
    with keras.StatelessScope():
        pass
    assert layer.embeddings._value is not None
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(layer(np.array([1, 2]))), np.ones((2, 3))
    )


@pytest.mark.skipif(BACKEND != "jax", reason="keras.distribution runs on JAX")
def test_under_keras_distribution_every_device_refuses(tmp_path):
    """On 4 devices (`DataParallel` over the 4 and over 2 of them, a
    `LayoutMap` sharding the table's rows, both, a stack sharded by rows;
    `predict` outside the distribution's scope of a model trained in it; a
    `jax.jit` of one's own under `jax.set_mesh`), a batch with an id outside
    the table is refused with the refusal, from `fit` or from the next use of
    its results, and the model restored from its weights trains on as one
    that never met the batch (tests/refused_ids_distributed.py); a good
    batch's step gathers no ids for the check, nor calls back to the host.
    Before, JAX ran the refusal on one device and XLA aborted the process
    40 s later, the other devices waiting for it in the step's all-reduce."""
    script = os.path.join(os.path.dirname(__file__), "refused_ids_distributed.py")
    env = child_env(
        KERAS_BACKEND="jax", XLA_FLAGS="--xla_force_host_platform_device_count=4"
    )
    result = subprocess.run(
        [sys.executable, script, "0", "1", "0", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        # A few seconds quiet; XLA's abort came after 40 s.
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = dict(
        line.split(": ", 1) for line in result.stdout.splitlines() if ": " in line
    )
    refusal = (
        "OutOfRangeIds: Embedding `table`: id 99 is outside the table, whose ids "
        "are [0, 40) (input_dim=40)."
    )
    for label in ("outside", "set_mesh"):
        assert lines.get(f"refused {label}", "").startswith(refusal), result.stdout
    for label in ("data", "two", "rows", "both", "stacked"):
        assert lines.get(f"refused {label}", "").startswith(refusal), result.stdout
        assert lines.get(f"resumed {label}") == "True", result.stdout
        sharded = "'model', None" in lines.get(f"sharded {label}", "")
        assert sharded == (label not in ("data", "two")), result.stdout
        # No device calls back to the host for a good batch.
        assert lines.get(f"host checks {label}") == "0", result.stdout
    # The check gathers the ids across devices only in the branch that
    # refuses them: its step holds no more all-gathers outside that branch
    # than a step without the check. Before, XLA gathered every table's ids
    # in every step (docs/benchmarks.md, "Ids outside a table").
    for label in ("data", "data-stacked", "both", "both-stacked"):
        checked, unchecked = lines[f"gathers {label}"].split()
        assert checked == unchecked, (label, result.stdout)
