"""`checkpoint`'s command line: the `inspect` and `convert` actions and
their options (the jax-tpu-embedding and keras-rs ones are `checkpoint_jax`'s).
Imports no TensorFlow.
"""

from __future__ import annotations

import argparse
from typing import Any

from tf_tpu_embed_opt.checkpoints import formats
from tf_tpu_embed_opt.cli import checkpoint_jax

__all__ = ["add_parser"]


def add_parser(subparsers: Any) -> None:
    """Adds the `checkpoint` command to the command line's subparsers."""
    checkpoint = subparsers.add_parser(
        "checkpoint",
        help="Inspect or convert embedding checkpoints (tables and slots).",
        description=(
            "Inspect or convert the embedding tables of a checkpoint with "
            "their optimizer slots. The checkpoint may be "
            f"{formats.described(formats.READ)}; its format is detected."
        ),
        allow_abbrev=False,
    )
    actions = checkpoint.add_subparsers(
        dest="checkpoint_command", metavar="ACTION", required=True
    )
    _add_inspect(actions)
    _add_convert(actions)


def _add_inspect(actions: Any) -> None:
    inspect = actions.add_parser(
        "inspect",
        help="Tables, shapes, slots, fitting algorithms, bytes and step.",
        description=(
            "List every table of the checkpoint with its shape, dtype, slots, "
            "the engine algorithms whose slots these are, and its bytes "
            "(table plus slots), and the step the checkpoint records; of "
            "SparseCore's and jax-tpu-embedding's stacked layouts, each stack "
            "and the place of its tables."
        ),
        allow_abbrev=False,
    )
    inspect.set_defaults(command_path="checkpoint inspect")
    inspect.add_argument(
        "path", metavar="PATH", help="Checkpoint prefix, directory or orbax step."
    )
    _add_object_path(inspect)
    inspect.add_argument(
        "--step-path",
        metavar="PATH",
        help=(
            "Of a TensorFlow checkpoint: the step is the variable at PATH "
            "(e.g. global_step). Default: step."
        ),
    )
    inspect.add_argument(
        "--json", action="store_true", help="Print JSON instead of a table."
    )
    checkpoint_jax.add_keras_rs_arguments(inspect)


_CONVERT_CASES = """\
Read SRC table by table, with its optimizer slots, and write DST, which
becomes discoverable only once complete. SRC may be any checkpoint `inspect`
reads.

Common cases (%(prog)s ...):
  SRC DST                                  TPUEmbedding's layout (the default)
  SRC DST --tables a,b --rename b=c        only some tables, renamed
  SRC DST --layouts-from CKPT --algorithm adam
                                           SparseCore's layout, stacked as CKPT
  SRC ROOT --to-jax 4x4                    a jax-tpu-embedding step (4 chips,
                                           4 SparseCores each)
  SRC ROOT --to-jax 4x4 --items-from STEP --keras-rs-features m:FEATURES
      --keras-rs-topology 4x4              a keras-rs job's step, over its STEP
"""


class _CasesFormatter(argparse.HelpFormatter):
    """Wraps paragraphs as argparse does, and keeps indented lines (the
    common cases) as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        blocks = []
        for block in text.split("\n\n"):
            lines = block.splitlines()
            if any(line.startswith("  ") for line in lines):
                blocks.append("\n".join(indent + line for line in lines))
            else:
                blocks.append(super()._fill_text(block, width, indent))
        return "\n\n".join(blocks)


def _add_convert(actions: Any) -> None:
    convert = actions.add_parser(
        "convert",
        help="Rewrite tables and slots, table by table, in another layout.",
        usage="%(prog)s [options] SRC DST",
        description=_CONVERT_CASES,
        formatter_class=_CasesFormatter,
        allow_abbrev=False,
    )
    convert.set_defaults(command_path="checkpoint convert")
    convert.add_argument(
        "source", metavar="SRC", help="Checkpoint prefix, directory or orbax step."
    )
    convert.add_argument(
        "destination",
        metavar="DST",
        help="Prefix to write (with --to-jax: the orbax root directory).",
    )
    tables = convert.add_argument_group("which tables, and their algorithm")
    tables.add_argument(
        "--tables",
        metavar="T1,T2",
        help="Write only these tables (default: all).",
    )
    tables.add_argument(
        "--rename",
        action="append",
        default=[],
        metavar="OLD=NEW",
        help="Rename a table of SRC in DST (repeatable).",
    )
    tables.add_argument(
        "--algorithm",
        action="append",
        default=[],
        metavar="[TABLE=]NAME",
        help=(
            "Require a table's slots to be those of an engine algorithm "
            "(e.g. adam, or user=adagrad with TABLE as named in SRC); without "
            "TABLE= for every other table."
        ),
    )
    layouts = convert.add_argument_group(
        "TensorFlow's layouts",
        "The default DST: TPUEmbedding's layout; with --layouts-from, SparseCore's.",
    )
    _add_object_path(layouts)
    layouts.add_argument(
        "--to-object-path",
        default="embedding",
        metavar="PATH",
        help="Object path of the embedding in DST. Default: embedding.",
    )
    layouts.add_argument(
        "--layouts-from",
        metavar="SPARSECORE_CHECKPOINT",
        help=(
            "Write DST in SparseCore's (TPUEmbeddingV2) layout, stacked, "
            "padded and sharded as this checkpoint's layouts say (the TPU "
            "job's). Needs --algorithm for each table; writes no step."
        ),
    )
    layouts.add_argument(
        "--step-path",
        metavar="PATH",
        help=(
            "Copy the step variable at PATH (e.g. step) into DST at the same "
            "path; an orbax SRC's step (it has no variables) goes there."
        ),
    )
    checkpoint_jax.add_arguments(convert)
    checkpoint_jax.add_keras_rs_arguments(convert)


def _add_object_path(parser: Any) -> None:
    parser.add_argument(
        "--object-path",
        metavar="PATH",
        help=(
            "Object path of the embedding in the checkpoint (e.g. embedding or "
            "model/tpu_embedding). Default: the one object holding tables "
            "with slots."
        ),
    )
