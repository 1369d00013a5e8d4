"""Numerical behaviour of the engine twins, as documented in the README.

Every engine rule is element-wise (docs/tpu_semantics.md §2), so a NaN or inf
in one gradient element reaches only that element of the row and its slots;
other elements, other looked-up rows and rows not looked up are unaffected.
Extreme learning rates keep the weights finite for the default settings.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import keras_face

import tf_tpu_embed_opt as teo
from tf_tpu_embed_opt.definitions import registry

pytestmark = keras_face

DEFINITIONS = list(registry.DEFINITIONS)


def twin(definition, learning_rate=0.1):
    return teo.to_keras(teo.embedding.class_for(definition)(learning_rate))


def sparse(values, ids, rows=5):
    return tf.IndexedSlices(
        tf.constant(np.array(values, "float32")),
        tf.constant(ids),
        tf.constant([rows, len(values[0])]),
    )


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("definition", DEFINITIONS, ids=[d.name for d in DEFINITIONS])
def test_non_finite_gradient_stays_in_its_element(definition, bad):
    poisoned, clean = twin(definition), twin(definition)
    table_poisoned = keras.Variable(np.ones((5, 3), "float32"))
    table_clean = keras.Variable(np.ones((5, 3), "float32"))
    poisoned.apply([sparse([[bad, 1, 1], [1, 1, 1]], [1, 3])], [table_poisoned])
    clean.apply([sparse([[1, 1, 1], [1, 1, 1]], [1, 3])], [table_clean])
    got, want = table_poisoned.numpy(), table_clean.numpy()
    np.testing.assert_array_equal(got[[0, 2, 4]], np.ones((3, 3)))
    np.testing.assert_array_equal(got[3], want[3])
    np.testing.assert_array_equal(got[1, 1:], want[1, 1:])
    for poisoned_slot, clean_slot in zip(poisoned.variables, clean.variables):
        if tuple(poisoned_slot.shape) != (5, 3):
            continue
        a, b = poisoned_slot.numpy(), clean_slot.numpy()
        np.testing.assert_array_equal(a[[0, 2, 3, 4]], b[[0, 2, 3, 4]])
        np.testing.assert_array_equal(a[1, 1:], b[1, 1:])


@pytest.mark.parametrize("learning_rate", [1e-30, 1e6], ids=["tiny", "huge"])
@pytest.mark.parametrize("definition", DEFINITIONS, ids=[d.name for d in DEFINITIONS])
def test_extreme_learning_rates_stay_finite(definition, learning_rate):
    optimizer = twin(definition, learning_rate)
    table = keras.Variable(np.ones((5, 3), "float32"))
    gradient = sparse(np.full((2, 3), 0.5), [1, 3])
    for _ in range(3):
        optimizer.apply([gradient], [table])
    assert np.all(np.isfinite(table.numpy()))
    if learning_rate == 1e-30 and definition.name not in ("FTRL",):
        # FTRL recomputes w from its slots; the others barely move.
        np.testing.assert_allclose(table.numpy(), np.ones((5, 3)), atol=1e-6)


# With default settings a zero gradient leaves these rows and slots unchanged
# (FTRL once its slots are consistent, i.e. after a first step); the others
# still move the row or decay a slot (momentum, moving averages).
ZERO_GRADIENT_NOOP = {"SGD", "Adagrad", "ProximalAdagrad", "FTRL"}


def _row_state(optimizer, table, row):
    state = [table.numpy()[row]]
    state += [v.numpy()[row] for v in optimizer.variables if tuple(v.shape) == (5, 3)]
    return np.concatenate(state)


@pytest.mark.parametrize("definition", DEFINITIONS, ids=[d.name for d in DEFINITIONS])
def test_zero_gradient_on_a_looked_up_row_is_still_a_step(definition):
    """The engine updates a looked-up row even when its gradient sums to 0."""
    optimizer = twin(definition)
    table = keras.Variable(np.ones((5, 3), "float32"))
    optimizer.apply([sparse([[1, 1, 1]], [2])], [table])
    before = _row_state(optimizer, table, 2)
    optimizer.apply([sparse([[1, 1, 1], [-1, -1, -1]], [2, 2])], [table])
    unchanged = np.array_equal(_row_state(optimizer, table, 2), before)
    assert unchanged == (definition.name in ZERO_GRADIENT_NOOP)
