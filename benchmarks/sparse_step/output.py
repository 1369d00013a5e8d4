"""The Markdown report: machine line, tables, goals."""

from __future__ import annotations

import datetime
import os
import platform
import statistics
from typing import Any, List, Optional, Sequence, Tuple

import keras
import numpy as np
import tensorflow as tf

from benchmarks.sparse_step.measurement import (
    QUIET_SHARE,
    Result,
)
from benchmarks.sparse_step.problems import (
    GIB,
)
from benchmarks.sparse_step.sections import (
    IMPORT_ADDED,
    Report,
    fmt_ms,
    ratio,
    ratio_value,
)


def machine_line() -> str:
    """Cores, CPU model, memory and versions of this machine."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    total = 0
    try:
        with open("/proc/meminfo") as meminfo:
            total = int(meminfo.readline().split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0
    tfrs = _dist_version("tensorflow-recommenders")
    malloc = [f"{k}={v}" for k, v in os.environ.items() if k.startswith("MALLOC_")]
    if "LD_PRELOAD" in os.environ:
        malloc.append(f"LD_PRELOAD={os.environ['LD_PRELOAD']}")
    return (
        f"{cores or os.cpu_count()} cores, {model}, {total / GIB:.0f} GiB RAM; "
        f"Python {platform.python_version()}, TensorFlow {tf.__version__} (CPU), "
        f"Keras {keras.__version__}, NumPy {np.__version__}, "
        f"tf_keras {_dist_version('tf_keras')}, "
        f"tensorflow-recommenders {tfrs}; {platform.system()} "
        f"{platform.release()}; malloc: {' '.join(malloc) or 'glibc defaults'}; "
        f"{datetime.date.today().isoformat()}"
    )


def _dist_version(name: str) -> str:
    try:
        from importlib import metadata

        return metadata.version(name)
    except Exception:
        return "not installed"


def size_text(rows: int) -> str:
    if rows % 1_000_000 == 0:
        return f"{rows // 1_000_000}M"
    if rows % 1_000 == 0:
        return f"{rows // 1_000}k"
    return str(rows)


def parse_size(text: str) -> int:
    text = text.strip().lower().replace("_", "")
    scale = {"k": 1_000, "m": 1_000_000}.get(text[-1:], 1)
    return int(float(text.rstrip("km")) * scale)


def render(report: Report, modes: Sequence[str]) -> str:
    """The Markdown tables of everything in `report`."""
    out: List[str] = [f"Machine: {report.machine}", "", report.ids_line, ""]
    if report.optimizers:
        out.extend(_optimizer_rows(report, modes))
    if report.grid:
        out.extend(_grid_rows(report, modes))
    if report.dense:
        out.extend(_dense_rows(report, modes))
    if report.imports:
        out.extend(_import_rows(report))
    goals = goal_rows(report, modes)
    if goals:
        out.append("### Goals of issue #4")
        out.append("")
        out.append("| goal | measured | target | status |")
        out.append("|---|--:|---|---|")
        out.extend(goals)
        out.append("")
    disturbed = [
        r.others
        for r in _all_results(report)
        if r.others is not None and r.others >= QUIET_SHARE
    ]
    if disturbed:
        out.append(
            f"- ~ : other processes used {QUIET_SHARE:.0%} or more of the CPUs "
            f"while this was timed ({len(disturbed)} results, up to "
            f"{max(disturbed):.0%}); such numbers are noisier."
        )
    for failure in report.failures:
        out.append(f"- n/a: {failure}")
    for note in report.notes:
        out.append(f"- {note}")
    if report.notes or report.failures or disturbed:
        out.append("")
    if report.command:
        out.append(f"Command: `{report.command}`")
    return "\n".join(out)


def _optimizer_rows(report: Report, modes: Sequence[str]) -> List[str]:
    """The section of every optimizer's sparse step."""
    out: List[str] = []
    rows, dim = report.base
    table = f"{size_text(rows)} x {dim} table"
    out.append(f"### Sparse step, every optimizer ({table})")
    out.append("")
    out.append(
        "ms/step is the median; `ours/ref` < 1 is faster than the reference; "
        "`keras/ours` is the speed-up over Keras 3's own optimizer; "
        "`xla/graph` compares our two modes; `vs Adagrad` is our step over "
        "our `Adagrad(epsilon=0)` step. In xla rows a reference that XLA "
        "cannot compile is compared in graph mode (marked `(graph)`)."
    )
    out.append("")
    out.append(
        "| optimizer | mode | ours ms | reference | ref ms | ours/ref "
        "| keras ms | keras/ours | xla/graph | vs Adagrad |"
    )
    out.append("|---|---|--:|---|--:|--:|--:|--:|--:|--:|")
    adagrad = {
        mode: report.optimizers.get(("Adagrad", mode), {}).get("ours") for mode in modes
    }
    for (name, mode), row in report.optimizers.items():
        ours, ref, ker = row.get("ours"), row.get("ref"), row.get("keras")
        ref_label = row.get("ref_label") or "–"
        ref_cmp = ref
        if mode == "xla" and ref is not None and ref.ms is None:
            ref_cmp = row.get("ref_graph")
            if ref_cmp is not None and ref_cmp.ms is not None:
                ref_label = f"{ref_label} (graph)"
        versus = row.get("adagrad") or adagrad.get(mode)
        xla_graph = ratio(ours, row.get("ours_graph")) if mode == "xla" else "–"
        label = name if name != "Adam-lazy" else "Adam(lazy=True)"
        if name == "Adagrad":
            label = "Adagrad(epsilon=0)"
        out.append(
            f"| {label} | {mode} | {fmt_ms(ours)} | {ref_label} "
            f"| {fmt_ms(ref_cmp)} | {ratio(ours, ref_cmp)} | {fmt_ms(ker)} "
            f"| {ratio(ker, ours)} | {xla_graph} "
            f"| {ratio(ours, versus) if name != 'Adagrad' else '1.00'} |"
        )
    out.append("")
    return out


def _grid_rows(report: Report, modes: Sequence[str]) -> List[str]:
    """The section over table sizes and dims."""
    out: List[str] = []
    out.append("### Sparse step over table sizes and dims (ours vs reference)")
    out.append("")
    out.append(
        "One group per optimizer and dim: all sizes, ours and reference, "
        "timed round-robin. `vs 1M rows`: ours at this size over ours at the "
        "smallest size (same dim, mode and ids). † = the group did not fit "
        "in memory at once and was timed in several batches (then the "
        "sizes are not side by side)."
    )
    out.append("")
    out.append(
        "| optimizer | rows | dim | mode | ours ms | ref ms | ours/ref "
        "| vs 1M rows | xla/graph |"
    )
    out.append("|---|--:|--:|---|--:|--:|--:|--:|--:|")
    for (name, rows, dim), results in report.grid.items():
        smallest = min(r for (n, r, d) in report.grid if n == name and d == dim)
        for mode in modes:
            ours = results.get(("ours", mode))
            ref = results.get(("ref", mode))
            if mode == "xla" and ref is not None and ref.ms is None:
                ref = results.get(("ref", "graph"))
            base = report.grid[name, smallest, dim].get(("ours", mode))
            flat = ratio(ours, base) if rows != smallest else "1.00"
            xla_graph = (
                ratio(ours, results.get(("ours", "graph"))) if mode == "xla" else "–"
            )
            note = ""
            if ours is not None and ours.ms is None:
                note = f" ({ours.note})"
            label = "Adam(lazy=True)" if name == "Adam-lazy" else name
            out.append(
                f"| {label} | {size_text(rows)} | {dim} | {mode} "
                f"| {fmt_ms(ours)}{note} | {fmt_ms(ref)} | {ratio(ours, ref)} "
                f"| {flat} | {xla_graph} |"
            )
    out.append("")
    return out


def _dense_rows(report: Report, modes: Sequence[str]) -> List[str]:
    """The section of the dense-gradient step."""
    out: List[str] = []
    out.append("### Dense-gradient step (ours vs Keras's own optimizer)")
    out.append("")
    out.append("| optimizer | mode | ours ms | keras ms | ours/keras |")
    out.append("|---|---|--:|--:|--:|")
    for name, results in report.dense.items():
        for mode in modes:
            ours = results.get(("ours", mode))
            ker = results.get(("keras", mode))
            out.append(
                f"| {name} | {mode} | {fmt_ms(ours)} | {fmt_ms(ker)} "
                f"| {ratio(ours, ker)} |"
            )
    out.append("")
    return out


def _import_rows(report: Report) -> List[str]:
    """The section of import times."""
    out: List[str] = []
    out.append("### Import time (fresh processes, median)")
    out.append("")
    out.append("| import | median s | min s | runs |")
    out.append("|---|--:|--:|--:|")
    for label, times in report.imports.items():
        out.append(
            f"| `{label}` | {statistics.median(times):.3f} | {min(times):.3f} "
            f"| {len(times)} |"
        )
    out.append("")
    return out


def _all_results(report: Report) -> List[Result]:
    found: List[Result] = []
    for row in report.optimizers.values():
        found.extend(v for v in row.values() if isinstance(v, Result))
    for group in list(report.grid.values()) + list(report.dense.values()):
        found.extend(group.values())
    return found


def _status(value: Optional[float], target: float, must: float, higher=False):
    if value is None:
        return "not measured"
    if higher:
        return (
            "met" if value >= target else ("met (min)" if value >= must else "MISSED")
        )
    return "met" if value <= target else ("met (max)" if value <= must else "MISSED")


def goal_rows(report: Report, modes: Sequence[str]) -> List[str]:
    """One Markdown row per goal of the issue that this run measured."""
    goals: List[Tuple[str, Optional[float], str, str]] = []
    if report.optimizers:
        goals += _optimizer_goals(report, modes)
    if report.grid:
        goals += _grid_goals(report, modes)
    if report.dense:
        worst, where = _worst(
            (
                ratio_value(results.get(("ours", mode)), results.get(("keras", mode))),
                f"{name}, {mode}",
            )
            for name, results in report.dense.items()
            for mode in modes
        )
        goals.append(
            (
                f"Dense step ours / Keras, worst ({where})",
                worst,
                "≤ 1.1x",
                _status(worst, 1.1, 1.1),
            )
        )
    lines = [
        f"| {goal} | {value:.2f}x | {target} | {status} |"
        for goal, value, target, status in goals
        if value is not None  # measured in this run
    ]
    if report.imports.get(IMPORT_ADDED):
        added = statistics.median(report.imports[IMPORT_ADDED])
        lines.append(
            f"| Import time added by tf_tpu_embed_opt | {added:.2f} s | < 0.3 s "
            f"| {'met' if added < 0.3 else 'MISSED'} |"
        )
    return lines


def _worst(values: Any) -> Tuple[Optional[float], str]:
    """The largest of `(value, where)` pairs whose value is measured."""
    worst, where = None, ""
    for value, place in values:
        if value is not None and (worst is None or value > worst):
            worst, where = value, place
    return worst, where


def _optimizer_goals(
    report: Report, modes: Sequence[str]
) -> List[Tuple[str, Optional[float], str, str]]:
    """The goals measured on every optimizer's sparse step."""

    def opt(name: str, mode: str, key: str) -> Optional[Result]:
        return report.optimizers.get((name, mode), {}).get(key)

    goals = []
    for name, reference in (
        ("Adagrad", "Adagrad(epsilon=0) / fused AdagradV2 (graph)"),
        ("Adam-lazy", "Adam(lazy=True) / gather-scatter lazy Adam (graph)"),
    ):
        value = ratio_value(opt(name, "graph", "ours"), opt(name, "graph", "ref"))
        goals.append((reference, value, "≤ 1.2x (≤ 1.5x)", _status(value, 1.2, 1.5)))
    for mode in modes:
        value = ratio_value(
            opt("ClippyAdagrad", mode, "ours"), opt("ClippyAdagrad", mode, "adagrad")
        )
        goals.append(
            (
                f"ClippyAdagrad / our Adagrad ({mode})",
                value,
                "≤ 2x",
                _status(value, 2.0, 2.0),
            )
        )
    for name, label in (("Adagrad", "Adagrad"), ("Adam-lazy", "Adam")):
        for mode in modes:
            value = ratio_value(opt(name, mode, "keras"), opt(name, mode, "ours"))
            goals.append(
                (
                    f"Keras {label} / ours ({name}, {mode})",
                    value,
                    "≥ 10x (aim 20x)",
                    _status(value, 20.0, 10.0, higher=True),
                )
            )
    for mode in modes:
        value = ratio_value(
            opt("ClippyAdagrad", mode, "ours"), opt("ClippyAdagrad", mode, "ref")
        )
        goals.append(
            (
                f"ClippyAdagrad / TFRS ClippyAdagrad ({mode})",
                value,
                "≤ 1x",
                _status(value, 1.0, 1.0),
            )
        )
    worst, where = _worst(
        (ratio_value(row.get("ours"), row.get("ours_graph")), name)
        for (name, mode), row in report.optimizers.items()
        if mode == "xla"
    )
    goals.append(
        (
            f"XLA / graph, worst optimizer ({where})",
            worst,
            "≤ 1.5x",
            _status(worst, 1.5, 1.5),
        )
    )
    return goals


def _grid_goals(
    report: Report, modes: Sequence[str]
) -> List[Tuple[str, Optional[float], str, str]]:
    """The goals measured over table sizes and dims."""
    worst, where = _worst(
        (
            ratio_value(
                results.get(("ours", mode)),
                report.grid[name, 1_000_000, dim].get(("ours", mode)),
            ),
            f"{name}, dim {dim}, {mode}",
        )
        for (name, rows, dim), results in report.grid.items()
        if rows == 4_000_000 and (name, 1_000_000, dim) in report.grid
        for mode in modes
    )
    goals = [
        (
            f"4M rows / 1M rows, worst ({where})",
            worst,
            "≤ 1.2x",
            _status(worst, 1.2, 1.2),
        )
    ]
    worst, where = _worst(
        (
            ratio_value(results.get(("ours", "xla")), results.get(("ours", "graph"))),
            f"{name}, {size_text(rows)} x {dim}",
        )
        for (name, rows, dim), results in report.grid.items()
    )
    goals.append(
        (
            f"XLA / graph over the grid, worst ({where})",
            worst,
            "≤ 1.5x",
            _status(worst, 1.5, 1.5),
        )
    )
    return goals
