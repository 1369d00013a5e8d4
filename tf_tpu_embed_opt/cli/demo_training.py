"""The demo's work: the two training runs, the table and the plot.

`tf_tpu_embed_opt.cli.demo` parses and checks the command line, then imports
this module (and with it numpy and Keras) and calls `run`; see that module for
what the demo shows. The training steps are `cli.demo_tensorflow`'s
(`tf.function`, a `GradientTape`) or, on Keras's JAX backend, `cli.demo_jax`'s,
where the twin's tables are `tf_tpu_embed_opt.layers.Embedding`s; TensorFlow is
imported only where it is used.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from typing import Any, Dict, List, Mapping, Optional, Tuple

import keras
import numpy as np

from tf_tpu_embed_opt.cli.demo_data import (
    BATCH,
    DENSE_FEATURES,
    EXAMPLES,
    HELD_OUT,
    TABLES,
    cross_entropy,
    ranking_model,
    synthetic_ctr_data,
)
from tf_tpu_embed_opt.cli.demo_plot import plot_losses
from tf_tpu_embed_opt.cli.describe import keras_call
from tf_tpu_embed_opt.cli.parser import UsageError, counted, fill, out, with_options
from tf_tpu_embed_opt.conversions import faces as convert
from tf_tpu_embed_opt.definitions import arguments, registry
from tf_tpu_embed_opt.definitions.spec import Definition
from tf_tpu_embed_opt.errors import tensorflow_installed, tensorflow_op_errors

__all__ = ["run", "synthetic_ctr_data", "plot_losses", "DemoRun"]

_DEMO_TENSOR_CORES = 8
# Table rows closer than this after the first step count as equal: the two runs
# compute singly looked-up rows with the same formula, up to float32 rounding.
_SAME_ROW_TOLERANCE = 1e-6


# ---------------------------------------------------------------------------
# Training.


class DemoRun:
    """The record of one training run.

    Attributes:
      label: How the run is named in the output.
      losses: Mean training loss of each finished epoch.
      held_out: Held-out loss after each finished epoch.
      step_losses: The training loss of every step.
      first_step_tables: The tables' values after the first step.
      first_batch: The ids of each table in the first batch.
      tables_moved: Whether any table differs from its initial value at the
        end.
    """

    def __init__(self, label: str) -> None:
        self.label = label
        self.losses: List[float] = []
        self.held_out: List[float] = []
        self.step_losses: List[float] = []
        self.first_step_tables: List[np.ndarray] = []
        self.first_batch: List[np.ndarray] = []
        self.tables_moved = False

    @property
    def finite(self) -> bool:
        values = self.losses + self.held_out
        return bool(values) and all(math.isfinite(x) for x in values)


def _train(
    run: DemoRun,
    table_optimizer: Any,
    data: Mapping[str, Any],
    epochs: int,
    seed: int,
    row_sparse: bool = False,
) -> None:
    """Trains a fresh model, seeded by `seed`, with `table_optimizer`.

    With `row_sparse` (Keras's JAX backend) the tables are
    `layers.Embedding`s, each with its own copy of `table_optimizer`.
    """
    # The same seed gives both runs the same initial weights and batches.
    keras.utils.set_random_seed(seed)
    model, tables = ranking_model(table_optimizer if row_sparse else None)
    table_variables = [table.embeddings for table in tables]
    dense_optimizer = keras.optimizers.Adam(learning_rate=1e-3)
    loss_function = keras.losses.BinaryCrossentropy(from_logits=True)
    if keras.backend.backend() == "jax":
        from tf_tpu_embed_opt.cli import demo_jax

        train_step, evaluate, table_values = demo_jax.steps(
            model,
            table_variables,
            None if row_sparse else table_optimizer,
            dense_optimizer,
            loss_function,
        )
    else:
        from tf_tpu_embed_opt.cli import demo_tensorflow

        train_step, evaluate, table_values = demo_tensorflow.steps(
            model, table_variables, table_optimizer, dense_optimizer, loss_function
        )

    rng = np.random.default_rng(seed + 1)
    initial = table_values()
    try:
        _epochs(run, train_step, evaluate, table_values, data, epochs, rng)
    finally:
        run.tables_moved = any(
            not np.array_equal(a, b) for a, b in zip(initial, table_values())
        )


def _epochs(
    run: DemoRun,
    train_step: Any,
    evaluate: Any,
    table_values: Any,
    data: Mapping[str, Any],
    epochs: int,
    rng: np.random.Generator,
) -> None:
    train, train_labels = data["train"], data["train_labels"]
    steps = EXAMPLES // BATCH
    for epoch in range(1, epochs + 1):
        started = time.perf_counter()
        order = rng.permutation(EXAMPLES)
        total = 0.0
        for step in range(steps):
            index = order[step * BATCH : (step + 1) * BATCH]
            batch = {name: values[index] for name, values in train.items()}
            loss = train_step(batch, train_labels[index])
            run.step_losses.append(loss)
            total += loss
            if epoch == 1 and step == 0:
                run.first_step_tables = table_values()
                run.first_batch = [train[name][index] for name, _, _ in TABLES]
        run.losses.append(total / steps)
        run.held_out.append(evaluate(data["test"], data["test_labels"]))
        # The losses are printed once, in the table of both runs.
        out(f"  epoch {epoch}/{epochs} trained ({time.perf_counter() - started:.1f} s)")
        sys.stdout.flush()
        if not run.finite:
            out("  the loss is not finite: this run stops here.")
            return


def _stock_optimizer(twin: Any) -> Optional[Any]:
    """`keras.optimizers.<stock>` with the twin's arguments Keras has; or None."""
    face = next(
        (
            d.keras
            for d in registry.DEFINITIONS
            if d.keras is not None and d.keras.name == type(twin).__name__
        ),
        None,
    )
    if face is None or face.stock is None:
        return None
    stock_class = getattr(keras.optimizers, face.stock)
    accepted = stock_class().get_config()
    config = {
        key: value
        for key, value in twin.get_config().items()
        if key in accepted and key != "name"
    }
    return stock_class.from_config(config)


def _duplicates_line(train: Mapping[str, np.ndarray], seed: int) -> str:
    """How many distinct ids the first epoch's batches have, on average."""
    order = np.random.default_rng(seed + 1).permutation(EXAMPLES)
    batches = order[: (EXAMPLES // BATCH) * BATCH].reshape(-1, BATCH)
    parts = []
    for name, _, _ in TABLES:
        distinct = np.mean([len(np.unique(train[name][b])) for b in batches])
        parts.append(f"{name} {distinct:.0f}")
    return (
        f"Duplicates: a batch looks up {BATCH} ids per table, of which on "
        f"average only {', '.join(parts)} are distinct."
    )


def _first_step_difference(twin: DemoRun, stock: DemoRun) -> Dict[str, Any]:
    """How the tables of the two runs differ after the first step.

    Returns:
      `rows`: rows that differ, split by how often the first batch looked
      them up (`repeated`: more than once, `once`, `untouched`: never);
      `largest`: the largest difference of an element.
    """
    counts = {"repeated": 0, "once": 0, "untouched": 0}
    largest = 0.0
    tables = zip(twin.first_step_tables, stock.first_step_tables, twin.first_batch)
    for a, b, ids in tables:
        difference = np.abs(a.astype("float64") - b).max(axis=1)
        scale = np.maximum(np.abs(a).max(axis=1), 1.0)
        differs = ~(difference <= _SAME_ROW_TOLERANCE * scale)  # NaN differs
        lookups = np.bincount(ids, minlength=a.shape[0])
        counts["repeated"] += int(np.sum(differs & (lookups > 1)))
        counts["once"] += int(np.sum(differs & (lookups == 1)))
        counts["untouched"] += int(np.sum(differs & (lookups == 0)))
        if np.isfinite(difference).any():
            largest = max(largest, float(np.nanmax(difference)))
    return {"rows": counts, "largest": largest}


def _difference_text(
    difference: Mapping[str, Any], repeated_ids: int, dense_gradient: bool = False
) -> str:
    """The first step's difference in words; `dense_gradient`: the stock run's
    tables had a whole gradient (JAX), their duplicate ids summed."""
    rows = difference["rows"]
    total = sum(rows.values())
    if total == 0:
        return (
            "After the first step (same weights, same batch) the two runs' "
            "tables are equal: with these arguments stock Keras computes what "
            "the engine does on this batch."
        )
    why = (
        "the engine's formula differs from stock Keras's; both sum the duplicates here"
        if dense_gradient
        else "stock Keras applies each occurrence on its own; the engine "
        "sums a row's gradients and steps once"
    )
    parts = [
        f"{rows['repeated']} of the {repeated_ids} rows the batch looked up more "
        f"than once ({why})"
    ]
    if rows["once"]:
        parts.append(
            f"{rows['once']} rows looked up once (the engine's formula differs "
            "from stock Keras's, e.g. Adam's bias correction)"
        )
    if rows["untouched"]:
        parts.append(
            f"{rows['untouched']} rows the batch did not look up (the engine "
            "updates only looked-up rows)"
        )
    return (
        f"After the first step (same weights, same batch), {total} table rows "
        f"differ between the two runs, by up to {difference['largest']:.3g}: "
        + "; ".join(parts)
        + ". The twin's run is the model the TPU would train."
    )


def _table(runs: List[DemoRun], baseline: float, hidden: float) -> List[str]:
    """The compact comparison: one row per epoch, train and held-out per run."""
    width = 22
    header = "epoch " + "".join(f"{run.label:>{width}}" for run in runs)
    subheader = "      " + "".join(
        f"{'train':>{width - 9}}{'held out':>9}" for _ in runs
    )
    lines = [header, subheader]
    epochs = max(len(run.losses) for run in runs)
    for epoch in range(epochs):
        cells = []
        for run in runs:
            if epoch < len(run.losses):
                cells.append(
                    f"{run.losses[epoch]:>{width - 9}.4f}{run.held_out[epoch]:>9.4f}"
                )
            else:
                cells.append(f"{'-':>{width - 9}}{'-':>9}")
        lines.append(f"{epoch + 1:>5} " + "".join(cells))
    lines.append(
        f"held out, for scale: predicting the click rate {baseline:.4f}; the "
        f"hidden model that drew the labels {hidden:.4f}"
    )
    return lines


# ---------------------------------------------------------------------------
# The command.


def run(args: argparse.Namespace, rate: float) -> int:
    """Trains both runs with the table learning rate `rate` and reports.

    Returns:
      0 if the twin's run learnt, 1 if not.
    """
    started = time.perf_counter()
    definition: Definition = args.optimizer
    jax = keras.backend.backend() == "jax"
    table_optimizer, twin = _table_optimizers(definition, rate)
    stock = _stock_optimizer(twin)

    features, labels, probabilities = synthetic_ctr_data(args.seed, EXAMPLES + HELD_OUT)
    data = {
        "train": {name: values[:EXAMPLES] for name, values in features.items()},
        "test": {name: values[EXAMPLES:] for name, values in features.items()},
        "train_labels": labels[:EXAMPLES],
        "test_labels": labels[EXAMPLES:],
    }
    test_labels = data["test_labels"][:, 0]
    click_rate = float(data["train_labels"].mean())
    baseline = cross_entropy(test_labels, np.full(HELD_OUT, click_rate))
    hidden = cross_entropy(test_labels, probabilities[EXAMPLES:])

    _introduce(args, data, table_optimizer, twin, stock)
    runs = _train_both(args, data, twin, stock)
    twin_run = runs[0]
    for line in _table(runs, baseline, hidden):
        out(line)
    out()
    if len(runs) == 2:
        repeated_ids = sum(
            int(np.sum(np.bincount(ids) > 1)) for ids in twin_run.first_batch
        )
        difference = _first_step_difference(twin_run, runs[1])
        out(fill(_difference_text(difference, repeated_ids, dense_gradient=jax)))
        out()

    status = _verdict(twin_run, baseline)
    if args.plot is not None:
        title = (
            f"{definition.name}(learning_rate={rate:g}) on the demo's tables, "
            f"seed {args.seed}"
        )
        plot_losses(args.plot, runs, baseline, hidden, title, EXAMPLES // BATCH)
        out(f"Loss curves of both runs drawn in {args.plot}.")
    out()
    _configuration(args, table_optimizer, twin)
    out()
    out(
        f"Trained and configured in {time.perf_counter() - started:.1f} s "
        f"(after importing Keras on {keras.backend.backend()}): "
        f"{'ok' if status == 0 else 'FAILED'}."
    )
    return status


def _introduce(
    args: argparse.Namespace,
    data: Dict[str, Any],
    table_optimizer: Any,
    twin: Any,
    stock: Any,
) -> None:
    """The data, the model and the two runs, before training."""
    jax = keras.backend.backend() == "jax"
    tables_text = ", ".join(f"{n} {v:,} x {d}" for n, v, d in TABLES)
    out(
        f"Data: {EXAMPLES:,} synthetic impressions to train on and "
        f"{HELD_OUT:,} held out (seed {args.seed}); click rate "
        f"{float(data['train_labels'].mean()):.1%}; Zipf-distributed ids, "
        f"{DENSE_FEATURES} dense features."
    )
    out(_duplicates_line(data["train"], args.seed))
    out(
        f"Model: embedding tables {tables_text}, concatenated with the dense "
        "features -> Dense(32, relu) -> Dense(1); binary cross-entropy; the "
        "dense layers trained with keras.optimizers.Adam(learning_rate=0.001)."
    )
    out(
        f"Tables: {table_optimizer!r} on a TPU. On CPU, twice (Keras on "
        f"{keras.backend.backend()}):"
    )
    if jax:
        out(
            "  1. its TPU-exact twin tf_tpu_embed_opt.optimizers."
            f"{keras_call(twin)} carried by tf_tpu_embed_opt.layers.Embedding: "
            "the looked-up rows step in the backward pass, duplicate ids summed;"
        )
    else:
        out(
            "  1. its TPU-exact twin tf_tpu_embed_opt.optimizers."
            f"{keras_call(twin)}: duplicate ids summed, one step per row;"
        )
    if stock is not None and jax:
        out(
            f"  2. stock keras.optimizers.{keras_call(stock)} on "
            "keras.layers.Embedding: the same arguments, on a gradient of the "
            "whole table (JAX sums the duplicates; every row is touched)."
        )
    elif stock is not None:
        out(
            f"  2. stock keras.optimizers.{keras_call(stock)}: the same "
            "arguments, each duplicate applied on its own."
        )
    else:
        out(
            f"  2. (none: Keras has no {args.optimizer.name}; only the twin's "
            "run is shown.)"
        )
    out()


def _train_both(
    args: argparse.Namespace, data: Dict[str, Any], twin: Any, stock: Any
) -> List["DemoRun"]:
    """The twin's run, and stock Keras's where Keras has the optimizer and
    does not fail on embedding gradients."""
    jax = keras.backend.backend() == "jax"
    twin_run = DemoRun("TPU-exact twin")
    runs = [twin_run]
    out(f"1. {twin_run.label}:")
    _train(twin_run, twin, data, args.epochs, args.seed, row_sparse=jax)
    if stock is not None:
        stock_run = DemoRun(f"stock Keras {type(stock).__name__}")
        out(f"2. {stock_run.label}:")
        try:
            _train(stock_run, stock, data, args.epochs, args.seed)
        except (*tensorflow_op_errors(), ValueError, TypeError) as error:
            # Stock Keras's own failure on embedding gradients is part of what
            # the demo shows (Keras 3.15's centered RMSprop fails on them).
            out(
                "  stock Keras failed on the embedding gradients "
                f"({'dense' if jax else 'tf.IndexedSlices'}): {_last_line(error)}"
            )
        else:
            runs.append(stock_run)
    out()
    return runs


def _configuration(args: argparse.Namespace, table_optimizer: Any, twin: Any) -> None:
    """What the tables would send to a TPU: the TPUEmbeddingConfiguration in
    one sentence (whole with --show-configuration); without TensorFlow, what
    SparseCore would run."""
    if not tensorflow_installed():
        out(_sparsecore_line(args.optimizer, twin))
        return
    from google.protobuf import text_format

    from tf_tpu_embed_opt.cli import demo_tensorflow

    config = demo_tensorflow.configuration(
        table_optimizer, TABLES, BATCH, _DEMO_TENSOR_CORES
    )
    heading = (
        "TPUEmbeddingConfiguration the same tables would send to a TPU "
        f"(num_hosts=1, num_tensor_cores={_DEMO_TENSOR_CORES}, batch "
        f"{BATCH} = {BATCH // _DEMO_TENSOR_CORES} per replica)"
    )
    if getattr(args, "show_configuration", False):
        out(heading + ":")
        sys.stdout.write(text_format.MessageToString(config))
    else:
        out(fill(f"{heading}: {_configuration_summary(config)}"))


def _configuration_summary(config: Any) -> str:
    """One sentence of a `TPUEmbeddingConfiguration`: its tables and their
    optimizers, read from the message itself."""
    tables = ", ".join(
        f"{t.name} {t.vocabulary_size:,} x {t.dimension}"
        for t in config.table_descriptor
    )
    optimizers = sorted(
        {
            t.optimization_parameters.WhichOneof("parameters")
            for t in config.table_descriptor
        }
    )
    return (
        f"{len(config.table_descriptor)} tables ({tables}), "
        f"optimization_parameters {', '.join(optimizers)}, "
        f"{len(config.feature_descriptor)} features. --show-configuration "
        "prints it in full."
    )


def _table_optimizers(definition: Definition, rate: float) -> Tuple[Any, Any]:
    """The tables' embedding-face optimizer and its TPU-exact twin.

    Without TensorFlow the embedding class's arguments are checked from the
    definitions, and the twin made as `to_keras` makes it.
    """
    try:
        if tensorflow_installed():
            from tf_tpu_embed_opt.embedding import parameters as embedding

            table_optimizer = embedding.class_for(definition)(learning_rate=rate)
            return table_optimizer, convert.to_keras(table_optimizer)
        table_optimizer = arguments.Checked(definition, learning_rate=rate)
    except (TypeError, ValueError) as error:
        raise UsageError(with_options(str(error), definition)) from None
    return table_optimizer, convert.twin_of_engine_optimizer(
        definition, table_optimizer
    )


def _sparsecore_line(definition: Definition, twin: Any) -> str:
    """What jax-tpu-embedding would run for the tables (TensorFlow absent)."""
    from tf_tpu_embed_opt.cli.describe_jax import spec_call

    engine = "jax-tpu-embedding"
    try:
        spec = convert.to_embedding(twin, engine=engine)
    except ValueError as error:
        reason = str(error).removeprefix("to_embedding: ")
        return fill(
            f"{engine} cannot run these tables' optimizer exactly: {reason} "
            "(TensorFlow is not installed, so the TPUEmbeddingConfiguration "
            "is not shown.)"
        )
    except ModuleNotFoundError as error:
        return fill(
            f"The {engine} spec of these tables is not shown: {error}. "
            "TensorFlow is not installed, so the TPUEmbeddingConfiguration is "
            "not shown either."
        )
    return fill(
        f"The {engine} spec the same tables would run on SparseCore "
        f"(tf_tpu_embed_opt.to_embedding(twin, engine={engine!r})): "
        f"{spec_call(definition, spec)}"
    )


def _last_line(error: Exception) -> str:
    """The informative last line of a TensorFlow error, without node listings."""
    lines = [
        line.strip()
        for line in str(error).splitlines()
        if line.strip() and not line.strip().startswith(("[[", "File ", "Detected"))
    ]
    return (lines[-1] if lines else type(error).__name__)[:300]


def _verdict(run: DemoRun, baseline: float) -> int:
    """Whether the twin's run learnt: finite, better than the click rate, and
    with tables that moved."""
    if not run.finite:
        out(
            f"Verdict: the {run.label}'s loss is not finite: the learning rate is "
            "unusable here; try a smaller --learning-rate."
        )
        return 1
    last = run.held_out[-1]
    if not last < baseline:
        out(
            f"Verdict: the {run.label} ends at a held-out loss of {last:.4f}, no "
            f"better than predicting the click rate ({baseline:.4f}): it did not "
            "learn. Try another --learning-rate."
        )
        return 1
    if not run.tables_moved:
        out(
            f"Verdict: the {run.label}'s tables did not move (is the learning "
            f"rate 0?); only the dense layers learnt, to a held-out loss of "
            f"{last:.4f} (predicting the click rate: {baseline:.4f}). The "
            "tables' optimizer was not shown at work."
        )
        return 1
    out(
        f"Verdict: the {run.label} learnt, its tables and the dense layers: "
        f"held-out loss {last:.4f} after {counted(len(run.held_out), 'epoch')}, below "
        f"{baseline:.4f} for predicting the click rate."
    )
    return 0
