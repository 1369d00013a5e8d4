"""A checkpoint saved while parameter-server steps are in flight holds one step.

On a loopback cluster (tests/ps_consistent_save.py) every row of a sharded
table takes the same Adagrad step each time, so the number of steps behind
each row's accumulator, behind its weights and in the saved `step` can be
read back and compared. The oracle for the weights is the engine's Adagrad
in NumPy (float64) from the initial table. `save_tpu_checkpoint` must write
one step everywhere; what TensorFlow's own `tf.train.Checkpoint.write` wrote
at the same moment is reported, not asserted (it depends on timing: the
issue measured 5 mixed files of 5).
"""

import pathlib

import numpy as np
import ps_consistent_save as script
import ps_training
import pytest
from conftest import version_independent

import tf_tpu_embed_opt as teo

pytestmark = version_independent

TIMEOUT = 240


def _steps_of(accumulators):
    """Steps behind each accumulator value: a = a0 + k g^2."""
    steps = (accumulators - script.INITIAL_ACCUMULATOR) / script.GRADIENT**2
    np.testing.assert_allclose(steps, np.round(steps), atol=0.02)
    return np.round(steps).astype(int)


def _weights_after(initial, steps):
    w = initial.astype(np.float64)
    a = script.INITIAL_ACCUMULATOR
    for _ in range(steps):
        a += script.GRADIENT**2
        w = w - script.LEARNING_RATE * script.GRADIENT / np.sqrt(a)
    return w


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    directory = tmp_path_factory.mktemp("consistent")
    results = ps_training.run_script(
        pathlib.Path(script.__file__),
        directory,
        {"directory": str(directory)},
        TIMEOUT,
    )
    return results


def test_save_tpu_checkpoint_waits_for_the_steps_in_flight(saved):
    reader = teo.checkpoints.TPUCheckpointReader(str(saved["ours"]))
    state = reader.read("table")
    steps = _steps_of(state["accumulators"])
    step = int(reader.read_scalar("step"))
    # Every row of both shards, and the step counter: one and the same step,
    # the last one scheduled before the save.
    assert set(steps.ravel()) == {script.STEPS}, sorted(set(steps.ravel()))
    assert step == script.STEPS
    np.testing.assert_allclose(
        state["parameters"], _weights_after(saved["initial"], step), rtol=0, atol=1e-5
    )


def test_what_tensorflows_own_writer_saved_meanwhile(saved, record_property):
    """Reported only: `tf.train.Checkpoint.write` does not wait."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(saved["theirs"]))
    shapes = reader.get_variable_to_shape_map()
    # The optimizer's variables are [iterations, learning rate, accumulator].
    (key,) = [k for k in shapes if k.startswith("optimizer/_variables/")]
    steps = sorted(set(_steps_of(reader.get_tensor(key)).ravel().tolist()))
    iterations = int(
        reader.get_tensor("optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE")
    )
    # Reported in the test's properties (pytest --junitxml), not printed into
    # the progress line.
    record_property("accumulator_row_steps", steps)
    record_property("iterations", iterations)
    assert shapes[key] == [script.ROWS, script.DIM]
