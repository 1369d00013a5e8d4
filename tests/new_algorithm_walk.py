"""Walks the throwaway algorithm of `test_new_algorithm.py` through every face.

Run as a script in a child process whose `sys.path` starts with a copy of the
package that has the algorithm's module and registry entry (and nothing else
changed). Prints one line per face it checked.
"""

import contextlib
import importlib.util
import io
import sys

import keras
import numpy as np

import tf_tpu_embed_opt as teo
from tf_tpu_embed_opt import cli


def check_keras_face():
    cls = teo.optimizers.SignMomentum
    assert "SignMomentum" in teo.optimizers.__all__
    assert "m ← β·m + (1−β)·g" in cls.__doc__, cls.__doc__
    optimizer = cls(learning_rate=0.5, beta=0.5)
    assert cls.from_config(optimizer.get_config()).get_config() == (
        optimizer.get_config()
    )
    # Two dense steps against the formula, in float32 as the twin computes.
    variable = keras.Variable(np.array([[1.0, -2.0], [3.0, 4.0]], "float32"))
    gradients = [
        np.array([[1.0, -1.0], [0.0, 2.0]], "float32"),
        np.array([[-3.0, 0.5], [0.0, 0.0]], "float32"),
    ]
    want, momentum = variable.numpy().copy(), np.zeros((2, 2), "float32")
    for gradient in gradients:
        optimizer.apply([keras.ops.convert_to_tensor(gradient)], [variable])
        momentum = np.float32(0.5) * momentum + np.float32(0.5) * gradient
        want = want - np.float32(0.5) * np.sign(momentum)
    assert np.array_equal(keras.ops.convert_to_numpy(variable), want)
    print("keras face")


def check_row_sparse_layer():
    # The loss is the sum of the looked-up rows: every gradient element is
    # positive, so the first step moves each looked-up row by exactly -lr.
    table = teo.layers.Embedding(
        6, 2, optimizer=teo.optimizers.SignMomentum(0.25, lazy=True), name="t"
    )
    inputs = keras.Input((2,), dtype="int32")
    model = keras.Model(inputs, table(inputs))
    model.compile("sgd", loss=lambda _, outputs: keras.ops.sum(outputs))
    before = keras.ops.convert_to_numpy(table.embeddings).copy()
    ids = np.array([[1, 1], [4, 1]], "int32")
    model.fit(ids, np.zeros((2, 2, 2), "float32"), batch_size=2, verbose=0)
    after = keras.ops.convert_to_numpy(table.embeddings)
    looked_up = np.isin(np.arange(6), ids)
    assert np.array_equal(after[~looked_up], before[~looked_up])
    assert np.array_equal(after[looked_up], before[looked_up] - np.float32(0.25))
    assert set(table.slots) == {"m"}
    print("row-sparse layer")


def twin():
    return teo.optimizers.SignMomentum(0.1, beta=0.7, lazy=True, clip_weight_max=3.0)


def check_optimizer_spec():
    if importlib.util.find_spec("tensorflow") is None:
        print("optimizer spec: skipped, no TensorFlow")
        return
    original = twin()
    back = teo.from_spec(teo.to_spec(original))
    assert type(back) is teo.optimizers.SignMomentum
    assert back.get_config() == original.get_config()
    print("optimizer spec")


def check_jax_tpu_embedding():
    if importlib.util.find_spec("jax_tpu_embedding") is None:
        print("jax-tpu-embedding: skipped, not installed")
        return
    jax_spec = teo.to_embedding(twin(), engine="jax-tpu-embedding")
    assert type(jax_spec).__name__ == "RuleOptimizerSpec", jax_spec
    got, want = teo.to_keras(jax_spec).get_config(), twin().get_config()
    assert got.pop("rounding") == "jax-tpu-embedding"
    for config in (got, want):
        config.pop("name")
        config.pop("rounding", None)
    assert got == want, (got, want)
    print("jax-tpu-embedding custom spec")


def check_tensorflow_engines_refuse():
    if importlib.util.find_spec("tensorflow") is None:
        print("TensorFlow engines: skipped, no TensorFlow")
        return
    for engine in ("TPUEmbedding", "TPUEmbeddingV2"):
        try:
            teo.to_embedding(twin(), engine=engine)
        except ValueError as error:
            assert "SignMomentum" in str(error), error
        else:
            raise AssertionError(f"{engine} took SignMomentum")
    report = teo.check_engine(twin(), "TPUEmbeddingV2")
    assert not report.runs and "SignMomentum" in "\n".join(report.lines())
    print("TensorFlow engines refuse it")


def run_cli(*argv):
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            code = cli.main(list(argv))
        except SystemExit as exit:
            code = exit.code
    return code, stdout.getvalue(), stderr.getvalue()


def check_describe():
    code, out, err = run_cli(
        "describe", "sign_momentum", "--beta", "0.8", "--engine", "jax-tpu-embedding"
    )
    if importlib.util.find_spec("jax_tpu_embedding") is None:
        assert code == 2 and "jax-tpu-embedding" in err, (code, out, err)
    else:
        assert code == 0, (out, err)
        assert "RuleOptimizerSpec('SignMomentum'" in out and "beta=0.8" in out
        assert "m  initial value 0.0. Momentum of the gradient." in out, out
    code, out, err = run_cli("describe", "--list")
    assert code == 0 and "SignMomentum" in out, (out, err)
    code, out, err = run_cli("describe", "sign_momentum", "--help")
    assert code == 0 and "m ← β·m + (1−β)·g" in out, (out, err)
    code, out, err = run_cli("describe", "sign_momentum", "--engine", "TPUEmbedding")
    assert code == 2 and "TPUEmbedding has no SignMomentum" in out, (out, err)
    print("describe")


if __name__ == "__main__":
    assert teo.__file__.startswith(sys.argv[1]), (teo.__file__, sys.argv[1])
    check_keras_face()
    check_row_sparse_layer()
    check_optimizer_spec()
    check_jax_tpu_embedding()
    check_tensorflow_engines_refuse()
    check_describe()
