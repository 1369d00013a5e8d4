"""The report's sections: optimizers, the size grid, dense steps, imports."""

from __future__ import annotations

import dataclasses
import gc
import os
import pathlib
import subprocess
import sys
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

import tf_tpu_embed_opt
from benchmarks.sparse_step.measurement import (
    QUIET_SHARE,
    Member,
    Result,
    Settings,
    log,
    run_group,
)
from benchmarks.sparse_step.problems import (
    DENSE_PAIRS,
    ENTRIES,
    MODES,
    KerasSubject,
    Problem,
    TfrsSubject,
    dense_problem,
    sparse_problem,
)

# --------------------------------------------------------------------------


def fmt_ms(result: Optional[Result]) -> str:
    if result is None:
        return "–"
    if result.ms is None:
        return "n/a"
    mark = "" if result.together else "†"
    if result.others is not None and result.others >= QUIET_SHARE:
        mark += "~"
    return f"{result.ms:.2f}{mark}"


def ratio(numerator: Optional[Result], denominator: Optional[Result]) -> str:
    value = ratio_value(numerator, denominator)
    return "–" if value is None else f"{value:.2f}"


def ratio_value(
    numerator: Optional[Result], denominator: Optional[Result]
) -> Optional[float]:
    if numerator is None or denominator is None:
        return None
    if numerator.ms is None or denominator.ms is None:
        return None
    return numerator.ms / denominator.ms


@dataclasses.dataclass
class Report:
    """Everything measured, for the tables and the goal summary."""

    machine: str = ""
    ids_line: str = ""
    optimizers: Dict[Tuple[str, str], Dict[str, Result]] = dataclasses.field(
        default_factory=dict
    )
    grid: Dict[Tuple[str, int, int], Dict[Tuple[str, str], Result]] = dataclasses.field(
        default_factory=dict
    )
    dense: Dict[str, Dict[Tuple[str, str], Result]] = dataclasses.field(
        default_factory=dict
    )
    imports: Dict[str, List[float]] = dataclasses.field(default_factory=dict)
    notes: List[str] = dataclasses.field(default_factory=list)
    failures: List[str] = dataclasses.field(default_factory=list)
    base: Tuple[int, int] = (0, 0)
    command: str = ""


def section_optimizers(
    names: Sequence[str],
    modes: Sequence[str],
    problem: Problem,
    settings: Settings,
    tfrs_cls: Optional[type],
    tfrs_missing: str,
    report: Report,
    keras_modes: Sequence[str] = MODES,
) -> None:
    """Every optimizer of the package at the base size, both modes."""
    for name in names:
        entry = ENTRIES[name]
        log(settings, f"[optimizers] {name} {problem.rows}x{problem.dim}")
        members = {"ours": Member(entry.ours(), modes, problem)}
        if entry.reference is not None:
            members["ref"] = Member(entry.reference(), modes, problem)
        if entry.keras is not None:
            keras_in = [m for m in modes if m in keras_modes]
            members["keras"] = Member(entry.keras(), keras_in, problem)
        if entry.tfrs:
            if tfrs_cls is not None:
                members["ref"] = Member(TfrsSubject(tfrs_cls), modes, problem)
            else:
                report.notes.append(f"TFRS ClippyAdagrad not measured: {tfrs_missing}")
            members["adagrad"] = Member(ENTRIES["Adagrad"].ours(), modes, problem)
        results = run_group(members, settings)
        ref_label = members["ref"].subject.label if "ref" in members else ""
        for (key, mode), result in results.items():
            if result.note and not (key == "ref" and mode == "xla"):
                report.failures.append(f"{name} {key} ({mode}): {result.note}")
        for mode in modes:
            row = {key: results.get((key, mode)) for key in members}
            row["ref_label"] = ref_label  # type: ignore[assignment]
            row["ours_graph"] = results.get(("ours", "graph"))
            row["ref_graph"] = results.get(("ref", "graph"))
            report.optimizers[name, mode] = row


def section_grid(
    names: Sequence[str],
    rows_list: Sequence[int],
    dims: Sequence[int],
    modes: Sequence[str],
    ids: np.ndarray,
    settings: Settings,
    report: Report,
) -> None:
    """Adagrad and lazy Adam over table sizes and dims, ours vs reference.

    One group per optimizer and dim: every table size, ours and the
    reference, timed side by side as far as memory allows, so that the
    size ratios are as robust as the reference ratios.
    """
    for name in names:
        entry = ENTRIES[name]
        for dim in dims:
            log(settings, f"[grid] {name} x {dim}: rows {rows_list}")
            members: Dict[str, Member] = {}
            for rows in rows_list:
                problem = sparse_problem(rows, dim, ids)
                members[f"ours|{rows}"] = Member(entry.ours(), modes, problem)
                if entry.reference is not None:
                    members[f"ref|{rows}"] = Member(entry.reference(), modes, problem)
            results = run_group(members, settings)
            for rows in rows_list:
                report.grid[name, rows, dim] = {
                    (key.split("|")[0], mode): result
                    for (key, mode), result in results.items()
                    if key.split("|")[1] == str(rows)
                }
            del members
            gc.collect()


def section_dense(
    names: Sequence[str],
    modes: Sequence[str],
    rows: int,
    dim: int,
    settings: Settings,
    report: Report,
) -> None:
    """Dense-gradient steps: our twins against Keras's own optimizers."""
    problem = dense_problem(rows, dim)
    for name in names:
        ours, theirs, tables = DENSE_PAIRS[name]
        log(settings, f"[dense] {name} {rows}x{dim}")
        members = {
            "ours": Member(KerasSubject("ours", ours, tables, 4), modes, problem),
            "keras": Member(KerasSubject("keras", theirs, tables, 4), modes, problem),
        }
        report.dense[name] = run_group(members, settings)


def section_import(runs: int, report: Report, totals: bool = True) -> None:
    """Import times in fresh processes, with and without the package.

    Three numbers per process kind, medians over `runs` fresh interpreters:
    `import tensorflow, keras`; the same plus `tf_tpu_embed_opt`; and, in a
    process that has already imported TensorFlow and Keras, the time of
    `import tf_tpu_embed_opt` alone (what the package adds; the difference of
    the first two is much noisier). With `totals=False`, only the last one
    (and no cache-warming round: this process has just read the same files).
    """
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # Time the import of the package this process benchmarks (the checkout's,
    # or the installed one when the harness runs against an installation).
    root = str(pathlib.Path(tf_tpu_embed_opt.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    codes = {
        "tensorflow, keras": (
            "import time; t = time.perf_counter(); import tensorflow, keras; "
            "print(time.perf_counter() - t)"
        ),
        "tensorflow, keras, tf_tpu_embed_opt": (
            "import time; t = time.perf_counter(); "
            "import tensorflow, keras, tf_tpu_embed_opt; "
            "print(time.perf_counter() - t)"
        ),
        IMPORT_ADDED: (
            "import time, tensorflow, keras; t = time.perf_counter(); "
            "import tf_tpu_embed_opt; print(time.perf_counter() - t)"
        ),
    }
    if not totals:
        codes = {IMPORT_ADDED: codes[IMPORT_ADDED]}
    times: Dict[str, List[float]] = {label: [] for label in codes}
    first = 0 if totals else 1  # A first round only warms the file cache.
    for run in range(first, runs + 1):
        for label, code in codes.items():
            done = subprocess.run(
                [sys.executable, "-c", code],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            if run:
                times[label].append(float(done.stdout.strip().splitlines()[-1]))
    report.imports = times


IMPORT_ADDED = "tf_tpu_embed_opt after tensorflow, keras"
