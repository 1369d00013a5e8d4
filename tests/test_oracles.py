"""A missing oracle fails loudly unless opted out, and the summary says so.

Runs pytest in a child on a scratch directory holding this suite's
`conftest.py` and `oracles.py`, with three stand-in oracles: one present, one
installable but missing, one that this environment cannot have. The same way,
which modules and tests the suite collects on each Keras backend, and which
the CI leg variables skip or select.
"""

import os
import pathlib
import re
import subprocess
import sys

import pytest
from conftest import TENSORFLOW_FREE_MARK as FREE_MARK

import tf_tpu_embed_opt

HERE = pathlib.Path(__file__).resolve().parent
PACKAGE_PARENT = os.path.dirname(
    os.path.dirname(os.path.abspath(tf_tpu_embed_opt.__file__))
)

STAND_INS = """
ORACLES = (
    Oracle("present", "a stand-in that works", lambda: ""),
    Oracle("absent", "a stand-in not installed", lambda: "not installed", ("x",)),
    Oracle("unavailable", "a stand-in this protobuf lacks", lambda: "too new"),
)
BY_NAME = {oracle.name: oracle for oracle in ORACLES}
"""

TESTS = """
import pytest


@pytest.mark.oracle("present")
def test_present():
    pass


@pytest.mark.oracle("absent")
def test_absent():
    pass


@pytest.mark.oracle("unavailable")
def test_unavailable():
    pass


def test_plain():
    pass


@pytest.mark.version_independent
def test_once_per_ci_run():
    pass


@pytest.mark.same_in_the_jax_leg
def test_alike_in_the_jax_leg():
    pass


@pytest.mark.keras_face
def test_keras_face_alone():
    pass


@pytest.mark.benchmark_harness
def test_a_benchmark_harness():
    pass


@pytest.mark.every_optimizer("name", ("kept",))
@pytest.mark.parametrize("name", ["kept", "left"])
def test_per_optimizer(name):
    pass
"""
# The stand-ins each CI leg variable may skip; the others always run.
LEG_TESTS = {
    "test_once_per_ci_run",
    "test_alike_in_the_jax_leg",
    "test_per_optimizer[left]",
    "test_keras_face_alone",
    "test_a_benchmark_harness",
}


def _suite_in(root, tests):
    """`root` holding this suite's conftest, the stand-in oracles and
    `tests` (the source of one test module)."""
    (root / "conftest.py").write_text((HERE / "conftest.py").read_text())
    (root / "oracles.py").write_text((HERE / "oracles.py").read_text() + STAND_INS)
    (root / "test_stand_ins.py").write_text(tests)
    return root


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    return _suite_in(tmp_path_factory.mktemp("suite"), TESTS)


def run(suite, **environ):
    env = dict(os.environ, PYTHONPATH=PACKAGE_PARENT, TF_CPP_MIN_LOG_LEVEL="3")
    # CI's leg variables are this test's to set.
    for variable in (
        "TF_TPU_EMBED_OPT_SKIP_ORACLES",
        "TF_TPU_EMBED_OPT_VERSION_INDEPENDENT_ELSEWHERE",
        "TF_TPU_EMBED_OPT_JAX_LEG_ELSEWHERE",
        "TF_TPU_EMBED_OPT_EVERY_OPTIMIZER_ELSEWHERE",
        "TF_TPU_EMBED_OPT_KERAS_FACE_ELSEWHERE",
        "TF_TPU_EMBED_OPT_BENCHMARK_HARNESS_ELSEWHERE",
        "TF_TPU_EMBED_OPT_ONLY_JTE_WITH_TENSORFLOW",
        "KERAS_BACKEND",
    ):
        env.pop(variable, None)
    env.update(environ)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", str(suite)],
        cwd=suite,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done.returncode, done.stdout + done.stderr


def test_missing_oracle_fails_and_the_summary_lists_every_oracle(suite):
    status, output = run(suite)
    assert status == 1, output
    assert re.search(r"PASSED .*::test_present", output), output
    assert re.search(r"ERROR .*::test_absent", output), output
    assert "Install it with `python tests/install_oracles.py`" in output
    assert "TF_TPU_EMBED_OPT_SKIP_ORACLES=absent" in output
    assert re.search(r"SKIPPED .*oracle 'unavailable' is not available", output)
    assert "present: ran in 1 of 1 tests" in output, output
    assert "absent: MISSING, 1 tests failed (not installed)" in output, output
    assert "unavailable: not available here, 1 tests skipped (too new)" in output
    assert re.search(r"1 error", output), output


def test_opting_out_skips_and_is_reported(suite):
    status, output = run(suite, TF_TPU_EMBED_OPT_SKIP_ORACLES="absent")
    assert status == 0, output
    assert re.search(r"SKIPPED .*oracle 'absent' opted out", output), output
    assert "absent: SKIPPED by TF_TPU_EMBED_OPT_SKIP_ORACLES" in output, output
    assert "present: ran in 1 of 1 tests" in output, output


@pytest.mark.parametrize(
    "variable, skipped, reason",
    [
        (
            "TF_TPU_EMBED_OPT_VERSION_INDEPENDENT_ELSEWHERE",
            "test_once_per_ci_run",
            "independent of the TensorFlow and protobuf versions",
        ),
        (
            "TF_TPU_EMBED_OPT_JAX_LEG_ELSEWHERE",
            "test_alike_in_the_jax_leg",
            "uses JAX, neither TensorFlow nor Keras's backend",
        ),
        (
            "TF_TPU_EMBED_OPT_EVERY_OPTIMIZER_ELSEWHERE",
            "test_per_optimizer[left]",
            "every optimizer runs in the TensorFlow 2.21 leg; here only kept",
        ),
        (
            "TF_TPU_EMBED_OPT_KERAS_FACE_ELSEWHERE",
            "test_keras_face_alone",
            "the Keras face alone: the TensorFlow 2.21 and 2.16 legs run it",
        ),
        (
            "TF_TPU_EMBED_OPT_BENCHMARK_HARNESS_ELSEWHERE",
            "test_a_benchmark_harness",
            "a benchmark's harness on JAX: the newest JAX leg runs it",
        ),
    ],
)
def test_ci_leg_variables_skip_their_tests_and_refuse_other_values(
    suite, variable, skipped, reason
):
    opted_out = {"TF_TPU_EMBED_OPT_SKIP_ORACLES": "absent"}
    status, output = run(suite, **opted_out, **{variable: "1"})
    assert status == 0, output
    # Skipped with its reason; the test of the other mark still runs.
    assert re.search(rf"SKIPPED .*{re.escape(reason)}", output), output
    assert not re.search(rf"PASSED .*::{re.escape(skipped)}", output), output
    for other in sorted(LEG_TESTS - {skipped}) + ["test_per_optimizer[kept]"]:
        assert re.search(rf"PASSED .*::{re.escape(other)}", output), output
    status, output = run(suite, **{variable: "yes"})
    assert status != 0, output
    assert f"{variable}='yes': use 1" in output, output
    assert "or 0/unset (run them)" in output, output


def test_a_subset_naming_no_value_of_its_argument_is_refused(tmp_path):
    typo = _suite_in(
        tmp_path,
        "import pytest\n\n\n"
        '@pytest.mark.every_optimizer("name", ("Adagard",))\n'
        '@pytest.mark.parametrize("name", ["Adagrad", "Adam"])\n'
        "def test_per_optimizer(name):\n"
        "    pass\n",
    )
    status, output = run(typo, TF_TPU_EMBED_OPT_EVERY_OPTIMIZER_ELSEWHERE="1")
    assert status != 0, output
    assert "none of the every_optimizer subset ['Adagard'] is a value of 'name'" in (
        output
    ), output
    # Unset, every optimizer runs and the subset is not read.
    status, output = run(typo)
    assert status == 0, output
    assert output.count("PASSED") == 2, output


def test_install_script_names_the_extra_of_an_oracle_it_cannot_install():
    sys.path.insert(0, str(HERE))
    import oracles

    missing = "ModuleNotFoundError: No module named 'jax'"
    line = oracles.state_line("jax-tpu-embedding", missing)
    if sys.version_info < (3, 11):
        # The extra brings it from Python 3.11 on: that is said instead.
        assert (
            line == f"skipped: needs Python >= 3.11 (this is {sys.version.split()[0]})"
        )
    else:
        assert line.startswith('skipped: needs the `jax` extra (pip install ".[jax]")')
        assert line.endswith(missing)
    assert oracles.state_line("jax-tpu-embedding", "") == "ok"
    # An oracle the script installs and that still fails stays a failure.
    assert oracles.state_line("tfrs", "ImportError: x") == "ImportError: x"


# A module that runs without TensorFlow (its marker line, put in by `format`:
# in this file's own text it would mark this module so), with one test that
# needs it, and a module that needs TensorFlow; jax-tpu-embedding's oracle is
# a stand-in that works.
FREE_OF_TENSORFLOW = """
{mark}

import pytest
from conftest import needs_tensorflow


def test_anywhere():
    pass


@needs_tensorflow("a stand-in reason")
@pytest.mark.oracle("jax-tpu-embedding")
def test_jte_with_tensorflow():
    pass


@pytest.mark.oracle("jax-tpu-embedding")
def test_jte_alone():
    pass
"""
NEEDS_TENSORFLOW = """
import pytest


@pytest.mark.oracle("jax-tpu-embedding")
def test_jte_in_its_module():
    pass


def test_its_backend():
    pass
"""


@pytest.fixture(scope="module")
def two_modules(tmp_path_factory):
    root = tmp_path_factory.mktemp("two_modules")
    (root / "conftest.py").write_text((HERE / "conftest.py").read_text())
    (root / "oracles.py").write_text(
        (HERE / "oracles.py").read_text()
        + STAND_INS.replace(
            "BY_NAME",
            'ORACLES += (Oracle("jax-tpu-embedding", "a stand-in", lambda: ""),)\n'
            "BY_NAME",
        )
    )
    (root / "test_free.py").write_text(FREE_OF_TENSORFLOW.format(mark=FREE_MARK))
    (root / "test_tied.py").write_text(NEEDS_TENSORFLOW)
    return root


def _passed(output):
    return sorted(re.findall(r"PASSED \S*::(\w+)", output))


def test_on_tensorflows_backend_every_module_runs(two_modules):
    status, output = run(two_modules)
    assert status == 0, output
    assert _passed(output) == [
        "test_anywhere",
        "test_its_backend",
        "test_jte_alone",
        "test_jte_in_its_module",
        "test_jte_with_tensorflow",
    ], output
    # The newest leg's second part: jax-tpu-embedding's tests that need
    # TensorFlow, in either kind of module.
    status, output = run(two_modules, TF_TPU_EMBED_OPT_ONLY_JTE_WITH_TENSORFLOW="1")
    assert status == 0, output
    assert _passed(output) == ["test_jte_in_its_module", "test_jte_with_tensorflow"]


def test_on_jax_beside_tensorflow_the_modules_that_need_it_are_left_out(
    two_modules,
):
    """`KERAS_BACKEND=jax pytest tests` where TensorFlow is installed too:
    the modules that need TensorFlow test its Keras backend (they were
    collected, and failed by the hundred, one at collection)."""
    pytest.importorskip("jax")
    status, output = run(two_modules, KERAS_BACKEND="jax")
    assert status == 0, output
    assert _passed(output) == [
        "test_anywhere",
        "test_jte_alone",
        "test_jte_with_tensorflow",
    ], output
    assert (
        "1 test modules need TensorFlow and its Keras backend (Keras's jax "
        "backend) and were not collected: test_tied.py"
    ) in output, output
    # Selecting the tests of modules it leaves out is refused by name.
    status, output = run(
        two_modules,
        KERAS_BACKEND="jax",
        TF_TPU_EMBED_OPT_ONLY_JTE_WITH_TENSORFLOW="1",
    )
    assert status == 4, output
    assert "here the backend is 'jax' (unset KERAS_BACKEND)" in output, output


def test_a_module_that_runs_without_tensorflow_carries_the_mark():
    """The suite collects a module without TensorFlow by its marker line: a
    module that says so in other words (in its docstring, or with more words
    on the line) would be left out of the JAX runs without a word."""
    unmarked = [
        path.name
        for path in sorted(HERE.glob("test_*.py"))
        for line in path.read_text(encoding="utf-8").splitlines()
        if line.lstrip("# ").startswith("Runs without TensorFlow") and line != FREE_MARK
    ]
    assert not unmarked, unmarked
