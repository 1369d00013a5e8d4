"""The command line: `describe` an optimizer, run the `demo`.

`python -m tf_tpu_embed_opt` and the console script `tf-tpu-embed-opt` both
call `main`.

- `describe ALGORITHM [--hyper-parameter VALUE ...] [--vocabulary-size N
  --dim D]` builds an embedding optimizer (options derived from its single
  definition, validated by its class) and prints the `OptimizationParameters`
  the TPU engine receives, its slot variables with their initial values, its
  TPU-exact Keras twin and, given a table size, the memory of the table plus
  slots. `describe --from FILE` does the same for an `OptimizerSpec` in text
  format (embedding or Keras face; a Keras optimizer the engine cannot run is
  reported as such, with the reason). `describe` alone lists the algorithms.
- `demo` trains a small synthetic click-through-rate model on CPU with the
  TPU-exact Keras twin for the embedding tables and Keras Adam for the dense
  layers, then prints the `TPUEmbeddingConfiguration` the same setup would
  send to a TPU.

User errors (unknown algorithm, bad value, unreadable file) print one line,
`tf-tpu-embed-opt: error: ...`, on stderr and exit with status 2.
"""

from __future__ import annotations

import argparse
import difflib
import inspect
import math
import os
import pathlib
import re
import sys
import textwrap
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
from google.protobuf import message as protobuf_message
from google.protobuf import text_format

from tf_tpu_embed_opt import (
    checkpoint_cli,
    convert,
    embedding,
    optimizer_spec,
    proto,
    registry,
)
from tf_tpu_embed_opt.spec import Definition

__all__ = [
    "main",
    "build_parser",
    "resolve_algorithm",
    "parse_number",
    "parse_clipvalue",
    "memory_bytes",
    "synthetic_ctr_data",
    "UsageError",
]

PROG = "tf-tpu-embed-opt"

# float32: every table and slot element takes 4 bytes on the TPU.
_BYTES_PER_VALUE = 4


class UsageError(Exception):
    """A mistake in the command line or its inputs; reported in one line."""

    def __init__(self, message: str, hint: Optional[str] = None) -> None:
        super().__init__(message)
        self.hint = hint


class _Parser(argparse.ArgumentParser):
    """An `ArgumentParser` whose errors become `UsageError` (one line, exit 2)."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        raise UsageError(message, hint=f"see `{self.prog} --help`")


# ---------------------------------------------------------------------------
# Values on the command line.

_DECIMAL = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?\Z")
_INTEGER = re.compile(r"\d+(?:[_,]\d{3})*\Z")


def parse_number(text: str) -> float:
    """A finite decimal number (`0.01`, `-1`, `1e-3`); no `nan`, `inf`, `0x1p3`.

    Raises:
      argparse.ArgumentTypeError: `text` is not such a number.
    """
    stripped = text.strip()
    if not _DECIMAL.match(stripped):
        raise argparse.ArgumentTypeError(
            f"expected a finite decimal number such as 0.01 or 1e-3; got {text!r}"
        )
    value = float(stripped)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is out of range")
    return value


def _is_none(text: str) -> bool:
    return text.strip().lower() == "none"


def _optional_number(text: str) -> Optional[float]:
    return None if _is_none(text) else parse_number(text)


def _flag(text: str) -> bool:
    value = text.strip().lower()
    if value not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false; got {text!r}")
    return value == "true"


def _optional_flag(text: str) -> Optional[bool]:
    return None if _is_none(text) else _flag(text)


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


def _positive_int(text: str) -> int:
    stripped = text.strip()
    if not _INTEGER.match(stripped) or int(re.sub("[_,]", "", stripped)) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer; got {text!r}")
    return int(re.sub("[_,]", "", stripped))


def _non_negative_int(text: str) -> int:
    stripped = text.strip()
    if not re.fullmatch(r"\d+", stripped):
        raise argparse.ArgumentTypeError(
            f"expected a non-negative integer; got {text!r}"
        )
    return int(stripped)


def _show(value: Any) -> str:
    """A value as it is written on the command line."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


# ---------------------------------------------------------------------------
# Algorithms and their options, derived from the definitions.


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


_ALIASES: Dict[str, Definition] = {}
for _definition in registry.DEFINITIONS:
    _ALIASES[_key(_definition.name)] = _definition
    _ALIASES[_key(_definition.proto_oneof)] = _definition
del _definition


def resolve_algorithm(name: str) -> Definition:
    """The definition for an algorithm name, matched leniently.

    Accepts the embedding class name in any case (`adagrad`, `RMSProp`) and the
    `OptimizationParameters` oneof name (`rms_prop`,
    `stochastic_gradient_descent`).

    Raises:
      UsageError: No algorithm has that name.
    """
    definition = _ALIASES.get(_key(name))
    if definition is not None:
        return definition
    known = ", ".join(d.name for d in registry.DEFINITIONS)
    close = difflib.get_close_matches(_key(name), list(_ALIASES), n=1)
    suggestion = f" (did you mean {_ALIASES[close[0]].name}?)" if close else ""
    raise UsageError(f"unknown algorithm {name!r}{suggestion}. Known: {known}.")


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


_COMMON_HELP = {
    "use_gradient_accumulation": (
        "Sum a row's gradients over the batch before applying them (needed for "
        "clipping and exact results)."
    ),
    "clip_weight_min": "Lower bound for the updated weights; none for no bound.",
    "clip_weight_max": "Upper bound for the updated weights; none for no bound.",
    "weight_decay_factor": (
        "Decoupled weight decay of the looked-up rows; none for no decay."
    ),
    "multiply_weight_decay_factor_by_learning_rate": (
        "Multiply the weight decay by the learning rate."
    ),
    "clipvalue": (
        "Gradient clipping: C clips to [-C, C]; MIN,MAX clips to [MIN, MAX] "
        "with an empty side for no bound (write --clipvalue=-1,2 when MIN is "
        "negative); none for no clipping."
    ),
    "low_dimensional_packing_status": "Pack tables of dimension 1, 2 or 4.",
}


def _parameters(definition: Definition) -> List[Tuple[str, Any]]:
    """(name, default) of the options of `definition`, in signature order.

    `slot_variable_creation_fn` (a callable) has no command-line form.
    """
    signature = inspect.signature(embedding.class_for(definition).__init__)
    return [
        (name, signature.parameters[name].default)
        for name in definition.parameter_names
        if name != "slot_variable_creation_fn"
    ]


def _add_algorithm_options(
    parser: argparse.ArgumentParser, definition: Definition
) -> None:
    hypers = definition.hyper
    group = parser.add_argument_group(f"{definition.name} arguments")
    for name, default in _parameters(definition):
        kwargs: Dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS}
        if name == "learning_rate":
            kwargs.update(type=parse_number, metavar="X", help="Learning rate (>= 0).")
        elif name in hypers:
            hyper = hypers[name]
            if hyper.kind == "bool":
                kwargs.update(type=_flag, metavar="{true,false}", help=hyper.doc)
            else:
                allowed = f" Must be {hyper.bounds.describe()}." if hyper.bounds else ""
                kwargs.update(type=parse_number, metavar="X", help=hyper.doc + allowed)
        elif name == "clipvalue":
            kwargs.update(
                type=parse_clipvalue, metavar="C|MIN,MAX|none", help=_COMMON_HELP[name]
            )
        elif name == "multiply_weight_decay_factor_by_learning_rate":
            kwargs.update(
                type=_optional_flag,
                metavar="{true,false,none}",
                help=_COMMON_HELP[name],
            )
        elif default is None:
            kwargs.update(
                type=_optional_number, metavar="X|none", help=_COMMON_HELP[name]
            )
        else:
            kwargs.update(type=_flag, metavar="{true,false}", help=_COMMON_HELP[name])
        kwargs["help"] = f"{kwargs['help']} Default: {_show(default)}."
        group.add_argument(_option(name), **kwargs)


def _add_size_options(parser: argparse.ArgumentParser, default: Any) -> None:
    group = parser.add_argument_group("table size (give both or neither)")
    group.add_argument(
        "--vocabulary-size",
        type=_positive_int,
        default=default,
        metavar="N",
        help="Rows of the table, for the memory estimate.",
    )
    group.add_argument(
        "--dim",
        type=_positive_int,
        default=default,
        metavar="D",
        help="Embedding dimension of the table, for the memory estimate.",
    )


def _fill(text: str) -> str:
    return textwrap.fill(text, width=79)


def _algorithm_list() -> str:
    width = max(len(d.name) for d in registry.DEFINITIONS)
    lines = []
    for d in registry.DEFINITIONS:
        lines.append(f"  {d.name:<{width}}  {d.proto_oneof:<28} {d.summary}")
    return "\n".join(lines)


_DESCRIBE_EPILOG = """\
ALGORITHM is an embedding class name in any case (adagrad, RMSProp) or the
engine's proto name (rms_prop). Options of one algorithm:
  {prog} describe ALGORITHM --help

examples:
  {prog} describe adam --vocabulary-size 1000000 --dim 64
  {prog} describe ftrl --learning-rate 0.05 --initial-accumulator-value 0.5
  {prog} describe rmsprop --momentum 0.9 --clipvalue=-1,2
  {prog} describe --from spec.txtpb
"""


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser (errors raise `UsageError`)."""
    from tf_tpu_embed_opt import __version__

    parser = _Parser(
        prog=PROG,
        description=(
            "One optimizer definition for Keras layers and TPU embedding tables: "
            "describe an embedding optimizer, or run the CPU demo."
        ),
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    describe = commands.add_parser(
        "describe",
        help="An embedding optimizer's proto, slots and memory per table.",
        description=_fill(
            "Print what the TPU embedding engine receives for an optimizer "
            "(OptimizationParameters in protobuf text format), its slot "
            "variables with their initial values, its TPU-exact Keras twin, "
            "and with --vocabulary-size and --dim the float32 memory of the "
            "table plus slots. Without ALGORITHM or --from: list the algorithms."
        ),
        epilog=_DESCRIBE_EPILOG.format(prog=PROG),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    describe.add_argument(
        "--list", action="store_true", help="List the algorithms and exit."
    )
    describe.add_argument(
        "--from",
        dest="source",
        metavar="FILE",
        help=(
            "Read an OptimizerSpec (tf_tpu_embed_opt.to_spec) in protobuf text "
            "format, or serialized; '-' reads stdin. Instead of ALGORITHM."
        ),
    )
    _add_size_options(describe, None)
    algorithms = describe.add_subparsers(
        dest="algorithm", metavar="ALGORITHM", title="algorithms"
    )
    for definition in registry.DEFINITIONS:
        sub = algorithms.add_parser(
            definition.name,
            help=definition.summary,
            description="\n\n".join(
                [
                    _fill(definition.summary),
                    "Update per looked-up row (η: learning rate, g: the row's "
                    f"summed gradient):\n  {definition.math}",
                    _fill(
                        "Defaults are those of tf_tpu_embed_opt.embedding."
                        f"{definition.name}. Floats are decimals, booleans "
                        "true/false, and none leaves an optional setting unset."
                    ),
                ]
            ),
            formatter_class=argparse.RawDescriptionHelpFormatter,
            allow_abbrev=False,
        )
        sub.set_defaults(definition=definition)
        _add_algorithm_options(sub, definition)
        _add_size_options(sub, argparse.SUPPRESS)

    demo = commands.add_parser(
        "demo",
        help="Train a small ranking model on CPU with the TPU-exact twins.",
        description=_fill(
            "Train a small synthetic click-through-rate model (three embedding "
            "tables and a dense tower) on CPU: the tables with the TPU-exact "
            "Keras twin of an embedding optimizer, the dense layers with "
            "keras.optimizers.Adam(1e-3). Then print the "
            "TPUEmbeddingConfiguration the same setup would send to a TPU. "
            "Exits with 1 if the loss did not fall."
        ),
        epilog=_fill(
            "Default learning rates of the tables (the loss is a mean over a "
            "batch of 256): "
            + ", ".join(
                f"{name.lower()} {rate:g}"
                for name, rate in _DEMO_LEARNING_RATES.items()
            )
            + "."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    checkpoint_cli.add_parser(commands)
    names = ",".join(d.name.lower() for d in registry.DEFINITIONS)
    demo.add_argument(
        "--optimizer",
        type=_demo_algorithm,
        default=registry.BY_NAME["Adagrad"],
        metavar="{" + names + "}",
        help="Embedding optimizer for the tables. Default: adagrad.",
    )
    demo.add_argument(
        "--learning-rate",
        type=parse_number,
        default=None,
        metavar="X",
        help="Learning rate of the tables' optimizer. Default: one suited to it.",
    )
    demo.add_argument(
        "--epochs",
        type=_positive_int,
        default=3,
        metavar="N",
        help="Passes over the data. Default: 3.",
    )
    demo.add_argument(
        "--seed",
        type=_non_negative_int,
        default=0,
        metavar="S",
        help="Seed of the data and the initial weights. Default: 0.",
    )
    return parser


def _demo_algorithm(text: str) -> Definition:
    try:
        return resolve_algorithm(text)
    except UsageError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


_DESCRIBE_VALUE_FLAGS = ("--list", "--help", "-h")


def _normalize_describe(tokens: Sequence[str]) -> List[str]:
    """`describe`'s arguments with ALGORITHM first and canonically spelled.

    argparse needs the algorithm's sub-command before its options and spelled
    exactly; users may write `describe --dim 64 adam --vocabulary-size 10`.
    A negative value after an option (`--clipvalue -1,2`) is attached with
    `=` so that argparse does not take it for an option.

    Raises:
      UsageError: An unknown algorithm, or ALGORITHM with --from or --list.
    """
    rest: List[str] = []
    algorithm: Optional[str] = None
    index = 0
    tokens = list(tokens)
    while index < len(tokens):
        token = tokens[index]
        if token == "--":
            positionals = tokens[index + 1 :]
            if positionals and algorithm is None:
                algorithm, positionals = positionals[0], positionals[1:]
            rest.extend(positionals)
            break
        if token.startswith("-") and len(token) > 1 and not _DECIMAL.match(token):
            takes_value = "=" not in token and token not in _DESCRIBE_VALUE_FLAGS
            if takes_value and index + 1 < len(tokens):
                value = tokens[index + 1]
                if (
                    value.startswith("-")
                    and not value.startswith("--")
                    and (value != "-h")
                ):
                    rest.append(f"{token}={value}")
                else:
                    rest.extend([token, value])
                index += 2
                continue
            rest.append(token)
        elif algorithm is None:
            algorithm = token
        else:
            rest.append(token)
        index += 1
    if algorithm is None:
        return rest
    definition = resolve_algorithm(algorithm)
    for token in rest:
        name = token.split("=", 1)[0]
        if name in ("--from", "--list"):
            raise UsageError(
                f"give either ALGORITHM ({definition.name}) or {name}, not both"
            )
    return [definition.name, *rest]


# ---------------------------------------------------------------------------
# describe


def _out(line: str = "") -> None:
    print(line, file=sys.stdout)


def _with_options(message: str, definition: Optional[Definition]) -> str:
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
        return f"{match.group(0)} ({_option(name)})"

    return re.sub(r"`(\w+)`", spell, message)


class _DynamicLearningRate:
    """Stands for a spec's dynamic learning rate, known only by its tag."""

    def __init__(self, tag: int) -> None:
        self.tag = tag

    def __call__(self) -> float:
        raise RuntimeError(
            f"the dynamic learning rate (tag {self.tag}) of an OptimizerSpec has "
            "no value outside TPUEmbedding"
        )

    def __repr__(self) -> str:
        return f"<dynamic learning rate, tag {self.tag}>"


def _rate_text(rate: Any) -> str:
    if isinstance(rate, float):
        return repr(proto.shortest_float(rate))
    if isinstance(rate, dict) and "class_name" in rate:  # a serialized schedule
        config = rate.get("config", {})
        shown = ", ".join(f"{k}={v!r}" for k, v in config.items() if k != "name")
        return f"{rate['class_name']}({shown})"
    return repr(rate)


def _keras_call(opt: Any, learning_rate: Any = None) -> str:
    """`Class(arguments)` for a Keras optimizer: the learning rate and non-defaults.

    Args:
      opt: The Keras optimizer.
      learning_rate: Shown instead of the configured learning rate, if given.
    """
    config = opt.get_config()
    defaults = type(opt)().get_config()
    rate = config.get("learning_rate") if learning_rate is None else learning_rate
    shown = [f"learning_rate={_rate_text(rate)}"]
    for key, value in config.items():
        if key in ("learning_rate", "name") or key not in defaults:
            continue
        if value != defaults[key]:
            shown.append(f"{key}={value!r}")
    return f"{type(opt).__name__}({', '.join(shown)})"


def _twin_line(opt: Any) -> str:
    arguments = embedding.arguments(opt)
    rate = arguments["learning_rate"]
    if callable(rate):
        # A Keras optimizer cannot report its config with a plain callable
        # learning rate; describe the twin of the same optimizer at rate 1.
        arguments["learning_rate"] = 1.0
        opt = embedding.class_for(embedding.definition_of(opt))(**arguments)
    try:
        twin = convert.to_keras(opt)
    except ValueError as error:
        return f"Keras twin: none. {error}"
    call = _keras_call(twin, rate if callable(rate) else None)
    return (
        "Keras twin (the engine's math on CPU/GPU, tf_tpu_embed_opt.to_keras):\n"
        f"  tf_tpu_embed_opt.optimizers.{call}"
    )


def memory_bytes(
    definition: Definition, vocabulary_size: int, dim: int
) -> Dict[str, int]:
    """float32 bytes of one table and its slots on the TPU.

    The engine's hidden gradient accumulator is not counted.

    Returns:
      `{"table": ..., "slots": ..., "total": ...}`.
    """
    table = vocabulary_size * dim * _BYTES_PER_VALUE
    slots = len(definition.slots) * table
    return {"table": table, "slots": slots, "total": table + slots}


def _memory_lines(
    opt: Any, definition: Definition, vocabulary_size: int, dim: int
) -> List[str]:
    sizes = memory_bytes(definition, vocabulary_size, dim)
    table, slots, total = sizes["table"], sizes["slots"], sizes["total"]
    rows = [
        (f"table  {vocabulary_size:,} x {dim} x 4", table, ""),
        (f"slots  {len(definition.slots)} x {table:,}", slots, ""),
        ("total", total, f" ({total / 2**20:,.1f} MiB)"),
    ]
    label_width = max(len(label) for label, _, _ in rows)
    number_width = len(f"{total:,}")
    lines = [
        f"Memory of one {vocabulary_size:,} x {dim} table and its slots (float32, "
        "4 bytes a value):"
    ]
    for label, value, suffix in rows:
        lines.append(
            f"  {label:<{label_width}} = {value:>{number_width},} bytes{suffix}"
        )
    if opt.use_gradient_accumulation:
        lines.append(
            f"  Not counted: the engine's hidden gradient accumulator ({table:,} "
            "bytes more while use_gradient_accumulation=True)."
        )
    return lines


def _describe_embedding(
    opt: Any,
    sizes: Optional[Tuple[int, int]],
    learning_rate_tag: Optional[int] = None,
) -> None:
    definition = embedding.definition_of(opt)
    if callable(opt.learning_rate) and learning_rate_tag is None:
        learning_rate_tag = 0
    parameters = proto.to_proto(opt, learning_rate_tag=learning_rate_tag)
    _out(repr(opt))
    _out(f"  tf_tpu_embed_opt.embedding.{definition.name}: {definition.summary}")
    _out(f"  Update per looked-up row: {definition.math}")
    _out()
    _out("OptimizationParameters (what the TPU engine receives):")
    sys.stdout.write(text_format.MessageToString(parameters))
    if callable(opt.learning_rate):
        _out(
            f"(learning_rate.dynamic.tag {learning_rate_tag}: TPUEmbedding calls "
            f"the learning-rate callable at every step: {opt.learning_rate!r})"
        )
    _out()
    hypers = {h.name: getattr(opt, h.name) for h in definition.hypers}
    if definition.slots:
        _out(
            "Slots (one float32 variable the shape of the table each; names of "
            f"the {definition.load_op} inputs):"
        )
        width = max(len(s.name) for s in definition.slots)
        for slot in definition.slots:
            start = slot.initial_value(hypers)
            source = f" ({slot.initial})" if isinstance(slot.initial, str) else ""
            _out(f"  {slot.name:<{width}}  initial value {start!r}{source}. {slot.doc}")
    else:
        _out("Slots: none.")
    _out()
    _out(_twin_line(opt))
    if sizes is not None:
        _out()
        for line in _memory_lines(opt, definition, *sizes):
            _out(line)


_CANNOT_RUN = {
    "ClippyAdagrad": (
        "ClippyAdagrad clips each update adaptively, by a factor computed from "
        "the weights and accumulators of the row (arXiv:2302.09178); the "
        "engine has only fixed gradient and weight bounds, so no embedding "
        "optimizer reproduces it. Train the tables with it on CPU/GPU, or use "
        "Adagrad with clipvalue on the TPU."
    ),
}


def _looks_like_text(data: bytes) -> bool:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    # A serialized OptimizerSpec starts with the tag byte 0x08 (spec_version).
    return not any(ord(c) < 32 and c not in "\t\n\r\f\v" for c in text)


def _read_spec(path: str) -> Any:
    """The `OptimizerSpec` in `path` (text format or serialized; '-': stdin)."""
    try:
        if path == "-":
            data = sys.stdin.buffer.read()
        else:
            data = pathlib.Path(path).read_bytes()
    except OSError as error:
        reason = error.strerror or str(error)
        raise UsageError(f"--from {path}: cannot read the file: {reason}") from None
    message = optimizer_spec.OptimizerSpec()
    if _looks_like_text(data):
        try:
            text_format.Parse(data.decode("utf-8"), message)
        except text_format.ParseError as error:
            raise UsageError(
                f"--from {path}: not an OptimizerSpec in protobuf text format: {error}"
            ) from None
        return message
    try:
        message.ParseFromString(data)
    except protobuf_message.DecodeError as error:
        raise UsageError(
            f"--from {path}: neither an OptimizerSpec in text format nor a "
            f"serialized one: {error}"
        ) from None
    return message


def _describe_from(path: str, sizes: Optional[Tuple[int, int]]) -> None:
    import keras

    message = _read_spec(path)
    tag: Optional[int] = None
    rate = None
    if (
        message.face == optimizer_spec.Face.EMBEDDING
        and message.learning_rate.WhichOneof("source") == "dynamic_tag"
    ):
        tag = message.learning_rate.dynamic_tag
        rate = _DynamicLearningRate(tag)
    try:
        opt = optimizer_spec.from_spec(message, learning_rate=rate)
    except (TypeError, ValueError) as error:
        raise UsageError(f"--from {path}: {error}") from None
    if not isinstance(opt, keras.optimizers.Optimizer):
        _out(f"From {path}: an embedding optimizer (OptimizerSpec face EMBEDDING).")
        _out()
        _describe_embedding(opt, sizes, tag)
        return
    _out(f"From {path}: a Keras optimizer (OptimizerSpec face KERAS).")
    _out(f"  tf_tpu_embed_opt.optimizers.{_keras_call(opt)}")
    name = type(opt).__name__
    try:
        engine_opt = convert.to_embedding(opt)
    except (TypeError, ValueError) as error:
        reason = _CANNOT_RUN.get(name, str(error))
        _out()
        _out(f"The TPU embedding engine cannot run {name}: {reason}")
        if sizes is not None:
            _out("No memory estimate: the engine cannot hold this optimizer's state.")
        return
    _out(
        "  The TPU embedding engine runs it exactly as the embedding optimizer "
        "below (tf_tpu_embed_opt.to_embedding)."
    )
    _out()
    _describe_embedding(engine_opt, sizes)


def _list_algorithms() -> None:
    _out("Algorithms (embedding class, engine proto name, summary):")
    _out(_algorithm_list())
    _out()
    _out(f"Options of one: {PROG} describe ALGORITHM --help")


def _describe(args: argparse.Namespace) -> int:
    sizes = None
    given = [
        name
        for name in ("vocabulary_size", "dim")
        if getattr(args, name, None) is not None
    ]
    if len(given) == 1:
        missing = "--dim" if given == ["vocabulary_size"] else "--vocabulary-size"
        present = _option(given[0])
        raise UsageError(
            f"{present} needs {missing} too: give both or neither "
            "(the memory estimate needs the table's rows and dimension)"
        )
    if given:
        sizes = (args.vocabulary_size, args.dim)
    definition = getattr(args, "definition", None)
    if args.list:
        if args.source is not None:
            raise UsageError("give either --list or --from, not both")
        _list_algorithms()
        return 0
    if args.source is not None:
        _describe_from(args.source, sizes)
        return 0
    if definition is None:
        if sizes is not None:
            raise UsageError("--vocabulary-size and --dim need ALGORITHM or --from")
        _list_algorithms()
        return 0
    arguments = {
        name: getattr(args, name)
        for name, _ in _parameters(definition)
        if hasattr(args, name)
    }
    try:
        opt = embedding.class_for(definition)(**arguments)
    except (TypeError, ValueError) as error:
        raise UsageError(_with_options(str(error), definition)) from None
    _describe_embedding(opt, sizes)
    return 0


# ---------------------------------------------------------------------------
# demo

# Learning rates with which every embedding optimizer gets close to its best
# held-out loss on the demo's data in three epochs. They look large because the
# loss is a mean over the batch, so a row's gradient is small: Adagrad's first
# steps, for instance, divide it by the square root of the initial accumulator.
_DEMO_LEARNING_RATES: Mapping[str, float] = {
    "SGD": 10.0,
    "Adagrad": 5.0,
    "AdagradMomentum": 0.1,
    "Adam": 0.01,
    "FTRL": 10.0,
    "Momentum": 3.0,
    "RMSProp": 0.03,
    "CenteredRMSProp": 0.03,
    "Adadelta": 30.0,
    "ProximalAdagrad": 5.0,
    "ProximalYogi": 0.1,
}

_DEMO_EXAMPLES = 32768
_DEMO_HELD_OUT = 8192
_DEMO_BATCH = 256
_DEMO_TENSOR_CORES = 8
# (feature, vocabulary size, embedding dimension)
_DEMO_TABLES = (("user_id", 2000, 16), ("item_id", 1000, 16), ("category", 50, 8))
_DEMO_DENSE_FEATURES = 4
_BIAS_SCALE = 1.0
_AFFINITY_SCALE = 0.7


def _zipf_ids(rng: np.random.Generator, vocabulary: int, count: int) -> np.ndarray:
    """Ids with Zipf-like popularity (p ∝ 1/rank^1.05), ranks shuffled."""
    weights = 1.0 / np.arange(1, vocabulary + 1) ** 1.05
    ranks = rng.choice(vocabulary, size=count, p=weights / weights.sum())
    return rng.permutation(vocabulary)[ranks].astype("int32")


def synthetic_ctr_data(
    seed: int, examples: int = _DEMO_EXAMPLES
) -> Tuple[Dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """A click-through-rate dataset with labels from a hidden logistic model.

    The hidden model adds a bias per user, item and category, a user-item
    affinity and a linear function of the dense features.

    Args:
      seed: Seed of numpy's generator.
      examples: Number of impressions.

    Returns:
      (features, labels, probabilities): `user_id`, `item_id`, `category`
      (int32 ids) and `dense` (float32, `[examples, 4]`); float32 labels
      `[examples, 1]`; the hidden model's click probabilities `[examples]`.
    """
    rng = np.random.default_rng(seed)
    (_, users, _), (_, items, _), (_, categories, _) = _DEMO_TABLES
    user = _zipf_ids(rng, users, examples)
    item = _zipf_ids(rng, items, examples)
    item_category = rng.integers(0, categories, size=items).astype("int32")
    category = item_category[item]
    dense = rng.normal(size=(examples, _DEMO_DENSE_FEATURES)).astype("float32")
    user_taste = rng.normal(size=(users, 2))
    item_profile = rng.normal(size=(items, 2))
    logits = (
        rng.normal(scale=_BIAS_SCALE, size=users)[user]
        + rng.normal(scale=_BIAS_SCALE, size=items)[item]
        + rng.normal(scale=_BIAS_SCALE, size=categories)[category]
        + _AFFINITY_SCALE * np.sum(user_taste[user] * item_profile[item], axis=1)
        + dense @ rng.normal(scale=0.5, size=_DEMO_DENSE_FEATURES)
        - 0.5
    )
    probabilities = 1.0 / (1.0 + np.exp(-logits))
    labels = rng.random(examples) < probabilities
    features = {"user_id": user, "item_id": item, "category": category, "dense": dense}
    return features, labels.astype("float32")[:, None], probabilities


def _cross_entropy(labels: np.ndarray, probabilities: np.ndarray) -> float:
    p = np.clip(probabilities, 1e-7, 1 - 1e-7)
    return float(-np.mean(labels * np.log(p) + (1 - labels) * np.log(1 - p)))


def _ranking_model() -> Tuple[Any, List[Any]]:
    import keras

    inputs = {
        name: keras.Input(shape=(), dtype="int32", name=name)
        for name, _, _ in _DEMO_TABLES
    }
    inputs["dense"] = keras.Input(shape=(_DEMO_DENSE_FEATURES,), name="dense")
    tables = [
        keras.layers.Embedding(vocabulary, dim, name=f"{name}_table")
        for name, vocabulary, dim in _DEMO_TABLES
    ]
    embedded = [
        table(inputs[name]) for table, (name, _, _) in zip(tables, _DEMO_TABLES)
    ]
    tower = keras.layers.Concatenate()([*embedded, inputs["dense"]])
    tower = keras.layers.Dense(32, activation="relu", name="hidden")(tower)
    logits = keras.layers.Dense(1, name="logit")(tower)
    return keras.Model(inputs, logits, name="ctr_ranking"), tables


def _demo_configuration(optimizer: Any) -> Any:
    """The `TPUEmbeddingConfiguration` for the demo's tables on one TPU host."""
    import tensorflow as tf

    from tf_tpu_embed_opt.configuration import tpu_embedding_configuration

    E = tf.tpu.experimental.embedding
    per_replica = _DEMO_BATCH // _DEMO_TENSOR_CORES
    feature_config = {}
    for name, vocabulary, dim in _DEMO_TABLES:
        table = E.TableConfig(vocabulary_size=vocabulary, dim=dim, name=name)
        feature_config[name] = E.FeatureConfig(
            table=table, output_shape=[per_replica], name=name
        )
    return tpu_embedding_configuration(
        feature_config, optimizer, num_hosts=1, num_tensor_cores=_DEMO_TENSOR_CORES
    )


def _demo_verdict(losses: List[float], held_out: List[float], scale: str) -> int:
    """Says whether the training loss fell; 1 if it did not."""
    first, last = losses[0], losses[-1]
    if not all(math.isfinite(x) for x in losses):
        _out(
            f"The loss is not finite ({last}): the learning rate is unusable here. "
            "Try another --learning-rate."
        )
        return 1
    if len(losses) == 1:
        _out(f"One epoch: nothing to compare; run more epochs to see it fall. {scale}")
        return 0
    if last < first:
        _out(
            f"The loss fell from {first:.4f} (epoch 1) to {last:.4f} (epoch "
            f"{len(losses)}); held out: {held_out[0]:.4f} -> {held_out[-1]:.4f}. "
            f"{scale}"
        )
        return 0
    _out(
        f"The loss did not fall: {first:.4f} (epoch 1), {last:.4f} (epoch "
        f"{len(losses)}). Try another --learning-rate."
    )
    return 1


def _demo(args: argparse.Namespace) -> int:
    import keras
    import tensorflow as tf

    started = time.perf_counter()
    definition: Definition = args.optimizer
    rate = args.learning_rate
    if rate is None:
        rate = _DEMO_LEARNING_RATES[definition.name]
    try:
        table_optimizer = embedding.class_for(definition)(learning_rate=rate)
    except (TypeError, ValueError) as error:
        raise UsageError(_with_options(str(error), definition)) from None
    twin = convert.to_keras(table_optimizer)
    dense_optimizer = keras.optimizers.Adam(learning_rate=1e-3)

    keras.utils.set_random_seed(args.seed)
    features, labels, probabilities = synthetic_ctr_data(
        args.seed, _DEMO_EXAMPLES + _DEMO_HELD_OUT
    )
    train = {name: values[:_DEMO_EXAMPLES] for name, values in features.items()}
    test = {name: values[_DEMO_EXAMPLES:] for name, values in features.items()}
    train_labels, test_labels = labels[:_DEMO_EXAMPLES], labels[_DEMO_EXAMPLES:]
    click_rate = float(train_labels.mean())
    baseline = _cross_entropy(test_labels[:, 0], np.full(_DEMO_HELD_OUT, click_rate))
    hidden = _cross_entropy(test_labels[:, 0], probabilities[_DEMO_EXAMPLES:])

    model, tables = _ranking_model()
    table_variables = [table.embeddings for table in tables]
    table_ids = {id(v) for v in table_variables}
    dense_variables = [v for v in model.trainable_variables if id(v) not in table_ids]
    twin.build(table_variables)
    dense_optimizer.build(dense_variables)
    loss_function = keras.losses.BinaryCrossentropy(from_logits=True)
    split = len(table_variables)

    @tf.function
    def train_step(batch: Dict[str, Any], batch_labels: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = loss_function(batch_labels, model(batch, training=True))
        gradients = tape.gradient(loss, table_variables + dense_variables)
        # Embedding gradients arrive as tf.IndexedSlices: the twin sums
        # duplicate ids and updates only the looked-up rows, as the engine does.
        twin.apply(gradients[:split], table_variables)
        dense_optimizer.apply(gradients[split:], dense_variables)
        return loss

    @tf.function
    def evaluate(batch: Dict[str, Any], batch_labels: Any) -> Any:
        return loss_function(batch_labels, model(batch, training=False))

    tables_text = ", ".join(f"{n} {v:,} x {d}" for n, v, d in _DEMO_TABLES)
    _out(
        f"Data: {_DEMO_EXAMPLES:,} synthetic impressions to train on and "
        f"{_DEMO_HELD_OUT:,} held out (seed {args.seed}); click rate "
        f"{click_rate:.1%}; Zipf-distributed ids, {_DEMO_DENSE_FEATURES} dense "
        "features."
    )
    _out(
        f"Model: embedding tables {tables_text}, concatenated with the dense "
        "features -> Dense(32, relu) -> Dense(1); binary cross-entropy."
    )
    _out(f"Tables: {table_optimizer!r} on a TPU;")
    _out(
        "        here its TPU-exact Keras twin "
        f"tf_tpu_embed_opt.optimizers.{_keras_call(twin)}."
    )
    _out(f"Dense:  keras.optimizers.{_keras_call(dense_optimizer)}.")
    _out()

    rng = np.random.default_rng(args.seed + 1)
    steps = _DEMO_EXAMPLES // _DEMO_BATCH
    verbose = 1 if sys.stdout.isatty() else 2
    test_batch = {name: tf.constant(values) for name, values in test.items()}
    losses: List[float] = []
    held_out: List[float] = []
    for epoch in range(1, args.epochs + 1):
        _out(f"Epoch {epoch}/{args.epochs}")
        progress = keras.utils.Progbar(
            steps, verbose=verbose, stateful_metrics=["loss"], unit_name="step"
        )
        order = rng.permutation(_DEMO_EXAMPLES)
        total = 0.0
        for step in range(steps):
            index = order[step * _DEMO_BATCH : (step + 1) * _DEMO_BATCH]
            batch = {name: tf.constant(values[index]) for name, values in train.items()}
            total += float(train_step(batch, tf.constant(train_labels[index])))
            progress.update(step + 1, values=[("loss", total / (step + 1))])
        losses.append(total / steps)
        held_out.append(float(evaluate(test_batch, tf.constant(test_labels))))
        _out(f"epoch {epoch}: loss {losses[-1]:.4f} (held out {held_out[-1]:.4f})")
    _out()
    scale = (
        f"For scale, on the held-out data: predicting the click rate gives "
        f"{baseline:.4f}, the hidden model that drew the labels {hidden:.4f}."
    )
    status = _demo_verdict(losses, held_out, scale)

    config = _demo_configuration(table_optimizer)
    _out()
    _out(
        "TPUEmbeddingConfiguration the same tables would send to a TPU "
        f"(num_hosts=1, num_tensor_cores={_DEMO_TENSOR_CORES}, batch {_DEMO_BATCH}"
        f" = {_DEMO_BATCH // _DEMO_TENSOR_CORES} per replica):"
    )
    sys.stdout.write(text_format.MessageToString(config))
    _out()
    _out(
        f"Trained and configured in {time.perf_counter() - started:.1f} s "
        "(after importing TensorFlow)."
    )
    return status


# ---------------------------------------------------------------------------
# main


def _error(message: str) -> None:
    line = " ".join(message.split())
    print(f"{PROG}: error: {line}", file=sys.stderr)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the command line.

    Args:
      argv: The arguments after the program name; `sys.argv[1:]` if None.

    Returns:
      The exit status: 0 on success, 2 for a usage error (reported in one line
      on stderr), 1 when the demo's loss did not fall.
    """
    tokens = list(sys.argv[1:] if argv is None else argv)
    try:
        if tokens and tokens[0] == "describe":
            tokens = ["describe", *_normalize_describe(tokens[1:])]
        parser = build_parser()
        try:
            args, extras = parser.parse_known_args(tokens)
        except SystemExit as exit_:  # --help, --version
            return exit_.code if isinstance(exit_.code, int) else 0
        if extras:
            command = [args.command]
            if getattr(args, "definition", None) is not None:
                command.append(args.definition.name)
            raise UsageError(
                f"unrecognized arguments for {' '.join(command)}: {' '.join(extras)}",
                hint=f"see `{PROG} {' '.join(command)} --help`",
            )
        if args.command == "describe":
            return _describe(args)
        if args.command == "checkpoint":
            return checkpoint_cli.run(args)
        return _demo(args)
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
