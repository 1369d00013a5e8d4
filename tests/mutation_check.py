"""Plants representative bugs in a scratch copy of the package, one at a time,
and checks that the test suite fails on each (a "killed" mutant).

Not a test (pytest does not collect it) and not run in every CI run: run it
when the suite changes (new or rewritten tests, a new oracle, a test made
faster), from the repository root, with the test extras and oracles installed:

    python tests/mutation_check.py                # each mutant against its subset
    python tests/mutation_check.py --full         # each against all of tests/
    python tests/mutation_check.py --only proto-writer-multiply-flag

Each mutant names the test files that must catch it (a subset, for speed:
about 10-20 minutes on 2 busy cores); `--full` runs the README's whole test
command instead. First the unmutated scratch copy must pass those tests.
A mutant whose original text is no longer in the package is reported STALE:
update its `old` text to the current code. Exits 1 unless every mutant is
killed.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Sequence, Tuple

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = "tf_tpu_embed_opt"


@dataclasses.dataclass(frozen=True)
class Mutant:
    """One planted bug: `old` replaced by `new` (exactly once) in `path`."""

    name: str
    path: str
    old: str
    new: str
    tests: Tuple[str, ...]
    why: str


MUTANTS = (
    Mutant(
        "proto-writer-multiply-flag",
        "embedding/parameters.py",
        """            parameters.weight_decay_factor = self.weight_decay_factor
            if self.multiply_weight_decay_factor_by_learning_rate:
                parameters.multiply_weight_decay_factor_by_learning_rate = True""",
        """            parameters.weight_decay_factor = self.weight_decay_factor
        if self.multiply_weight_decay_factor_by_learning_rate:
            parameters.multiply_weight_decay_factor_by_learning_rate = True""",
        ("tests/test_embedding.py",),
        "writes the multiply flag without a weight decay (TensorFlow does not)",
    ),
    Mutant(
        "proto-writer-zero-clip",
        "embedding/parameters.py",
        "        if self.clip_weight_min is not None:\n",
        "        if self.clip_weight_min:\n",
        ("tests/test_embedding.py",),
        "drops a lower weight clip of 0.0",
    ),
    Mutant(
        "proto-writer-negated-bool",
        "embedding/parameters.py",
        "                value = bool(value) != hyper.proto_negated\n",
        "                value = bool(value)\n",
        ("tests/test_embedding.py",),
        "writes lazy_adam into use_non_lazy_adam without negating it",
    ),
    Mutant(
        "proto-reader-clip-ends",
        "embedding/proto.py",
        'for name, field in (("clip_weight_min", "lower"), ("clip_weight_max", '
        '"upper")):',
        'for name, field in (("clip_weight_min", "upper"), ("clip_weight_max", '
        '"lower")):',
        ("tests/test_embedding.py",),
        "reads the weight clip ends swapped",
    ),
    Mutant(
        "proto-reader-unspecified-accumulation",
        "embedding/proto.py",
        "params.gradient_accumulation_status != _Status.DISABLED",
        "params.gradient_accumulation_status == _Status.ENABLED",
        ("tests/test_embedding.py",),
        "reads an unspecified accumulation status as disabled",
    ),
    Mutant(
        "update-rule-adam-epsilon",
        "definitions/algorithms/adam.py",
        'denom = xp.sqrt(v + h["epsilon"] ** 2)',
        'denom = xp.sqrt(v + h["epsilon"])',
        ("tests/test_update_rules.py",),
        "Adam's sum-inside-sqrt epsilon not squared",
    ),
    Mutant(
        "update-rule-ftrl-accumulator",
        "definitions/algorithms/ftrl.py",
        "    a = a_old + xp.square(g)\n",
        "    a = a_old + xp.abs(g)\n",
        ("tests/test_update_rules.py",),
        "FTRL accumulates |g| instead of g²",
    ),
    Mutant(
        "dedup-max-instead-of-sum",
        "optimizers/sparse.py",
        "    rows = tf.math.unsorted_segment_sum(values, segments, count)\n",
        "    rows = tf.math.unsorted_segment_max(values, segments, count)\n",
        ("tests/test_update_rules.py", "tests/test_optimizers.py"),
        "duplicate ids keep the largest row instead of the sum",
    ),
    Mutant(
        "dedup-dynamic-shape-mean",
        "optimizers/sparse.py",
        "        return ids, tf.math.unsorted_segment_sum(values, segments, "
        "tf.shape(ids)[0])\n",
        "        return ids, tf.math.unsorted_segment_mean(values, segments, "
        "tf.shape(ids)[0])\n",
        ("tests/test_update_rules.py", "tests/test_optimizers.py"),
        "the dynamic-shape path averages duplicate ids instead of summing",
    ),
    Mutant(
        "to-keras-drops-lower-weight-clip",
        "conversions/faces.py",
        "        clip_weight_min=opt.clip_weight_min,\n",
        "        clip_weight_min=None,\n",
        ("tests/test_convert.py",),
        "to_keras loses clip_weight_min",
    ),
    Mutant(
        "to-embedding-epsilon-bound",
        "definitions/algorithms/adagrad.py",
        "value / (2 * initial) <= EPSILON_TOLERANCE",
        "value / (2 * initial) <= 100 * EPSILON_TOLERANCE",
        ("tests/test_convert.py",),
        "to_embedding accepts a non-negligible Adagrad epsilon silently",
    ),
    Mutant(
        "configuration-one-tag",
        "embedding/configuration.py",
        "tag = tags[opt.learning_rate] if callable(opt.learning_rate) else None",
        "tag = 0 if callable(opt.learning_rate) else None",
        ("tests/test_configuration.py",),
        "every dynamic learning rate gets tag 0",
    ),
    Mutant(
        "configuration-global-wins",
        "embedding/configuration.py",
        "table_optimizer = table.optimizer if table.optimizer is not None else "
        "optimizer",
        "table_optimizer = optimizer if optimizer is not None else table.optimizer",
        ("tests/test_configuration.py", "tests/test_bad_inputs.py"),
        "the global optimizer overrides a table's own",
    ),
    Mutant(
        "configuration-vocabulary-per-host",
        "embedding/configuration.py",
        "descriptor.vocabulary_size = max(table.vocabulary_size, num_hosts)",
        "descriptor.vocabulary_size = table.vocabulary_size",
        ("tests/test_configuration.py",),
        "tables smaller than the host count are not padded as TensorFlow does",
    ),
)


def _copy_checkout(destination: pathlib.Path) -> pathlib.Path:
    """A snapshot of the checkout (tests included, so that editing the suite
    while this runs does not change the verdicts); returns its package."""
    shutil.copytree(
        ROOT,
        destination,
        ignore=shutil.ignore_patterns(".git", "__pycache__", "*.egg-info", "build"),
        dirs_exist_ok=True,
    )
    return destination / PACKAGE


def _environment(scratch: pathlib.Path) -> dict:
    env = dict(os.environ)
    # A missing oracle must fail here, not skip.
    env.pop("TF_TPU_EMBED_OPT_SKIP_ORACLES", None)
    env.pop("TF_TPU_EMBED_OPT_EXPECT_INSTALLED", None)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(scratch)] + [p for p in [env.get("PYTHONPATH")] if p]
    )
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _run_tests(
    scratch: pathlib.Path, tests: Sequence[str], timeout: float
) -> Tuple[int, str]:
    # cwd is the scratch checkout: `python -m pytest` puts it first on
    # sys.path, so its (mutated) package is imported, never the original.
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:logging"]
    command += list(tests)
    try:
        done = subprocess.run(
            command,
            cwd=scratch,
            env=_environment(scratch),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return -1, "timed out"
    # pytest's last line: "1 failed, 20 passed in 3.21s".
    pattern = re.compile(r"\b(passed|failed|errors?|skipped|deselected)\b.* in \d")
    lines = [line for line in done.stdout.splitlines() if pattern.search(line)]
    summary = lines[-1] if lines else (done.stdout + done.stderr)[-300:]
    return done.returncode, summary.strip("= ")


def _imported_from(scratch: pathlib.Path) -> str:
    done = subprocess.run(
        [sys.executable, "-c", f"import {PACKAGE}; print({PACKAGE}.__file__)"],
        cwd=scratch,
        env=_environment(scratch),
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip().splitlines()[-1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--full", action="store_true", help="run all of tests/")
    parser.add_argument(
        "--only", action="append", default=[], help="run this mutant (repeatable)"
    )
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument(
        "--no-baseline",
        action="store_true",
        help="skip the check that the unmutated copy passes",
    )
    options = parser.parse_args(argv)
    known = {m.name for m in MUTANTS}
    unknown = set(options.only) - known
    if unknown:
        parser.error(f"unknown mutants {sorted(unknown)}; known: {sorted(known)}")
    chosen = [m for m in MUTANTS if not options.only or m.name in options.only]

    results = []
    with tempfile.TemporaryDirectory(prefix="mutation_check_") as work:
        scratch = pathlib.Path(work)
        package = _copy_checkout(scratch)
        location = pathlib.Path(_imported_from(scratch)).resolve()
        if package.resolve() not in location.parents:
            print(f"mutation_check: the scratch copy is not imported ({location})")
            return 1
        if not options.no_baseline:
            tests = (
                ("tests",)
                if options.full
                else tuple(sorted({t for m in chosen for t in m.tests}))
            )
            status, summary = _run_tests(scratch, tests, options.timeout)
            print(f"baseline (no mutant): {summary}", flush=True)
            if status != 0:
                print("mutation_check: the unmutated copy fails; fix that first")
                return 1
        for mutant in chosen:
            source = package / mutant.path
            original = source.read_text()
            if original.count(mutant.old) != 1:
                results.append((mutant, "STALE", "original text not found once"))
                print(f"STALE    {mutant.name}", flush=True)
                continue
            source.write_text(original.replace(mutant.old, mutant.new))
            started = time.monotonic()
            tests = ("tests",) if options.full else mutant.tests
            try:
                status, summary = _run_tests(scratch, tests, options.timeout)
            finally:
                source.write_text(original)
            verdict = "killed" if status not in (0, -1, 5) else "SURVIVED"
            if status == -1:
                verdict = "TIMEOUT"
            seconds = time.monotonic() - started
            results.append((mutant, verdict, summary))
            print(f"{verdict:8} {mutant.name} ({seconds:.0f} s): {summary}", flush=True)

    print("\nmutant | planted bug | result")
    print("--- | --- | ---")
    for mutant, verdict, summary in results:
        print(f"{mutant.name} | {mutant.why} | {verdict}: {summary}")
    return 0 if all(verdict == "killed" for _, verdict, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
