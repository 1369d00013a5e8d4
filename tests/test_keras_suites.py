"""Keras's own optimizer tests, run against this package's twins.

They run on the Keras backend of the test run (TensorFlow, or JAX in CI's JAX
leg); a row of the README table that begins "On the JAX backend" lists tests
that fail on that backend only.

The installed Keras ships its optimizer tests (`keras/src/optimizers/*_test.py`
with `keras.src.testing`). Each file named in `SUITES` is loaded from the
installed Keras (nothing is fetched) with only the class under test swapped
for this package's twin of the same name, and run with `unittest`. Every test
must pass, except exactly those that the README's "Differences from Keras and
TensorFlow" table lists as showing a by-design difference: those must fail (a
listed test that passes is an error too, so the table stays true). Tests that
also fail with Keras's own classes are not the twins' concern and are left out
of the comparison.
"""

# Runs without TensorFlow.

from __future__ import annotations

import importlib.util
import pathlib
import re
import sys
import types
import unittest
from typing import Dict, Optional, Set, Tuple

import doc_pages
import keras
import pytest
from conftest import keras_face

import tf_tpu_embed_opt as teo

# The README and docs/ (tests/doc_pages.py): the tables moved to pages.
README = doc_pages
TABLE_HEADING = "## Differences from Keras and TensorFlow"

SUITES = (
    "sgd_test",
    "adagrad_test",
    "adam_test",
    "ftrl_test",
    "rmsprop_test",
    "adadelta_test",
    "optimizer_test",
    "optimizer_sparse_test",
)

pytestmark = [pytest.mark.oracle("keras-suites"), keras_face]

# The twins with Keras's names: the classes swapped in.
SWAPPED = {
    name: getattr(teo.optimizers, name)
    for name in ("SGD", "Adagrad", "Adam", "Ftrl", "RMSprop", "Adadelta")
}


def _keras_optimizers() -> types.ModuleType:
    try:
        from keras.src import optimizers
    except ImportError as error:  # pragma: no cover - depends on the install
        pytest.skip(f"the installed Keras has no keras.src.optimizers: {error}")
    return optimizers


def _suite_path(name: str) -> pathlib.Path:
    path = pathlib.Path(_keras_optimizers().__file__).parent / f"{name}.py"
    if not path.is_file():
        pytest.skip(
            f"the installed Keras {keras.__version__} does not ship "
            f"keras/src/optimizers/{name}.py"
        )
    try:
        importlib.import_module("keras.src.testing")
    except ImportError as error:  # pragma: no cover - depends on the install
        pytest.skip(f"the installed Keras has no keras.src.testing: {error}")
    return path


def _load(name: str, swap: bool) -> types.ModuleType:
    """The test module, its class under test replaced by the twin if `swap`.

    The Keras package's attributes are replaced while the file runs, because
    some files build their test tables at import (`optimizer_sparse_test.py`);
    afterwards the module sees the twins through its own names only.
    """
    optimizers = _keras_optimizers()
    path = _suite_path(name)
    swapped = SWAPPED if swap else {}
    saved = {key: getattr(optimizers, key) for key in swapped}
    module_name = f"tf_tpu_embed_opt_keras_suite_{name}_{'twins' if swap else 'keras'}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    try:
        for key, cls in swapped.items():
            setattr(optimizers, key, cls)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    finally:
        for key, cls in saved.items():
            setattr(optimizers, key, cls)
        sys.modules.pop(module_name, None)
    if swap:
        for key, cls in swapped.items():
            if key in vars(module):
                setattr(module, key, cls)
        if isinstance(vars(module).get("optimizers"), types.ModuleType):
            view = types.ModuleType(f"{optimizers.__name__} with the twins")
            view.__dict__.update(
                {k: v for k, v in vars(optimizers).items() if not k.startswith("__")}
            )
            view.__dict__.update(swapped)
            module.optimizers = view
    return module


def _run(
    name: str, swap: bool, only: Optional[Set[str]] = None
) -> Tuple[Set[str], Set[str], int]:
    """(failed test ids, skipped test ids, tests run) of one suite file, or
    of its tests in `only` (test ids)."""
    module = _load(name, swap)
    tests = _flatten(unittest.defaultTestLoader.loadTestsFromModule(module))
    suite = unittest.TestSuite(
        test for test in tests if only is None or _short(name, test) in only
    )
    result = unittest.TestResult()
    # Keras's TestCase turns traceback filtering off for good; restore it.
    filtering = keras.config.is_traceback_filtering_enabled()
    try:
        suite.run(result)
    finally:
        if filtering:
            keras.config.enable_traceback_filtering()
    failed = {_short(name, test) for test, _ in result.failures + result.errors}
    skipped = {_short(name, test) for test, _ in result.skipped}
    return failed, skipped, result.testsRun


def _short(name: str, test: unittest.TestCase) -> str:
    return f"{name}.py::{type(test).__name__}::{test._testMethodName}"


def listed_differences() -> Dict[str, str]:
    """Keras test id -> the README table row (its "What") that it shows."""
    text = README.TEXT
    start = text.index(TABLE_HEADING)
    end = text.find("\n## ", start + len(TABLE_HEADING))
    section = text[start : end if end != -1 else None]
    listed = {}
    for line in section.splitlines():
        if not line.startswith("|") or line.startswith("|---"):
            continue
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        only = re.match(r"On the (\w+) backend", cells[0])
        if only and only.group(1).lower() != keras.backend.backend():
            continue
        for test_id in re.findall(r"`(\w+_test\.py::\w+::\w+)`", line):
            listed[test_id] = cells[0]
    return listed


def test_readme_lists_the_differences_in_one_table():
    listed = listed_differences()
    assert listed, f"no Keras test ids in the README's {TABLE_HEADING!r} table"
    text = README.TEXT
    assert text.count(TABLE_HEADING) == 1


@pytest.mark.parametrize("name", SUITES)
def test_keras_suite_passes_but_for_listed_differences(name):
    failed, skipped, run = _run(name, swap=True)
    assert run > 0
    if skipped:
        # Skips that Keras's own classes get too (backend features) are fine
        # (only those tests run again, with Keras's classes).
        skipped -= _run(name, swap=False, only=skipped)[1]
    assert not skipped, f"tests skipped with the twins only: {sorted(skipped)}"
    expected = {
        test_id
        for test_id in listed_differences()
        if test_id.startswith(f"{name}.py::")
    }
    unexpected = failed - expected
    if unexpected:
        # Not a twin's difference if Keras's own classes fail it too (an
        # installed Keras whose tests need something this machine lacks).
        keras_failed, _, _ = _run(name, swap=False, only=unexpected)
        unexpected -= keras_failed
    assert not unexpected, (
        f"Keras tests that fail with the twins but are not listed in the "
        f"README's {TABLE_HEADING!r} table: {sorted(unexpected)}"
    )
    missing = expected - failed
    if missing:
        # A listed test this Keras does not have is no evidence either way.
        module = _load(name, swap=False)
        present = {
            _short(name, test)
            for test in _flatten(unittest.defaultTestLoader.loadTestsFromModule(module))
        }
        missing &= present
    assert not missing, (
        f"README lists these Keras tests as differences but they pass with the "
        f"twins (update the table): {sorted(missing)}"
    )


def _flatten(suite: unittest.TestSuite):
    for item in suite:
        if isinstance(item, unittest.TestSuite):
            yield from _flatten(item)
        else:
            yield item
