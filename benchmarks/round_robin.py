"""Timing models side by side: `train_on_batch` round-robin, medians.

Each model is compiled and warmed up first, then every round times each
model's steps in turn, so that a slower or busier stretch of the machine
falls on every model alike. Each model's minor page faults per step are
counted too: on CPU, glibc maps a step's temporaries larger than its mmap
threshold afresh at every step, and the kernel faults every page of them
in again (`docs/benchmarks.md`, "The host allocator on CPU").
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence

import keras

from tf_tpu_embed_opt.cli import allocator

try:
    import resource
except ImportError:  # Windows: no getrusage
    resource = None

__all__ = ["add_allocator_option", "machine_line", "median_ms", "set_allocator"]


def add_allocator_option(parser: Any) -> None:
    """`--glibc-defaults`, for a harness that times training steps."""
    parser.add_argument(
        "--glibc-defaults",
        action="store_true",
        help=(
            "leave glibc's malloc at its defaults; by default the harness "
            "tells it to keep freed memory, as `tf-tpu-embed-opt demo` does "
            '(docs/benchmarks.md, "The host allocator on CPU")'
        ),
    )


def set_allocator(args: Any) -> str:
    """Keeps freed memory in this process unless `--glibc-defaults` (or the
    environment sets glibc's malloc variables); returns the settings."""
    if args.glibc_defaults:
        return allocator.settings()
    return allocator.keep_freed_memory()


def median_ms(
    models: Mapping[str, Any],
    batches: Sequence[Any],
    labels: Any,
    rounds: int,
    warmup: int,
    faults: Optional[Dict[str, float]] = None,
) -> Dict[str, float]:
    """Each model's median step in milliseconds: `warmup` steps each on the
    first batches, then `rounds` rounds over every model and batch (the
    outputs fetched, as `train_on_batch` returns them). Given a dict,
    `faults` receives each model's median minor page faults per step (of
    the whole process, from `getrusage`; NaN where there is none)."""
    for model in models.values():  # compile and warm up
        for batch in batches[:warmup]:
            model.train_on_batch(batch, labels)
    times: Dict[str, List[float]] = {name: [] for name in models}
    minor: Dict[str, List[float]] = {name: [] for name in models}
    for _ in range(rounds):
        for name, model in models.items():
            for batch in batches:
                before = _minor_faults()
                start = time.perf_counter()
                model.train_on_batch(batch, labels)
                times[name].append(time.perf_counter() - start)
                minor[name].append(_minor_faults() - before)
    if faults is not None:
        faults.update({name: statistics.median(m) for name, m in minor.items()})
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def machine_line(jit_compile: Any) -> str:
    """The machine, the Keras and the host allocator's settings that ran the
    benchmark (glibc's malloc variables change a CPU step's time)."""
    return (
        f"Machine: {os.cpu_count()} cores, {platform.machine()}; Keras "
        f"{keras.__version__} on {keras.backend.backend()}, "
        f"jit_compile={jit_compile}; host allocator: {allocator.settings()}"
    )


def _minor_faults() -> float:
    """The process's minor page faults so far (NaN without `getrusage`)."""
    if resource is None:
        return float("nan")
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)
