"""The performance page's figures show the numbers beside them (issue #56,
item 9).

Each figure of docs/benchmarks.md is drawn by `python -m benchmarks.figures`
from the tables marked `<!-- figure: NAME -->` and records a digest of them;
a table changed without drawing its figure again fails here.
"""

# Runs without TensorFlow.

import importlib.util
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "benchmarks.md"


def _figures():
    # By its file: the `pytest` script tests the installed wheel, without the
    # checkout (and its `benchmarks` folder) on the path.
    spec = importlib.util.spec_from_file_location(
        "benchmark_figures", ROOT / "benchmarks" / "figures.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


figures = _figures()
TABLES = figures.marked_tables(PAGE.read_text(encoding="utf-8"))


def test_every_figure_has_its_tables_on_the_page():
    assert set(TABLES) == set(figures.FIGURES)
    assert len(TABLES["row_sparse_rows"]) == 2  # JAX, TensorFlow
    assert len(TABLES["host_allocator"]) == 1


@pytest.mark.parametrize("name", sorted(figures.FIGURES))
def test_a_figure_shows_the_numbers_beside_it(name):
    text = PAGE.read_text(encoding="utf-8")
    image = ROOT / "docs" / "images" / f"{name}.png"
    assert f"](images/{name}.png)" in text
    assert image.is_file()
    assert figures.recorded_digest(image) == figures.digest(TABLES[name]), (
        f"{image.name} does not show the tables of {PAGE.name}: run "
        "`python -m benchmarks.figures`"
    )


def test_the_digest_changes_with_any_number():
    tables = [[row[:] for row in table] for table in TABLES["host_allocator"]]
    before = figures.digest(tables)
    tables[0][1][2] = tables[0][1][2] + "1"
    assert figures.digest(tables) != before


def test_a_marker_without_a_table_is_refused():
    with pytest.raises(ValueError, match="not followed by a table"):
        figures.marked_tables("<!-- figure: host_allocator -->\n\ntext\n")


def test_one_command_draws_them_again(tmp_path):
    pytest.importorskip("matplotlib")
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "figures.py"),
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    for name in figures.FIGURES:
        drawn = tmp_path / f"{name}.png"
        assert figures.recorded_digest(drawn) == figures.digest(TABLES[name])
