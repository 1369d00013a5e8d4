"""The README's Python examples run, and its optimizer table is current."""

import contextlib
import io
import os
import pathlib
import re
import shlex
import subprocess
import sys

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


DESCRIBE = re.search(r"## Describe an optimizer\n\n```bash\n(.*?)```", README, re.S)


def test_readme_describe_commands_run(tmp_path):
    """Each line of the describe block, with the CLI run as `python -m`."""
    assert DESCRIBE, "the README lost its describe block"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    for line in DESCRIBE.group(1).strip().splitlines():
        command = line.split("   #")[0].strip()
        command = command.replace(
            "tf-tpu-embed-opt", f"{shlex.quote(sys.executable)} -m tf_tpu_embed_opt"
        ).replace("python -c", f"{shlex.quote(sys.executable)} -c")
        result = subprocess.run(
            command, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert result.returncode == 0, (line, result.stderr[-2000:])
    assert "ftrl" in result.stdout


def test_readme_tables_are_generated_from_definitions():
    assert tables.embedding_optimizers_markdown() in README
    assert tables.conversions_markdown() in README
