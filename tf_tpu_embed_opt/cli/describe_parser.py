"""`describe`'s command line: its options, derived from the definitions.

One sub-parser per algorithm of the registry, with one option per argument of
its embedding class (or, for an algorithm the TensorFlow engines do not have,
of its spec or twin), its help text from the definition; and
`normalize_arguments`, which lets users write options before ALGORITHM and
ALGORITHM in any spelling. Imports no TensorFlow.
"""

from __future__ import annotations

import argparse
from typing import Any, Dict, List, Optional, Sequence, Tuple

from tf_tpu_embed_opt.cli.parser import (
    DECIMAL,
    PROG,
    UsageError,
    add_verbose_option,
    fill,
    option,
    parse_clipvalue,
    parse_flag,
    parse_number,
    parse_optional_flag,
    parse_optional_number,
    parse_table_extent,
    resolve_algorithm,
    show,
)
from tf_tpu_embed_opt.definitions import registry, spec
from tf_tpu_embed_opt.definitions.spec import Definition

__all__ = ["add_parser", "algorithm_list", "normalize_arguments", "parameters"]


def _common_help(name: str) -> str:
    """The definitions' text of a shared argument, as the command line spells
    it (`none`; `--clipvalue` takes C or MIN,MAX)."""
    text = spec.COMMON_DOCS[name].replace("None", "none")
    if name == "clipvalue":
        text += (
            " Written C or MIN,MAX, an empty side for no bound (--clipvalue=-1,2 "
            "when MIN is negative)."
        )
    return text


def parameters(definition: Definition) -> List[Tuple[str, Any]]:
    """(name, default) of the options of `definition`, in signature order.

    `slot_variable_creation_fn` (a callable) has no command-line form.
    """
    hypers = definition.hyper
    parameters = []
    for name in definition.parameter_names:
        if name == "slot_variable_creation_fn":
            continue
        if name == "learning_rate":
            default = definition.learning_rate_default
        elif name in hypers:
            default = hypers[name].default
        else:
            default = spec.COMMON_DEFAULTS[name]
        parameters.append((name, default))
    return parameters


def _add_algorithm_options(
    parser: argparse.ArgumentParser, definition: Definition
) -> None:
    hypers = definition.hyper
    group = parser.add_argument_group(f"{definition.name} arguments")
    for name, default in parameters(definition):
        kwargs: Dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS}
        if name == "learning_rate":
            kwargs.update(type=parse_number, metavar="X", help="Learning rate (>= 0).")
        elif name in hypers:
            hyper = hypers[name]
            if hyper.kind == "bool":
                kwargs.update(type=parse_flag, metavar="{true,false}", help=hyper.doc)
            else:
                allowed = f" Must be {hyper.bounds.describe()}." if hyper.bounds else ""
                kwargs.update(type=parse_number, metavar="X", help=hyper.doc + allowed)
        elif name == "clipvalue":
            kwargs.update(
                type=parse_clipvalue, metavar="C|MIN,MAX|none", help=_common_help(name)
            )
        elif name == "multiply_weight_decay_factor_by_learning_rate":
            kwargs.update(
                type=parse_optional_flag,
                metavar="{true,false,none}",
                help=_common_help(name),
            )
        elif default is None:
            kwargs.update(
                type=parse_optional_number, metavar="X|none", help=_common_help(name)
            )
        else:
            kwargs.update(
                type=parse_flag, metavar="{true,false}", help=_common_help(name)
            )
        kwargs["help"] = f"{kwargs['help']} Default: {show(default)}."
        group.add_argument(option(name), **kwargs)


def _add_size_options(parser: argparse.ArgumentParser, default: Any) -> None:
    group = parser.add_argument_group("table size (give both or neither)")
    group.add_argument(
        "--vocabulary-size",
        type=parse_table_extent,
        default=default,
        metavar="N",
        help="Rows of the table, for the memory estimate.",
    )
    group.add_argument(
        "--dim",
        type=parse_table_extent,
        default=default,
        metavar="D",
        help="Embedding dimension of the table, for the memory estimate.",
    )


def _add_engine_option(parser: argparse.ArgumentParser, default: Any) -> None:
    parser.add_argument(
        "--engine",
        choices=spec.ENGINES,
        default=default,
        help=(
            "Also report what this engine does with the optimizer: "
            "TPUEmbeddingV2 (SparseCore) lists what it receives, drops and "
            "refuses; exit status 2 if it cannot run it. Without --engine: "
            "what TPUEmbedding receives, status 0 where none runs it."
        ),
    )


def algorithm_list() -> str:
    width = max(len(d.name) for d in registry.ALL)
    lines = []
    for d in registry.ALL:
        if d.tensorflow_engines:
            engine = d.proto_oneof
        elif d.jax is not None:
            engine = f"({spec.JAX_ENGINE} only)"
        elif d.engine_refusal is not None:
            engine = "(no engine; Keras only)"
        else:
            engine = f"({spec.JAX_ENGINE}, custom)"
        lines.append(f"  {d.name:<{width}}  {engine:<28} {d.summary}")
    return "\n".join(lines)


def _defaults_text(definition: Definition) -> str:
    """Where an algorithm's defaults come from, for its `--help`."""
    if definition.tensorflow_engines:
        return f"Defaults are those of tf_tpu_embed_opt.embedding.{definition.name}."
    if definition.jax is not None:
        return (
            f"Only engine {spec.JAX_ENGINE} has it; defaults are those of its "
            f"{definition.jax.spec_class}."
        )
    if definition.engine_refusal is not None:
        return (
            f"No engine runs it: {definition.engine_refusal}. Defaults "
            f"are those of tf_tpu_embed_opt.optimizers.{definition.keras.name}."
        )
    return (
        f"No engine has it built in; {spec.JAX_ENGINE} runs it as a custom "
        "optimizer. Defaults are those of tf_tpu_embed_opt.optimizers."
        f"{definition.keras.name}."
    )


def update_words(definition: Definition) -> str:
    """How `describe` introduces the algorithm's update (its `math`)."""
    if definition.factor is None:
        return "Update per looked-up row"
    return "Update of the looked-up rows, scaled per variable"


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


def add_parser(subparsers: Any) -> None:
    """Adds `describe` and one sub-parser per algorithm to `subparsers`."""
    describe = subparsers.add_parser(
        "describe",
        help="An embedding optimizer's proto, slots and memory per table.",
        description=fill(
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
    # None: no engine named, so no verdict asked (TPUEmbedding is described).
    _add_engine_option(describe, None)
    algorithms = describe.add_subparsers(
        dest="algorithm", metavar="ALGORITHM", title="algorithms"
    )
    for definition in registry.ALL:
        sub = algorithms.add_parser(
            definition.name,
            help=definition.summary,
            description="\n\n".join(
                [
                    fill(definition.summary),
                    f"{update_words(definition)} (η: learning rate, g: the "
                    f"row's summed gradient):\n  {definition.math}",
                    fill(
                        _defaults_text(definition)
                        + " Floats are decimals, booleans true/false, and none "
                        "leaves an optional setting unset."
                    ),
                ]
            ),
            formatter_class=argparse.RawDescriptionHelpFormatter,
            allow_abbrev=False,
        )
        sub.set_defaults(
            definition=definition, command_path=f"describe {definition.name}"
        )
        _add_algorithm_options(sub, definition)
        _add_size_options(sub, argparse.SUPPRESS)
        _add_engine_option(sub, argparse.SUPPRESS)
        add_verbose_option(sub, argparse.SUPPRESS)


_DESCRIBE_VALUE_FLAGS = ("--list", "--help", "-h", "--verbose")


def normalize_arguments(tokens: Sequence[str]) -> List[str]:
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
        if token.startswith("-") and len(token) > 1 and not DECIMAL.match(token):
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
