"""The command line where TensorFlow is not installed (the `[jax]` install).

`describe ... --engine jax-tpu-embedding` works for every algorithm: the
embedding class's arguments are checked from the definitions, and the spec is
made from them; where TensorFlow is installed, the output is the same as
through the embedding classes (the TensorFlow path is the oracle). What needs
TensorFlow says so in one line, exit status 2. On Keras's JAX backend `demo`
trains the twin's tables as `layers.Embedding`s and, without TensorFlow, shows
the jax-tpu-embedding spec.
"""

# Runs without TensorFlow.

import re

import keras
import pytest
from demo_output import demo_losses

from tf_tpu_embed_opt import cli
from tf_tpu_embed_opt.cli import describe_jax

pytest.importorskip("jax_tpu_embedding", reason="the jax-tpu-embedding engine")

try:
    import tensorflow  # noqa: F401

    HAS_TENSORFLOW = True
except ModuleNotFoundError:
    HAS_TENSORFLOW = False

# Each TensorFlow algorithm with arguments the engine takes, and with ones it
# refuses; every argument form the command line has (numbers, flags).
CASES = [
    ("sgd", "--learning-rate", "0.5"),
    ("adagrad", "--initial-accumulator-value", "0.3"),
    ("adam",),  # sum_inside_sqrt=True: refused
    ("adam", "--sum-inside-sqrt", "false", "--beta-2", "0.99"),
    ("ftrl", "--l1-regularization-strength", "0.1", "--beta", "0.5"),
    ("adagradmomentum", "--momentum", "0.9", "--use-nesterov", "true"),
    ("adagradmomentum", "--exponent", "4", "--beta2", "0.9"),
    ("rmsprop",),  # no spec
    ("proximalyogi",),  # no spec
    ("adagrad", "--clipvalue", "1"),  # an engine option jax-tpu-embedding lacks
    ("laprop", "--learning-rate", "0.01"),
    ("f2a",),
]


def _run(capsys, argv, monkeypatch=None, without_tensorflow=False):
    if without_tensorflow and monkeypatch is not None:
        monkeypatch.setattr(describe_jax, "_embedding_classes", lambda: None)
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    if monkeypatch is not None:
        monkeypatch.undo()
    return code, out, err


@pytest.mark.parametrize("case", CASES, ids=lambda c: " ".join(c))
def test_describe_on_the_jax_engine(capsys, monkeypatch, case):
    argv = ["describe", *case, "--engine", "jax-tpu-embedding"]
    code, out, err = _run(capsys, argv, monkeypatch, without_tensorflow=True)
    assert code in (0, 2), err
    assert not err or code == 2
    if code == 0:
        assert out.split("(", 1)[0].endswith("OptimizerSpec"), out
        assert "Keras twin" in out
    else:
        assert "What jax-tpu-embedding does with it:" in out and "refuses" in out
    if HAS_TENSORFLOW:
        # The oracle: the same through TensorFlow's embedding classes.
        assert _run(capsys, argv) == (code, out, err)


def test_describe_says_why_a_custom_spec_runs(capsys):
    code, out, _ = _run(
        capsys,
        ["describe", "adagrad", "--clipvalue", "1", "--engine", "jax-tpu-embedding"],
    )
    assert code == 0
    assert out.startswith("RuleOptimizerSpec('Adagrad'")
    assert "options={clip_gradient_min=-1.0, clip_gradient_max=1.0}" in out
    assert (
        "  Custom, because clip_gradient_min=-1.0: the specs have no gradient "
        "clipping.\n  Custom, because clip_gradient_max=1.0:"
    ) in out
    # The step the spec runs, with its clipping (`rules.step_math`).
    assert (
        "  Update per looked-up row: g ← clamp(g, -1.0, 1.0);  a ← a + g²;  "
        "w ← w − η·g/√a\n"
    ) in out
    code, out, _ = _run(
        capsys, ["describe", "rmsprop", "--engine", "jax-tpu-embedding"]
    )
    assert code == 0
    assert (
        "  Custom, because jax-tpu-embedding has no spec of its own for RMSProp "
        "(its own: SGD, Adagrad,"
    ) in out
    # The engine's own spec: no reason to give.
    code, out, _ = _run(
        capsys, ["describe", "adagrad", "--engine", "jax-tpu-embedding"]
    )
    assert code == 0 and "Custom, because" not in out


def test_describe_checks_arguments_without_tensorflow(capsys, monkeypatch):
    argv = ["describe", "adam", "--beta-1", "2", "--engine", "jax-tpu-embedding"]
    code, out, err = _run(capsys, argv, monkeypatch, without_tensorflow=True)
    assert code == 2 and "beta_1" in err and not out
    if HAS_TENSORFLOW:
        assert _run(capsys, argv) == (code, out, err)


@pytest.mark.skipif(HAS_TENSORFLOW, reason="TensorFlow is installed here")
def test_what_needs_tensorflow_says_so_in_one_line(capsys, tmp_path):
    """Naming what needs it (the engine, the target layout) and what runs
    without it, not the whole command (issue #56, item 2)."""
    code, out, err = _run(capsys, ["describe", "adam"])
    assert code == 2 and not out
    assert err.count("\n") == 1 and "needs TensorFlow" in err
    assert "`tf-tpu-embed-opt describe Adam` on engine TPUEmbedding" in err
    assert "`--engine jax-tpu-embedding` runs without TensorFlow" in err
    from jax_checkpoints import save_step, table_values

    step, *_ = save_step(tmp_path / "job", 1, 4, table_values(seed=1))
    code, out, err = _run(capsys, ["checkpoint", "inspect", step])
    assert code == 0 and "4 tables" in out, err
    moved = tmp_path / "moved"
    code, out, err = _run(
        capsys, ["checkpoint", "convert", step, str(moved), "--to-jax", "2x4"]
    )
    assert code == 0 and out.startswith(f"wrote {moved}"), err
    code, out, err = _run(capsys, ["checkpoint", "convert", step, str(tmp_path / "tf")])
    assert code == 2 and not out and err.count("\n") == 1
    assert "`tf-tpu-embed-opt checkpoint convert` into TensorFlow's layouts" in err
    assert "`inspect` and `convert --to-jax` run without TensorFlow" in err


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="Keras's JAX backend")
def test_demo_on_jax_trains_row_sparse_tables(capsys):
    code, out, err = _run(capsys, ["demo", "--epochs", "2", "--optimizer", "adagrad"])
    assert code == 0, err
    assert "carried by tf_tpu_embed_opt.layers.Embedding" in out
    twin = demo_losses(out, 1)
    assert len(twin) == 2 and twin[1] < twin[0]
    assert "Verdict: the TPU-exact twin learnt, its tables and the dense" in out
    if not HAS_TENSORFLOW:
        assert "AdagradOptimizerSpec(learning_rate=5.0," in out


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="Keras's JAX backend")
def test_demo_on_jax_says_when_the_tables_did_not_move(capsys):
    argv = ["demo", "--epochs", "1", "--optimizer", "adagrad", "--learning-rate", "0"]
    code, out, err = _run(capsys, argv)
    assert code == 1, err
    assert "tables did not move" in out and "learnt, its tables" not in out


def _algorithm_names():
    from tf_tpu_embed_opt.definitions import registry

    return [d.name for d in registry.ALL]


@pytest.mark.parametrize("name", _algorithm_names())
def test_describe_counts_the_slots_it_lists(capsys, name):
    """The memory counts the slots listed above it (RMSProp's custom spec
    keeps `ms` alone without momentum; it counted `mom` too)."""
    code, out, _ = _run(
        capsys,
        ["describe", name, "--engine", "jax-tpu-embedding"]
        + ["--vocabulary-size", "10", "--dim", "2"],
    )
    if code != 0:  # the engine cannot run these defaults (said above)
        assert "Memory" not in out
        return
    listed = out.split("jax-tpu-embedding's names):\n", 1)[1].split("\n\n", 1)[0]
    slots = [line for line in listed.splitlines() if "initial value" in line]
    counted = re.search(r"slots  (\d+) x", out)
    assert counted is not None, out
    assert int(counted.group(1)) == len(slots), out


_KERAS_ON_TENSORFLOW = """
import sys
sys.modules["tensorflow"] = None  # as where TensorFlow is not installed
from tf_tpu_embed_opt import cli
from tf_tpu_embed_opt.errors import TensorFlowNotInstalled

try:
    import tf_tpu_embed_opt.optimizers
except TensorFlowNotInstalled as error:
    print(error)
import tf_tpu_embed_opt

try:  # the embedding face needs TensorFlow itself, whatever Keras runs on
    tf_tpu_embed_opt.embedding
except TensorFlowNotInstalled as error:
    print(error)
sys.exit(cli.main(["describe", "adam", "--engine", "jax-tpu-embedding"]))
"""


def test_a_jax_install_without_keras_backend_jax_is_told_to_set_it(tmp_path):
    """Keras defaults to its TensorFlow backend: where TensorFlow is missing
    and JAX is installed, the package says to set KERAS_BACKEND=jax (it
    said only "No module named 'tensorflow'")."""
    import os
    import pathlib
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    env["KERAS_HOME"] = str(tmp_path)  # no keras.json: Keras's default
    if not os.environ.get("TF_TPU_EMBED_OPT_EXPECT_INSTALLED"):
        root = pathlib.Path(__file__).resolve().parents[1]
        env["PYTHONPATH"] = str(root)
    result = subprocess.run(
        [sys.executable, "-c", _KERAS_ON_TENSORFLOW],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(tmp_path),
        timeout=300,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "tf_tpu_embed_opt.optimizers needs Keras" in result.stdout
    assert "set KERAS_BACKEND=jax" in result.stdout
    assert "tf_tpu_embed_opt.embedding needs TensorFlow 2.16-2.21" in result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "set KERAS_BACKEND=jax" in lines[0], result.stderr


def test_checkpoint_convert_help_puts_the_common_cases_first(tmp_path):
    """`checkpoint convert --help` (issue #56): a one-line usage, the common
    cases before the options, the options grouped by what they write, every
    case's options real ones, no line over 80 columns."""
    import os
    import pathlib
    import re
    import subprocess
    import sys

    env = dict(os.environ)
    if not os.environ.get("TF_TPU_EMBED_OPT_EXPECT_INSTALLED"):
        env["PYTHONPATH"] = str(pathlib.Path(__file__).resolve().parents[1])
    result = subprocess.run(
        [sys.executable, "-m", "tf_tpu_embed_opt", "checkpoint", "convert", "--help"],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(tmp_path),
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    lines = out.splitlines()
    assert lines[0] == "usage: tf-tpu-embed-opt checkpoint convert [options] SRC DST"
    headings = [
        "Common cases",
        "positional arguments:",
        "which tables, and their algorithm:",
        "TensorFlow's layouts:",
        "jax-tpu-embedding:",
        "keras-rs:",
    ]
    places = [out.index(heading) for heading in headings]
    assert places == sorted(places)
    cases = out[places[0] : places[1]]
    options = out[places[1] :]
    named = set(re.findall(r"(--[a-z-]+)", cases))
    assert {"--tables", "--layouts-from", "--to-jax", "--keras-rs-features"} <= named
    for option in named:
        assert re.search(rf"^  {option}\b", options, re.M), option
    assert max(len(line) for line in lines) <= 80


@pytest.mark.parametrize("engine", [(), ("--engine", "jax-tpu-embedding")])
def test_describe_from_says_it_needs_tensorflow_on_every_engine(
    capsys, monkeypatch, tmp_path, engine
):
    """An OptimizerSpec holds TensorFlow's OptimizationParameters, so `--from`
    needs TensorFlow on jax-tpu-embedding too: it said that `describe` needs
    it and that jax-tpu-embedding runs without it (simulated where TensorFlow
    is installed)."""
    from tf_tpu_embed_opt import errors

    path = tmp_path / "spec.pbtxt"
    path.write_text('spec_version: 1\nface: KERAS\nalgorithm: "Adagrad"\n')
    if HAS_TENSORFLOW:
        monkeypatch.setattr(errors, "tensorflow_installed", lambda: False)
    code, out, err = _run(capsys, ["describe", "--from", str(path), *engine])
    assert code == 2 and not out and err.count("\n") == 1
    assert err.startswith(
        "tf-tpu-embed-opt: error: `tf-tpu-embed-opt describe --from` (an "
        "OptimizerSpec is read with TensorFlow's protos, on every engine; "
        "`describe ALGORITHM --engine jax-tpu-embedding` runs without "
        "TensorFlow) needs TensorFlow"
    ), err
