"""The Python examples of the README and of docs/ run, and the tables are current."""

import ast
import contextlib
import gc
import io
import logging
import math
import re
import shlex
import warnings

import doc_pages
import numpy as np
import oracles
import pytest
from google.protobuf import text_format
from proto_oracle import OptimizationParameters, expected_proto
from tensorflow.core.protobuf.tpu.tpu_embedding_configuration_pb2 import (
    TPUEmbeddingConfiguration,
)

from tf_tpu_embed_opt.definitions import tables

# The README and every page of docs/ (tests/doc_pages.py).
README = doc_pages.TEXT
PAGE_BLOCKS = doc_pages.python_blocks()
BLOCKS = [block for _, block in PAGE_BLOCKS]


def test_readme_has_python_examples():
    assert len(BLOCKS) >= 2


def _messages(output, *types):
    """The text-format protos (then other lines) a block printed, in order."""
    parts = [p for p in output.split("\n\n") if p.strip()]
    messages = [text_format.Parse(p, t()) for p, t in zip(parts, types)]
    return messages, "\n\n".join(parts[len(types) :]).strip()


def _check_quick_start_lazy(output):
    # Keras Adam is not lazy; the twin defaults to Keras (DESIGN §3).
    assert output == "False\n"


def _check_tpu_strategy_loop(output):
    (config,), rest = _messages(output, TPUEmbeddingConfiguration)
    expected = TPUEmbeddingConfiguration()
    table = expected.table_descriptor.add(
        name="items", vocabulary_size=10_000, dimension=16
    )
    # keras.optimizers.Adagrad(0.05) is the engine's Adagrad(0.05) (its
    # epsilon is negligible next to the initial accumulator 0.1).
    table.optimization_parameters.CopyFrom(
        expected_proto("Adagrad", {"learning_rate": 0.05})
    )
    expected.mode = TPUEmbeddingConfiguration.TRAINING
    expected.num_hosts = 1
    expected.num_tensor_cores = 8
    expected.feature_descriptor.add(input_shape=[64])
    assert config == expected, config
    assert "Adagrad" in rest, rest


def _check_per_table_overrides(output):
    # Tables in order of first use by the key-sorted features: user, video;
    # video takes the global optimizer.
    (params,), rest = _messages(output, OptimizationParameters)
    expected = expected_proto("Adagrad", {"learning_rate": 0.1, "clipvalue": 5.0})
    assert params == expected, params
    assert rest == ""


def _check_proto_round_trip(output):
    (params,), rest = _messages(output, OptimizationParameters)
    arguments = {"learning_rate": 0.001, "rho": 0.9, "momentum": 0.5}
    expected = expected_proto("RMSProp", {**arguments, "epsilon": 1e-7})
    assert params == expected, params
    # The load op's inputs (TPU op definition LoadTPUEmbeddingRMSPropParameters).
    assert rest == "['ms', 'mom']"


def _check_keras_fit(output):
    losses = ast.literal_eval(output.strip())
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses), losses
    assert losses[1] < losses[0], losses


def _check_engine_twin(output):
    numbers = re.findall(r"-?\d+(?:\.\d*)?(?:e[-+]?\d+)?", output)
    table = np.array([float(x) for x in numbers]).reshape(5, 2)
    # The engine's Adam, by hand: ids 3 and 3 sum to g = [4, -2], clipped to
    # [1, -1]; m = 0.1 g, v = 0.001 g², w -= 0.01 m / sqrt(v + ε²), ε = 1e-7.
    g = np.array([1.0, -1.0])
    step = 0.01 * (0.1 * g) / np.sqrt(0.001 * g**2 + 1e-7**2)
    expected = np.zeros((5, 2))
    expected[3] = -step
    np.testing.assert_allclose(table, expected, rtol=1e-6, atol=0)


def _check_to_embedding(output):
    first, second = output.strip().split("\n")
    # Stock Keras Adam: non-lazy, epsilon outside the square root.
    assert first.startswith("Adam(learning_rate="), first
    assert "lazy_adam=False" in first and "sum_inside_sqrt=False" in first, first
    assert "beta_1=0.9, beta_2=0.999, epsilon=1e-07" in first, first
    assert "weight_decay=0.004" in second, second


def _check_clippy_config(output):
    # TF Recommenders' default: the accumulator update of the paper.
    assert output == "False\n"


def _check_algorithm_module(output):
    # docs/development.md's algorithm module: a module prints nothing; its
    # Definition checked itself when the block ran, and
    # tests/test_new_algorithm.py walks it through every face.
    assert output == ""


# What each README block prints, checked against values stated in the README
# and computed here; a block is recognized by a line of its source.
OUTPUT_CHECKS = {
    'sources="docs/development.md, Adding an algorithm.",': _check_algorithm_module,
    'sources="docs/development.md, A slot of another shape.",': (
        _check_algorithm_module
    ),
    'print(model.optimizer.get_config()["lazy"])': _check_quick_start_lazy,
    "print(teo.to_keras(table_optimizer))": _check_tpu_strategy_loop,
    "print(config.table_descriptor[1].optimization_parameters)": (
        _check_per_table_overrides
    ),
    "print(teo.to_proto(rmsprop))": _check_proto_round_trip,
    'print(history.history["loss"])': _check_keras_fit,
    "print(table.numpy())": _check_engine_twin,
    "print(table_optimizer)": _check_to_embedding,
    'print(optimizer.get_config()["use_standard_accumulator_update"])': (
        _check_clippy_config
    ),
}


def _sparsecore_missing():
    import tensorflow as tf

    if hasattr(tf.tpu.experimental.embedding, "SparseCoreEmbeddingConfig"):
        return ""
    return (
        f"TensorFlow {tf.__version__} has no SparseCore configs "
        "(TPUEmbeddingV2's stacking and keras-rs need them)"
    )


def _keras_rs_missing():
    import importlib.util

    if importlib.util.find_spec("keras_rs") is None:
        # What brings it: the test extra, from the Python the oracle names.
        return oracles.state_line("keras-rs", "keras_rs is not installed")
    return _sparsecore_missing()


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


# Blocks that need what some supported TensorFlow lacks, recognized by a line
# of their source: the reason they cannot run here, or "".
def _jax_engine_missing():
    import importlib.util

    for module in ("jax_tpu_embedding", "keras_rs", "orbax"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (the jax extra brings it)"
    return ""


REQUIREMENTS = {
    "sparsecore_layout.stack_layouts(": _sparsecore_missing,
    "import keras_rs": _keras_rs_missing,
    'engine="jax-tpu-embedding"': _jax_engine_missing,
    "import orbax.checkpoint": _jax_engine_missing,
    "from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import": (_jax_engine_missing),
    "keras_rs_steps.embedding_spec(": _jax_engine_missing,
    "keras.callbacks.OrbaxCheckpoint(": _jax_engine_missing,
}


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_python_block_runs(index):
    page = doc_pages.name(PAGE_BLOCKS[index][0])
    for line, missing in REQUIREMENTS.items():
        if line in BLOCKS[index] and missing():
            pytest.skip(f"{page} block {index}: {missing()}")
    output = io.StringIO()
    logged = _Records()
    tensorflow_logger = logging.getLogger("tensorflow")
    tensorflow_logger.addHandler(logged)
    try:
        with (
            contextlib.redirect_stdout(output),
            warnings.catch_warnings(record=True) as caught,
        ):
            warnings.simplefilter("always")
            exec(compile(BLOCKS[index], f"{page} block {index}", "exec"), {})
        # TensorFlow warns about a checkpoint's unused values when the
        # restore status is collected.
        gc.collect()
    finally:
        tensorflow_logger.removeHandler(logged)
    # Nor one Keras warns about (a model fed another structure than built).
    assert not [w for w in caught if "expected structure" in str(w.message)], (
        f"{page} block {index} makes Keras warn: {[str(w.message) for w in caught]}"
    )
    # An example that leaves TensorFlow warning about it is not a good one.
    assert not [m for m in logged.messages if "could not be found" in m], (
        f"README block {index} makes TensorFlow warn: {logged.messages}"
    )
    checks = [c for line, c in OUTPUT_CHECKS.items() if line in BLOCKS[index]]
    assert len(checks) <= 1, f"README block {index} matches several checks"
    if checks:
        checks[0](output.getvalue())
    else:
        # A block added since: it must at least show something.
        assert output.getvalue().strip()


def test_every_output_check_matches_a_block():
    for line in (*OUTPUT_CHECKS, *REQUIREMENTS):
        assert any(line in block for block in BLOCKS), line


DESCRIBE = re.search(r"## Describe an optimizer\n\n```bash\n(.*?)```", README, re.S)


def test_readme_describe_commands_run(tmp_path, monkeypatch, capsys):
    """Each line of the describe block, in this process.

    `tf-tpu-embed-opt ARGS` is `cli.main(ARGS)`, the console script's body,
    and `python -c CODE` runs CODE; both in a scratch directory. (The console
    script and `python -m` as processes: tests/test_packaging.py and
    tests/test_cli.py.)
    """
    from tf_tpu_embed_opt import cli

    assert DESCRIBE, "the README lost its describe block"
    monkeypatch.chdir(tmp_path)
    out = ""
    for line in DESCRIBE.group(1).strip().splitlines():
        words = shlex.split(line, comments=True)
        if words[0] == "tf-tpu-embed-opt":
            code = cli.main(words[1:])
            out, err = capsys.readouterr()
            assert code == 0, (line, err[-2000:])
        else:
            assert words[:2] == ["python", "-c"] and len(words) == 3, line
            exec(compile(words[2], "<README describe block>", "exec"), {})
    assert "ftrl" in out


def test_readme_tables_are_generated_from_definitions():
    assert tables.embedding_optimizers_markdown() in README
    assert tables.conversions_markdown() in README
    assert tables.jax_engine_markdown() in README
    from tf_tpu_embed_opt.engines import tables as engine_tables

    assert engine_tables.availability_markdown() in README
