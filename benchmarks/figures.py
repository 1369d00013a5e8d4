"""The performance page's figures, drawn from the numbers beside them.

docs/benchmarks.md keeps each benchmark's measured table; a table this
harness draws is marked by a comment on the line before it,
`<!-- figure: NAME -->`, and its figure, `docs/images/NAME.png`, is shown
right after it. Each figure records a digest of the tables it draws (PNG text
`Tables-SHA256`), so a test can tell that the image shows the numbers on the
page (tests/test_benchmark_files.py): change a table, then run

    python -m benchmarks.figures          # or: python benchmarks/figures.py

to draw the figures again (matplotlib, in the `test` and `plot` extras).

Figures:

- `row_sparse_rows`: `benchmarks/row_sparse_embedding.py`'s step time of one
  table against its rows, `layers.Embedding` on JAX and on TensorFlow, with
  the reference at 1M rows (Keras's own path) as a marker;
- `host_allocator`: `benchmarks/dlrm.py`'s many-table step over its MLP-only
  step, with glibc told to keep freed memory and with its defaults.
"""

from __future__ import annotations

import argparse
import hashlib
import pathlib
import re
from typing import Callable, Dict, List, Sequence, Tuple

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "benchmarks.md"
IMAGES = ROOT / "docs" / "images"
DIGEST_KEY = "Tables-SHA256"
_MARKER = re.compile(r"^<!-- figure: ([a-z_]+) -->$")

__all__ = ["DIGEST_KEY", "digest", "draw", "marked_tables", "recorded_digest"]


def marked_tables(text: str) -> Dict[str, List[List[List[str]]]]:
    """Each figure's tables in the page's text, in order: rows of cells,
    the header first (the `|---|` line left out).

    Raises:
      ValueError: A marker not followed by a table.
    """
    lines = text.splitlines()
    tables: Dict[str, List[List[List[str]]]] = {}
    for index, line in enumerate(lines):
        match = _MARKER.match(line.strip())
        if match is None:
            continue
        rows = []
        for row in lines[index + 1 :]:
            if not row.startswith("|"):
                break
            if not set(row) <= set("|-: "):
                rows.append(
                    [cell.strip() for cell in row.strip().strip("|").split("|")]
                )
        if len(rows) < 2:
            raise ValueError(f"{PAGE.name}: {line.strip()} is not followed by a table")
        tables.setdefault(match.group(1), []).append(rows)
    return tables


def digest(tables: Sequence[List[List[str]]]) -> str:
    """The SHA-256 of the cells of `tables`, as the figure records it."""
    text = "\n".join("|".join(row) for table in tables for row in table)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _number(cell: str) -> float:
    return float(cell.replace(",", "").rstrip("x"))


def _column(table: List[List[str]], name: str) -> int:
    return table[0].index(name)


# The reference of each backend's table (its last two columns).
_REFERENCES = (
    ("JAX", "keras.layers.Embedding, Keras's"),
    ("TensorFlow", "keras.layers.Embedding, the twin"),
)


def _row_sparse_rows(axes, tables) -> None:
    for table, (backend, reference), color in zip(tables, _REFERENCES, ("C0", "C1")):
        rows_at = _column(table, "rows")
        ms_at = _column(table, "row-sparse ms")
        for optimizer, style in (("Adagrad", "-"), ("lazy Adam", "--")):
            body = [row for row in table[1:] if row[0] == optimizer]
            axes.plot(
                [_number(row[rows_at]) for row in body],
                [_number(row[ms_at]) for row in body],
                style,
                marker="o",
                color=color,
                label=f"layers.Embedding, {optimizer}, {backend}",
            )
            for row in body:
                if row[-2]:
                    axes.plot(
                        _number(row[rows_at]),
                        _number(row[-2]),
                        "x" if optimizer == "Adagrad" else "+",
                        color=color,
                        markersize=9,
                        label=f"{reference} {optimizer}, {backend}",
                    )
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel("rows of the table (dim 64)")
    axes.set_ylabel("ms per training step (median)")
    axes.set_title("One table's step against its rows")


def _host_allocator(axes, tables) -> None:
    (table,) = tables
    names = [row[0].replace("`", "") for row in table[1:]]
    kept = [_number(row[2]) for row in table[1:]]
    defaults = [_number(row[4]) for row in table[1:]]
    positions = range(len(names))
    height = 0.4
    axes.barh(
        [p - height / 2 for p in positions],
        kept,
        height,
        label="glibc keeps freed memory",
    )
    axes.barh(
        [p + height / 2 for p in positions], defaults, height, label="glibc's defaults"
    )
    axes.axvline(1.0, color="black", linewidth=0.8)
    axes.axvline(1.3, color="gray", linestyle=":", label="1.3x the MLP-only step")
    axes.set_yticks(list(positions), names)
    axes.invert_yaxis()
    axes.set_xlabel("step time / MLP-only step (JAX, median)")
    axes.set_title("Many tables: the host allocator")


# Each figure's drawing, and where its legend goes.
FIGURES: Dict[str, Tuple[Callable[..., None], str]] = {
    "row_sparse_rows": (_row_sparse_rows, "upper left"),
    "host_allocator": (_host_allocator, "lower right"),
}


def draw(text: str, out: pathlib.Path) -> Dict[str, pathlib.Path]:
    """Draws every marked figure of the page's `text` into `out`.

    Raises:
      ValueError: A marker names no figure of `FIGURES`, or a figure has no
        table on the page.
    """
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    tables = marked_tables(text)
    unknown = sorted(set(tables) - set(FIGURES))
    missing = sorted(set(FIGURES) - set(tables))
    if unknown or missing:
        raise ValueError(
            f"{PAGE.name}: markers of unknown figures {unknown}, figures "
            f"without a marked table {missing}; known: {sorted(FIGURES)}."
        )
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    for name, (plot, legend) in FIGURES.items():
        figure, axes = pyplot.subplots(figsize=(8, 4.5), dpi=100)
        plot(axes, tables[name])
        handles, labels = axes.get_legend_handles_labels()
        unique = dict(zip(labels, handles))  # one entry per label
        axes.legend(unique.values(), unique.keys(), fontsize=7, loc=legend)
        axes.grid(True, which="major", alpha=0.3)
        figure.tight_layout()
        path = out / f"{name}.png"
        metadata = {DIGEST_KEY: digest(tables[name]), "Software": None}
        figure.savefig(path, metadata=metadata)
        pyplot.close(figure)
        written[name] = path
    return written


def recorded_digest(path: pathlib.Path) -> str:
    """The tables' digest a figure records (its PNG text chunk), or ''."""
    data = path.read_bytes()
    position = 8  # after the PNG signature
    while position + 8 <= len(data):
        length = int.from_bytes(data[position : position + 4], "big")
        kind = data[position + 4 : position + 8]
        body = data[position + 8 : position + 8 + length]
        if kind == b"tEXt":
            key, _, value = body.partition(b"\0")
            if key.decode("latin-1") == DIGEST_KEY:
                return value.decode("latin-1")
        position += 12 + length
    return ""


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.figures",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument(
        "--out", type=pathlib.Path, default=IMAGES, help=f"default: {IMAGES}"
    )
    args = parser.parse_args(list(argv) or None)
    for name, path in draw(PAGE.read_text(encoding="utf-8"), args.out).items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
