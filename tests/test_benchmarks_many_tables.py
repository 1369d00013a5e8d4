"""The many-table and row-wise harnesses run and report every variant (tiny
sizes, JAX).

`benchmarks/dlrm.py` (a DLRM-like model: its variants' steps, and the memory
of one variant), `benchmarks/out_of_range_ids.py` (what the refusal of ids
outside a table costs, separate and stacked tables) and
`benchmarks/row_wise.py` (`RowWiseAdagrad` against FBGEMM's CPU kernels,
which CI does not install: run without them, it must say so), run as their
docstrings say, on Keras's JAX backend in a child process, with few steps and
small batches. Timing is never asserted here: performance lives in
`benchmarks/` and docs/benchmarks.md.
"""

# Runs without TensorFlow.

import importlib.util
import pathlib
import re
import subprocess
import sys

import pytest
from child_env import child_env
from conftest import benchmark_harness, same_in_the_jax_leg

ROOT = pathlib.Path(__file__).resolve().parents[1]
MS = r"\d+\.\d+"
MIB = r"(\d+|nan)"  # NaN where /proc cannot say (not Linux)
# What docs/benchmarks.md recommends on CPU ("The host allocator on CPU").
TUNABLES = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4294967296"

# The harnesses' children run on JAX whatever this process runs: the newest
# JAX leg runs these once.
pytestmark = [
    same_in_the_jax_leg,
    benchmark_harness,
    pytest.mark.skipif(
        not (ROOT / "benchmarks" / "dlrm.py").is_file(),
        reason="no benchmarks/ next to tests/",
    ),
]


def _run(module, *arguments, status=0, backend="jax", **env):
    """What `python -m benchmarks.<module> <arguments>` printed, on Keras's
    `backend`, ended with `status`."""
    return _python(
        "-m", f"benchmarks.{module}", *arguments, status=status, backend=backend, **env
    )


def _python(*arguments, status=0, backend="jax", **env):
    pytest.importorskip(backend)
    result = subprocess.run(
        [sys.executable, *arguments],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env=child_env(KERAS_BACKEND=backend, **env),
    )
    assert result.returncode == status, result.stderr[-3000:]
    return result.stdout + result.stderr


def _keras_rs_on_jax():
    """Whether to time keras-rs's tables too: keras-rs installed and no
    TensorFlow, as in CI's JAX leg (where TensorFlow is installed, keras-rs
    may load its TensorFlow layer, which TensorFlow 2.16 cannot import)."""
    return (
        importlib.util.find_spec("keras_rs") is not None
        and importlib.util.find_spec("tensorflow") is None
    )


def test_the_dlrm_harness_reports_each_variant_against_the_mlp():
    variants = ("teo-1k", "teo-stacked-1k")
    if _keras_rs_on_jax():
        variants += ("keras-rs-stacked-1k",)
    listed = ",".join(variants)
    text = _run(
        "dlrm",
        "--quick",
        "--batch=256",
        f"--variants={listed},mlp",
        GLIBC_TUNABLES=TUNABLES,
    )
    row = rf"\| {MS} \| [\d,]+ \| (?P<ratio>{MS}) \| [\d,]+ \|$"
    for variant in variants:
        assert re.search(rf"^\| {variant} {row}", text, re.M), text
    assert re.search(rf"^\| mlp {row}", text, re.M)["ratio"] == "1.00", text
    # The host allocator's settings change a CPU step's time: said with the
    # machine.
    assert f"host allocator: GLIBC_TUNABLES={TUNABLES}\n" in text, text


def test_the_dlrm_harness_measures_one_variants_memory():
    text = _run("dlrm", "--memory", "--quick", "--batch=256", "--variants=teo-1k")
    # 26 tables of 1,000 x 16 and their accumulators: 3 MiB.
    assert re.search(rf"^\| teo-1k \| 3 \| {MIB} \| ({MS}|nan) \|$", text, re.M), text
    text = _run("dlrm", "--memory", "--variants=teo-1k,mlp", status=2)
    assert "--memory measures one variant per process" in text


@pytest.mark.parametrize("devices", ["1", "2"])
def test_the_id_check_harness_reports_separate_and_stacked_tables(devices):
    """Also under `DataParallel` over 2 CPU devices (`BENCH_DEVICES`)."""
    text = _run(
        "out_of_range_ids",
        "--quick",
        "--tables=3",
        "--rows=100",
        "--batch=256",
        BENCH_DEVICES=devices,
    )
    distributed = "keras.distribution.DataParallel over 2 CPU devices\n" in text
    assert distributed == (devices == "2"), text
    for variant in ("checked", "unchecked", "zeros", "stacked", "stacked-unchecked"):
        assert re.search(rf"^\| {variant} \| {MS} \| {MS} \| [\d,]+ \|$", text, re.M), (
            text
        )
    for goal in ("checked / unchecked", "stacked / stacked-unchecked"):
        assert re.search(
            rf"^Goal: {goal} <= 1\.05: {MS} \((met|MISSED)\)$", text, re.M
        ), text


def test_the_id_check_harness_dispatches_every_program_synchronously():
    """`--synchronous` sets JAX's CPU client before JAX makes it (the
    harness refuses it after); the report says so."""
    text = _run(
        "out_of_range_ids",
        "--quick",
        "--synchronous",
        "--tables=2",
        "--rows=100",
        "--batch=256",
    )
    assert "every program dispatched synchronously (--synchronous)\n" in text
    assert re.search(rf"^\| checked \| {MS} \| {MS} \| [\d,]+ \|$", text, re.M)


def test_the_id_check_harness_refuses_to_set_dispatch_jax_has_set():
    """Once JAX has made its CPU client it ignores the setting: the harness
    says so rather than time asynchronous steps as synchronous ones."""
    code = (
        "import jax\n"
        "from benchmarks import out_of_range_ids\n"
        "jax.devices()\n"
        "out_of_range_ids._dispatch_synchronously()\n"
    )
    text = _python("-c", code, status=1)
    assert "RuntimeError: --synchronous: JAX has made its CPU client already" in text, (
        text[-3000:]
    )


def test_the_id_check_harness_refuses_synchronous_off_jax():
    text = _run(
        "out_of_range_ids",
        "--quick",
        "--synchronous",
        status=2,
        backend="tensorflow",
    )
    assert "--synchronous runs on Keras's JAX backend" in text, text


@pytest.mark.parametrize("setting", ["0", "-2", "two", ""])
def test_the_id_check_harness_refuses_a_bad_device_count(setting):
    text = _run("out_of_range_ids", "--quick", status=2, BENCH_DEVICES=setting)
    assert (
        f"BENCH_DEVICES={setting!r}: a number of CPU devices, 1 or more, is "
        "allowed" in text
    ), text


def test_the_row_wise_harness_reports_both_optimizers_without_fbgemm():
    """The state bytes it reports are the variables' own: one float per row,
    against one per element for Adagrad."""
    rows = 5000
    text = _run(
        "row_wise",
        f"--rows={rows}",
        "--ids=256",
        "--steps=2",
        "--rounds=1",
        "--warmup=1",
    )
    assert "FBGEMM: not run (no --fbgemm-python)" in text
    ms = r"\d+\.\d\d"  # the report's two decimals
    row_wise = rf"\| RowWiseAdagrad \| {ms} \| n/a \| {ms} \| {rows * 4:,} \|"
    assert re.search(row_wise, text), text
    adagrad = rf"\| Adagrad \| {ms} \| n/a \| 1\.00 \| {rows * 64 * 4:,} \|"
    assert re.search(adagrad, text), text
