"""The README's Python examples run, and its optimizer table is current."""

import contextlib
import io
import pathlib
import re

import pytest

from tf_tpu_embed_opt import tables

README = (pathlib.Path(__file__).resolve().parent.parent / "README.md").read_text(
    encoding="utf-8"
)
BLOCKS = re.findall(r"```python\n(.*?)```", README, re.S)


def test_readme_has_python_examples():
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_python_block_runs(index):
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        exec(compile(BLOCKS[index], f"README block {index}", "exec"), {})
    assert output.getvalue()


def test_readme_tables_are_generated_from_definitions():
    assert tables.embedding_optimizers_markdown() in README
    assert tables.conversions_markdown() in README
