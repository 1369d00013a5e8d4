"""Each benchmark runs as a file as well as a module.

`python benchmarks/dlrm.py --help` and `python -m benchmarks.dlrm --help`
alike: a benchmark that imports its neighbours from `benchmarks` puts the
checkout on the path when it is run as a file (issue #56, item 1). Run from
another directory, as a user may.
"""

# Runs without TensorFlow.

import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest
from child_env import child_env
from conftest import version_independent

ROOT = pathlib.Path(__file__).resolve().parent.parent
FILES = sorted(
    path.name
    for path in (ROOT / "benchmarks").glob("*.py")
    if "from benchmarks" in path.read_text(encoding="utf-8")
)
# What each needs beyond the package's `[jax]` extra.
NEEDS_TENSORFLOW = {"breakdown.py"}


def _without_the_checkout():
    """The children's environment (`child_env`) less the checkout on
    `PYTHONPATH`, where the tests run from a checkout: the file itself must
    find `benchmarks` there."""
    env = child_env()
    paths = env["PYTHONPATH"].split(os.pathsep)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in paths if pathlib.Path(p).resolve() != ROOT
    )
    return env


def test_the_benchmarks_that_import_their_neighbours_are_found():
    assert "dlrm.py" in FILES and "row_sparse_embedding.py" in FILES


@version_independent
@pytest.mark.parametrize("name", FILES)
def test_a_benchmark_runs_as_a_file(name, tmp_path):
    if name in NEEDS_TENSORFLOW and importlib.util.find_spec("tensorflow") is None:
        pytest.skip(f"{name} needs TensorFlow")
    if importlib.util.find_spec("jax") is None:
        pytest.skip("the benchmarks run on JAX's backend by default")
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / name), "--help"],
        cwd=tmp_path,
        env=_without_the_checkout(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage:"), done.stdout[:300]
