"""`demo`: why the package exists, on a small ranking model, in seconds on CPU.

The demo trains the same synthetic click-through-rate model twice, from the
same initial weights on the same batches: once with the TPU-exact Keras twin
of an embedding optimizer for the tables (what the TPU embedding engine
computes: a row's duplicate ids summed, one step per looked-up row), once with
the stock `keras.optimizers` class given the same arguments (which applies
each duplicate of a sparse gradient on its own). Ids follow a Zipf law, so a
batch repeats its popular ids many times. It prints one line per epoch and
run, a table of both runs, how far apart the tables are after the first step,
an honest verdict and a line summing up the `TPUEmbeddingConfiguration` the
same tables would send to a TPU (`--show-configuration`: the whole message);
`--plot FILE.png` draws both loss curves (needs matplotlib).

Exit status: 0 when the twin's run ends finite, better than predicting the
click rate on held-out data, and with tables that moved; 1 otherwise; 2 for
usage errors.

On Keras's JAX backend the twin's tables are `tf_tpu_embed_opt.layers.Embedding`s
(the rows step in the backward pass) and the stock run's are
`keras.layers.Embedding`s; without TensorFlow the jax-tpu-embedding spec is
shown instead of the `TPUEmbeddingConfiguration`.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import pathlib
from typing import Any, Mapping

from tf_tpu_embed_opt.cli import allocator
from tf_tpu_embed_opt.cli.parser import (
    UsageError,
    algorithm_type,
    fill,
    parse_non_negative_int,
    parse_number,
    parse_positive_int,
    with_options,
)
from tf_tpu_embed_opt.definitions import arguments, registry

__all__ = ["add_parser", "run"]

# Learning rates with which every embedding optimizer gets close to its best
# held-out loss on the demo's data in three epochs (each definition's
# `demo_learning_rate`). They look large because the loss is a mean over the
# batch, so a row's gradient is small: Adagrad's first steps, for instance,
# divide it by the square root of the initial accumulator.
DEMO_LEARNING_RATES: Mapping[str, float] = {
    d.name: (
        d.learning_rate_default
        if d.demo_learning_rate is None
        else d.demo_learning_rate
    )
    for d in registry.DEFINITIONS
}

# Adam shows the most: TPU Adam (lazy, epsilon inside the square root, no bias
# correction) and stock Keras Adam part on the first step.
_DEFAULT_OPTIMIZER = "Adam"

_MAX_SEED = 2**32 - 1

_PLOT_EXTRA = (
    "the `[plot]` extra (pip install '.[plot]' from a checkout, or pip install "
    "matplotlib)"
)


_DESCRIPTION = (
    "Train the same small click-through-rate model (three embedding "
    "tables with Zipf-distributed, duplicate-heavy ids, and a dense "
    "tower) twice on CPU, from the same weights on the same batches: "
    "the tables once with the TPU-exact Keras twin of an embedding "
    "optimizer (what the TPU computes: a row's duplicate ids summed, "
    "one step per row) and once with the stock keras.optimizers class "
    "given the same arguments (which applies each duplicate on its "
    "own); the dense layers with keras.optimizers.Adam(1e-3). Prints "
    "one line per epoch, a table of both runs and a line summing up "
    "the TPUEmbeddingConfiguration the tables would send to a TPU "
    "(--show-configuration prints it whole). Exits "
    "with 1 when the twin's run ends with a non-finite loss, no better "
    "than predicting the click rate on held-out data, or with tables "
    "that did not move. On Keras's JAX backend the twin's tables are "
    "tf_tpu_embed_opt.layers.Embedding (row-sparse steps in the "
    "backward pass)."
)


def add_parser(subparsers: Any) -> None:
    """Adds `demo` to `subparsers`."""
    demo = subparsers.add_parser(
        "demo",
        help="Train a ranking model with stock Keras and with the TPU-exact twin.",
        description=fill(_DESCRIPTION),
        epilog=fill(
            "Default learning rates of the tables (the loss is a mean over a "
            "batch of 256): "
            + ", ".join(
                f"{name.lower()} {rate:g}" for name, rate in DEMO_LEARNING_RATES.items()
            )
            + "."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    names = ",".join(d.name.lower() for d in registry.DEFINITIONS)
    demo.add_argument(
        "--optimizer",
        type=algorithm_type,
        default=registry.BY_NAME[_DEFAULT_OPTIMIZER],
        metavar="{" + names + "}",
        help=(
            "Embedding optimizer for the tables. Default: "
            f"{_DEFAULT_OPTIMIZER.lower()}."
        ),
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
        type=parse_positive_int,
        default=3,
        metavar="N",
        help="Passes over the data (at most 100). Default: 3.",
    )
    demo.add_argument(
        "--seed",
        type=parse_non_negative_int,
        default=0,
        metavar="S",
        help="Seed of the data and the initial weights (< 2**32). Default: 0.",
    )
    demo.add_argument(
        "--show-configuration",
        action="store_true",
        help=(
            "Print the whole TPUEmbeddingConfiguration the tables would send "
            "to a TPU (protobuf text, about 90 lines). Default: one line "
            "summing it up."
        ),
    )
    demo.add_argument(
        "--plot",
        metavar="FILE.png",
        default=None,
        help=(
            "Draw both runs' loss curves into this PNG file (needs matplotlib: "
            "pip install '.[plot]' from a checkout)."
        ),
    )


def _check_plot_path(path: str) -> None:
    if importlib.util.find_spec("matplotlib") is None:
        raise UsageError(
            f"--plot needs matplotlib, which is not installed: {_PLOT_EXTRA}"
        )
    if not path.lower().endswith(".png"):
        raise UsageError(f"--plot {path}: the file name must end with .png")
    parent = pathlib.Path(path).expanduser().resolve().parent
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise UsageError(f"--plot {path}: cannot write into {parent}")


# ---------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    """Runs `demo`; returns 0 if the twin's run learnt, 1 if not."""
    if args.epochs > 100:
        raise UsageError(f"--epochs {args.epochs}: at most 100 (3 show the point)")
    if args.seed > _MAX_SEED:
        raise UsageError(
            f"--seed {args.seed}: at most {_MAX_SEED} (the seeds of numpy and "
            "Keras are 32-bit)"
        )
    if args.plot is not None:
        _check_plot_path(args.plot)

    rate = args.learning_rate
    if rate is None:
        rate = DEMO_LEARNING_RATES[args.optimizer.name]
    try:
        # The embedding class's checks, from the definitions: a bad learning
        # rate answers before TensorFlow or Keras loads.
        arguments.Checked(args.optimizer, learning_rate=rate)
    except (TypeError, ValueError) as error:
        raise UsageError(with_options(str(error), args.optimizer)) from None

    # A program that trains: glibc keeps the memory its steps free (the
    # library itself leaves a process's allocator alone).
    allocator.keep_freed_memory()
    # The work lives in its own module: numpy, TensorFlow and Keras load only
    # now, so that `demo --help` and usage errors stay instant.
    from tf_tpu_embed_opt.cli import demo_training

    return demo_training.run(args, rate)
