"""`layers.Embedding` trained by `fit` against the TPU engines' lazy rules.

For every lazy engine algorithm, the embedding-face optimizer is given to the
layer as it is (the layer converts it with `to_keras`), the model is trained
with `fit` (compiled as Keras compiles it on this backend), and after each
step the table and every slot are compared with the oracles of
`tests/test_convert.py`: TensorFlow's fused sparse CPU kernels
(`ResourceSparseApply{AdagradV2,Momentum,RMSProp,CenteredRMSProp,Adadelta,
ProximalAdagrad,FtrlV2}`, Adam as `ApplyAdam` on the gathered rows) and the
formulas of `docs/tpu_semantics.md` for the others, on the distinct ids with
their summed rows.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import keras_face
from test_convert import (
    _ORACLE_DEFAULTS,
    ATOL,
    CASES,
    DIM,
    ROWS,
    RTOL,
    STEP_IDS,
    STEP_VALUES,
    W0,
    _sum_duplicates,
)

import tf_tpu_embed_opt as teo

pytestmark = keras_face

LAZY = [case for case in CASES if case.lazy]


class _Gradients(keras.layers.Layer):
    """Makes d loss / d output the given rows: the loss is sum(output * G)."""

    def call(self, output, g):
        return tf.reduce_sum(output * g, axis=[1, 2])


def _model(optimizer):
    ids = keras.Input((None,), dtype="int32", batch_size=1)
    g = keras.Input((None, DIM), batch_size=1)
    layer = teo.layers.Embedding(
        ROWS,
        DIM,
        optimizer=optimizer,
        embeddings_initializer=keras.initializers.Constant(W0),
    )
    model = keras.Model([ids, g], _Gradients()(layer(ids), g))
    # The loss is the model's output itself.
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss=lambda y, out: out)
    return model, layer


@pytest.mark.parametrize("case", LAZY, ids=lambda c: c.id)
def test_fit_steps_the_rows_as_the_engines_kernels(case):
    model, layer = _model(case.make(teo.embedding, case.lr))
    state = {"w": W0.copy()}
    state.update(
        {
            name: np.full((ROWS, DIM), value, np.float32)
            for name, value in case.slots.items()
        }
    )
    hypers = {**_ORACLE_DEFAULTS, **case.hypers}
    for ids, values in zip(STEP_IDS, STEP_VALUES):
        x = [np.array([ids], "int32"), values[None]]
        model.fit(x, np.zeros((1,), "float32"), batch_size=1, verbose=0)
        unique, summed = _sum_duplicates(ids, values)
        case.oracle(state, unique, summed, case.lr, hypers)
        np.testing.assert_allclose(
            layer.embeddings.numpy(), state["w"], rtol=RTOL, atol=ATOL
        )
        for name, variable in layer.slots.items():
            np.testing.assert_allclose(
                variable.numpy(),
                state[variable.name],  # the Keras slot name
                rtol=RTOL,
                atol=ATOL,
                err_msg=f"slot {name}",
            )
    never = sorted(set(range(ROWS)) - {i for ids in STEP_IDS for i in ids})
    np.testing.assert_array_equal(layer.embeddings.numpy()[never], W0[never])
