"""Timing a comparison group round-robin, with CPU and memory watched."""

from __future__ import annotations

import dataclasses
import gc
import os
import statistics
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from benchmarks.sparse_step.problems import (
    GIB,
    Problem,
    Step,
    Subject,
)

# --------------------------------------------------------------------------


@dataclasses.dataclass
class Result:
    """The timing of one subject in one mode (or why there is none).

    Attributes:
      ms: Median milliseconds per step, or None.
      samples: Number of timed steps.
      spread: Inter-quartile range over the median (a noise indicator).
      note: Why `ms` is None, or how it was measured.
      together: Whether it was timed round-robin with the rest of its group.
      others: Share of the CPUs other processes used meanwhile (None: unknown).
    """

    ms: Optional[float] = None
    samples: int = 0
    spread: float = 0.0
    note: str = ""
    together: bool = True
    others: Optional[float] = None


@dataclasses.dataclass
class Settings:
    """Measurement settings (from the command line)."""

    repeats: int
    min_repeats: int
    warmup: int
    seconds: float
    memory_budget: int
    verbose: bool
    quiet_wait: float = 0.0


def available_memory() -> int:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 * GIB


class CpuMonitor:
    """How much of the CPUs other processes used while we measured.

    Reads `/proc/stat` (all CPUs' busy time) and subtracts this process's own
    CPU time; the rest is what other processes took, as a share of all cores.
    """

    def __init__(self) -> None:
        self.ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self.cores = os.cpu_count() or 1
        self.start()

    def _busy(self) -> Optional[float]:
        try:
            with open("/proc/stat") as stat:
                fields = [float(x) for x in stat.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)
        return (sum(fields[:8]) - idle) / self.ticks

    def start(self) -> None:
        """Starts a measurement interval."""
        times = os.times()
        self.wall = time.perf_counter()
        self.own = times.user + times.system
        self.busy = self._busy()

    def others(self) -> Optional[float]:
        """Share of all cores used by other processes since `start`."""
        busy = self._busy()
        if busy is None or self.busy is None:
            return None
        times = os.times()
        own = times.user + times.system - self.own
        wall = max(time.perf_counter() - self.wall, 1e-3)
        return max(0.0, (busy - self.busy - own) / (wall * self.cores))

    def wait_quiet(self, settings: "Settings") -> None:
        """Waits (at most `settings.quiet_wait` s) until others use < 5%."""
        deadline = time.perf_counter() + settings.quiet_wait
        told = False
        while True:
            self.start()
            time.sleep(0.3)
            share = self.others()
            if share is None or share < QUIET_SHARE:
                return
            if time.perf_counter() > deadline:
                log(settings, f"    still busy ({share:.0%} used by others)")
                return
            if not told:
                log(settings, f"    waiting: other processes use {share:.0%}")
                told = True


QUIET_SHARE = 0.05
MONITOR: Optional[CpuMonitor] = None


def _resident() -> int:
    """Resident memory of this process in bytes (0 if unknown)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return 0


def _first_line(error: BaseException) -> str:
    """The informative line of an error (TensorFlow's start with boilerplate)."""
    skip = ("File ", "[[", "Detected at node", "Graph execution error", "The op is")
    lines = [line.strip() for line in str(error).splitlines()]
    lines = [line for line in lines if line and not line.startswith(skip)]
    message = lines[0] if lines else type(error).__name__
    return f"{type(error).__name__}: {message[:120]}"


def log(settings: Settings, message: str) -> None:
    if settings.verbose:
        print(message, file=sys.stderr, flush=True)


def time_units(
    units: List[Tuple[str, Step]],
    arguments: Tuple[tf.Tensor, tf.Tensor],
    settings: Settings,
) -> Dict[str, Result]:
    """Compiles and warms up each step, then times them all round-robin.

    Args:
      units: (key, step) pairs; every step takes the same `arguments`.
      arguments: The ids and gradient values passed to every call.
      settings: Measurement settings.

    Returns:
      key -> result (with a note instead of a time if the step failed).
    """
    results: Dict[str, Result] = {}
    live: List[Tuple[str, Step]] = []
    for key, step in units:
        try:
            start = time.perf_counter()
            step(*arguments).numpy()
            compile_s = time.perf_counter() - start
            for _ in range(settings.warmup):
                step(*arguments).numpy()
        except Exception as error:  # An op XLA lacks, an OOM, ...
            results[key] = Result(note=_first_line(error))
            log(settings, f"    {key}: {results[key].note}")
            continue
        log(settings, f"    {key}: first call {compile_s:.2f} s")
        live.append((key, step))
    samples: Dict[str, List[float]] = {key: [] for key, _ in live}
    spent = {key: 0.0 for key, _ in live}
    if MONITOR is not None:
        if settings.quiet_wait > 0:
            MONITOR.wait_quiet(settings)
        MONITOR.start()
    while True:
        active = [
            (key, step)
            for key, step in live
            if len(samples[key]) < settings.repeats
            and (
                len(samples[key]) < settings.min_repeats
                or spent[key] < settings.seconds
            )
        ]
        if not active:
            break
        for key, step in active:
            start = time.perf_counter()
            step(*arguments).numpy()
            elapsed = time.perf_counter() - start
            samples[key].append(elapsed)
            spent[key] += elapsed
    others = MONITOR.others() if MONITOR is not None else None
    if others is not None and others >= QUIET_SHARE:
        log(settings, f"    other processes used {others:.0%} of the CPUs")
    for key, _ in live:
        times = sorted(samples[key])
        median = statistics.median(times)
        quartiles = statistics.quantiles(times, n=4) if len(times) > 1 else [0, 0, 0]
        results[key] = Result(
            ms=median * 1e3,
            samples=len(times),
            spread=(quartiles[2] - quartiles[0]) / median,
            others=others,
        )
    return results


@dataclasses.dataclass
class Member:
    """A subject of a comparison group, the modes to time and its problem.

    All members of one group share the ids and gradient values (they may
    differ in table rows).
    """

    subject: Subject
    modes: Sequence[str]
    problem: Problem


def run_group(
    members: Dict[str, Member], settings: Settings
) -> Dict[Tuple[str, str], Result]:
    """Times each `(member, mode)` of a comparison group.

    Members are packed, in order, into batches that fit the memory budget
    (usually one batch: the whole group); the states of a batch are built
    together and all its steps are timed round-robin. A member that alone
    does not fit is skipped with a note. Results of a group that needed more
    than one batch are marked (`together=False`).

    Args:
      members: Group key -> member.
      settings: Measurement settings.

    Returns:
      `(group key, mode)` -> result.
    """
    results: Dict[Tuple[str, str], Result] = {}
    started = time.perf_counter()
    batches: List[List[str]] = [[]]
    used = 0
    for key, member in members.items():
        need = member.subject.bytes_needed(member.problem)
        if need > settings.memory_budget:
            note = (
                f"skipped: needs ~{need / GIB:.1f} GiB > budget "
                f"{settings.memory_budget / GIB:.1f} GiB"
            )
            for mode in member.modes:
                results[key, mode] = Result(note=note)
            log(settings, f"    {key}: {note}")
            continue
        if batches[-1] and used + need > settings.memory_budget:
            batches.append([])
            used = 0
        batches[-1].append(key)
        used += need
    together = len(batches) == 1
    for batch in batches:
        units: List[Tuple[str, Step]] = []
        built: List[Subject] = []
        timed: Dict[str, Result] = {}
        try:
            for key in batch:
                member = members[key]
                log(settings, f"    build {key}: {_resident() / GIB:.1f} GiB resident")
                member.subject.build(member.problem)
                built.append(member.subject)
                for mode in member.modes:
                    # No local name for the step: it holds the state's
                    # variables, which must go with `units.clear()`.
                    units.append(
                        (f"{key}|{mode}", member.subject.step(member.problem, mode))
                    )
            if units:
                first = members[batch[0]].problem
                timed = time_units(units, (first.ids, first.values), settings)
        finally:
            units.clear()
            for subject in built:
                subject.release()
            gc.collect()
        for unit, result in timed.items():
            key, mode = unit.rsplit("|", 1)
            result.together = together
            results[key, mode] = result
    log(
        settings,
        f"    ({time.perf_counter() - started:.1f} s; {len(batches)} batch(es); "
        f"memory after release {_resident() / GIB:.1f} GiB)",
    )
    return results
