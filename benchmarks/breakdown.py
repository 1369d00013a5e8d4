"""Where the time of our sparse step goes (companion of `sparse_step`).

Two views of one `apply_gradients` step of our `Adagrad(epsilon=0)` and
`Adam(lazy=True)` on the `sparse_step` problem (1M x 64 table, 16,384 Zipf ids):

1. Stages of the graph-mode step, timed as separate cumulative
   `tf.function`s on the package's own functions: de-duplication
   (`deduplicate`, one entry per distinct id, as `update_step` does outside
   XLA), + gather of the table and slot rows, + the update rule
   (`rules.tpu_step`), + the scatters (that is `update_step`), + Keras's
   `apply_gradients` around it. The difference between consecutive stages is
   the cost of the added part. (Under XLA the rows are updated inside
   conditionals, `sparse.update_distinct`, so prefixes of the step are not
   the step's parts; the XLA profile below shows them.)
2. A TensorFlow profiler trace of the graph-mode step, summed per op type
   (with 2 cores, ops overlap: the op times can add up to more than the step),
   and the thunks of the XLA-compiled step.

Run from the repository root:

    python -m benchmarks.breakdown [--rows 1M] [--dim 64] [--output FILE]
"""

from __future__ import annotations

import argparse
import collections
import glob
import pathlib
import sys
import tempfile
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import keras
import tensorflow as tf

if __package__ in (None, ""):
    # Run as a file (`python benchmarks/breakdown.py`): `benchmarks` is the
    # checkout's folder, which Python does not put on the path then.
    sys.path.append(str(pathlib.Path(__file__).resolve().parent.parent))

from benchmarks.sparse_step import cli, measurement, output, problems  # noqa: E402
from tf_tpu_embed_opt import optimizers as teo  # noqa: E402
from tf_tpu_embed_opt.definitions import rules  # noqa: E402

STAGES = ("dedup", "+ gather", "+ rule", "+ scatter", "apply_gradients")

# Op types of the profile, by part of the step.
CATEGORIES = {
    "Unique": "dedup",
    "UnsortedSegmentSum": "dedup",
    "UnsortedSegmentMax": "dedup",
    "ResourceGather": "gather",
    "ResourceScatterUpdate": "scatter",
}


def _optimizer(name: str) -> keras.optimizers.Optimizer:
    if name == "Adagrad":
        return teo.Adagrad(epsilon=0.0)
    return teo.Adam(lazy=True)


def _stage_step(
    name: str, stage: str, problem: problems.Problem
) -> Tuple[Callable[[tf.Tensor, tf.Tensor], tf.Tensor], List[Any]]:
    """A step that runs our update up to `stage`; returns it and its state."""
    optimizer = _optimizer(name)
    table = keras.Variable(
        initializer="zeros", shape=(problem.rows, problem.dim), name="table"
    )
    optimizer.build([table])
    slots = {
        slot: variables[0] for slot, variables in optimizer._slot_variables.items()
    }
    lr = tf.constant(0.001)
    dense_shape = tf.constant([problem.rows, problem.dim])

    def body(ids: tf.Tensor, values: tf.Tensor) -> Tuple[tf.Tensor, ...]:
        if stage == "apply_gradients":
            gradient = tf.IndexedSlices(values, ids, dense_shape)
            optimizer.apply_gradients([(gradient, table)])
            return (table.value.sparse_read([0]),)
        unique, rows = teo.deduplicate(ids, values, static_shape=False)
        if stage == "dedup":
            return unique, rows
        w = tf.gather(table.value, unique)
        current = {slot: tf.gather(v.value, unique) for slot, v in slots.items()}
        if stage == "+ gather":
            return (unique, rows, w, *current.values())
        new_w, new_slots = rules.tpu_step(
            optimizer._active,
            teo.TENSORFLOW,
            w,
            current,
            rows,
            lr,
            optimizer._hypers,
            **optimizer._options,
        )
        if stage == "+ rule":
            return (unique, new_w, *new_slots.values())
        for slot, value in new_slots.items():
            slots[slot].value.scatter_update(tf.IndexedSlices(value, unique))
        table.value.scatter_update(tf.IndexedSlices(new_w, unique))
        return (table.value.sparse_read([0]),)

    function = tf.function(body)

    def step(ids: tf.Tensor, values: tf.Tensor) -> tf.Tensor:
        # The call returns once every output is computed; fetch one of them.
        return function(ids, values)[0]

    return step, [optimizer, table]


def stage_table(
    names: Sequence[str], problem: problems.Problem, settings: measurement.Settings
) -> List[str]:
    """Markdown rows: cumulative stage times (graph mode) and increments."""
    lines = [
        "| optimizer | stage | cumulative ms | added ms |",
        "|---|---|--:|--:|",
    ]
    for name in names:
        units, state = [], []
        for stage in STAGES:
            step, held = _stage_step(name, stage, problem)
            units.append((stage, step))
            state.extend(held)
        results = measurement.time_units(units, (problem.ids, problem.values), settings)
        previous = 0.0
        for stage in STAGES:
            ms = results[stage].ms
            if ms is None:
                lines.append(f"| {name} | {stage} | n/a | – |")
                continue
            lines.append(f"| {name} | {stage} | {ms:.2f} | {ms - previous:+.2f} |")
            previous = ms
        del units, state
    return lines


def _profile(
    step: Callable[[tf.Tensor, tf.Tensor], tf.Tensor],
    problem: problems.Problem,
    steps: int,
) -> Tuple[Dict[str, float], float]:
    """Per-op-type milliseconds per step from a profiler trace, and wall ms."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    for _ in range(5):
        step(problem.ids, problem.values).numpy()
    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(logdir)
        for _ in range(steps):
            step(problem.ids, problem.values).numpy()
        tf.profiler.experimental.stop()
        path = glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True)[0]
        space = xplane_pb2.XSpace()
        space.ParseFromString(pathlib.Path(path).read_bytes())
    totals: Dict[str, float] = collections.defaultdict(float)
    wall = 0.0
    for plane in space.planes:
        if plane.name != "/host:CPU":
            continue
        metadata = plane.event_metadata
        for line in plane.lines:
            for event in line.events:
                name = metadata[event.metadata_id].name
                ms = event.duration_ps / 1e9 / steps
                if line.name == "python" and name == "EagerExecute":
                    wall += ms
                elif line.name.startswith("tf_Compute") and _is_op(name):
                    totals[name.rsplit(":", 1)[1]] += ms
                elif _is_thunk(name):  # XLA:CPU thunks (python or Eigen threads).
                    totals[f"xla:{name}"] += ms
    return dict(totals), wall


_CONTAINERS = (
    "step",
    "body",
    "TFE_Py_ExecuteCancelable",
    "EagerExecute",
    "EagerKernelExecute",
    "EagerCopyToDevice",
    "CpuExecutable::ExecuteAsyncOnStream",
    "ThunkExecutor::Execute",
    "BlockUntilReady",
    "FunctionRun",
    "ExecutorDoneCallback",
    "KernelAndDeviceFunc::Run",
    "ParallelFor",
)


def _is_thunk(name: str) -> bool:
    return (
        name not in _CONTAINERS
        and ":" not in name
        and not name.startswith(("EagerLocalExecute", "__inference"))
    )


def xla_profile_table(
    names: Sequence[str], problem: problems.Problem, steps: int = 20
) -> List[str]:
    """Markdown rows: the most expensive XLA:CPU thunks of our XLA step."""
    lines = ["| step | wall ms | top XLA thunks (ms per step) |", "|---|--:|---|"]
    for name in names:
        entry = "Adagrad" if name == "Adagrad" else "Adam-lazy"
        subject = problems.ENTRIES[entry].ours()
        subject.build(problem)
        try:
            totals, wall = _profile(subject.step(problem, "xla"), problem, steps)
        finally:
            subject.release()
        thunks = sorted(
            ((op[4:], ms) for op, ms in totals.items() if op.startswith("xla:")),
            key=lambda kv: -kv[1],
        )
        top = ", ".join(f"`{op}` {ms:.2f}" for op, ms in thunks[:7])
        lines.append(f"| ours {name} (xla) | {wall:.2f} | {top} |")
    return lines


def _is_op(name: str) -> bool:
    # Op events are "name:Type"; executor events are "ExecutorState::Process".
    return ":" in name and "::" not in name


def profile_table(
    names: Sequence[str], problem: problems.Problem, steps: int = 20
) -> List[str]:
    """Markdown rows: profiled op time per category for our step and fused."""
    subjects: Dict[str, problems.Subject] = {}
    for name in names:
        subjects[f"ours {name}"] = problems.ENTRIES[
            "Adagrad" if name == "Adagrad" else "Adam-lazy"
        ].ours()
    subjects["fused AdagradV2"] = problems.ENTRIES["Adagrad"].reference()
    subjects["gather/scatter lazy Adam"] = problems.LazyAdamReference()
    lines = [
        "| step | wall ms | dedup | gather | rule (element-wise) | scatter "
        "| other | top op types |",
        "|---|--:|--:|--:|--:|--:|--:|---|",
    ]
    for label, subject in subjects.items():
        subject.build(problem)
        try:
            totals, wall = _profile(subject.step(problem, "graph"), problem, steps)
        finally:
            subject.release()
        parts: Dict[str, float] = collections.defaultdict(float)
        for op, ms in totals.items():
            if op.startswith("ResourceSparseApply"):
                parts["rule"] += ms
            else:
                parts[CATEGORIES.get(op, _elementwise_or_other(op))] += ms
        top = ", ".join(
            f"{op} {ms:.2f}"
            for op, ms in sorted(totals.items(), key=lambda kv: -kv[1])[:4]
        )
        lines.append(
            f"| {label} | {wall:.2f} | {parts['dedup']:.2f} | {parts['gather']:.2f} "
            f"| {parts['rule']:.2f} | {parts['scatter']:.2f} | {parts['other']:.2f} "
            f"| {top} |"
        )
    return lines


_ELEMENTWISE = {
    "Mul",
    "AddV2",
    "Sub",
    "RealDiv",
    "Sqrt",
    "Rsqrt",
    "Square",
    "Maximum",
    "Minimum",
    "Neg",
    "Abs",
    "Sign",
    "Pow",
    "SelectV2",
}


def _elementwise_or_other(op: str) -> str:
    return "rule" if op in _ELEMENTWISE else "other"


def main(argv: Optional[Sequence[str]] = None) -> str:
    """Prints (and optionally writes) the two breakdown tables."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.breakdown", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--rows", default="1M", help="Table rows.")
    parser.add_argument("--dim", type=int, default=64, help="Table dim.")
    parser.add_argument("--repeats", type=int, default=40, help="Timed steps.")
    parser.add_argument("--optimizers", default="Adagrad,Adam", help="Adagrad, Adam.")
    parser.add_argument("--output", help="Also write the Markdown to this file.")
    args = parser.parse_args(argv)
    rows = output.parse_size(args.rows)
    ids = problems.zipf_ids(problems.BATCH, min(rows, 1_000_000))
    problem = problems.sparse_problem(rows, args.dim, ids)
    settings = measurement.Settings(
        repeats=args.repeats,
        min_repeats=args.repeats,
        warmup=3,
        seconds=60.0,
        memory_budget=0,
        verbose=False,
    )
    names = cli.comma_list(args.optimizers)
    lines = [
        f"Machine: {output.machine_line()}",
        "",
        f"{output.size_text(rows)} x {args.dim} table, {problems.BATCH:,} Zipf ids.",
        "",
        "Stages of the graph-mode step (medians of round-robin timed steps; "
        "`added` = this stage minus the previous one):",
        "",
        *stage_table(names, problem, settings),
        "",
        "Graph-mode profile (TensorFlow profiler, ms per step summed per op type):",
        "",
        *profile_table(names, problem),
        "",
        "XLA-mode profile (the thunks of the compiled step; names are HLO "
        "instructions: `sort*` is the de-duplication's sort, `*gather*` "
        "gathers, `*scatter*` segment sums and scatters, `conditional*` the "
        "row updates, `wrapped_broadcast*` zero-fills):",
        "",
        *xla_profile_table(names, problem),
    ]
    text = "\n".join(lines)
    print(text)
    if args.output:
        pathlib.Path(args.output).write_text(text + "\n")
    return text


if __name__ == "__main__":
    main(sys.argv[1:])
