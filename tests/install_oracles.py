"""Installs the suite's optional oracles into the running Python environment.

The README's test set-up (after `pip install ".[cpu,test]"`) and `.ci/run`:

    python tests/install_oracles.py

For each installable entry of `tests/oracles.py` it runs `pip install` (with
`--no-deps` where the entry asks: TF Recommenders and `tf_keras` both require
`tensorflow`, which would add a second TensorFlow next to `tensorflow-cpu` or
`tensorflow-tpu`), with `{tf_minor}` set from the installed TensorFlow; then it
probes every oracle and exits 1 if an installable one still does not work.
`--dry-run` prints the pip commands without running them.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import pathlib
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import oracles  # noqa: E402

TENSORFLOW_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-tpu")


def tensorflow_minor() -> str:
    """ "major.minor" of the installed TensorFlow distribution."""
    for distribution in TENSORFLOW_DISTRIBUTIONS:
        try:
            version = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
        return ".".join(version.split(".")[:2])
    raise SystemExit(
        "install_oracles: no TensorFlow is installed (looked for "
        f"{', '.join(TENSORFLOW_DISTRIBUTIONS)}); install the package with an "
        'extra first, e.g. pip install ".[cpu,test]".'
    )


def pip_commands(minor: str):
    """One pip command per installable oracle."""
    for oracle in oracles.ORACLES:
        if not oracle.installable:
            continue
        command = [sys.executable, "-m", "pip", "install", "-q"]
        if oracle.no_deps:
            command.append("--no-deps")
        command += [r.format(tf_minor=minor) for r in oracle.requirements]
        yield oracle, command


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dry-run", action="store_true", help="print the pip commands only"
    )
    options = parser.parse_args(argv)
    minor = tensorflow_minor()
    for oracle, command in pip_commands(minor):
        print(f"install_oracles: {oracle.name}: {' '.join(command[1:])}", flush=True)
        if not options.dry_run:
            subprocess.run(command, check=True)
    if options.dry_run:
        return 0
    # Probe in a fresh process: what was just installed must import.
    probe = (
        "import sys; sys.path.insert(0, {tests!r}); import oracles\n"
        "for o in oracles.ORACLES:\n"
        "    print(o.name, '\\t', oracles.why_missing(o.name) or 'ok')\n"
    ).format(tests=str(pathlib.Path(__file__).resolve().parent))
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True
    )
    if result.returncode != 0:
        print(result.stderr[-3000:], file=sys.stderr)
        return 1
    failed = False
    for line in result.stdout.strip().splitlines():
        name, _, why = line.partition(" \t ")
        why = "" if why == "ok" else why
        print(f"install_oracles: {name}: {oracles.state_line(name, why)}")
        failed |= oracles.BY_NAME[name].installable and bool(why)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
