"""Plants every small bug of a few kinds in one module, one at a time, and
runs the tests that execute the planted line: which bugs no test sees.

Not a test (pytest does not collect it) and not run in CI. Where
`mutation_check.py` keeps a fixed list of representative bugs that must
stay killed, this sweeps a module the suite has not been asked about yet.
Each mutant is one of:

- a comparison flipped (`<`/`<=`, `>`/`>=`, `==`/`!=`, `in`/`not in`,
  `is`/`is not`);
- an arithmetic operator swapped (`+`/`-`, `*`/`/`, `//`/`/`, `%`/`//`,
  `**`/`*`), also in `+=` and the like;
- `and`/`or` swapped; a `not` dropped;
- an integer constant plus one;
- a `raise` replaced by `pass`.

First record which test runs which line (once, the whole suite or part of
it; about 20 minutes for `tests` on 2 cores), then sweep, from the
repository root:

    python tests/mutation_sweep.py --record tests
    python tests/mutation_sweep.py tf_tpu_embed_opt/checkpoints/shared/stacks.py

A mutant runs, with `-x`, the test functions that executed its line when it
was recorded (the whole parametrization of each). Lines that run when a
module is imported, or inside hypothesis's or a fixture's own frames, are
tied to no test function: their mutants run the test files that reach the
module at all. A mutant is `killed` (a test failed), `SURVIVED` (every test
passed: a bug no test sees, or an equivalent change: read it),
`uncovered` (no recorded test runs its line), or `TIMEOUT`. The record
comes from the environment it ran in: branches of another backend or
version show as uncovered. `--start`/`--stop` choose mutants by index.

Lines that run only in a subprocess a test starts (several JAX processes, a
loopback parameter-server cluster) are tied to no test by the record: sweep
them with `--tests`, which runs the tests given for every mutant chosen,
whatever the record says (once first unmutated: they must pass):

    python tests/mutation_sweep.py --start 53 --stop 87 \
        tf_tpu_embed_opt/checkpoints/keras/state.py \
        --tests tests/test_jax_processes.py
"""

from __future__ import annotations

import argparse
import ast
import copy
import pathlib
import subprocess
import sys
import tempfile
import time
from typing import Dict, Iterator, List, Optional, Sequence, Set, Tuple

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import mutation_check  # noqa: E402  (the scratch copy and the test runner)

ROOT = mutation_check.ROOT
RECORD = ROOT / ".mutation_sweep.coverage"

_COMPARE = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}
_ARITHMETIC = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Div,
    ast.Div: ast.Mult,
    ast.FloorDiv: ast.Div,
    ast.Mod: ast.FloorDiv,
    ast.Pow: ast.Mult,
}


class Mutant:
    """One planted bug: the source span of `node` replaced by `text`."""

    def __init__(self, node: ast.AST, text: str, what: str):
        self.line = node.lineno
        self.span = (node.lineno, node.col_offset, node.end_lineno, node.end_col_offset)
        self.text = text
        self.what = what

    def apply(self, source: str) -> str:
        lines = source.encode().splitlines(keepends=True)
        first, first_col, last, last_col = self.span
        start = sum(map(len, lines[: first - 1])) + first_col
        end = sum(map(len, lines[: last - 1])) + last_col
        data = source.encode()
        return (data[:start] + self.text.encode() + data[end:]).decode()


def _changed(node: ast.AST, **fields) -> ast.AST:
    changed = copy.copy(node)
    for name, value in fields.items():
        setattr(changed, name, value)
    return changed


def _expression(node: ast.expr) -> str:
    return f"({ast.unparse(node)})"


def _mutants_of(node: ast.AST) -> Iterator[Tuple[ast.AST, str, str]]:
    if isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            if type(op) in _COMPARE:
                ops = list(node.ops)
                ops[i] = _COMPARE[type(op)]()
                yield node, _expression(_changed(node, ops=ops)), "comparison"
    elif isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in _ARITHMETIC:
        changed = _changed(node, op=_ARITHMETIC[type(node.op)]())
        text = ast.unparse(changed)
        yield (
            node,
            _expression(changed) if isinstance(node, ast.BinOp) else text,
            ("arithmetic"),
        )
    elif isinstance(node, ast.BoolOp):
        other = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        yield node, _expression(_changed(node, op=other)), "and/or"
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        yield node, _expression(node.operand), "not dropped"
    elif isinstance(node, ast.Constant) and type(node.value) is int:
        yield node, repr(node.value + 1), "integer + 1"
    elif isinstance(node, ast.Raise):
        yield node, "pass", "raise -> pass"


def _skipped(tree: ast.Module) -> Set[int]:
    """ids of nodes not to mutate: docstrings, f-strings, annotations."""
    skipped: Set[int] = set()
    for node in ast.walk(tree):
        inside = []
        if isinstance(node, ast.JoinedStr):
            inside.append(node)
        if isinstance(node, (ast.arg, ast.AnnAssign)) and node.annotation:
            inside.append(node.annotation)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns:
            inside.append(node.returns)
        for root in inside:
            skipped.update(id(n) for n in ast.walk(root))
    return skipped


def mutants(source: str) -> List[Mutant]:
    tree = ast.parse(source)
    skipped = _skipped(tree)
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped or not hasattr(node, "lineno"):
            continue
        for target, text, what in _mutants_of(node):
            found.append(Mutant(target, text, what))
    return sorted(found, key=lambda m: (m.span, m.text))


def _test_id(context: str) -> Optional[str]:
    # coverage's test_function context: "test_x.test_y" or "test_x.TestC.test_y"
    # (pytest puts tests/ on sys.path; a package of tests would add "tests.").
    parts = context.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        for base in (ROOT / "tests", ROOT):
            path = base.joinpath(*parts[:cut]).with_suffix(".py")
            if path.is_file():
                return "::".join([str(path.relative_to(ROOT))] + parts[cut:])
    return None


def covering_tests(
    module: pathlib.Path, data_file: pathlib.Path
) -> Tuple[Dict[int, Set[str]], Set[str]]:
    """Per line of `module`, the recorded tests that ran it; and the test
    files that ran any line of it (for lines tied to no test)."""
    import coverage

    data = coverage.CoverageData(basename=str(data_file))
    data.read()
    measured = [f for f in data.measured_files() if f.endswith(str(module))]
    if not measured:
        return {}, set()
    per_line: Dict[int, Set[str]] = {}
    files: Set[str] = set()
    for line, contexts in data.contexts_by_lineno(measured[0]).items():
        tests = {t for t in map(_test_id, contexts) if t}
        # Run by no test function (an import, hypothesis's own frames): "*".
        per_line[line] = tests | ({"*"} if len(tests) < len(contexts) else set())
        files.update(t.split("::")[0] for t in tests)
    return per_line, files


def record(tests: Sequence[str], data_file: pathlib.Path) -> int:
    """Runs `tests` under coverage, each line tied to its test functions."""
    try:
        import coverage  # noqa: F401
    except ImportError:
        print("mutation_sweep: --record needs coverage (pip install coverage)")
        return 1
    with tempfile.TemporaryDirectory() as work:
        rc = pathlib.Path(work) / "coveragerc"
        rc.write_text(
            "[run]\n"
            f"source = {mutation_check.PACKAGE}\n"
            "dynamic_context = test_function\n"
            f"data_file = {data_file}\n"
        )
        command = [sys.executable, "-m", "coverage", "run", f"--rcfile={rc}"]
        command += ["-m", "pytest", "-q", "-p", "no:logging", "-p", "no:cacheprovider"]
        return subprocess.run(command + list(tests), cwd=ROOT).returncode


def _tests_for(mutant: Mutant, per_line, files) -> Tuple[str, ...]:
    tests = set(per_line.get(mutant.line, ()))
    if "*" in tests:  # also the files that reach the module at all
        tests = (tests - {"*"}) | files
    # A test file run whole takes in its functions.
    whole = {t for t in tests if "::" not in t}
    return tuple(
        sorted(t for t in tests if t in whole or t.split("::")[0] not in whole)
    )


def sweep(
    module: str,
    data_file: pathlib.Path,
    start: int,
    stop: Optional[int],
    timeout: float,
    given: Sequence[str] = (),
) -> int:
    path = pathlib.Path(module)
    original = (ROOT / path).read_text()
    found = mutants(original)[start:stop]
    per_line, files = ({}, set()) if given else covering_tests(path, data_file)
    counts: Dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="mutation_sweep_") as work:
        scratch = pathlib.Path(work)
        mutation_check._copy_checkout(scratch)
        target = scratch / path
        if given:
            # Else a test that fails anyway (or a mistyped test id) would
            # "kill" every mutant.
            status, summary = mutation_check._run_tests(scratch, given, timeout)
            if status != 0:
                print(f"{module}: the tests given fail unmutated: {summary}")
                return 1
        for index, mutant in enumerate(found, start):
            tests = tuple(given) or _tests_for(mutant, per_line, files)
            label = f"{index:4} line {mutant.line:4} {mutant.what}: {mutant.text[:60]}"
            if not tests:
                verdict, summary, seconds = "uncovered", "", 0.0
            else:
                target.write_text(mutant.apply(original))
                started = time.monotonic()
                try:
                    status, summary = mutation_check._run_tests(scratch, tests, timeout)
                finally:
                    target.write_text(original)
                seconds = time.monotonic() - started
                verdict = {0: "SURVIVED", -1: "TIMEOUT", 5: "no tests"}.get(
                    status, "killed"
                )
            counts[verdict] = counts.get(verdict, 0) + 1
            print(f"{verdict:9} {label} ({seconds:.0f} s) {summary}", flush=True)
    print(f"{module}: " + ", ".join(f"{n} {v}" for v, n in sorted(counts.items())))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("modules", nargs="*", help="package modules to sweep")
    parser.add_argument(
        "--record", nargs="+", metavar="TESTS", help="record which test runs which line"
    )
    parser.add_argument(
        "--data",
        type=pathlib.Path,
        default=RECORD,
        help=f"the record (default {RECORD})",
    )
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--stop", type=int, default=None)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument(
        "--tests",
        nargs="+",
        default=(),
        metavar="TEST",
        help="run these tests for every mutant instead of the recorded ones",
    )
    options = parser.parse_args(argv)
    if options.record:
        return record(options.record, options.data.resolve())
    if not options.modules:
        parser.error("give modules to sweep, or --record TESTS")
    if not options.tests and not options.data.exists():
        parser.error(f"no record at {options.data}: run --record first")
    failed = 0
    for module in options.modules:
        failed |= sweep(
            module,
            options.data,
            options.start,
            options.stop,
            options.timeout,
            options.tests,
        )
    return failed


if __name__ == "__main__":
    sys.exit(main())
