"""The golden numbers of `docs/tpu_semantics.md` §6, as test data.

Derived from TensorFlow's TPU embedding tests: one step with learning rate 0.1
on a "video" table (8 x 4, values 0..31) whose rows 0 and 1 are looked up, and
a "user" table (16 x 2, values 0..31) whose rows 0-3 are; the expected new
rows and slot rows to six decimals. Shared by the rule tests
(`test_update_rules.py`) and the Keras face on JAX (`test_jax_backend.py`).
"""

import numpy as np

GOLDEN_LR = 0.1
VIDEO_ROWS = [0, 1]
VIDEO_GRADS = np.array([[8, 13, 18, 23], [12, 17, 22, 27]], dtype=np.float64)
USER_ROWS = [0, 1, 2, 3]
USER_GRADS = np.array([[2 / 3, 1], [2 / 3, 1], [2 / 3, 1], [6, 7]], np.float64)

GOLDEN = {
    "sgd": dict(
        name="SGD",
        hypers={},
        video0=[-0.8, -0.3, 0.2, 0.7],
        video1=[2.8, 3.3, 3.8, 4.3],
        user0=[-0.066667, 0.9],
        user3=[5.4, 6.3],
        slots0={},
    ),
    "adagrad": dict(
        name="Adagrad",
        hypers={"initial_accumulator_value": 0.1},
        video0=[-0.099922, 0.90003, 1.900015, 2.900009],
        video1=[3.900035, 4.900017, 5.90001, 6.900007],
        user0=[-0.090351, 0.904654],
        user3=[5.900139, 6.900102],
        slots0={"accumulators": [64.1, 169.1, 324.1, 529.1]},
    ),
    "adagrad_momentum": dict(
        name="AdagradMomentum",
        hypers={
            "momentum": 0.9,
            "use_nesterov": True,
            "exponent": 3.0,
            "epsilon": 0.1,
            "beta2": 0.9,
        },
        video0=[-0.814465, 0.03939, 0.92832, 1.836617],
        video1=[3.064999, 3.948676, 4.853795, 5.772533],
        user0=[-0.241414, 0.675105],
        user3=[5.262938, 6.222211],
        slots0={
            "accumulators": [6.4, 16.9, 32.4, 52.9],
            "momenta": [4.286658, 5.055845, 5.640419, 6.12307],
        },
    ),
    "adam": dict(
        name="Adam",
        hypers={
            "beta_1": 0.9,
            "beta_2": 0.999,
            "epsilon": 1e-7,
            "sum_inside_sqrt": True,
        },
        video0=[-0.316228, 0.683772, 1.683772, 2.683772],
        video1=[3.683772, 4.683772, 5.683772, 6.683772],
        user0=[-0.316228, 0.683772],
        user3=[5.683772, 6.683772],
        slots0={
            "momenta": [0.8, 1.3, 1.8, 2.3],
            "velocities": [0.064, 0.169, 0.324, 0.529],
        },
    ),
    "ftrl": dict(
        name="FTRL",
        hypers={
            "learning_rate_power": -0.5,
            "l1_regularization_strength": 0.0,
            "l2_regularization_strength": 0.0,
            "beta": 0.0,
            "initial_accumulator_value": 0.1,
        },
        video0=[-0.099922, 0.875712, 1.864884, 2.858766],
        video1=[3.794662, 4.807025, 5.813775, 6.818028],
        user0=[-0.090351, 0.603142],
        user3=[5.584349, 6.584196],
        slots0={
            "accumulators": [64.1, 169.1, 324.1, 529.1],
            "linears": [8, -113.876178, -335.730996, -657.578381],
        },
    ),
}
