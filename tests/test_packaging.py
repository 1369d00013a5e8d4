"""Import behaviour and metadata that users depend on."""

# Runs without TensorFlow.

import importlib.util
import os
import pathlib
import re
import subprocess
import sys
import zipfile

import pytest

import tf_tpu_embed_opt as teo

ROOT = pathlib.Path(__file__).resolve().parent.parent
HAS_TENSORFLOW = importlib.util.find_spec("tensorflow") is not None

# Runs in a child interpreter where importing TensorFlow fails as it does in an
# environment without it.
_WITHOUT_TENSORFLOW = """
import sys

class _NoTensorFlow:
    def find_spec(self, name, path=None, target=None):
        if name == "tensorflow" or name.startswith("tensorflow."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _NoTensorFlow())
import tf_tpu_embed_opt  # the Keras face needs no TensorFlow

print("imported")
try:
    tf_tpu_embed_opt.embedding
except ImportError as error:
    print(error)
else:
    print("embedding without TensorFlow")
"""


def test_without_tensorflow_the_package_imports_and_names_the_extras():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    result = subprocess.run(
        [sys.executable, "-c", _WITHOUT_TENSORFLOW],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(ROOT),
        check=True,
    )
    message = result.stdout
    assert message.startswith("imported\n")
    assert "embedding without TensorFlow" not in message
    assert "tf_tpu_embed_opt.embedding needs TensorFlow" in message
    for extra in ("[cpu]", "[tensorflow]", "[tpu]", "[jax]"):
        assert extra in message


def test_public_names():
    assert teo.__all__ == [
        "embedding",
        "optimizers",
        "layers",
        "from_proto",
        "to_proto",
        "to_embedding",
        "to_keras",
        "OptimizerSpec",
        "to_spec",
        "from_spec",
        "tpu_embedding_configuration",
        "engines",
        "check_engine",
        "EngineReport",
        "checkpoints",
        "keras_state",
        "multi_optimizer",
        "sparsecore_layout",
        "sharded",
        "load_into_keras",
        "save_tpu_checkpoint",
        "keras_optimizer",
        "embedding_optimizers",
        "TensorFlowNotInstalled",
        "__version__",
    ]
    for name in teo.__all__:
        try:
            getattr(teo, name)
        except ImportError as error:
            # Without TensorFlow (the JAX leg) only the Keras face loads; the
            # others say what they need.
            assert not HAS_TENSORFLOW, error
            assert "needs TensorFlow" in str(error), error


def test_py_typed_marker_ships():
    assert (pathlib.Path(teo.__file__).parent / "py.typed").is_file()


def test_tests_run_against_the_installed_package_in_ci():
    if not os.environ.get("TF_TPU_EMBED_OPT_EXPECT_INSTALLED"):
        pytest.skip("set by .ci/run, which tests the installed wheel")
    location = pathlib.Path(teo.__file__).resolve()
    assert ROOT not in location.parents, f"imported from the checkout: {location}"
    assert "site-packages" in location.parts


def test_wheel_contents():
    wheel = os.environ.get("TF_TPU_EMBED_OPT_WHEEL")
    if not wheel:
        pytest.skip("TF_TPU_EMBED_OPT_WHEEL (set by .ci/run) names no wheel")

    names = set(zipfile.ZipFile(wheel).namelist())
    for required in (
        "tf_tpu_embed_opt/py.typed",
        "tf_tpu_embed_opt/optimizer_spec/descriptor.py",
        "tf_tpu_embed_opt/definitions/algorithms/adam.py",
        # Modules of nested packages (issue #55's folders) ship too.
        "tf_tpu_embed_opt/checkpoints/sparsecore/writer.py",
        "tf_tpu_embed_opt/checkpoints/jax_tpu_embedding/writer.py",
        "tf_tpu_embed_opt/checkpoints/shared/stacks.py",
        "tf_tpu_embed_opt/conversions/faces.py",
    ):
        assert required in names
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(metadata).decode()
    requirements = [
        line for line in text.splitlines() if line.startswith("Requires-Dist:")
    ]
    # TensorFlow only through extras, one distribution per extra.
    unconditional = [r for r in requirements if "extra ==" not in r]
    assert not any("tensorflow" in r for r in unconditional), unconditional
    for extra, distribution in (
        ("cpu", "tensorflow-cpu"),
        ("tensorflow", "tensorflow"),
        ("tpu", "tensorflow-tpu"),
    ):
        tensorflows = [
            r.split()[1].split("<")[0].split(">")[0].split("=")[0].split(";")[0]
            for r in requirements
            if f'extra == "{extra}"' in r and "tensorflow" in r
        ]
        assert tensorflows == [distribution], (extra, tensorflows)


def test_console_script_is_installed():
    if not os.environ.get("TF_TPU_EMBED_OPT_EXPECT_INSTALLED"):
        pytest.skip("set by .ci/run, which installs the wheel with its scripts")
    script = pathlib.Path(sys.executable).parent / "tf-tpu-embed-opt"
    result = subprocess.run(
        [str(script), "describe", "adagrad"], capture_output=True, text=True
    )
    if not HAS_TENSORFLOW:
        # `describe` on the default engine prints a TensorFlow proto:
        # refused in one line, naming the command and the engine.
        assert result.returncode == 2, result.stderr
        assert "describe Adagrad` on engine TPUEmbedding" in result.stderr
        assert "needs TensorFlow" in result.stderr
        assert len(result.stderr.splitlines()) == 1, result.stderr
        return
    assert result.returncode == 0, result.stderr
    assert "adagrad {" in result.stdout


def test_exactly_one_tensorflow_distribution():
    if not os.environ.get("TF_TPU_EMBED_OPT_EXPECT_INSTALLED"):
        pytest.skip("set by .ci/run, which installs the wheel with an extra")
    from importlib import metadata

    def normalized(name):
        return re.sub(r"[-_.]+", "-", name).lower()

    names = {normalized(d.metadata["Name"]) for d in metadata.distributions()}
    installed = names & {
        "tensorflow",
        "tensorflow-cpu",
        "tensorflow-tpu",
        "tensorflow-intel",
        "tensorflow-macos",
    }
    # None in the JAX leg, which installs the `[jax]` extra only.
    assert len(installed) == (1 if HAS_TENSORFLOW else 0), installed


def test_install_hints_name_an_install_that_works():
    """No message or docstring tells users `pip install tf_tpu_embed_opt[...]`,
    which no registry serves: the extras install from a checkout (`pip
    install ".[cpu]"`), as the README says."""
    pattern = re.compile(r"pip install ['\"]?tf_tpu_embed_opt\[")
    found = [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "tf_tpu_embed_opt").rglob("*.py"))
        if pattern.search(path.read_text(encoding="utf-8"))
    ]
    assert not found, found


def test_help_on_the_package_lists_what_loads_here():
    """`dir()` lists the public names that load in this install (all of them
    with TensorFlow; on the `[jax]` install, those of the Keras face, the
    layers, engines and checkpoints), so that `help(tf_tpu_embed_opt)`, which
    reads every name `dir()` lists, works without TensorFlow too."""
    import pydoc

    from tf_tpu_embed_opt.errors import TensorFlowNotInstalled

    loads, needs = [], []
    for name in teo.__all__:
        try:
            getattr(teo, name)
            loads.append(name)
        except TensorFlowNotInstalled:
            needs.append(name)
    assert dir(teo) == sorted(loads)
    if not HAS_TENSORFLOW:
        assert set(needs) == teo._NEED_TENSORFLOW
    text = pydoc.render_doc(teo, renderer=pydoc.plaintext)
    for fragment in ("Keras face", "to_keras", "load_into_keras", "layers"):
        assert fragment in text, fragment


@pytest.mark.parametrize("package", ["checkpoints", "engines"])
def test_help_on_the_subpackages_lists_what_loads_here(package):
    """So do `tf_tpu_embed_opt.checkpoints` and `.engines`, whose names load
    their modules on first use: `help()` of either failed without TensorFlow
    with a bare `ModuleNotFoundError`, and so did a name that needs it (now
    `TensorFlowNotInstalled` naming it)."""
    import importlib
    import pydoc

    from tf_tpu_embed_opt.errors import TensorFlowNotInstalled

    module = importlib.import_module(f"tf_tpu_embed_opt.{package}")
    names = sorted({*module.__all__, *getattr(module, "_LAZY", ())})
    loads, needs = [], []
    for name in names:
        try:
            getattr(module, name)
            loads.append(name)
        except TensorFlowNotInstalled as error:
            assert str(error).startswith(
                f"tf_tpu_embed_opt.{package}.{name} needs TensorFlow"
            )
            needs.append(name)
    assert dir(module) == loads
    assert set(needs) == (set() if HAS_TENSORFLOW else module._NEED_TENSORFLOW)
    assert "NAME\n    tf_tpu_embed_opt." + package in pydoc.render_doc(
        module, renderer=pydoc.plaintext
    )
