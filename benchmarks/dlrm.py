"""A recommender's training step with many tables: a DLRM-like model.

The model many-table recommenders look like, as a user writes it with one
embedding layer per feature: 26 categorical features with their own tables
(the Criteo Kaggle cardinalities of facebookresearch/dlrm, the five largest
scaled by 0.3: 10,527,278 rows in all, dim 16), 13 dense features, a bottom
MLP 512-256-16, the pairwise dot products of the 27 vectors, a top MLP
256-1, batch 2,048, Zipf ids. Variants, each timed in this process round-robin
(`model.train_on_batch`, outputs fetched, median over rounds x steps):

- `keras`: `keras.layers.Embedding` tables, Keras's Adagrad for the model;
- `teo`: `tf_tpu_embed_opt.layers.Embedding` tables with the engine's Adagrad
  (`Adagrad(epsilon=0)`), Keras's Adam for the dense part;
- `teo-stacked`: the same tables in one `tf_tpu_embed_opt.layers.
  StackedEmbedding` (one stack: one dedup, gather and scatter per step);
- `keras-rs`, `keras-rs-stacked`: the same tables as a keras-rs
  `DistributedEmbedding` on the default device (one feature per table),
  through `row_sparse_tables`, unstacked and with `stack=True`;
- `keras-1k`, `teo-1k`, `teo-stacked-1k`, `keras-rs-1k`,
  `keras-rs-stacked-1k`: the same with every table at 1,000 rows;
- `keras-1row`: every table one row (`keras.layers.Embedding`): the
  interaction's gradient with respect to the 26 vectors, which `mlp` does
  not take, with a table step that costs next to nothing: the floor of any
  variant with tables;
- `mlp`: the MLPs and the interaction only (the embeddings are zeros).

It prints ms/step, examples/s, each variant over `mlp` (the goal for
`teo`: at most 1.3x, what stacking tables that share a step is for) and the
minor page faults per step, which show whether the host allocator maps the
step's temporaries afresh every step (`docs/benchmarks.md`, "The host
allocator on CPU"). The harness tells glibc to keep freed memory for its own
process, as `tf-tpu-embed-opt demo` does; `--glibc-defaults` measures with
glibc's defaults, which a training script of one's own gets unless it sets
`MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=4294967296` before it starts.
`BENCH_JIT=0` or `1` sets `jit_compile`.

`--memory` measures one variant instead (Linux; run each in its own process,
as a second variant would reuse memory the first freed): the resident set
after the warm-up over the one before the model, and how far the timed
steps' peak rises above it ("a step adds"; the goal: nothing the size of a
table).

Run from the repository root (about 2 GB of memory per large variant):

    KERAS_BACKEND=jax python -m benchmarks.dlrm [--quick] [--variants teo,mlp]
    KERAS_BACKEND=jax python -m benchmarks.dlrm --memory --variants teo-stacked
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
from typing import Any, List, Tuple

os.environ.setdefault("KERAS_BACKEND", "jax")

import keras  # noqa: E402
import numpy as np  # noqa: E402

if __package__ in (None, ""):
    # Run as a file (`python benchmarks/dlrm.py`): `benchmarks` is the
    # checkout's folder, which Python does not put on the path then.
    sys.path.append(str(pathlib.Path(__file__).resolve().parent.parent))

import tf_tpu_embed_opt as teo  # noqa: E402
from benchmarks import memory, round_robin  # noqa: E402

JIT = os.environ.get("BENCH_JIT", "auto")
JIT = JIT if JIT == "auto" else JIT == "1"
# facebookresearch/dlrm's Criteo Kaggle table sizes.
CRITEO_KAGGLE = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593,
    3194, 27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105,
    142572,
)  # fmt: skip
LARGEST = sorted(CRITEO_KAGGLE, reverse=True)[:5]
ROWS = tuple(int(r * 0.3) if r in LARGEST else r for r in CRITEO_KAGGLE)
DIM, DENSE = 16, 13
VARIANTS = (
    "keras",
    "teo",
    "teo-stacked",
    "keras-rs",
    "keras-rs-stacked",
    "keras-1k",
    "teo-1k",
    "teo-stacked-1k",
    "keras-rs-1k",
    "keras-rs-stacked-1k",
    "keras-1row",
    "mlp",
)


def _mlp(x: Any, widths: List[int], last_relu: bool = True) -> Any:
    for index, width in enumerate(widths):
        relu = last_relu or index < len(widths) - 1
        x = keras.layers.Dense(width, activation="relu" if relu else None)(x)
    return x


def _tables(variant: str, ids: Any) -> List[Any]:
    """Each feature's looked-up vector, as the variant looks it up."""
    rows_of = [1000 if variant.endswith("-1k") else rows for rows in ROWS]
    if variant == "keras-1row":
        rows_of = [1] * len(ROWS)
    columns = [ids[:, index] % rows for index, rows in enumerate(rows_of)]
    if variant in ("keras", "keras-1k", "keras-1row"):
        return [
            keras.layers.Embedding(rows, DIM, name=f"table_{index}")(column)
            for index, (rows, column) in enumerate(zip(rows_of, columns))
        ]
    if variant.startswith("keras-rs"):
        return _keras_rs_tables(variant, rows_of, columns)
    tables = [
        teo.layers.Embedding(
            rows, DIM, optimizer=_table_optimizer(), name=f"table_{index}"
        )
        for index, rows in enumerate(rows_of)
    ]
    if variant.startswith("teo-stacked"):
        return teo.layers.StackedEmbedding(tables)(columns)
    return [table(column) for table, column in zip(tables, columns)]


def _keras_rs_tables(variant: str, rows_of: List[int], columns: List[Any]) -> List:
    """The tables as a keras-rs `DistributedEmbedding` off SparseCore."""
    import keras_rs

    features = {
        f"feature_{index:02d}": keras_rs.layers.FeatureConfig(
            name=f"feature_{index:02d}",
            table=keras_rs.layers.TableConfig(
                name=f"table_{index}",
                vocabulary_size=rows,
                embedding_dim=DIM,
                optimizer=_table_optimizer(),
                placement="default_device",
            ),
            input_shape=(None,),
            output_shape=(None, DIM),
        )
        for index, rows in enumerate(rows_of)
    }
    embedding = teo.layers.row_sparse_tables(
        keras_rs.layers.DistributedEmbedding(features),
        stack=variant.startswith("keras-rs-stacked"),
    )
    looked = embedding(dict(zip(features, columns)))
    return [looked[name] for name in features]


def _table_optimizer() -> Any:
    """The tables' optimizer: the engine's Adagrad."""
    return teo.optimizers.Adagrad(0.05, epsilon=0.0)


def _model(variant: str) -> Any:
    ids = keras.Input((len(ROWS),), dtype="int32", name="ids")
    dense = keras.Input((DENSE,), name="dense_features")
    bottom = _mlp(dense, [512, 256, DIM])
    if variant == "mlp":
        vectors = [bottom] + [keras.ops.zeros_like(bottom)] * len(ROWS)
    else:
        vectors = [bottom, *_tables(variant, ids)]
    stacked = keras.ops.stack(vectors, axis=1)  # [batch, 27, dim]
    dots = keras.ops.einsum("bid,bjd->bij", stacked, stacked)
    upper = np.triu_indices(len(vectors), k=1)
    pairs = keras.ops.reshape(dots, (-1, len(vectors) ** 2))
    flat = upper[0] * len(vectors) + upper[1]
    pairs = keras.ops.take(pairs, flat, axis=1)
    top = keras.layers.Concatenate()([bottom, pairs])
    outputs = _mlp(top, [256, 1], last_relu=False)
    model = keras.Model([ids, dense], outputs)
    dense_optimizer = (
        keras.optimizers.Adam(1e-3)
        if variant.startswith(("teo", "keras-rs")) or variant == "mlp"
        else keras.optimizers.Adagrad(0.05)
    )
    model.compile(
        optimizer=dense_optimizer,
        loss=keras.losses.BinaryCrossentropy(from_logits=True),
        jit_compile=JIT,
    )
    return model


def _batches(count: int, batch: int) -> List[Any]:
    """Zipf ids per feature (the column's modulo keeps them in its table)."""
    rng = np.random.default_rng(0)
    return [
        [
            (rng.zipf(1.2, size=(batch, len(ROWS))) - 1).astype("int32")
            % np.asarray(ROWS, "int32"),
            rng.normal(size=(batch, DENSE)).astype("float32"),
        ]
        for _ in range(count)
    ]


def _memory_mib(variant: str, batches: List[Any], labels: Any) -> Tuple[float, float]:
    """The resident set after two warm-up steps over the one before the
    model, and the peak of the other steps over the former, in MiB (NaN
    where the peak cannot be reset)."""
    baseline = memory.resident_mib("VmRSS")
    model = _model(variant)
    for batch in batches[:2]:
        model.train_on_batch(batch, labels)
    with memory.PeakAbove() as peak:
        for batch in batches[2:]:
            model.train_on_batch(batch, labels)
    return peak.resident - baseline, peak.added


def _state_mib(variant: str) -> float:
    """The tables and their optimizer's slots (Adagrad's accumulator, in
    Keras's optimizer too), in MiB."""
    if variant == "mlp":
        return 0.0
    rows = len(ROWS) * 1000 if variant.endswith("-1k") else sum(ROWS)
    if variant == "keras-1row":
        rows = len(ROWS)
    return (1 + len(_table_optimizer().slot_table())) * rows * DIM * 4 / 2**20


def _print_memory(variant: str, batches: List[Any], labels: Any) -> None:
    resident, added = _memory_mib(variant, batches, labels)
    print(round_robin.machine_line(JIT))
    print(f"{len(batches) - 2} steps after 2 warm-up steps; batch {len(labels):,}")
    print()
    print("| variant | tables + slots MiB | resident MiB | a step adds MiB |")
    print("|---|--:|--:|--:|")
    print(f"| {variant} | {_state_mib(variant):.0f} | {resident:.0f} | {added:.1f} |")


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument(
        "--memory", action="store_true", help="the memory of one variant instead"
    )
    round_robin.add_allocator_option(parser)
    args = parser.parse_args(argv)
    round_robin.set_allocator(args)
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"--variants: unknown {unknown}; known: {', '.join(VARIANTS)}")
    if args.memory and len(variants) != 1:
        parser.error(
            f"--memory measures one variant per process; --variants gave {variants}"
        )
    steps = 3 if args.quick else args.steps
    rounds = 2 if args.quick else args.rounds
    labels = (np.random.default_rng(1).random((args.batch, 1)) < 0.25).astype("float32")
    if args.memory:
        _print_memory(variants[0], _batches(2 + steps, args.batch), labels)
        return 0
    models = {v: _model(v) for v in variants}
    batches = _batches(steps, args.batch)
    faults: dict = {}
    median = round_robin.median_ms(models, batches, labels, rounds, 2, faults)
    distinct = np.mean([len(np.unique(b[0][:, 2])) for b in batches])
    print(round_robin.machine_line(JIT))
    print(
        f"{len(ROWS)} tables, {sum(ROWS):,} rows x {DIM}; batch {args.batch:,}; "
        f"{rounds} rounds x {steps} steps, round-robin; median "
        f"(the largest table sees {distinct:,.0f} distinct ids per step)"
    )
    print()
    print("| variant | ms/step | examples/s | / mlp | page faults/step |")
    print("|---|--:|--:|--:|--:|")
    for variant in variants:
        ratio = f"{median[variant] / median['mlp']:.2f}" if "mlp" in median else "–"
        rate = args.batch / median[variant] * 1e3
        print(
            f"| {variant} | {median[variant]:.1f} | {rate:,.0f} | {ratio} | "
            f"{faults[variant]:,.0f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
