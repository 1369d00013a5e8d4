"""Shared fixtures, strategies and the oracle hooks of the test suite.

On Keras's JAX backend (CI's JAX leg: `pip install ".[jax,test]"`,
`KERAS_BACKEND=jax`), only the test modules that say so in a line
`# Runs without TensorFlow.` are collected; the others need TensorFlow and
its Keras backend (also where TensorFlow is installed beside JAX), and the
summary says which were left out.

A test that needs an optional oracle (see `tests/oracles.py`) is marked
`@pytest.mark.oracle("name")`. It fails when the oracle is missing, unless the
user opts out with `TF_TPU_EMBED_OPT_SKIP_ORACLES`; oracles that depend on the
environment (not installable) are skipped with their reason. The terminal
summary says, for each oracle, whether it ran.
"""

import contextlib
import copy
import functools
import importlib.util
import os
import pathlib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import google.protobuf  # noqa: E402
import numpy as np  # noqa: E402
import oracles  # noqa: E402
import pytest  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tf_tpu_embed_opt.definitions import registry  # noqa: E402


def _protobuf_version():
    return tuple(int(p) for p in google.protobuf.__version__.split(".")[:2])


# TensorFlow's own parameter classes assign a bool to an enum field, which
# protobuf rejects from 7.34 (upb) on; `tensorflow_writable` makes them the
# byte oracle there too.
TENSORFLOW_WRITES_PROTOS = _protobuf_version() < (7, 34)


def tensorflow_writable(opt):
    """TensorFlow's own optimizer `opt`, writable by TensorFlow's code anywhere.

    TensorFlow's `_set_optimization_parameters` assigns the bool
    `low_dimensional_packing_status` to an enum field: protobuf < 7.34 stores
    int(bool) (True: ENABLED = 1, False: UNSPECIFIED = 0), later versions
    refuse the bool. There a shallow copy holding that int lets TensorFlow's
    own writer run unchanged and write what it writes under protobuf 6; below
    7.34 `opt` itself is returned.
    """
    if TENSORFLOW_WRITES_PROTOS:
        return opt
    writable = copy.copy(opt)
    writable.low_dimensional_packing_status = int(opt.low_dimensional_packing_status)
    return writable


# Keras's options that act on every gradient before a step, a sparse one
# (`tf.IndexedSlices`, JAX's `BCOO`) included: clipping, and the division by
# `loss_scale_factor`.
GRADIENT_OPTIONS = [
    {"clipvalue": 0.3},
    {"clipnorm": 0.5},
    {"global_clipnorm": 0.5},
    {"loss_scale_factor": 4.0},
]


@functools.lru_cache(maxsize=None)
def _xla_jit_on_host():
    import tensorflow as tf

    try:
        tf.function(lambda: tf.constant(1.0) + 1.0, jit_compile=True)()
    except Exception as error:  # noqa: BLE001 - any failure means "no XLA here"
        return False, f"{type(error).__name__}: {str(error).splitlines()[-1]}"
    return True, ""


def xla_on_host() -> bool:
    """Whether this TensorFlow JIT-compiles on the host (asked once, lazily).

    tensorflow-tpu without libtpu cannot ("could not find registered transfer
    manager for platform Host"); XLA tests skip there. Asked only by the tests
    that need it, so that a suite without them (e.g. the child suites of
    tests/test_oracles.py) does not import TensorFlow.
    """
    return _xla_jit_on_host()[0]


# Skips the test where `xla_on_host()` is False (pytest_runtest_setup).
requires_xla = pytest.mark.requires_xla

# Tests whose outcome does not depend on the TensorFlow or protobuf version (a
# real cluster on 127.0.0.1, the benchmark harness) carry this mark; .ci/run
# sets the variable in every leg and runs them once, with `-m
# version_independent`, in the TensorFlow 2.21 leg's virtualenv. Unset (the
# default), every test runs.
VERSION_INDEPENDENT_VARIABLE = "TF_TPU_EMBED_OPT_VERSION_INDEPENDENT_ELSEWHERE"
version_independent = pytest.mark.version_independent

# Tests that use JAX (and jax-tpu-embedding, orbax) but neither TensorFlow nor
# Keras's backend compute the same with TensorFlow installed or not: CI's JAX
# leg (no TensorFlow) runs them, and .ci/run sets this variable in the
# TensorFlow 2.21 leg, which has JAX too, to skip them there. Unset (the
# default), every test runs.
JAX_LEG_VARIABLE = "TF_TPU_EMBED_OPT_JAX_LEG_ELSEWHERE"
same_in_the_jax_leg = pytest.mark.same_in_the_jax_leg

# Tests of the Keras face on the suite's backend alone (twins, the row-sparse
# layer, Keras's own suites): with TensorFlow, their outcome is the same on
# TensorFlow 2.20 as on 2.21 and 2.16, which bracket it; no proto, protobuf or
# TPU module is involved. .ci/run sets this variable in the tensorflow-tpu 2.20
# leg, which then leaves them to the TensorFlow 2.21 and 2.16 legs. Unset (the
# default), they run.
KERAS_FACE_VARIABLE = "TF_TPU_EMBED_OPT_KERAS_FACE_ELSEWHERE"
keras_face = pytest.mark.keras_face


# Tests that run a benchmark's harness on Keras's JAX backend (benchmarks/ is
# not installed with the package; timings are never asserted): whether the
# harness runs and reports does not depend on where the JAX stack sits in its
# declared range. .ci/run sets this variable in the JAX leg at the declared
# minimums, which leaves them to the newest JAX leg. Unset (the default), they
# run.
BENCHMARK_HARNESS_VARIABLE = "TF_TPU_EMBED_OPT_BENCHMARK_HARNESS_ELSEWHERE"
benchmark_harness = pytest.mark.benchmark_harness


# Integration tests parametrized over the optimizers (fit, jit, graph mode,
# mixed precision, sharded variables) test how a TensorFlow version runs a
# step, alike for every optimizer; each optimizer's math is pinned against
# TensorFlow's kernels and Keras's optimizers in every leg. .ci/run sets this
# variable in its older-TensorFlow legs, which then run such a test for its
# mark's representative subset only; the TensorFlow 2.21 leg runs every
# optimizer. Unset (the default), every one runs.
EVERY_OPTIMIZER_VARIABLE = "TF_TPU_EMBED_OPT_EVERY_OPTIMIZER_ELSEWHERE"


# The newest leg's second part (.ci/run): TensorFlow installed next to the
# newest JAX and jax-tpu-embedding, whose JAX-only tests the leg ran first.
# With this variable at 1, only the tests that use jax-tpu-embedding (its
# oracle) and need TensorFlow run (those of the modules that need it, and
# those marked `needs_tensorflow` in the modules that do not); the others
# are deselected. Unset (the default), every test runs.
JTE_WITH_TENSORFLOW_VARIABLE = "TF_TPU_EMBED_OPT_ONLY_JTE_WITH_TENSORFLOW"

# A test that needs TensorFlow in a module that runs without it: skipped
# where TensorFlow is missing (`@needs_tensorflow("why")`, or bare).
needs_tensorflow = pytest.mark.needs_tensorflow


def every_optimizer(argument: str, subset):
    """Marks a test parametrized over optimizers by `argument`: where
    EVERY_OPTIMIZER_VARIABLE=1, only the values in `subset` run."""
    return pytest.mark.every_optimizer(argument, tuple(subset))


def _elsewhere(variable: str, tests: str) -> bool:
    value = os.environ.get(variable, "")
    if value not in ("", "0", "1"):
        raise pytest.UsageError(
            f"{variable}={value!r}: use 1 (skip the {tests}, run in another CI "
            "leg) or 0/unset (run them)."
        )
    return value == "1"


def _version_independent_elsewhere() -> bool:
    return _elsewhere(VERSION_INDEPENDENT_VARIABLE, "version-independent tests")


def _jax_leg_elsewhere() -> bool:
    return _elsewhere(JAX_LEG_VARIABLE, "tests the JAX leg runs alike")


def _keras_face_elsewhere() -> bool:
    return _elsewhere(KERAS_FACE_VARIABLE, "tests of the Keras face alone")


def _benchmark_harness_elsewhere() -> bool:
    return _elsewhere(BENCHMARK_HARNESS_VARIABLE, "benchmark harnesses on JAX")


def _only_jte_with_tensorflow() -> bool:
    return _elsewhere(
        JTE_WITH_TENSORFLOW_VARIABLE,
        "tests other than jax-tpu-embedding's that need TensorFlow",
    )


def _every_optimizer_elsewhere() -> bool:
    return _elsewhere(
        EVERY_OPTIMIZER_VARIABLE, "optimizers outside each test's representative subset"
    )


TENSORFLOW_BACKED = [d for d in registry.DEFINITIONS if d.tensorflow_class]
BEYOND_TENSORFLOW = [d for d in registry.DEFINITIONS if not d.tensorflow_class]


@contextlib.contextmanager
def exact_tensorflow():
    """Grappler's arithmetic rewrite turns `g / sqrt(a)` into
    `g * rsqrt(a)`, and Eigen's vectorized rsqrt rounds differently from
    its scalar tail: outside XLA an element's last bit then depends on where
    it sits in its tensor, which stacking changes. Without the rewrite the
    step is exact."""
    import keras

    if keras.backend.backend() != "tensorflow":
        yield
        return
    import tensorflow as tf

    before = tf.config.optimizer.get_experimental_options()
    tf.config.optimizer.set_experimental_options({"arithmetic_optimization": False})
    try:
        yield
    finally:
        tf.config.optimizer.set_experimental_options(
            {"arithmetic_optimization": before.get("arithmetic_optimization", True)}
        )


def keras_rs_or_skip():
    """keras-rs, or a skip where it cannot import: on Keras's TensorFlow
    backend it imports its TensorFlow layer, which needs SparseCore configs
    (TensorFlow >= 2.17; on 2.16 the import fails with an AttributeError)."""
    import keras

    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        if not hasattr(tf.tpu.experimental.embedding, "SparseCoreEmbeddingConfig"):
            pytest.skip(
                "keras-rs's TensorFlow layer needs SparseCore configs, which "
                f"TensorFlow {tf.__version__} lacks"
            )
    return pytest.importorskip("keras_rs")


def canonical(x):
    """The shortest decimal with the float32 value of `x` (what protos keep)."""
    return float(str(np.float32(x)))


def floats_in(bounds, default_low=-100.0, default_high=100.0):
    low = default_low if bounds is None or bounds.lower is None else bounds.lower
    high = default_high if bounds is None or bounds.upper is None else bounds.upper
    return (
        st.floats(min_value=low, max_value=high, width=32)
        .map(canonical)
        .filter(lambda v: bounds is None or bounds.contains(v))
    )


def _rate():
    return lambda: 0.01


@st.composite
def arguments_for(draw, definition, callable_rate=True):
    """Random valid, proto-exact constructor arguments for `definition`."""
    values = {}
    if callable_rate and draw(st.booleans()):
        values["learning_rate"] = _rate()
    else:
        values["learning_rate"] = draw(floats_in(None, 0.0, 10.0))
    for hyper in definition.hypers:
        if hyper.kind == "bool":
            values[hyper.name] = draw(st.booleans())
        else:
            values[hyper.name] = draw(floats_in(hyper.bounds, 0.0, 10.0))
    accumulate = draw(st.booleans())
    if definition.name == "Adam" and not values["lazy_adam"]:
        accumulate = True
    values["use_gradient_accumulation"] = accumulate
    low = draw(st.none() | floats_in(None))
    high = draw(st.none() | floats_in(None))
    if low is not None and high is not None and low > high:
        low, high = high, low
    values["clip_weight_min"], values["clip_weight_max"] = low, high
    # The multiply flag is drawn independently of the decay: the classes accept
    # it without (or with a zero) decay, and TensorFlow then does not write it.
    decay = draw(st.sampled_from([None, 0.0]) | floats_in(None, 0.0, 1.0))
    values["weight_decay_factor"] = decay
    values["multiply_weight_decay_factor_by_learning_rate"] = draw(
        st.sampled_from([None, False, True])
    )
    if accumulate:
        kind = draw(st.sampled_from(["none", "scalar", "tuple"]))
        if kind == "scalar":
            values["clipvalue"] = draw(
                floats_in(None, 0.0, 100.0).filter(lambda v: v > 0)
            )
        elif kind == "tuple":
            lo = draw(st.none() | floats_in(None, -100.0, 0.0))
            hi = draw(
                (st.none() if lo is not None else st.nothing())
                | floats_in(None, 0.0, 100.0)
            )
            values["clipvalue"] = (lo, hi)
    packing_allowed = bool(definition.tensorflow_class) or (
        definition.zero_gradient_is_noop
    )
    values["low_dimensional_packing_status"] = packing_allowed and draw(st.booleans())
    return values


def as_written(arguments):
    """`arguments` as the proto keeps them: the decay only when non-zero, the
    multiply flag only when set together with a decay (None otherwise)."""
    values = dict(arguments)
    decay = values["weight_decay_factor"]
    values["weight_decay_factor"] = decay if decay else None
    multiply = values["multiply_weight_decay_factor_by_learning_rate"]
    values["multiply_weight_decay_factor_by_learning_rate"] = (
        True if decay and multiply else None
    )
    return values


# ---------------------------------------------------------------------------
# Oracles: a missing one is a loud failure unless opted out; the summary says
# which ran.

_ORACLE_TESTS = {oracle.name: 0 for oracle in oracles.ORACLES}
_ORACLE_RAN = {oracle.name: 0 for oracle in oracles.ORACLES}


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "oracle(name): needs the optional oracle `name` of tests/oracles.py",
    )
    config.addinivalue_line(
        "markers", "requires_xla: skipped where TensorFlow cannot JIT on the host"
    )
    config.addinivalue_line(
        "markers",
        "version_independent: the outcome does not depend on the TensorFlow or "
        f"protobuf version; skipped when {VERSION_INDEPENDENT_VARIABLE}=1",
    )
    config.addinivalue_line(
        "markers",
        "same_in_the_jax_leg: uses JAX, neither TensorFlow nor Keras's backend; "
        f"skipped when {JAX_LEG_VARIABLE}=1",
    )
    config.addinivalue_line(
        "markers",
        "keras_face: the Keras face on the suite's backend alone; skipped when "
        f"{KERAS_FACE_VARIABLE}=1",
    )
    config.addinivalue_line(
        "markers",
        "benchmark_harness: runs a benchmark's harness on Keras's JAX backend; "
        f"skipped when {BENCHMARK_HARNESS_VARIABLE}=1",
    )
    config.addinivalue_line(
        "markers",
        "needs_tensorflow(reason): needs TensorFlow in a module that runs "
        "without it; skipped without TensorFlow",
    )
    config.addinivalue_line(
        "markers",
        "every_optimizer(argument, subset): parametrized over optimizers by "
        f"`argument`; only `subset` runs when {EVERY_OPTIMIZER_VARIABLE}=1",
    )
    # A typo in the opt-out variables must not go unnoticed.
    try:
        oracles.opted_out(os.environ)
    except ValueError as error:
        raise pytest.UsageError(str(error)) from None
    _version_independent_elsewhere()
    _jax_leg_elsewhere()
    _every_optimizer_elsewhere()
    _keras_face_elsewhere()
    _benchmark_harness_elsewhere()
    if _only_jte_with_tensorflow() and _keras_backend() != "tensorflow":
        raise pytest.UsageError(
            f"{JTE_WITH_TENSORFLOW_VARIABLE}=1 selects tests of the modules that "
            "need TensorFlow, which run on Keras's TensorFlow backend; here "
            + (
                f"the backend is {_keras_backend()!r} (unset KERAS_BACKEND)"
                if _keras_backend()
                else "TensorFlow is not installed"
            )
            + "."
        )


def _oracle_names(item):
    names = [mark.args[0] for mark in item.iter_markers("oracle")]
    for name in names:
        if name not in oracles.BY_NAME:
            raise pytest.UsageError(
                f"{item.nodeid}: unknown oracle {name!r}; known: "
                f"{', '.join(oracles.BY_NAME)}"
            )
    return names


HAS_TENSORFLOW = importlib.util.find_spec("tensorflow") is not None
TENSORFLOW_FREE_MARK = "# Runs without TensorFlow."
_LEFT_OUT_WITHOUT_TENSORFLOW = set()


@functools.lru_cache(maxsize=None)
def _keras_backend():
    """Keras's backend where TensorFlow is installed; `None` without it (the
    modules that need TensorFlow are then left out, whatever KERAS_BACKEND
    says, and Keras is not imported here)."""
    if not HAS_TENSORFLOW:
        return None
    import keras

    return keras.backend.backend()


def pytest_ignore_collect(collection_path, config):
    # The modules that need TensorFlow test its Keras backend and its engines
    # (tf.IndexedSlices gradients, TensorFlow's kernels as oracles): on
    # another backend they are left out even where TensorFlow is installed,
    # as the run on TensorFlow's backend covers them.
    path = pathlib.Path(collection_path)
    if not (path.name.startswith("test_") and path.suffix == ".py"):
        return None
    if _keras_backend() == "tensorflow" or not _needs_tensorflow(str(path)):
        return None
    _LEFT_OUT_WITHOUT_TENSORFLOW.add(path.name)
    return True


@functools.lru_cache(maxsize=None)
def _needs_tensorflow(module_path: str) -> bool:
    """Whether the test module at `module_path` lacks the mark of a module
    that runs without TensorFlow (read once per module)."""
    text = pathlib.Path(module_path).read_text(encoding="utf-8")
    return TENSORFLOW_FREE_MARK not in text.splitlines()


def pytest_collection_modifyitems(config, items):
    if not _only_jte_with_tensorflow():
        return
    kept, left = [], []
    for item in items:
        wanted = "jax-tpu-embedding" in _oracle_names(item) and (
            _needs_tensorflow(str(item.fspath))
            or item.get_closest_marker("needs_tensorflow") is not None
        )
        (kept if wanted else left).append(item)
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = kept


def pytest_collection_finish(session):
    # After deselection (-k, -m): only the tests that will run count.
    for item in session.items:
        for name in _oracle_names(item):
            _ORACLE_TESTS[name] += 1


def _skip_outside_the_subset(item):
    mark = item.get_closest_marker("every_optimizer")
    if mark is None or not _every_optimizer_elsewhere():
        return
    argument, subset = mark.args
    value = item.callspec.params[argument]
    values = [
        parameter.values[0] if hasattr(parameter, "values") else parameter
        for parameter in _parameters(item, argument)
    ]
    if not set(subset) & set(values):
        raise pytest.UsageError(
            f"{item.nodeid}: none of the every_optimizer subset {list(subset)} "
            f"is a value of {argument!r}"
        )
    if value not in subset:
        pytest.skip(
            f"every optimizer runs in the TensorFlow 2.21 leg; here only "
            f"{', '.join(subset)} ({EVERY_OPTIMIZER_VARIABLE}=1, set by .ci/run)"
        )


def _parameters(item, argument):
    """The values `argument` takes in the test's parametrize marks."""
    for mark in item.iter_markers("parametrize"):
        names = mark.args[0]
        if isinstance(names, str):
            names = [name.strip() for name in names.split(",")]
        if argument in names and len(names) == 1:
            return list(mark.args[1])
    raise pytest.UsageError(
        f"{item.nodeid}: every_optimizer names {argument!r}, which no "
        "parametrize mark of the test takes alone"
    )


def pytest_runtest_setup(item):
    mark = item.get_closest_marker("needs_tensorflow")
    if mark is not None and not HAS_TENSORFLOW:
        pytest.skip(mark.args[0] if mark.args else "needs TensorFlow")
    if item.get_closest_marker("requires_xla") and not xla_on_host():
        pytest.skip(
            f"this TensorFlow cannot JIT-compile on the host ({_xla_jit_on_host()[1]})"
        )
    if item.get_closest_marker("version_independent") and (
        _version_independent_elsewhere()
    ):
        pytest.skip(
            "independent of the TensorFlow and protobuf versions: runs once "
            f"per CI run ({VERSION_INDEPENDENT_VARIABLE}=1 here, set by .ci/run)"
        )
    if item.get_closest_marker("same_in_the_jax_leg") and _jax_leg_elsewhere():
        pytest.skip(
            "uses JAX, neither TensorFlow nor Keras's backend: the JAX leg runs "
            f"it ({JAX_LEG_VARIABLE}=1 here, set by .ci/run)"
        )
    if item.get_closest_marker("keras_face") and _keras_face_elsewhere():
        pytest.skip(
            "the Keras face alone: the TensorFlow 2.21 and 2.16 legs run it "
            f"({KERAS_FACE_VARIABLE}=1 here, set by .ci/run)"
        )
    if item.get_closest_marker("benchmark_harness") and _benchmark_harness_elsewhere():
        pytest.skip(
            "a benchmark's harness on JAX: the newest JAX leg runs it "
            f"({BENCHMARK_HARNESS_VARIABLE}=1 here, set by .ci/run)"
        )
    _skip_outside_the_subset(item)
    for name in _oracle_names(item):
        missing = oracles.why_missing(name)
        if not missing:
            continue
        oracle = oracles.BY_NAME[name]
        skipped = oracles.opted_out(os.environ)
        if name in skipped or "all" in skipped:
            pytest.skip(
                f"oracle {name!r} opted out by {oracles.SKIP_VARIABLE} ({missing})"
            )
        if not oracle.installable:
            pytest.skip(f"oracle {name!r} is not available here: {missing}")
        pytest.fail(
            f"oracle {name!r} ({oracle.description}) is missing: {missing}. "
            "Install it with `python tests/install_oracles.py`, or skip it "
            f"explicitly with {oracles.SKIP_VARIABLE}={name}.",
            pytrace=False,
        )
    for name in _oracle_names(item):
        _ORACLE_RAN[name] += 1


def pytest_terminal_summary(terminalreporter):
    if _LEFT_OUT_WITHOUT_TENSORFLOW:
        here = (
            f"Keras's {_keras_backend()} backend"
            if _keras_backend()
            else "TensorFlow is not installed"
        )
        terminalreporter.section("without TensorFlow")
        terminalreporter.write_line(
            f"{len(_LEFT_OUT_WITHOUT_TENSORFLOW)} test modules need TensorFlow "
            f"and its Keras backend ({here}) and were not collected: "
            + ", ".join(sorted(_LEFT_OUT_WITHOUT_TENSORFLOW))
        )
    terminalreporter.section("oracles")
    skipped = oracles.opted_out(os.environ)
    for oracle in oracles.ORACLES:
        name, needed = oracle.name, _ORACLE_TESTS[oracle.name]
        if not needed:
            state = "not needed by the selected tests"
        elif _ORACLE_RAN[name]:
            state = f"ran in {_ORACLE_RAN[name]} of {needed} tests"
        else:
            missing = oracles.why_missing(name)
            if name in skipped or "all" in skipped:
                state = f"SKIPPED by {oracles.SKIP_VARIABLE} ({missing})"
            elif oracle.installable:
                state = f"MISSING, {needed} tests failed ({missing})"
            else:
                state = f"not available here, {needed} tests skipped ({missing})"
        terminalreporter.write_line(f"{name}: {state} - {oracle.description}")
