"""The command line: `describe` an optimizer, run the `demo`, `checkpoint`s.

`python -m tf_tpu_embed_opt` and the console script `tf-tpu-embed-opt` both
call `main`. User errors (unknown algorithm, bad value, unreadable file) print
one line, `tf-tpu-embed-opt: error: ...`, on stderr and exit with status 2.
TensorFlow's log lines are hidden unless `--verbose` is given; `--help` and
usage errors do not import TensorFlow at all.

Subcommands. Each is a module listed in `SUBCOMMANDS` that provides:

- `add_parser(subparsers) -> None`: adds its parser with
  `subparsers.add_parser(NAME, ...)` (a `tf_tpu_embed_opt.cli.parser.Parser`,
  so its errors are one line). It must not import TensorFlow, here or at the
  module's top level: `--help` builds every subcommand's parser.
- `run(args: argparse.Namespace) -> int`: does the work and returns the exit
  status; it raises `tf_tpu_embed_opt.cli.parser.UsageError` for a mistake
  in the input (reported in one line, status 2). TensorFlow is imported here.
- optionally `normalize_arguments(tokens) -> tokens`: rewrites the tokens after
  the subcommand's name before parsing (`describe` moves ALGORITHM first).

A parser may `set_defaults(command_path="describe Adam")` to name itself in
the error for unrecognized arguments. `main` adds `--verbose` to every
subcommand. Adding a subcommand is one module and one entry in `SUBCOMMANDS`.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import os
import sys
from types import ModuleType
from typing import Dict, Optional, Sequence, Tuple

from tf_tpu_embed_opt.cli import checkpoint, demo, describe
from tf_tpu_embed_opt.cli.parser import (
    PROG,
    Parser,
    UsageError,
    add_verbose_option,
)

__all__ = ["main", "build_parser", "SUBCOMMANDS", "UsageError"]

# The subcommands, in the order `--help` lists them.
SUBCOMMANDS: Tuple[ModuleType, ...] = (describe, demo, checkpoint)


def build_parser() -> Tuple[argparse.ArgumentParser, Dict[str, ModuleType]]:
    """The command line's parser and the module that runs each subcommand."""
    from tf_tpu_embed_opt import __version__

    parser = Parser(
        prog=PROG,
        description=(
            "One optimizer definition for Keras layers and TPU embedding tables: "
            "describe an embedding optimizer, run the CPU demo, or inspect and "
            "convert TPU embedding checkpoints."
        ),
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    add_verbose_option(parser, False)
    subparsers = parser.add_subparsers(
        dest="command", metavar="COMMAND", required=True, parser_class=Parser
    )
    modules: Dict[str, ModuleType] = {}
    for module in SUBCOMMANDS:
        known = set(subparsers.choices)
        module.add_parser(subparsers)
        for name in set(subparsers.choices) - known:
            modules[name] = module
            add_verbose_option(subparsers.choices[name], argparse.SUPPRESS)
    return parser, modules


def _quiet_tensorflow() -> None:
    """Hides TensorFlow's log lines; loads TensorFlow with stderr closed off.

    TF_CPP_MIN_LOG_LEVEL=3 silences the C++ runtime lines, but not the ones
    TensorFlow's shared libraries print while they load, before absl's logging
    is initialized ("All log messages before absl::InitializeLog() ...", and
    "oneDNN custom operations are on" on CPUs where oneDNN is enabled, e.g.
    with AVX-512 or TF_ENABLE_ONEDNN_OPTS=1). So TensorFlow is imported here
    with file descriptor 2 pointed at the null device, and stderr restored
    right after; an import that fails still raises its error. oneDNN stays as
    the user set it. The Python loggers of TensorFlow and absl print warnings
    otherwise, so they are raised to ERROR.
    """
    if "tensorflow" not in sys.modules:
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
        if importlib.util.find_spec("tensorflow") is not None:
            _import_without_stderr("tensorflow")
    logging.getLogger("tensorflow").setLevel(logging.ERROR)
    logging.getLogger("absl").setLevel(logging.ERROR)


def _import_without_stderr(name: str) -> None:
    """Imports `name` with file descriptor 2 on the null device meanwhile."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, 2)
        finally:
            os.close(null)
        importlib.import_module(name)
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _error(message: str) -> None:
    line = " ".join(message.split())
    print(f"{PROG}: error: {line}", file=sys.stderr)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the command line.

    Args:
      argv: The arguments after the program name; `sys.argv[1:]` if None.

    Returns:
      The exit status: 0 on success, 2 for a usage error (reported in one line
      on stderr), 1 when the demo's run did not learn.
    """
    tokens = list(sys.argv[1:] if argv is None else argv)
    try:
        parser, modules = build_parser()
        # The first token that names a subcommand; options before it are the
        # top level's (`--verbose`).
        for index, token in enumerate(tokens):
            module = modules.get(token)
            if module is not None:
                normalize = getattr(module, "normalize_arguments", None)
                if normalize is not None:
                    tokens[index + 1 :] = normalize(tokens[index + 1 :])
                break
            if not token.startswith("-"):
                break
        try:
            args, extras = parser.parse_known_args(tokens)
        except SystemExit as exit_:  # --help, --version
            return exit_.code if isinstance(exit_.code, int) else 0
        if extras:
            command = getattr(args, "command_path", args.command)
            raise UsageError(
                f"unrecognized arguments for {command}: {' '.join(extras)}",
                hint=f"see `{PROG} {command} --help`",
            )
        if not args.verbose:
            _quiet_tensorflow()
        return modules[args.command].run(args)
    except UsageError as error:
        message = str(error)
        if error.hint:
            message = f"{message} ({error.hint})"
        _error(message)
        return 2
    except BrokenPipeError:  # e.g. `... | head`; Python flushes stdout at exit
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 1
