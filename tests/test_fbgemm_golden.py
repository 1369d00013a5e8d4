"""FBGEMM's CPU kernels, pinned (issue #54).

`tests/data/fbgemm_golden.npz` holds what FBGEMM 1.9.0's own CPU kernels
computed (`tests/fbgemm_golden.py` wrote it where FBGEMM was installed): 32
runs of 120 steps, pooled and unpooled lookups with duplicate ids within and
across bags, dims 16, 64 and 128, every weight-decay mode, and two of
row-wise Adagrad on an FP16 table. The transcription
of their arithmetic in `tests/fbgemm_reference.py` gives the same float32
bits at steps 1, 10 and 120; the package's row-wise optimizer is held to
these numbers.
"""

# Runs without TensorFlow.

import pathlib

import fbgemm_inputs
import fbgemm_reference
import numpy as np
import pytest
from conftest import version_independent

# NumPy against recorded data: the same in every leg, so CI runs it once.
pytestmark = version_independent

GOLDEN = pathlib.Path(__file__).resolve().parent / "data" / "fbgemm_golden.npz"


@pytest.fixture(scope="module")
def golden():
    with np.load(GOLDEN) as data:
        return {name: data[name] for name in data.files}


def test_the_golden_data_covers_every_run(golden):
    names = {name.split("/")[0] for name in golden if "/" in name}
    assert names == {config.name for config in fbgemm_inputs.CONFIGS}
    assert len(fbgemm_inputs.CONFIGS) == 32
    assert "fbgemm_gpu 1.9.0" in set(golden["versions"])


@pytest.mark.parametrize(
    "config", fbgemm_inputs.CONFIGS, ids=[c.name for c in fbgemm_inputs.CONFIGS]
)
def test_fbgemm_arithmetic_is_transcribed_bit_for_bit(config, golden):
    for step, (table, state) in fbgemm_reference.run(config).items():
        prefix = f"{config.name}/step{step}"
        np.testing.assert_array_equal(table, golden[f"{prefix}/table"], err_msg=prefix)
        if state is not None:
            np.testing.assert_array_equal(
                state, golden[f"{prefix}/state0"].reshape(state.shape), err_msg=prefix
            )


def test_the_pooled_cpu_path_ignores_weight_decay(golden):
    """FBGEMM 1.9.0's pooled CPU kernel of EXACT_ROWWISE_ADAGRAD leaves the
    weight decay out (the transcription above, which matches it, does too):
    with the decay applied the same run would end far from FBGEMM's table.
    A conversion must say it."""
    for config in fbgemm_inputs.CONFIGS:
        if config.pooled and config.weight_decay_mode != "NONE":
            final = golden[f"{config.name}/step{fbgemm_inputs.STEPS}/table"]
            decayed = fbgemm_reference.run(
                config, recorded=(fbgemm_inputs.STEPS,), pooled_decay=True
            )[fbgemm_inputs.STEPS][0]
            assert np.abs(decayed - final).max() > 1e-3, config.name


def test_an_fp16_table_steps_in_float32_with_float32_state(golden):
    """On a TorchRec FP16 table FBGEMM keeps the row state in float32 and
    steps in float32 (the transcription above, bit for bit): with gradients
    of about 1e-4 the state holds mean squares float16 cannot (below its
    least value, 2^-24), which a step in float16 would make 0."""
    runs = [c for c in fbgemm_inputs.CONFIGS if c.precision == "FP16"]
    assert {c.pooled for c in runs} == {True, False}
    for config in runs:
        prefix = f"{config.name}/step1"
        state = golden[f"{prefix}/state0"]
        assert state.dtype == np.float32
        looked_up = state[state > 0]
        assert looked_up.size and looked_up.min() < 2.0**-24, config.name
        table = golden[f"{prefix}/table"]
        np.testing.assert_array_equal(
            table.astype(np.float16).astype(np.float32), table
        )
        assert np.isfinite(golden[f"{config.name}/step120/table"]).all()


@pytest.mark.parametrize(
    "dim, pooled", [(16, True), (64, True), (24, True), (13, False), (64, False)]
)
def test_the_rules_sum_of_squares_in_numpy_is_fbgemms(dim, pooled):
    """RowWiseAdagrad's rule against the array namespace NumPy (`rules.NUMPY`,
    what the float64 oracle runs use) sums a row's squares as FBGEMM's
    kernels do (the transcription, pinned above): 8 lanes pooled, in order
    unpooled, bit for bit in float32."""
    from tf_tpu_embed_opt.definitions import rules
    from tf_tpu_embed_opt.definitions.algorithms import row_wise_adagrad

    g = np.random.default_rng(dim).normal(size=(5, dim)).astype(np.float32)
    ours = row_wise_adagrad._sum_of_squares(rules.NUMPY, g, 8 if pooled else 1)
    theirs = fbgemm_reference._sum_of_squares(g, pooled)
    assert ours.dtype == np.float32
    np.testing.assert_array_equal(np.reshape(ours, -1), theirs)
