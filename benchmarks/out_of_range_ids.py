"""What the refusal of ids outside a table costs a training step.

`tf_tpu_embed_opt.layers.Embedding` checks every batch's ids before it looks
them up (`out_of_range_ids="error"`, the default): on JAX two reductions and a
host callback per layer and step, on TensorFlow two reductions and a
conditional assertion. This harness times a recommender-like model with many
tables (default: 26 tables of 1,000 rows x 16, one id per table and example,
batch 2,048, Zipf ids, an MLP 256-64-1 over the concatenated rows and 13
dense features; Adagrad tables, Adam for the dense part) three ways, in one
process, round-robin, `model.train_on_batch` per step (outputs fetched):

- `checked`: the layer as users get it;
- `unchecked`: the same layers with the check taken out (the harness replaces
  the lookup module's `checked_ids` by the identity): the reference;
- `zeros`: `out_of_range_ids="zeros"`, the explicit alternative.

It prints the median step of each and `checked / unchecked` (goal: at most
1.05) and `zeros / unchecked`. Small tables make the fixed per-layer cost
show most; the goal is about it. `BENCH_JIT=0` or `1` sets
`model.compile(jit_compile=...)` (default "auto").

Run from the repository root:

    KERAS_BACKEND=jax python -m benchmarks.out_of_range_ids [--quick]
"""

from __future__ import annotations

import argparse
import os
import types
from typing import Any, List

os.environ.setdefault("KERAS_BACKEND", "jax")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import tf_tpu_embed_opt as teo  # noqa: E402
from benchmarks import round_robin  # noqa: E402

JIT = os.environ.get("BENCH_JIT", "auto")
JIT = JIT if JIT == "auto" else JIT == "1"
DENSE_FEATURES = 13
VARIANTS = ("checked", "unchecked", "zeros")


def _model(variant: str, tables: int, rows: int, dim: int) -> Any:
    ids = keras.Input((tables,), dtype="int32", name="ids")
    dense = keras.Input((DENSE_FEATURES,), name="dense_features")
    columns = [dense]
    for index in range(tables):
        layer = teo.layers.Embedding(
            rows,
            dim,
            optimizer=teo.optimizers.Adagrad(0.05, epsilon=0.0),
            out_of_range_ids="zeros" if variant == "zeros" else "error",
            name=f"table_{index}",
        )
        if variant == "unchecked":
            # The lookup without the check: the reference the check is
            # measured against.
            layer._lookup = types.SimpleNamespace(
                **{**vars(layer._lookup), "checked_ids": lambda ids, *_: ids}
            )
        columns.append(layer(ids[:, index]))
    hidden = keras.layers.Concatenate()(columns)
    for width in (256, 64):
        hidden = keras.layers.Dense(width, activation="relu")(hidden)
    model = keras.Model([ids, dense], keras.layers.Dense(1)(hidden))
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse", jit_compile=JIT)
    return model


def _batches(count: int, batch: int, tables: int, rows: int) -> List[Any]:
    rng = np.random.default_rng(0)
    return [
        [
            ((rng.zipf(1.2, size=(batch, tables)) - 1) % rows).astype("int32"),
            rng.normal(size=(batch, DENSE_FEATURES)).astype("float32"),
        ]
        for _ in range(count)
    ]


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps")
    parser.add_argument("--tables", type=int, default=26)
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args(argv)
    steps = 8 if args.quick else args.steps
    rounds = 2 if args.quick else args.rounds
    models = {v: _model(v, args.tables, args.rows, args.dim) for v in VARIANTS}
    batches = _batches(steps, args.batch, args.tables, args.rows)
    y = np.ones((args.batch, 1), "float32")
    median = round_robin.median_ms(models, batches, y, rounds, warmup=3)
    print(round_robin.machine_line(JIT))
    print(
        f"{args.tables} tables of {args.rows:,} x {args.dim}, batch "
        f"{args.batch:,}; {rounds} rounds x {steps} steps per variant, "
        "round-robin; median ms/step"
    )
    print()
    print("| variant | ms/step | / unchecked |")
    print("|---|--:|--:|")
    for variant in VARIANTS:
        ratio = median[variant] / median["unchecked"]
        print(f"| {variant} | {median[variant]:.2f} | {ratio:.3f} |")
    ratio = median["checked"] / median["unchecked"]
    print()
    print(
        f"Goal: checked / unchecked <= 1.05: {ratio:.3f} "
        f"({'met' if ratio <= 1.05 else 'MISSED'})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
