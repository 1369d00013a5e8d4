"""The README's benchmark command runs and reports every table (tiny sizes).

Timing is never asserted here (issue #4: performance lives in `benchmarks/`);
this only checks that the harness of the checkout works end to end.

`benchmarks/` (and the `tests/tfrs_oracle.py` it imports) are not installed:
the harness comes from the checkout, appended to the child's `sys.path`, while
the package comes from where this process imported it (site-packages when CI
runs `pytest tests`), placed first; the child reports which one it used.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest
from child_env import child_env
from conftest import version_independent, xla_on_host

import tf_tpu_embed_opt

ROOT = pathlib.Path(__file__).resolve().parents[1]
MS = r"\d+\.\d\d~?"  # "~": timed while other processes were busy
PACKAGE = os.path.abspath(tf_tpu_embed_opt.__file__)

# Runs the harness as `python -m benchmarks.sparse_step` would, but with the
# checkout after the package's own directory on sys.path.
RUN_HARNESS = """
import runpy, sys
sys.path.append({root!r})
import tf_tpu_embed_opt
print("PACKAGE", tf_tpu_embed_opt.__file__, file=sys.stderr, flush=True)
sys.argv = ["benchmarks.sparse_step"] + {arguments!r}
runpy.run_module("benchmarks.sparse_step", run_name="__main__", alter_sys=True)
"""


# A tool of the checkout, not of the package: once per CI run is enough.
@version_independent
@pytest.mark.skipif(
    not (ROOT / "benchmarks" / "sparse_step" / "__main__.py").is_file(),
    reason="no benchmarks/ next to tests/",
)
def test_sparse_step_harness_reports_every_table(tmp_path):
    modes = "graph,xla" if xla_on_host() else "graph"
    output = tmp_path / "results.md"
    arguments = [
        # --quick with every size given: its only other effect is the import
        # section, timed in 1 fresh process instead of 6 (of ~5 s each).
        "--quick",
        "--optimizers=Adagrad,Adam-lazy,ClippyAdagrad",
        "--grid-optimizers=Adagrad",
        "--rows=2k,4k",
        "--dims=4",
        "--base-rows=2k",
        "--base-dim=4",
        "--batch=64",
        f"--modes={modes}",
        "--keras-modes=graph",
        "--repeats=2",
        "--min-repeats=1",
        "--warmup=1",
        "--seconds=0.1",
        "--dense-rows=1k",
        "--dense-dim=4",
        "--dense-optimizers=Adagrad",
        "--import-runs=1",
        "--quiet-wait=0",
        "--quiet",
        f"--output={output}",
    ]
    code = RUN_HARNESS.format(root=str(ROOT), arguments=arguments)
    env = child_env(TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    used = re.search(r"^PACKAGE (.*)$", result.stderr, re.M).group(1)
    assert os.path.abspath(used) == PACKAGE, (used, PACKAGE)
    text = output.read_text()
    assert text.strip() == result.stdout.strip()
    assert re.search(r"^Machine: \d+ cores, .*TensorFlow \d", text, re.M), text
    for mode in modes.split(","):
        # Ours, the fused reference and the ratio, for each optimizer row.
        assert re.search(
            rf"\| Adagrad\(epsilon=0\) \| {mode} \| {MS} \| fused AdagradV2", text
        ), text
        assert re.search(rf"\| Adam\(lazy=True\) \| {mode} \| {MS} \|", text), text
        assert re.search(rf"\| ClippyAdagrad \| {mode} \| {MS} \|", text), text
        # The grid: both table sizes.
        for rows in ("2k", "4k"):
            assert re.search(rf"\| Adagrad \| {rows} \| 4 \| {mode} \| {MS} \|", text)
        assert re.search(rf"\| Adagrad \| {mode} \| {MS} \| {MS} \| \d+\.\d\d \|", text)
    assert "`tf_tpu_embed_opt after tensorflow, keras`" in text


@version_independent
@pytest.mark.skipif(
    not (ROOT / "benchmarks" / "jax_processes.py").is_file(),
    reason="no benchmarks/ next to tests/",
)
def test_jax_processes_benchmark_reports_both_jobs():
    """`benchmarks/jax_processes.py --step` at a tiny size: the job as 1
    process of 2 devices and as 2 processes of 1 device (on 127.0.0.1), each
    reported with its ms/step, the second with its ratio."""
    pytest.importorskip("jax")
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.jax_processes", "--step"]
        + ["--rows=4096", "--steps=3", "--rounds=1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=child_env(KERAS_BACKEND="jax"),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert any(
        re.fullmatch(r"1 process x 2 devices: +\d+\.\d\d ms/step", x) for x in lines
    )
    assert any(
        re.fullmatch(r"2 processes x 1 device: +\d+\.\d\d ms/step \(\d+\.\d\dx\)", x)
        for x in lines
    ), result.stdout
