"""The command line of `python -m benchmarks.sparse_step`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

import tf_tpu_embed_opt
from benchmarks.sparse_step import measurement
from benchmarks.sparse_step.measurement import (
    CpuMonitor,
    Result,
    Settings,
    available_memory,
    log,
)
from benchmarks.sparse_step.output import (
    machine_line,
    parse_size,
    render,
)
from benchmarks.sparse_step.problems import (
    BATCH,
    DENSE_PAIRS,
    ENTRIES,
    GIB,
    GRID_DEFAULT,
    MODES,
    SEED,
    ZIPF_EXPONENT,
    sparse_problem,
    zipf_ids,
)
from benchmarks.sparse_step.sections import (
    Report,
    section_dense,
    section_grid,
    section_import,
    section_optimizers,
)
from tests.tfrs_oracle import load_clippy_adagrad


def comma_list(text: str) -> List[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


# What --quick sets, where the option was left at its default.
_QUICK = {
    "optimizers": "Adagrad,Adam-lazy,ClippyAdagrad",
    "rows": "1M,4M",
    "dims": "64",
    "repeats": 15,
    "import_runs": 3,
    "seconds": 0.5,
    "min_repeats": 3,
    "dense_optimizers": "SGD,Adagrad,Adam",
    "keras_modes": "graph",
    "quiet_wait": 5.0,
}


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """The command line (see `--help`)."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.sparse_step",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="~1 minute: Adagrad, lazy Adam and ClippyAdagrad at 1M x 64, the "
        "grid at 1M and 4M x 64, Keras in graph mode only, 3 dense pairs, "
        "fewer repeats and import runs (options given explicitly win).",
    )
    _add_subject_arguments(parser.add_argument_group("what is measured"))
    _add_timing_arguments(parser.add_argument_group("how it is timed and reported"))
    args = parser.parse_args(argv)
    if args.quick:
        for name, value in _QUICK.items():
            if getattr(args, name) == parser.get_default(name):  # Not set.
                setattr(args, name, value)
    return args


def _add_subject_arguments(parser: Any) -> None:
    parser.add_argument(
        "--sections",
        default="optimizers,grid,dense,import",
        help="Comma-separated subset of optimizers,grid,dense,import.",
    )
    parser.add_argument(
        "--optimizers",
        default=",".join(ENTRIES),
        help="Optimizers of the per-optimizer section (Adam-lazy is Adam(lazy=True)).",
    )
    parser.add_argument(
        "--grid-optimizers",
        default=",".join(GRID_DEFAULT),
        help="Optimizers of the table-size x dim grid.",
    )
    parser.add_argument("--rows", default="1M,4M,10M", help="Grid table rows.")
    parser.add_argument("--dims", default="16,64,128", help="Grid table dims.")
    parser.add_argument(
        "--base-rows", default="1M", help="Rows of the per-optimizer section."
    )
    parser.add_argument(
        "--base-dim", type=int, default=64, help="Dim of the per-optimizer section."
    )
    parser.add_argument("--modes", default="graph,xla", help="graph and/or xla.")
    parser.add_argument(
        "--keras-modes",
        default="graph,xla",
        help="Modes in which Keras's own optimizers are timed (they are slow "
        "to compile with XLA).",
    )
    parser.add_argument("--batch", type=int, default=BATCH, help="Ids per step.")
    parser.add_argument(
        "--id-range",
        default="1M",
        help="Ids are clipped below this (the same ids for every table size; "
        "must not exceed the smallest table).",
    )
    parser.add_argument(
        "--dense-rows", default="100k", help="Rows of the dense-gradient variable."
    )
    parser.add_argument(
        "--dense-dim", type=int, default=64, help="Dim of the dense variable."
    )
    parser.add_argument(
        "--dense-optimizers",
        default=",".join(DENSE_PAIRS),
        help="Dense twins to compare.",
    )


def _add_timing_arguments(parser: Any) -> None:
    parser.add_argument(
        "--repeats", type=int, default=30, help="Timed steps per subject (at most)."
    )
    parser.add_argument(
        "--min-repeats", type=int, default=5, help="Timed steps at least."
    )
    parser.add_argument(
        "--warmup", type=int, default=3, help="Untimed steps after compiling."
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=2.0,
        help="Stop timing a subject after this many seconds of steps (once it has "
        "--min-repeats).",
    )
    parser.add_argument(
        "--import-runs", type=int, default=7, help="Fresh processes per import."
    )
    parser.add_argument(
        "--memory-fraction",
        type=float,
        default=0.75,
        help="Share of available memory the tables of one group may use.",
    )
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=60.0,
        help="Before timing a group, wait up to this many seconds until other "
        "processes use < 5%% of the CPUs (0: do not wait).",
    )
    parser.add_argument("--output", help="Also write the Markdown to this file.")
    parser.add_argument("--json", help="Also write the raw results to this JSON file.")
    parser.add_argument("--quiet", action="store_true", help="No progress on stderr.")


def main(argv: Optional[Sequence[str]] = None) -> str:
    """Runs the benchmark; prints and returns the Markdown report."""
    args = parse_args(argv)
    sections = set(comma_list(args.sections))
    modes = [m for m in comma_list(args.modes) if m in MODES]
    names = comma_list(args.optimizers)
    grid_names = comma_list(args.grid_optimizers)
    for name in names + grid_names:
        if name not in ENTRIES:
            raise SystemExit(f"unknown optimizer {name!r}; known: {', '.join(ENTRIES)}")
    rows_list = sorted(parse_size(r) for r in comma_list(args.rows))
    dims = [int(d) for d in comma_list(args.dims)]
    base_rows = parse_size(args.base_rows)
    smallest = min(rows_list + [base_rows]) if "grid" in sections else base_rows
    id_range = min(parse_size(args.id_range), smallest)
    settings = Settings(
        repeats=args.repeats,
        min_repeats=min(args.min_repeats, args.repeats),
        warmup=args.warmup,
        seconds=args.seconds,
        memory_budget=int(available_memory() * args.memory_fraction),
        verbose=not args.quiet,
        quiet_wait=args.quiet_wait,
    )
    measurement.MONITOR = CpuMonitor()
    report = Report(machine=machine_line(), base=(base_rows, args.base_dim))
    report.command = "python -m benchmarks.sparse_step " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    ids = zipf_ids(args.batch, id_range)
    report.ids_line = (
        f"Gradient: {args.batch:,} ids from Zipf({ZIPF_EXPONENT}) (NumPy seed "
        f"{SEED}, `zipf - 1` clipped below {id_range:,}), {len(np.unique(ids)):,} "
        f"unique; the same ids for every table size. Medians of up to "
        f"{settings.repeats} timed steps (at least {settings.min_repeats}, "
        f"~{settings.seconds:g} s per subject) after {settings.warmup} warm-up "
        f"steps; memory budget {settings.memory_budget / GIB:.1f} GiB per group; "
        f"tf_tpu_embed_opt {tf_tpu_embed_opt.__version__}."
    )
    started = time.perf_counter()
    if "optimizers" in sections and names:
        tfrs_cls, tfrs_missing = (None, "")
        if "ClippyAdagrad" in names:
            tfrs_cls, tfrs_missing = load_clippy_adagrad()
        problem = sparse_problem(base_rows, args.base_dim, ids)
        section_optimizers(
            names,
            modes,
            problem,
            settings,
            tfrs_cls,
            tfrs_missing,
            report,
            keras_modes=comma_list(args.keras_modes),
        )
        del problem
    if "grid" in sections and grid_names:
        section_grid(grid_names, rows_list, dims, modes, ids, settings, report)
    if "dense" in sections:
        section_dense(
            comma_list(args.dense_optimizers),
            modes,
            parse_size(args.dense_rows),
            args.dense_dim,
            settings,
            report,
        )
    if "import" in sections:
        log(settings, "[import]")
        section_import(args.import_runs, report, totals=not args.quick)
    report.notes.append(f"Total benchmark time {time.perf_counter() - started:.0f} s.")
    text = render(report, modes)
    print(text)
    if args.output:
        pathlib.Path(args.output).write_text(text + "\n")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(_raw(report), indent=1) + "\n")
    return text


def _raw(report: Report) -> Dict[str, Any]:
    def flat(results: Dict[Any, Any]) -> Dict[str, Any]:
        out = {}
        for key, value in results.items():
            name = "|".join(str(k) for k in key) if isinstance(key, tuple) else str(key)
            out[name] = (
                dataclasses.asdict(value) if isinstance(value, Result) else value
            )
        return out

    return {
        "machine": report.machine,
        "ids": report.ids_line,
        "optimizers": {"|".join(k): flat(v) for k, v in report.optimizers.items()},
        "grid": {"|".join(map(str, k)): flat(v) for k, v in report.grid.items()},
        "dense": {k: flat(v) for k, v in report.dense.items()},
        "imports": report.imports,
    }
