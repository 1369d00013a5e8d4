"""One source of measured numbers: docs/benchmarks.md.

A guide may quote a measurement (milliseconds, MiB, GiB, a ratio such as
`1.39x`), rounded or not, but only one that docs/benchmarks.md states: a
guide that drifted from the benchmarks (it said 1.8 ms against 96 ms where
they said 3.27 ms against 117.1 ms) fails here.
"""

# Runs without TensorFlow.

import pathlib
import re

import pytest

DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs"
BENCHMARKS = (DOCS / "benchmarks.md").read_text(encoding="utf-8")

_NUMBER = r"(\d[\d,]*(?:\.\d+)?)"
# A unit after a number; a ratio is written against the number (`1.39x`),
# which a shape (`4,096 x 64`) is not.
_QUANTITIES = {
    "ms": _NUMBER + r"\s?ms\b",
    "MiB": _NUMBER + r"\s?MiB\b",
    "GiB": _NUMBER + r"\s?GiB\b",
    "x": _NUMBER + r"x\b",
}


def _values(text, pattern):
    return [match.replace(",", "") for match in re.findall(pattern, text)]


def _decimals(text):
    return len(text.split(".")[1]) if "." in text else 0


def _stated(value, unit):
    """Whether docs/benchmarks.md states `value` (as a string), rounded to
    its decimals: with the unit, or in a table column of that unit."""
    candidates = _values(BENCHMARKS, _QUANTITIES[unit])
    candidates += _values(BENCHMARKS, r"\|\s*" + _NUMBER + r"x?\s*(?=\|)")
    places = _decimals(value)
    return any(round(float(c), places) == float(value) for c in candidates)


@pytest.mark.parametrize(
    "guide", sorted((DOCS / "guides").glob("*.md")), ids=lambda path: path.name
)
def test_a_guide_quotes_only_numbers_the_benchmarks_state(guide):
    text = guide.read_text(encoding="utf-8")
    drifted = [
        f"{value} {unit}"
        for unit, pattern in _QUANTITIES.items()
        for value in _values(text, pattern)
        if not _stated(value, unit)
    ]
    assert not drifted, (
        f"{guide.name} quotes {drifted}, which docs/benchmarks.md does not "
        "state: quote it from there, or link to it."
    )


def test_the_check_catches_a_drifted_number():
    assert _stated("3.3", "ms") and _stated("117", "ms") and _stated("1.39", "x")
    # Numbers the benchmarks do not state (the drifted guide's 96 ms is now
    # a rounding of a later run's 95.7 ms, and its 1.8 ms of a ratio, 1.78).
    assert not _stated("96.4", "ms") and not _stated("4321.5", "ms")
