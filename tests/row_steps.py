"""Steps of looked-up rows for the JAX engine's tests: the same ids and
gradients given to a twin (as a row-sparse gradient of the Keras backend) and
to an engine oracle (each distinct row once, its gradients summed)."""

# Runs without TensorFlow.

import warnings

import numpy as np


def sparse_gradient(backend, ids, grads, shape):
    """A row-sparse gradient of `backend`: `tf.IndexedSlices` or a JAX `BCOO`."""
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.IndexedSlices(
            tf.constant(grads), tf.constant(ids, tf.int64), tf.constant(shape)
        )
    from jax.experimental import sparse as jax_sparse

    indices = np.asarray(ids, "int32").reshape(-1, 1)
    return jax_sparse.BCOO((np.asarray(grads), indices), shape=tuple(shape))


def summed(ids, grads):
    """{row: its gradients summed, in order}: what the engine steps."""
    rows = {}
    for row, grad in zip(ids, grads):
        rows[row] = rows.get(row, 0) + np.asarray(grad, np.float32)
    return rows


def twin_run(keras, twin, initial, step_ids, step_grads):
    """The table after the twin's steps, and the variable it stepped."""
    variable = keras.Variable(initial.copy())
    backend = keras.backend.backend()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for ids, grads in zip(step_ids, step_grads):
            gradient = sparse_gradient(backend, ids, grads, initial.shape)
            twin.apply_gradients([(gradient, variable)])
    return keras.ops.convert_to_numpy(variable.value), variable


def oracle_run(oracle, spec, initial, step_ids, step_grads):
    """The table and slots after `oracle`'s steps of `spec` (jte_oracle)."""
    table = initial.copy()
    slots = oracle.initial_slots(spec, table.shape)
    for step, (ids, grads) in enumerate(zip(step_ids, step_grads)):
        table, slots = oracle.step(spec, table, slots, summed(ids, grads), step)
    return table, slots


def assert_rows(actual, expected, initial, steps, *, bounded, what):
    """`actual` equals `expected` bit for bit, or, where the two sides are
    known to round apart (`bounded`, each caller says why), within the
    derived bound: each differing operation is within an ulp of the exact
    value on either side and moves a value by a few ulps (4) of the largest
    value it is computed from; the differences add up over the steps."""
    if not bounded:
        np.testing.assert_array_equal(actual, expected, err_msg=what)
        return
    scale = max(np.max(np.abs(expected)), np.max(np.abs(initial)))
    atol = 4 * steps * np.finfo(np.float32).eps * scale
    np.testing.assert_allclose(actual, expected, rtol=0, atol=atol, err_msg=what)
