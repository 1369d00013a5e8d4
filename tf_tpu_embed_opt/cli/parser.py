"""Argument parsing shared by the subcommands; imports no TensorFlow.

Everything here runs before a subcommand decides whether it needs TensorFlow,
so `--help` and usage errors stay instant: this module and the subcommands'
`add_parser` functions import only the standard library and the package's
TensorFlow-free definitions (`tf_tpu_embed_opt.definitions`).
"""

from __future__ import annotations

import argparse
import difflib
import math
import re
import sys
import textwrap
from typing import Any, Dict, Optional, Sequence

from tf_tpu_embed_opt.definitions import registry
from tf_tpu_embed_opt.definitions.spec import Definition

__all__ = [
    "PROG",
    "MAX_TABLE_ELEMENTS",
    "UsageError",
    "Parser",
    "parse_number",
    "parse_clipvalue",
    "parse_flag",
    "parse_optional_flag",
    "parse_optional_number",
    "parse_positive_int",
    "parse_table_extent",
    "parse_non_negative_int",
    "parse_pairs",
    "resolve_algorithm",
    "algorithm_type",
    "add_verbose_option",
    "option",
    "show",
    "counted",
    "fill",
    "out",
    "with_options",
]

PROG = "tf-tpu-embed-opt"

# The largest table the command line reasons about: 2**40 float32 values are
# 4 TiB, beyond the embedding memory of any TPU pod slice or host today, so a
# larger `--vocabulary-size` x `--dim` is a typo, not a plan.
MAX_TABLE_ELEMENTS = 2**40


class UsageError(Exception):
    """A mistake in the command line or its inputs; reported in one line."""

    def __init__(self, message: str, hint: Optional[str] = None) -> None:
        super().__init__(message)
        self.hint = hint


class Parser(argparse.ArgumentParser):
    """An `ArgumentParser` whose errors become `UsageError` (one line, exit 2)."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        raise UsageError(message, hint=f"see `{self.prog} --help`")


# ---------------------------------------------------------------------------
# Values on the command line.

DECIMAL = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?\Z")
_INTEGER = re.compile(r"\d+(?:[_,]\d{3})*\Z")
# 1e6, 2E9: integers in scientific notation (an exponent, no fraction).
_SCIENTIFIC_INTEGER = re.compile(r"(\d+)[eE]\+?(\d+)\Z")


def parse_number(text: str) -> float:
    """A finite decimal number (`0.01`, `-1`, `1e-3`); no `nan`, `inf`, `0x1p3`.

    Raises:
      argparse.ArgumentTypeError: `text` is not such a number.
    """
    stripped = text.strip()
    if not DECIMAL.match(stripped):
        raise argparse.ArgumentTypeError(
            f"expected a finite decimal number such as 0.01 or 1e-3; got {text!r}"
        )
    value = float(stripped)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is out of range")
    return value


def _is_none(text: str) -> bool:
    return text.strip().lower() == "none"


def parse_optional_number(text: str) -> Optional[float]:
    """`parse_number`, or None for `none`."""
    return None if _is_none(text) else parse_number(text)


def parse_flag(text: str) -> bool:
    """`true` or `false`, in any case.

    Raises:
      argparse.ArgumentTypeError: Anything else.
    """
    value = text.strip().lower()
    if value not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false; got {text!r}")
    return value == "true"


def parse_optional_flag(text: str) -> Optional[bool]:
    """`parse_flag`, or None for `none`."""
    return None if _is_none(text) else parse_flag(text)


def parse_clipvalue(text: str) -> Optional[Any]:
    """`C` (clip to [-C, C]), `MIN,MAX` (an empty side is no bound) or `none`.

    Raises:
      argparse.ArgumentTypeError: Neither form.
    """
    if _is_none(text):
        return None
    if "," not in text:
        return parse_number(text)
    parts = text.split(",")
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(
            f"expected C or MIN,MAX (either side may be empty); got {text!r}"
        )
    return tuple(None if not p.strip() else parse_number(p) for p in parts)


def _integer(text: str, what: str) -> int:
    stripped = text.strip()
    if _INTEGER.match(stripped):
        return int(re.sub("[_,]", "", stripped))
    scientific = _SCIENTIFIC_INTEGER.match(stripped)
    # The exponent is bounded before it is used, so `1e999999999` costs nothing.
    if scientific and len(scientific.group(2)) <= 3:
        return int(scientific.group(1)) * 10 ** int(scientific.group(2))
    raise argparse.ArgumentTypeError(f"expected {what}; got {text!r}")


def parse_positive_int(text: str) -> int:
    """A positive integer: `64`, `1_000_000`, `1,000,000` or `1e6`.

    Raises:
      argparse.ArgumentTypeError: Not a positive integer.
    """
    value = _integer(text, "a positive integer")
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer; got {text!r}")
    return value


def parse_table_extent(text: str) -> int:
    """A table's row count or dimension: a positive integer up to 2**40.

    Raises:
      argparse.ArgumentTypeError: Not a positive integer, or above
        `MAX_TABLE_ELEMENTS`.
    """
    value = parse_positive_int(text)
    if value > MAX_TABLE_ELEMENTS:
        raise argparse.ArgumentTypeError(
            f"{text.strip()} is above the largest table this tool describes, "
            f"2**40 = {MAX_TABLE_ELEMENTS:,} values (4 TiB of float32)"
        )
    return value


def parse_non_negative_int(text: str) -> int:
    """`0`, `1`, ...: digits only.

    Raises:
      argparse.ArgumentTypeError: Anything else.
    """
    stripped = text.strip()
    if not re.fullmatch(r"\d+", stripped):
        raise argparse.ArgumentTypeError(
            f"expected a non-negative integer; got {text!r}"
        )
    return int(stripped)


def parse_pairs(
    values: Sequence[str], option: str, form: str = "OLD=NEW"
) -> Dict[str, str]:
    """The `KEY=VALUE` values of a repeatable option, by key.

    Raises:
      ValueError: A value without both sides (`form` says what is expected),
        or a key given twice (the later one would win without a word).
    """
    pairs: Dict[str, str] = {}
    for value in values:
        key, sep, given = value.partition("=")
        if not sep or not key or not given:
            raise ValueError(f"{option}: expected {form}; received {value!r}.")
        if key in pairs:
            raise ValueError(
                f"{option}: {key!r} is given twice ({key}={pairs[key]} and "
                f"{value}); give it once."
            )
        pairs[key] = given
    return pairs


def show(value: Any) -> str:
    """A value as it is written on the command line."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


# ---------------------------------------------------------------------------
# Algorithms, by any of their names.


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


_ALIASES: Dict[str, Definition] = {}
for _definition in registry.ALL:
    _ALIASES[_key(_definition.name)] = _definition
    if _definition.proto_oneof is not None:
        _ALIASES[_key(_definition.proto_oneof)] = _definition
del _definition


def resolve_algorithm(
    name: str, definitions: Sequence[Definition] = registry.ALL
) -> Definition:
    """The definition for an algorithm name, matched leniently.

    Accepts the embedding class name in any case (`adagrad`, `RMSProp`) and the
    `OptimizationParameters` oneof name (`rms_prop`,
    `stochastic_gradient_descent`).

    Args:
      name: The name given.
      definitions: The algorithms allowed (default: every one, LaProp and
        F2A of jax-tpu-embedding included).

    Raises:
      UsageError: No algorithm of `definitions` has that name.
    """
    aliases = {k: d for k, d in _ALIASES.items() if d in definitions}
    definition = aliases.get(_key(name))
    if definition is not None:
        return definition
    known = ", ".join(d.name for d in definitions)
    close = difflib.get_close_matches(_key(name), list(aliases), n=1)
    suggestion = f" (did you mean {aliases[close[0]].name}?)" if close else ""
    raise UsageError(f"unknown algorithm {name!r}{suggestion}. Known: {known}.")


def algorithm_type(text: str) -> Definition:
    """`resolve_algorithm` over the TensorFlow engines' algorithms, as an
    argparse `type`."""
    try:
        return resolve_algorithm(text, registry.DEFINITIONS)
    except UsageError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def option(name: str) -> str:
    """The command-line spelling of an argument: `beta_1` -> `--beta-1`."""
    return "--" + name.replace("_", "-")


def with_options(message: str, definition: Optional[Definition]) -> str:
    """Adds the command-line spelling after each argument name in `message`."""
    if definition is None:
        return message
    names = set(definition.parameter_names)
    seen = set()

    def spell(match: "re.Match[str]") -> str:
        name = match.group(1)
        if name not in names or name in seen:
            return match.group(0)
        seen.add(name)
        return f"{match.group(0)} ({option(name)})"

    return re.sub(r"`(\w+)`", spell, message)


def add_verbose_option(parser: argparse.ArgumentParser, default: Any) -> None:
    """`--verbose`: let TensorFlow's own logging through."""
    parser.add_argument(
        "--verbose",
        action="store_true",
        default=default,
        help=(
            "Show TensorFlow's start-up and runtime log lines (hidden by "
            "default; TF_CPP_MIN_LOG_LEVEL then applies as usual)."
        ),
    )


def counted(count: int, noun: str) -> str:
    """`1 table`, `2 tables`: a count with its noun in the right number."""
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def step_line(document: Dict[str, Any]) -> str:
    """`inspect`'s line of the step a checkpoint records (its description's
    `step`, see `Checkpoint.step`, or the one at `--step-path`)."""
    step, path = document["step"], document.get("step_path")
    if step is None:
        return "step: none recorded"
    return f"step: {step}" + (f" (at {path})" if path else "")


def fill(text: str) -> str:
    """`text` wrapped at 79 columns, for help texts."""
    return textwrap.fill(text, width=79)


def out(line: str = "") -> None:
    """Prints one line on stdout."""
    print(line, file=sys.stdout)
