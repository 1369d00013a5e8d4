"""A new algorithm is one module and one registry entry.

The module is the one docs/development.md shows ("Adding an algorithm"): an
algorithm no engine has built in. The test copies the installed package,
adds the module and its registry entry, checks that no other file of the
copy differs from the package, and runs `new_algorithm_walk.py` against the
copy on each installed Keras backend: the Keras twin (its math against the
formula), the row-sparse layer, the package's spec, jax-tpu-embedding's
custom spec, the refusal by name on the TensorFlow engines, and `describe`.
"""

# Runs without TensorFlow.

import filecmp
import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

import tf_tpu_embed_opt

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = pathlib.Path(tf_tpu_embed_opt.__file__).resolve().parent

BACKENDS = [
    pytest.param(
        name,
        marks=pytest.mark.skipif(
            importlib.util.find_spec(name) is None, reason=f"{name} missing"
        ),
    )
    for name in ("tensorflow", "jax")
]


def _module_text():
    """The algorithm module of docs/development.md."""
    page = (ROOT / "docs" / "development.md").read_text(encoding="utf-8")
    section = page[page.index("## Adding an algorithm") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def _add_to_registry(text):
    """The registry with the new module imported and listed in `ALL`."""
    imports = "    sgd,\n)"
    listed = "    f2a.DEFINITION,\n)"
    assert text.count(imports) == 1 and text.count(listed) == 1
    text = text.replace(imports, "    sgd,\n    sign_momentum,\n)")
    return text.replace(listed, "    f2a.DEFINITION,\n    sign_momentum.DEFINITION,\n)")


def _differing(left, right):
    """Relative paths of the files that differ between two trees (caches
    aside)."""
    found = []

    def walk(comparison, prefix):
        found.extend(prefix + name for name in comparison.diff_files)
        found.extend(prefix + name for name in comparison.left_only)
        found.extend(prefix + name for name in comparison.right_only)
        for name, sub in comparison.subdirs.items():
            walk(sub, f"{prefix}{name}/")

    walk(filecmp.dircmp(left, right, ignore=["__pycache__"]), "")
    return sorted(found)


@pytest.fixture(scope="module")
def package_copy(tmp_path_factory):
    root = tmp_path_factory.mktemp("new_algorithm")
    copy = root / "tf_tpu_embed_opt"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    algorithms = copy / "definitions" / "algorithms"
    (algorithms / "sign_momentum.py").write_text(_module_text(), encoding="utf-8")
    registry = copy / "definitions" / "registry.py"
    registry.write_text(_add_to_registry(registry.read_text(encoding="utf-8")))
    assert _differing(PACKAGE, copy) == [
        "definitions/algorithms/sign_momentum.py",
        "definitions/registry.py",
    ]
    return root


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_new_algorithm_is_one_module_and_one_registry_entry(package_copy, backend):
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
    env["PYTHONPATH"] = str(package_copy)
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tests" / "new_algorithm_walk.py"),
            str(package_copy),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(package_copy),
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    faces = result.stdout.splitlines()
    assert faces[:2] == ["keras face", "row-sparse layer"], faces
    assert faces[-1] == "describe", faces
    if importlib.util.find_spec("tensorflow") is not None:
        assert "TensorFlow engines refuse it" in faces and "optimizer spec" in faces
