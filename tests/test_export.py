"""A model with row-sparse tables exported for serving (`model.export`).

Keras exports a JAX model through jax2tf into a TensorFlow SavedModel, and a
TensorFlow one directly. The oracle is the table itself: the exported
program's output is the looked-up rows, a gather, so it equals the table's
rows bit for bit (zeros for an id outside the table where the layer reads
zeros). On JAX an id outside the table cannot be refused in an exported
program (the check is a host callback): such a layer is refused when it is
exported, by name, and the model exports on TensorFlow from its `.keras`
file, where the served program refuses the id.

Each child process runs on one Keras backend; both need TensorFlow (jax2tf
writes a SavedModel) and JAX.

A TensorFlow loads what JAX exports only within StableHLO's compatibility
window: TensorFlow 2.21 reads no program of JAX 0.11.2 or later, of any Keras
model. The served JAX program is checked where a plain Keras model's export
serves (`_skip_unless_tensorflow_serves_jax`), and skipped, with the reason,
where not.
"""

import importlib.util
import subprocess
import sys

import pytest
from child_env import child_env

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("jax") is None
    or importlib.util.find_spec("jax.experimental.jax2tf") is None,
    reason="JAX (with jax2tf) missing",
)

_CHILD = r"""
import sys
mode, directory = sys.argv[1:]
import os
import keras
import numpy as np
import tensorflow as tf
import tf_tpu_embed_opt as teo

ids = np.array([[1, 2], [2, 3], [9, 0], [4, 4]], "int32")
outside = np.array([[1, 10], [-1, 3]], "int32")
saved = os.path.join(directory, "model.keras")


def model(out_of_range_ids):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((2,), dtype="int32")
    table = teo.layers.Embedding(
        10,
        4,
        optimizer=teo.optimizers.Adagrad(0.1),
        out_of_range_ids=out_of_range_ids,
        name="items",
    )
    built = keras.Model(inputs, keras.layers.Flatten()(table(inputs)))
    built.compile(optimizer="sgd", loss="mse")
    built.fit(ids, np.ones((4, 8), "float32"), verbose=0)
    return built


def served(built, name):
    path = os.path.join(directory, name)
    built.export(path, format="tf_saved_model", verbose=False)
    return tf.saved_model.load(path)  # its `serve` needs it kept


def rows(built, batch):
    table = keras.ops.convert_to_numpy(built.get_layer("items").embeddings)
    inside = (batch >= 0) & (batch < len(table))
    gathered = table[np.where(inside, batch, 0)] * inside[..., None]
    return gathered.reshape(len(batch), -1)


if mode == "jax-zeros":
    built = model("zeros")
    exported = served(built, "zeros")
    for batch in (ids, outside):
        got = exported.serve(tf.constant(batch)).numpy()
        np.testing.assert_array_equal(got, rows(built, batch))
elif mode == "jax-error":
    built = model("error")
    built.save(saved)
    try:
        served(built, "error")
    except ValueError as error:
        assert "cannot refuse ids outside a table" in str(error), error
        assert "`items`" in str(error) and "out_of_range_ids='zeros'" in str(error)
    else:
        raise AssertionError("exported on JAX without the check")
elif mode == "tensorflow-error":
    built = keras.saving.load_model(saved)
    exported = served(built, "error")
    got = exported.serve(tf.constant(ids)).numpy()
    np.testing.assert_array_equal(got, rows(built, ids))
    try:
        exported.serve(tf.constant(outside))
    except tf.errors.InvalidArgumentError as error:
        assert "id 10" in str(error) and "outside the table" in str(error), error
    else:
        raise AssertionError("the served program took an id outside the table")
elif mode == "scores":
    # Served: the pooled rows' scores against every row of the table, which
    # the model reads besides its lookup (a SavedModel traces the gradient
    # of that read, which training refuses).
    built = model("zeros")
    table = built.get_layer("items")

    class Scores(keras.layers.Layer):
        def call(self, pooled):
            return keras.ops.matmul(pooled, keras.ops.transpose(table.embeddings))

    inputs = keras.Input((2,), dtype="int32")
    scorer = keras.Model(inputs, Scores()(keras.ops.sum(table(inputs), axis=1)))
    exported = served(scorer, "scores")
    got = exported.serve(tf.constant(ids)).numpy()
    values = keras.ops.convert_to_numpy(table.embeddings).astype("float64")
    pooled = values[ids].sum(axis=1)
    # Two rows summed, then a dot product of 4: each term off by at most
    # 6 units of rounding of its magnitude.
    magnitude = np.abs(values[ids]).sum(axis=1) @ np.abs(values).T
    bound = 6 * np.finfo("float32").eps * magnitude
    assert (np.abs(got - pooled @ values.T) <= bound).all(), (got, pooled @ values.T)
print("checked", mode, keras.backend.backend())
"""


# A plain Keras model exported on JAX and served by this TensorFlow: whether
# the installed pair can serve a JAX export at all.
_PLAIN_CHILD = r"""
import sys
import jax
import keras
import numpy as np
import tensorflow as tf

inputs = keras.Input((2,))
keras.Model(inputs, keras.layers.Dense(1)(inputs)).export(
    sys.argv[1], format="tf_saved_model", verbose=False
)
loaded = tf.saved_model.load(sys.argv[1])  # its `serve` needs it kept
try:
    loaded.serve(tf.constant(np.ones((1, 2), "float32")))
except tf.errors.InvalidArgumentError as error:
    # Only the program's version is a reason to skip; anything else fails.
    if "failed to deserialize portable artifact" not in str(error):
        raise
    lines = [line for line in str(error).splitlines() if "error:" in line]
    print(
        f"TensorFlow {tf.__version__} serves no model that JAX "
        f"{jax.__version__} exports, not even a plain Keras one: {lines[-1:]}"
    )
else:
    print("served")
"""


def _child(source, backend, *arguments):
    """What the child running `source` on Keras's `backend` printed; it must
    end well."""
    done = subprocess.run(
        [sys.executable, "-c", source, *map(str, arguments)],
        env=child_env(KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def _skip_unless_tensorflow_serves_jax(directory):
    printed = _child(_PLAIN_CHILD, "jax", directory / "plain")
    if "served" not in printed.split():
        pytest.skip(printed.strip().splitlines()[-1][:400])


def _run(mode, backend, directory):
    assert f"checked {mode} {backend}" in _child(_CHILD, backend, mode, directory)


def test_a_jax_model_reading_zeros_outside_its_tables_exports(tmp_path):
    _skip_unless_tensorflow_serves_jax(tmp_path)
    _run("jax-zeros", "jax", tmp_path)


@pytest.mark.parametrize("backend", ["jax", "tensorflow"])
def test_a_model_that_reads_its_table_to_serve_exports(backend, tmp_path):
    """A model that scores against every row reads its table besides the
    lookup; training refuses a gradient through that read, and the
    SavedModel's gradient function (which `model.export` traces on JAX)
    failed on it. It exports and serves the scores."""
    if backend == "jax":
        _skip_unless_tensorflow_serves_jax(tmp_path)
    _run("scores", backend, tmp_path)


def test_a_jax_model_that_refuses_ids_exports_on_tensorflow(tmp_path):
    """Refused on JAX, naming the table and the two ways; exported on
    TensorFlow from the model's `.keras` file, the program serves the rows
    and refuses an id outside the table."""
    _run("jax-error", "jax", tmp_path)
    _run("tensorflow-error", "tensorflow", tmp_path)
