"""The `[jax]` extra's declared minimums are the versions CI tests.

setup.py declares each requirement of the `[jax]` extra with a minimum
(`>=`); tests/jax_minimums.txt pins exactly those versions, and CI's
minimum-versions leg installs the package with it (.ci/run). Here the two
files are held to each other, and, in that leg
(TF_TPU_EMBED_OPT_MINIMUM_VERSIONS=1), the installed versions to the pins:
a minimum raised or lowered in one place only, or a leg that resolved to
something else, fails.
"""

# Runs without TensorFlow.

import ast
import os
import pathlib
from importlib import metadata

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = pathlib.Path(__file__).resolve().parent.parent
MINIMUMS = pathlib.Path(__file__).resolve().parent / "jax_minimums.txt"
MINIMUM_VERSIONS_VARIABLE = "TF_TPU_EMBED_OPT_MINIMUM_VERSIONS"


def _jax_extra():
    """The `[jax]` extra's requirement lines, read from setup.py."""
    tree = ast.parse((ROOT / "setup.py").read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and key.value == "jax":
                    return [ast.literal_eval(element) for element in value.elts]
    raise AssertionError("setup.py has no `jax` extra")


def _declared():
    """{name: minimum version} of the `[jax]` extra."""
    declared = {}
    for line in _jax_extra():
        requirement = Requirement(line)
        (specifier,) = requirement.specifier
        assert specifier.operator == ">=", line
        declared[canonicalize_name(requirement.name)] = specifier.version
    return declared


def _pins():
    """{name: version} of tests/jax_minimums.txt."""
    pins = {}
    for line in MINIMUMS.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            requirement = Requirement(line)
            (specifier,) = requirement.specifier
            assert specifier.operator == "==", line
            pins[canonicalize_name(requirement.name)] = specifier.version
    return pins


def _same(declared, pinned):
    """`3.15` declares what `3.15.0` pins."""
    a, b = (tuple(int(p) for p in v.split(".")) for v in (declared, pinned))
    width = max(len(a), len(b))
    return a + (0,) * (width - len(a)) == b + (0,) * (width - len(b))


def test_every_declared_minimum_is_pinned_for_the_minimum_leg():
    declared, pins = _declared(), _pins()
    # jaxlib comes with jax[cpu], at jax's version.
    assert pins.pop("jaxlib") == pins["jax"]
    assert sorted(pins) == sorted(declared)
    for name, version in declared.items():
        assert _same(version, pins[name]), (name, version, pins[name])


def test_the_minimum_leg_runs_the_minimums():
    if os.environ.get(MINIMUM_VERSIONS_VARIABLE) != "1":
        pytest.skip(
            f"the minimum-versions leg sets {MINIMUM_VERSIONS_VARIABLE}=1 (.ci/run)"
        )
    for name, version in _pins().items():
        assert metadata.version(name) == version, name
