"""The pages written for JAX users run where TensorFlow is not installed.

Every ```python block of the guides that say they need no TensorFlow runs
here, in the suite of the `[jax]` install (where TensorFlow is installed,
`test_readme.py` runs them with every other block).
"""

# Runs without TensorFlow.

import contextlib
import io

import pytest
from doc_pages import ROOT, TEXTS, python_blocks

try:
    import tensorflow  # noqa: F401

    HAS_TENSORFLOW = True
except ModuleNotFoundError:
    HAS_TENSORFLOW = False

PAGES = [
    ROOT / "docs" / "guides" / "keras-on-jax.md",
    ROOT / "docs" / "guides" / "row-sparse-embedding.md",
    ROOT / "docs" / "guides" / "jax-checkpoints.md",
]
BLOCKS = [(path, block) for path, block in python_blocks() if path in PAGES]


def test_the_pages_say_so():
    for path in PAGES:
        assert "TensorFlow" in TEXTS[path], path
    assert len(BLOCKS) >= 5


@pytest.mark.skipif(HAS_TENSORFLOW, reason="test_readme.py runs them here")
@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_block_runs_without_tensorflow(index):
    path, block = BLOCKS[index]
    if "keras_rs" in block:
        pytest.importorskip("keras_rs")
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        exec(compile(block, f"{path.name} block {index}", "exec"), {})
    assert output.getvalue().strip()
