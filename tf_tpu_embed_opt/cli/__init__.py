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
import contextlib
import difflib
import logging
import os
import sys
from types import ModuleType
from typing import Any, Dict, Iterator, Optional, Sequence, Tuple

from tf_tpu_embed_opt.cli import checkpoint, demo, describe
from tf_tpu_embed_opt.cli.parser import (
    PROG,
    Parser,
    UsageError,
    add_verbose_option,
)
from tf_tpu_embed_opt.errors import (
    JaxNotInstalled,
    TensorFlowNotInstalled,
    is_jax_missing,
    is_tensorflow_missing,
    keras_backend_missing,
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
    """Hides the log lines of TensorFlow's Python loggers (absl's too)."""
    if "tensorflow" not in sys.modules:
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    logging.getLogger("tensorflow").setLevel(logging.ERROR)
    logging.getLogger("absl").setLevel(logging.ERROR)


@contextlib.contextmanager
def _native_stderr_to_null() -> Iterator[None]:
    """Points file descriptor 2 at the null device, Python's stderr kept.

    TF_CPP_MIN_LOG_LEVEL=3 silences TensorFlow's C++ runtime lines, but not
    the ones its shared libraries print while they load, before absl's
    logging is initialized ("All log messages before absl::InitializeLog()
    ...", and "oneDNN custom operations are on" on CPUs where oneDNN is on,
    e.g. with AVX-512 or TF_ENABLE_ONEDNN_OPTS=1). TensorFlow loads when a
    subcommand first needs it, so while the subcommand runs, what native code
    writes to descriptor 2 goes to the null device, and `sys.stderr` (this
    command's own errors and warnings) writes to a copy of the original
    descriptor. oneDNN stays as the user set it; `--verbose` shows the lines.
    Nothing changes once TensorFlow is loaded (it printed already).
    """
    if "tensorflow" in sys.modules:
        yield
        return
    try:
        attached = sys.stderr is not None and sys.stderr.fileno() == 2
    except (AttributeError, OSError, ValueError):  # a captured stderr
        attached = False
    sys.stderr.flush()
    saved = os.dup(2)
    python_stderr = sys.stderr
    if attached:
        sys.stderr = open(  # noqa: SIM115 - closed below
            os.dup(saved),
            "w",
            encoding=python_stderr.encoding,
            errors=python_stderr.errors,
            buffering=1,
        )
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    os.close(null)
    try:
        yield
    finally:
        if attached:
            sys.stderr.flush()
            sys.stderr.close()
            sys.stderr = python_stderr
        os.dup2(saved, 2)
        os.close(saved)


def tokens_command(tokens: Sequence[str]) -> str:
    """The subcommand named in `tokens` (the first that is no option)."""
    return next((t for t in tokens if not t.startswith("-")), "")


def _error(message: str) -> None:
    line = " ".join(message.split())
    print(f"{PROG}: error: {line}", file=sys.stderr)


def _innermost(parser: argparse.ArgumentParser, tokens: Sequence[str]) -> Any:
    """The (sub)parser that `tokens` name, descending through each token
    that is one of the current parser's subcommands."""
    for token in tokens:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                if token in action.choices:
                    parser = action.choices[token]
                break
    return parser


def _did_you_mean(extras: Sequence[str], parser: argparse.ArgumentParser) -> str:
    """What the refusal of `extras` adds: `(did you mean --x?)` for each
    unknown option close to one of `parser`'s (a `_` for a `-`, a typo)."""
    options = [o for a in parser._actions for o in a.option_strings]
    guesses = []
    for extra in extras:
        if not extra.startswith("--") or extra in options:
            continue
        name = extra.split("=", 1)[0].replace("_", "-")
        close = difflib.get_close_matches(name, options, n=1, cutoff=0.75)
        if close and close[0] not in guesses:
            guesses.append(close[0])
    return f" (did you mean {' or '.join(guesses)}?)" if guesses else ""


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
                f"unrecognized arguments for {command}: {' '.join(extras)}"
                + _did_you_mean(extras, _innermost(parser, tokens)),
                hint=f"see `{PROG} {command} --help`",
            )
        if args.verbose:
            return modules[args.command].run(args)
        _quiet_tensorflow()
        with _native_stderr_to_null():
            return modules[args.command].run(args)
    except ModuleNotFoundError as error:
        if isinstance(error, (JaxNotInstalled, TensorFlowNotInstalled)):
            # Raised by the command itself, naming what needed it.
            _error(str(error))
            return 2
        if is_jax_missing(error):
            command = f"`{PROG} {tokens_command(tokens)}`"
            _error(str(JaxNotInstalled(command, error.name or "jax")))
            return 2
        if not is_tensorflow_missing(error):
            raise
        what = f"`{PROG} {tokens_command(tokens)}`"
        _error(str(TensorFlowNotInstalled(what, keras_backend_missing(error))))
        return 2
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
