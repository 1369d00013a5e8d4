"""Timing models side by side: `train_on_batch` round-robin, medians.

Each model is compiled and warmed up first, then every round times each
model's steps in turn, so that a slower or busier stretch of the machine
falls on every model alike.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from typing import Any, Dict, List, Mapping, Sequence

import keras

__all__ = ["machine_line", "median_ms"]


def median_ms(
    models: Mapping[str, Any],
    batches: Sequence[Any],
    labels: Any,
    rounds: int,
    warmup: int,
) -> Dict[str, float]:
    """Each model's median step in milliseconds: `warmup` steps each on the
    first batches, then `rounds` rounds over every model and batch (the
    outputs fetched, as `train_on_batch` returns them)."""
    for model in models.values():  # compile and warm up
        for batch in batches[:warmup]:
            model.train_on_batch(batch, labels)
    times: Dict[str, List[float]] = {name: [] for name in models}
    for _ in range(rounds):
        for name, model in models.items():
            for batch in batches:
                start = time.perf_counter()
                model.train_on_batch(batch, labels)
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def machine_line(jit_compile: Any) -> str:
    """The machine and the Keras that ran the benchmark."""
    return (
        f"Machine: {os.cpu_count()} cores, {platform.machine()}; Keras "
        f"{keras.__version__} on {keras.backend.backend()}, "
        f"jit_compile={jit_compile}"
    )
