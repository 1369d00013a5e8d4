"""What the refusal of ids outside a table costs a training step.

`tf_tpu_embed_opt.layers.Embedding` checks every batch's ids before it looks
them up (`out_of_range_ids="error"`, the default): on JAX a reduction and a
conditional pure callback per layer (per `StackedEmbedding`) and step, on
TensorFlow two reductions and a conditional assertion. This harness times a
recommender-like model with many tables (default: 26 tables of 1,000 rows x
16, one id per table and example, batch 2,048, Zipf ids, an MLP 256-64-1
over the concatenated rows and 13 dense features; Adagrad tables, Adam for
the dense part) five ways, in one process, round-robin,
`model.train_on_batch` per step (outputs fetched):

- `checked`: the layer as users get it;
- `unchecked`: the same layers with the check taken out (the harness replaces
  the lookup module's `checked_ids` by the identity): the reference;
- `zeros`: `out_of_range_ids="zeros"`, the explicit alternative;
- `stacked`, `stacked-unchecked`: the same tables in one
  `StackedEmbedding`, with its one check of all the tables and without it.

It prints the median step of each against its unchecked form (goal for the
checked forms: at most 1.05) and its minor page faults per step (glibc's
defaults map a step's temporaries afresh at every step once they pass its
mmap threshold: docs/benchmarks.md, "The host allocator on CPU"). Small
tables make the fixed per-layer cost show most; the goal is about it.
`BENCH_JIT=0` or `1` sets
`model.compile(jit_compile=...)` (default "auto"). On JAX, `BENCH_DEVICES=N`
runs every variant under `keras.distribution.DataParallel` over N CPU
devices (`--xla_force_host_platform_device_count`), where the check runs on
every device (docs/benchmarks.md, "On several devices"). On JAX,
`--synchronous` dispatches every program synchronously
(`jax_cpu_enable_async_dispatch=False`), as JAX on CPU dispatches a program
that holds a host callback, the check's included: the ratios then say what
the check costs beyond the loss of asynchronous dispatch (docs/benchmarks.md,
"What a callback that never runs costs").

Run from the repository root:

    KERAS_BACKEND=jax python -m benchmarks.out_of_range_ids [--quick]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import types
from typing import Any, List

os.environ.setdefault("KERAS_BACKEND", "jax")
DEVICES_SETTING = os.environ.get("BENCH_DEVICES", "1")
# 0 for a setting that is not a positive count: `main` refuses it.
DEVICES = int(DEVICES_SETTING) if DEVICES_SETTING.strip().isdigit() else 0
if DEVICES > 1:
    # Read by XLA when JAX first makes its CPU devices, after these imports.
    os.environ["XLA_FLAGS"] = (
        f"{os.environ.get('XLA_FLAGS', '')} "
        f"--xla_force_host_platform_device_count={DEVICES}"
    ).strip()

import keras  # noqa: E402
import numpy as np  # noqa: E402

if __package__ in (None, ""):
    # Run as a file (`python benchmarks/out_of_range_ids.py`): `benchmarks` is the
    # checkout's folder, which Python does not put on the path then.
    sys.path.append(str(pathlib.Path(__file__).resolve().parent.parent))

import tf_tpu_embed_opt as teo  # noqa: E402
from benchmarks import round_robin  # noqa: E402

JIT = os.environ.get("BENCH_JIT", "auto")
JIT = JIT if JIT == "auto" else JIT == "1"
DENSE_FEATURES = 13
VARIANTS = ("checked", "unchecked", "zeros", "stacked", "stacked-unchecked")
CHECKED_FORMS = (("checked", "unchecked"), ("stacked", "stacked-unchecked"))


def _model(variant: str, tables: int, rows: int, dim: int) -> Any:
    ids = keras.Input((tables,), dtype="int32", name="ids")
    dense = keras.Input((DENSE_FEATURES,), name="dense_features")
    layers = [
        teo.layers.Embedding(
            rows,
            dim,
            optimizer=teo.optimizers.Adagrad(0.05, epsilon=0.0),
            out_of_range_ids="zeros" if variant == "zeros" else "error",
            name=f"table_{index}",
        )
        for index in range(tables)
    ]
    features = [ids[:, index] for index in range(tables)]
    if variant.startswith("stacked"):
        stacked = teo.layers.StackedEmbedding(layers)
        if variant == "stacked-unchecked":
            # The stack's one check of all its tables taken out.
            for stack in stacked._stacks:
                stack._lookup = _without(
                    stack._lookup, "checked_tables", lambda ids, *_: list(ids)
                )
        columns = stacked(features)
    else:
        if variant == "unchecked":
            # The lookup without the check: the reference the check is
            # measured against.
            for layer in layers:
                layer._lookup = _without(
                    layer._lookup, "checked_ids", lambda ids, *_: ids
                )
        columns = [layer(f) for layer, f in zip(layers, features)]
    hidden = keras.layers.Concatenate()([dense, *columns])
    for width in (256, 64):
        hidden = keras.layers.Dense(width, activation="relu")(hidden)
    model = keras.Model([ids, dense], keras.layers.Dense(1)(hidden))
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse", jit_compile=JIT)
    return model


def _dispatch_synchronously() -> None:
    """JAX's CPU client made synchronous; refused once it exists (JAX reads
    the setting as it makes the client, and would ignore it then)."""
    import jax
    from jax._src import xla_bridge

    if xla_bridge.backends_are_initialized():
        raise RuntimeError("--synchronous: JAX has made its CPU client already")
    jax.config.update("jax_cpu_enable_async_dispatch", False)


def _without(lookup: Any, name: str, identity: Any) -> Any:
    """The lookup module `lookup` with its function `name` replaced."""
    return types.SimpleNamespace(**{**vars(lookup), name: identity})


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
    parser.add_argument(
        "--synchronous",
        action="store_true",
        help="JAX: dispatch every program synchronously, as JAX on CPU "
        "dispatches one with a host callback",
    )
    round_robin.add_allocator_option(parser)
    args = parser.parse_args(argv)
    round_robin.set_allocator(args)
    if DEVICES < 1:
        parser.error(
            f"BENCH_DEVICES={DEVICES_SETTING!r}: a number of CPU devices, 1 or "
            "more, is allowed"
        )
    if args.synchronous:
        if keras.backend.backend() != "jax":
            parser.error("--synchronous runs on Keras's JAX backend")
        _dispatch_synchronously()
    if DEVICES > 1:
        if keras.backend.backend() != "jax":
            parser.error("BENCH_DEVICES runs on Keras's JAX backend")
        devices = keras.distribution.list_devices()
        if len(devices) != DEVICES:
            parser.error(f"BENCH_DEVICES={DEVICES}, but JAX has {devices}")
        keras.distribution.set_distribution(keras.distribution.DataParallel())
    steps = 8 if args.quick else args.steps
    rounds = 2 if args.quick else args.rounds
    models = {v: _model(v, args.tables, args.rows, args.dim) for v in VARIANTS}
    batches = _batches(steps, args.batch, args.tables, args.rows)
    y = np.ones((args.batch, 1), "float32")
    faults: dict = {}
    median = round_robin.median_ms(models, batches, y, rounds, 3, faults)
    print(round_robin.machine_line(JIT))
    if args.synchronous:
        print("every program dispatched synchronously (--synchronous)")
    if DEVICES > 1:
        print(f"keras.distribution.DataParallel over {DEVICES} CPU devices")
    print(
        f"{args.tables} tables of {args.rows:,} x {args.dim}, batch "
        f"{args.batch:,}; {rounds} rounds x {steps} steps per variant, "
        "round-robin; median ms/step"
    )
    print()
    print("| variant | ms/step | / its unchecked form | page faults/step |")
    print("|---|--:|--:|--:|")
    for variant in VARIANTS:
        stacked = variant.startswith("stacked")
        reference = "stacked-unchecked" if stacked else "unchecked"
        ratio = median[variant] / median[reference]
        print(
            f"| {variant} | {median[variant]:.2f} | {ratio:.3f} | "
            f"{faults[variant]:,.0f} |"
        )
    print()
    for checked, unchecked in CHECKED_FORMS:
        ratio = median[checked] / median[unchecked]
        print(
            f"Goal: {checked} / {unchecked} <= 1.05: {ratio:.3f} "
            f"({'met' if ratio <= 1.05 else 'MISSED'})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
