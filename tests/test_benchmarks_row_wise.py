"""The row-wise benchmark's harness runs and reports (tiny sizes, JAX).

`benchmarks/row_wise.py` times `RowWiseAdagrad` and `Adagrad` steps of
`layers.Embedding` against FBGEMM's CPU kernels, which CI does not install:
here it runs without them, in a child process on Keras's JAX backend, and
must say so. The state bytes it reports are the variables' own: one float
per row, against one per element for Adagrad. Timing is never asserted.
"""

# Runs without TensorFlow.

import pathlib
import re
import subprocess
import sys

import pytest
from child_env import child_env
from conftest import benchmark_harness, same_in_the_jax_leg

ROOT = pathlib.Path(__file__).resolve().parents[1]

pytestmark = [
    same_in_the_jax_leg,
    benchmark_harness,
    pytest.mark.skipif(
        not (ROOT / "benchmarks" / "row_wise.py").is_file(),
        reason="no benchmarks/ next to tests/",
    ),
]


def test_the_row_wise_harness_reports_both_optimizers_without_fbgemm():
    pytest.importorskip("jax")
    rows = 5000
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.row_wise", f"--rows={rows}"]
        + ["--ids=256", "--steps=2", "--rounds=1", "--warmup=1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=child_env(KERAS_BACKEND="jax"),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    text = result.stdout
    assert "FBGEMM: not run (no --fbgemm-python)" in text
    ms = r"\d+\.\d\d"
    row_wise = rf"\| RowWiseAdagrad \| {ms} \| n/a \| {ms} \| {rows * 4:,} \|"
    assert re.search(row_wise, text), text
    adagrad = rf"\| Adagrad \| {ms} \| n/a \| 1\.00 \| {rows * 64 * 4:,} \|"
    assert re.search(adagrad, text), text
