"""Benchmark of one `apply_gradients` step on an embedding table (issue #4).

Every measured step is a `tf.function` (mode `graph`) or a
`tf.function(jit_compile=True)` (mode `xla`) that applies one row-sparse
gradient (`tf.IndexedSlices`: a batch of Zipf-distributed ids with one gradient
row each, duplicates included) to a `rows x dim` float32 table, then returns a
one-row `sparse_read` of the table, whose `.numpy()` is the synchronisation
point. The ids and gradient rows are arguments of the function, so that no
graph optimisation can precompute the de-duplication. After a compile call and
`--warmup` calls, the steps of one comparison group (our optimizer, its
references, Keras's own optimizer, in both modes) are timed round-robin, one
call at a time with `time.perf_counter`, and the median is reported. Ratios are
therefore between numbers measured side by side in one process.

References, written here:

- `fused`: `tf.unique` + `tf.math.unsorted_segment_sum`, then TensorFlow's
  fused sparse kernel (`ResourceSparseApplyAdagradV2(epsilon=0)`, ...).
- `gather/scatter`: the straightforward lazy Adam (unique, segment sum,
  gather the rows of m, v and w, update, three `scatter_update`).
- `keras`: Keras 3's own optimizer on the same `tf.IndexedSlices`.
- `tfrs`: TF Recommenders' `ClippyAdagrad` on legacy Keras (`tf_keras`),
  loaded as in `tests/test_clippy_adagrad.py`.

Run from the repository root (see `--help`):

    python -m benchmarks.sparse_step [--quick] [--output benchmarks/RESULTS.md]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import keras
import numpy as np
import tensorflow as tf

import tf_tpu_embed_opt
from tests.tfrs_oracle import load_clippy_adagrad
from tf_tpu_embed_opt import optimizers as teo

MODES = ("graph", "xla")
BATCH = 16_384
ZIPF_EXPONENT = 1.2
SEED = 0
FLOAT_BYTES = 4
GIB = 2**30

# A step function takes the ids and the gradient rows (or, for a dense step,
# the gradient and an unused placeholder) and returns a tiny tensor to fetch.
Step = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]


# --------------------------------------------------------------------------
# Problem: ids, gradient rows, table size.


@dataclasses.dataclass
class Problem:
    """One table size and the gradient applied to it at every step.

    Attributes:
      rows: Rows of the table.
      dim: Columns of the table.
      ids: `[batch]` int32 ids, duplicates included (sparse steps).
      values: `[batch, dim]` float32 gradient rows (sparse steps), or the
        `[rows, dim]` dense gradient (dense steps).
      dense: Whether the gradient is a dense tensor rather than an
        `IndexedSlices`.
    """

    rows: int
    dim: int
    ids: tf.Tensor
    values: tf.Tensor
    dense: bool = False

    @property
    def table_bytes(self) -> int:
        """Size of one `rows x dim` float32 table."""
        return self.rows * self.dim * FLOAT_BYTES

    def sync(self, variable: tf.Variable) -> tf.Tensor:
        """A tiny read of the updated table, fetched to end the timed call.

        A sparse step reads one row with `sparse_read` (a `ResourceGather`, as
        an `Embedding` layer does). A dense step reads one element through a
        dense read instead: a sparse read would switch the variable to
        copy-on-read mode, in which every dense read copies the whole table,
        which a dense layer's variable never is.
        """
        if self.dense:
            return tf.reduce_sum(variable[:1, :1])
        return variable.sparse_read([0])

    def gradient(self, ids: tf.Tensor, values: tf.Tensor) -> Any:
        """The gradient built inside a step from its two arguments."""
        if self.dense:
            return values
        return tf.IndexedSlices(values, ids, tf.constant([self.rows, self.dim]))


def zipf_ids(batch: int, id_range: int, seed: int = SEED) -> np.ndarray:
    """`batch` ids drawn from Zipf(1.2), shifted to start at 0, clipped to range.

    Args:
      batch: Number of ids.
      id_range: Ids are clipped into `[0, id_range)`.
      seed: NumPy generator seed.

    Returns:
      An int32 array of `batch` ids (id 0 is the most frequent).
    """
    rng = np.random.default_rng(seed)
    ids = rng.zipf(ZIPF_EXPONENT, batch) - 1
    return np.minimum(ids, id_range - 1).astype(np.int32)


def sparse_problem(rows: int, dim: int, ids: np.ndarray) -> Problem:
    """A sparse problem with fixed-seed normal gradient rows."""
    rng = np.random.default_rng(SEED + dim)
    values = rng.standard_normal((len(ids), dim), dtype=np.float32)
    return Problem(rows, dim, tf.constant(ids), tf.constant(values))


def dense_problem(rows: int, dim: int) -> Problem:
    """A dense problem: a `[rows, dim]` normal gradient."""
    rng = np.random.default_rng(SEED + 1)
    values = rng.standard_normal((rows, dim), dtype=np.float32)
    return Problem(rows, dim, tf.zeros([1], tf.int32), tf.constant(values), True)


# --------------------------------------------------------------------------
# Subjects: an optimizer state (table + slots) and its step in each mode.


class Subject:
    """An optimizer state on one table, with a step function per mode.

    Attributes:
      label: Name in the tables.
      tables: Number of full-size tables the state holds (table + slots).
      scratch: Full-size temporaries one step may allocate (dense updates).
    """

    label = ""
    tables = 1
    scratch = 0

    def bytes_needed(self, problem: Problem) -> int:
        """Peak memory estimate of this subject on `problem`."""
        return (self.tables + self.scratch) * problem.table_bytes

    def build(self, problem: Problem) -> None:
        """Creates the table and the slots."""
        raise NotImplementedError

    def step(self, problem: Problem, mode: str) -> Step:
        """Returns the (not yet traced) step function of `mode`."""
        raise NotImplementedError

    def release(self) -> None:
        """Drops every reference to the state."""


def _function(body: Callable[[tf.Tensor, tf.Tensor], tf.Tensor], mode: str) -> Step:
    return tf.function(body, jit_compile=(mode == "xla"), reduce_retracing=True)


class KerasSubject(Subject):
    """A Keras 3 optimizer (ours or Keras's) on a `keras.Variable`."""

    def __init__(
        self,
        label: str,
        factory: Callable[[], keras.optimizers.Optimizer],
        tables: int,
        scratch: int = 0,
    ) -> None:
        self.label = label
        self.factory = factory
        self.tables = tables
        self.scratch = scratch
        self.variable: Any = None
        self.optimizer: Any = None

    def build(self, problem: Problem) -> None:
        self.variable = keras.Variable(
            initializer="zeros", shape=(problem.rows, problem.dim), name="table"
        )
        self.optimizer = self.factory()
        self.optimizer.build([self.variable])

    def step(self, problem: Problem, mode: str) -> Step:
        optimizer, variable = self.optimizer, self.variable

        def body(ids: tf.Tensor, values: tf.Tensor) -> tf.Tensor:
            optimizer.apply_gradients([(problem.gradient(ids, values), variable)])
            return problem.sync(variable.value)

        return _function(body, mode)

    def release(self) -> None:
        self.variable = self.optimizer = None


class TfrsSubject(Subject):
    """TF Recommenders' `ClippyAdagrad` (legacy Keras) on a `tf.Variable`."""

    label = "TFRS ClippyAdagrad"
    tables = 2

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.variable: Any = None
        self.optimizer: Any = None

    def build(self, problem: Problem) -> None:
        self.variable = tf.Variable(tf.zeros((problem.rows, problem.dim)))
        self.optimizer = self.cls()
        self.optimizer.build([self.variable])

    def step(self, problem: Problem, mode: str) -> Step:
        optimizer, variable = self.optimizer, self.variable

        def body(ids: tf.Tensor, values: tf.Tensor) -> tf.Tensor:
            optimizer.apply_gradients([(problem.gradient(ids, values), variable)])
            return problem.sync(variable)

        return _function(body, mode)

    def release(self) -> None:
        self.variable = self.optimizer = None


def _dedup(ids: tf.Tensor, values: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
    unique, segments = tf.unique(ids)
    rows = tf.math.unsorted_segment_sum(values, segments, tf.shape(unique)[0])
    return unique, rows


class FusedSubject(Subject):
    """De-duplication, then one of TensorFlow's fused sparse-apply kernels.

    `apply(variables, lr, grad, indices)` calls the kernel; `slots` are the
    initial values of the slot tables, in the kernel's argument order; `kernel`
    names the fused `tf.raw_ops` kernel, if one is used.
    """

    def __init__(
        self,
        label: str,
        slots: Sequence[float],
        apply: Callable[[List[tf.Variable], tf.Tensor, tf.Tensor], Any],
        dedup: bool = True,
        kernel: Optional[str] = None,
    ) -> None:
        self.label = label
        self.kernel = kernel
        self.slot_values = tuple(slots)
        self.tables = 1 + len(self.slot_values)
        self.apply = apply
        self.dedup = dedup
        self.variables: List[tf.Variable] = []

    def build(self, problem: Problem) -> None:
        shape = (problem.rows, problem.dim)
        self.variables = [tf.Variable(tf.zeros(shape))] + [
            tf.Variable(tf.fill(shape, value)) for value in self.slot_values
        ]

    def step(self, problem: Problem, mode: str) -> Step:
        variables, apply, dedup = self.variables, self.apply, self.dedup
        if mode == "xla" and self.kernel is not None:
            return _no_xla_kernel(self.kernel)

        def body(ids: tf.Tensor, values: tf.Tensor) -> tf.Tensor:
            if dedup:
                ids, values = _dedup(ids, values)
            apply(variables, ids, values)
            return variables[0].sparse_read([0])

        return _function(body, mode)

    def release(self) -> None:
        self.variables = []


class LazyAdamReference(Subject):
    """The straightforward gather/scatter lazy Adam (Keras's bias correction)."""

    label = "gather/scatter lazy Adam"
    tables = 3

    def __init__(self, lr: float = 0.001, beta_1: float = 0.9, beta_2: float = 0.999):
        self.lr, self.beta_1, self.beta_2, self.epsilon = lr, beta_1, beta_2, 1e-7
        self.variables: List[tf.Variable] = []

    def build(self, problem: Problem) -> None:
        shape = (problem.rows, problem.dim)
        self.variables = [tf.Variable(tf.zeros(shape)) for _ in range(3)]
        self.variables.append(tf.Variable(0.0))

    def step(self, problem: Problem, mode: str) -> Step:
        w, m, v, t = self.variables
        lr, b1, b2, eps = self.lr, self.beta_1, self.beta_2, self.epsilon

        def body(ids: tf.Tensor, values: tf.Tensor) -> tf.Tensor:
            step = t.assign_add(1.0)
            lr_t = lr * tf.sqrt(1 - tf.pow(b2, step)) / (1 - tf.pow(b1, step))
            unique, g = _dedup(ids, values)
            new_m = b1 * tf.gather(m, unique) + (1 - b1) * g
            new_v = b2 * tf.gather(v, unique) + (1 - b2) * tf.square(g)
            new_w = tf.gather(w, unique) - lr_t * new_m / (tf.sqrt(new_v) + eps)
            m.scatter_update(tf.IndexedSlices(new_m, unique))
            v.scatter_update(tf.IndexedSlices(new_v, unique))
            w.scatter_update(tf.IndexedSlices(new_w, unique))
            return w.sparse_read([0])

        return _function(body, mode)

    def release(self) -> None:
        self.variables = []


class DenseAdamReference(Subject):
    """Non-lazy Adam's floor: densify the gradient, fused `ResourceApplyAdam`."""

    label = "densify + ResourceApplyAdam"
    tables = 3
    scratch = 1

    def __init__(self, lr: float = 0.001):
        self.lr = lr
        self.variables: List[tf.Variable] = []

    def build(self, problem: Problem) -> None:
        shape = (problem.rows, problem.dim)
        self.variables = [tf.Variable(tf.zeros(shape)) for _ in range(3)]
        self.variables.append(tf.Variable(1.0))  # beta_1^t
        self.variables.append(tf.Variable(1.0))  # beta_2^t

    def step(self, problem: Problem, mode: str) -> Step:
        w, m, v, p1, p2 = self.variables
        lr, rows = self.lr, problem.rows

        def body(ids: tf.Tensor, values: tf.Tensor) -> tf.Tensor:
            grad = values
            if not problem.dense:
                grad = tf.math.unsorted_segment_sum(values, ids, rows)
            tf.raw_ops.ResourceApplyAdam(
                var=w.handle,
                m=m.handle,
                v=v.handle,
                beta1_power=p1.assign(p1 * 0.9),
                beta2_power=p2.assign(p2 * 0.999),
                lr=lr,
                beta1=0.9,
                beta2=0.999,
                epsilon=1e-7,
                grad=grad,
            )
            return w.sparse_read([0])

        return _function(body, mode)

    def release(self) -> None:
        self.variables = []


def _fused(label: str, slots: Sequence[float], kernel: str, **hypers: Any):
    """A `FusedSubject` calling `tf.raw_ops.<kernel>` with slot handles."""
    op = getattr(tf.raw_ops, kernel)

    def apply(variables: List[tf.Variable], ids: tf.Tensor, grad: tf.Tensor) -> Any:
        return op(
            **{name: v.handle for name, v in zip(_KERNEL_SLOTS[kernel], variables)},
            grad=grad,
            indices=ids,
            **hypers,
        )

    return lambda: FusedSubject(label, slots, apply, kernel=kernel)


def _no_xla_kernel(kernel: str) -> Step:
    """A step that reports, without compiling, that XLA cannot run `kernel`.

    XLA has no kernel for TensorFlow's fused `ResourceSparseApply*` ops (checked
    for every one used here on TF 2.21). Compiling one fails, after TensorFlow
    has logged an `OP_REQUIRES failed ... ResourceSparseApply...` listing that
    reads like a crash of the benchmark; the table compares such a reference
    in graph mode instead, so it is not tried.
    """

    def step(*_: Any) -> Any:
        raise NotImplementedError(f"XLA has no kernel for {kernel}")

    return step


_KERNEL_SLOTS = {
    "ResourceSparseApplyAdagradV2": ("var", "accum"),
    "ResourceSparseApplyMomentum": ("var", "accum"),
    "ResourceSparseApplyFtrl": ("var", "accum", "linear"),
    "ResourceSparseApplyRMSProp": ("var", "ms", "mom"),
    "ResourceSparseApplyCenteredRMSProp": ("var", "mg", "ms", "mom"),
    "ResourceSparseApplyAdadelta": ("var", "accum", "accum_update"),
    "ResourceSparseApplyProximalAdagrad": ("var", "accum"),
}


def _scatter_sgd() -> Subject:
    def apply(variables: List[tf.Variable], ids: tf.Tensor, grad: tf.Tensor) -> Any:
        return variables[0].scatter_sub(tf.IndexedSlices(0.01 * grad, ids))

    return FusedSubject("scatter_sub (no dedup)", (), apply, dedup=False)


# --------------------------------------------------------------------------
# The optimizers of the package and what each is compared with.


@dataclasses.dataclass
class Entry:
    """One optimizer of the package and its references.

    Attributes:
      name: Row name (`Adam-lazy` is `Adam(lazy=True)`).
      ours: Our subject.
      reference: A hand-written or fused reference, if any.
      keras: Keras 3's own optimizer with the same math, if any.
      tfrs: Whether TF Recommenders' ClippyAdagrad is the reference.
    """

    name: str
    ours: Callable[[], Subject]
    reference: Optional[Callable[[], Subject]] = None
    keras: Optional[Callable[[], Subject]] = None
    tfrs: bool = False


def _ours(label: str, factory: Callable[[], Any], tables: int, scratch: int = 0):
    return lambda: KerasSubject(label, factory, tables, scratch)


def _keras(factory: Callable[[], Any], tables: int):
    # Keras's own optimizers densify sparse gradients: full-size temporaries.
    return lambda: KerasSubject("keras", factory, tables, scratch=4)


K = keras.optimizers
ENTRIES: Dict[str, Entry] = {
    e.name: e
    for e in (
        Entry(
            "SGD",
            _ours("ours", teo.SGD, 1),
            _scatter_sgd,
            _keras(K.SGD, 1),
        ),
        Entry(
            "Adagrad",
            _ours("ours", lambda: teo.Adagrad(epsilon=0.0), 2),
            _fused(
                "fused AdagradV2",
                (0.1,),
                "ResourceSparseApplyAdagradV2",
                lr=0.001,
                epsilon=0.0,
            ),
            _keras(K.Adagrad, 2),
        ),
        Entry(
            "AdagradMomentum",
            _ours("ours", lambda: teo.AdagradMomentum(momentum=0.9), 3),
        ),
        Entry(
            "Adam-lazy",
            _ours("ours", lambda: teo.Adam(lazy=True), 3),
            LazyAdamReference,
            _keras(K.Adam, 3),
        ),
        Entry(
            "Adam",
            _ours("ours", teo.Adam, 3, scratch=4),
            DenseAdamReference,
            _keras(K.Adam, 3),
        ),
        Entry(
            "Ftrl",
            _ours("ours", lambda: teo.Ftrl(lazy=True), 3),
            _fused(
                "fused Ftrl",
                (0.1, 0.0),
                "ResourceSparseApplyFtrl",
                lr=0.001,
                l1=0.0,
                l2=0.0,
                lr_power=-0.5,
            ),
            _keras(K.Ftrl, 3),
        ),
        Entry(
            "Momentum",
            _ours("ours", teo.Momentum, 2),
            _fused(
                "fused Momentum",
                (0.0,),
                "ResourceSparseApplyMomentum",
                lr=0.01,
                momentum=0.9,
            ),
            _keras(lambda: K.SGD(0.01, momentum=0.9), 2),
        ),
        Entry(
            "RMSprop",
            _ours("ours", lambda: teo.RMSprop(lazy=True), 2),
            _fused(
                "fused RMSProp",
                (0.0, 0.0),
                "ResourceSparseApplyRMSProp",
                lr=0.001,
                rho=0.9,
                momentum=0.0,
                epsilon=1e-7,
            ),
            _keras(K.RMSprop, 2),
        ),
        Entry(
            "RMSprop-centered",
            _ours("ours", lambda: teo.RMSprop(centered=True, lazy=True), 3),
            _fused(
                "fused CenteredRMSProp",
                (0.0, 0.0, 0.0),
                "ResourceSparseApplyCenteredRMSProp",
                lr=0.001,
                rho=0.9,
                momentum=0.0,
                epsilon=1e-7,
            ),
            _keras(lambda: K.RMSprop(centered=True), 3),
        ),
        Entry(
            "Adadelta",
            _ours("ours", lambda: teo.Adadelta(lazy=True), 3),
            _fused(
                "fused Adadelta",
                (0.0, 0.0),
                "ResourceSparseApplyAdadelta",
                lr=0.001,
                rho=0.95,
                epsilon=1e-7,
            ),
            _keras(K.Adadelta, 3),
        ),
        Entry(
            "ProximalAdagrad",
            _ours("ours", teo.ProximalAdagrad, 2),
            _fused(
                "fused ProximalAdagrad",
                (0.1,),
                "ResourceSparseApplyProximalAdagrad",
                lr=0.001,
                l1=0.0,
                l2=0.0,
            ),
        ),
        Entry("ProximalYogi", _ours("ours", teo.ProximalYogi, 3)),
        Entry(
            "ClippyAdagrad",
            _ours("ours", teo.ClippyAdagrad, 2),
            tfrs=True,
        ),
    )
}

# Our twins with a Keras original, for the dense-gradient steps.
DENSE_PAIRS: Dict[str, Tuple[Callable[[], Any], Callable[[], Any], int]] = {
    "SGD": (teo.SGD, K.SGD, 1),
    "SGD(momentum=0.9)": (
        lambda: teo.SGD(momentum=0.9),
        lambda: K.SGD(momentum=0.9),
        2,
    ),
    "Adagrad": (teo.Adagrad, K.Adagrad, 2),
    "Adam": (teo.Adam, K.Adam, 3),
    "Adam(amsgrad=True)": (
        lambda: teo.Adam(amsgrad=True),
        lambda: K.Adam(amsgrad=True),
        4,
    ),
    "Ftrl": (teo.Ftrl, K.Ftrl, 3),
    "RMSprop": (teo.RMSprop, K.RMSprop, 3),
    "RMSprop(centered=True)": (
        lambda: teo.RMSprop(centered=True),
        lambda: K.RMSprop(centered=True),
        4,
    ),
    "Adadelta": (teo.Adadelta, K.Adadelta, 3),
}
GRID_DEFAULT = ("Adagrad", "Adam-lazy")


# --------------------------------------------------------------------------
# Measurement.


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


def _available_memory() -> int:
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
                _log(settings, f"    still busy ({share:.0%} used by others)")
                return
            if not told:
                _log(settings, f"    waiting: other processes use {share:.0%}")
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


def _log(settings: Settings, message: str) -> None:
    if settings.verbose:
        print(message, file=sys.stderr, flush=True)


def _time_units(
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
            _log(settings, f"    {key}: {results[key].note}")
            continue
        _log(settings, f"    {key}: first call {compile_s:.2f} s")
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
        _log(settings, f"    other processes used {others:.0%} of the CPUs")
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
            _log(settings, f"    {key}: {note}")
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
                _log(settings, f"    build {key}: {_resident() / GIB:.1f} GiB resident")
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
                timed = _time_units(units, (first.ids, first.values), settings)
        finally:
            units.clear()
            for subject in built:
                subject.release()
            gc.collect()
        for unit, result in timed.items():
            key, mode = unit.rsplit("|", 1)
            result.together = together
            results[key, mode] = result
    _log(
        settings,
        f"    ({time.perf_counter() - started:.1f} s; {len(batches)} batch(es); "
        f"memory after release {_resident() / GIB:.1f} GiB)",
    )
    return results


# --------------------------------------------------------------------------
# Sections.


def _fmt_ms(result: Optional[Result]) -> str:
    if result is None:
        return "–"
    if result.ms is None:
        return "n/a"
    mark = "" if result.together else "†"
    if result.others is not None and result.others >= QUIET_SHARE:
        mark += "~"
    return f"{result.ms:.2f}{mark}"


def _ratio(numerator: Optional[Result], denominator: Optional[Result]) -> str:
    value = _ratio_value(numerator, denominator)
    return "–" if value is None else f"{value:.2f}"


def _ratio_value(
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
        _log(settings, f"[optimizers] {name} {problem.rows}x{problem.dim}")
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
            _log(settings, f"[grid] {name} x {dim}: rows {rows_list}")
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
        _log(settings, f"[dense] {name} {rows}x{dim}")
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


# --------------------------------------------------------------------------
# Output.


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


def _size(rows: int) -> str:
    if rows % 1_000_000 == 0:
        return f"{rows // 1_000_000}M"
    if rows % 1_000 == 0:
        return f"{rows // 1_000}k"
    return str(rows)


def _parse_size(text: str) -> int:
    text = text.strip().lower().replace("_", "")
    scale = {"k": 1_000, "m": 1_000_000}.get(text[-1:], 1)
    return int(float(text.rstrip("km")) * scale)


def render(report: Report, modes: Sequence[str]) -> str:
    """The Markdown tables of everything in `report`."""
    out: List[str] = []
    out.append(f"Machine: {report.machine}")
    out.append("")
    out.append(report.ids_line)
    out.append("")
    if report.optimizers:
        rows, dim = report.base
        out.append(f"### Sparse step, every optimizer ({_size(rows)} x {dim} table)")
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
            mode: report.optimizers.get(("Adagrad", mode), {}).get("ours")
            for mode in modes
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
            xla_graph = _ratio(ours, row.get("ours_graph")) if mode == "xla" else "–"
            label = name if name != "Adam-lazy" else "Adam(lazy=True)"
            if name == "Adagrad":
                label = "Adagrad(epsilon=0)"
            out.append(
                f"| {label} | {mode} | {_fmt_ms(ours)} | {ref_label} "
                f"| {_fmt_ms(ref_cmp)} | {_ratio(ours, ref_cmp)} | {_fmt_ms(ker)} "
                f"| {_ratio(ker, ours)} | {xla_graph} "
                f"| {_ratio(ours, versus) if name != 'Adagrad' else '1.00'} |"
            )
        out.append("")
    if report.grid:
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
                flat = _ratio(ours, base) if rows != smallest else "1.00"
                xla_graph = (
                    _ratio(ours, results.get(("ours", "graph")))
                    if mode == "xla"
                    else "–"
                )
                note = ""
                if ours is not None and ours.ms is None:
                    note = f" ({ours.note})"
                label = "Adam(lazy=True)" if name == "Adam-lazy" else name
                out.append(
                    f"| {label} | {_size(rows)} | {dim} | {mode} "
                    f"| {_fmt_ms(ours)}{note} | {_fmt_ms(ref)} | {_ratio(ours, ref)} "
                    f"| {flat} | {xla_graph} |"
                )
        out.append("")
    if report.dense:
        out.append("### Dense-gradient step (ours vs Keras's own optimizer)")
        out.append("")
        out.append("| optimizer | mode | ours ms | keras ms | ours/keras |")
        out.append("|---|---|--:|--:|--:|")
        for name, results in report.dense.items():
            for mode in modes:
                ours = results.get(("ours", mode))
                ker = results.get(("keras", mode))
                out.append(
                    f"| {name} | {mode} | {_fmt_ms(ours)} | {_fmt_ms(ker)} "
                    f"| {_ratio(ours, ker)} |"
                )
        out.append("")
    if report.imports:
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
    lines: List[str] = []

    def opt(name: str, mode: str, key: str) -> Optional[Result]:
        return report.optimizers.get((name, mode), {}).get(key)

    def add(goal: str, value: Optional[float], target: str, status: str, fmt="x"):
        if value is None:
            return  # Not measured in this run.
        shown = f"{value:.2f}{fmt}"
        lines.append(f"| {goal} | {shown} | {target} | {status} |")

    if report.optimizers:
        value = _ratio_value(
            opt("Adagrad", "graph", "ours"), opt("Adagrad", "graph", "ref")
        )
        add(
            "Adagrad(epsilon=0) / fused AdagradV2 (graph)",
            value,
            "≤ 1.2x (≤ 1.5x)",
            _status(value, 1.2, 1.5),
        )
        value = _ratio_value(
            opt("Adam-lazy", "graph", "ours"), opt("Adam-lazy", "graph", "ref")
        )
        add(
            "Adam(lazy=True) / gather-scatter lazy Adam (graph)",
            value,
            "≤ 1.2x (≤ 1.5x)",
            _status(value, 1.2, 1.5),
        )
        for mode in modes:
            value = _ratio_value(
                opt("ClippyAdagrad", mode, "ours"),
                opt("ClippyAdagrad", mode, "adagrad"),
            )
            add(
                f"ClippyAdagrad / our Adagrad ({mode})",
                value,
                "≤ 2x",
                _status(value, 2.0, 2.0),
            )
        for name, label in (("Adagrad", "Adagrad"), ("Adam-lazy", "Adam")):
            for mode in modes:
                value = _ratio_value(opt(name, mode, "keras"), opt(name, mode, "ours"))
                add(
                    f"Keras {label} / ours ({name}, {mode})",
                    value,
                    "≥ 10x (aim 20x)",
                    _status(value, 20.0, 10.0, higher=True),
                )
        for mode in modes:
            value = _ratio_value(
                opt("ClippyAdagrad", mode, "ours"), opt("ClippyAdagrad", mode, "ref")
            )
            add(
                f"ClippyAdagrad / TFRS ClippyAdagrad ({mode})",
                value,
                "≤ 1x",
                _status(value, 1.0, 1.0),
            )
        worst, where = None, ""
        for (name, mode), row in report.optimizers.items():
            if mode != "xla":
                continue
            value = _ratio_value(row.get("ours"), row.get("ours_graph"))
            if value is not None and (worst is None or value > worst):
                worst, where = value, name
        if worst is not None:
            add(
                f"XLA / graph, worst optimizer ({where})",
                worst,
                "≤ 1.5x",
                _status(worst, 1.5, 1.5),
            )
    if report.grid:
        worst, where = None, ""
        for (name, rows, dim), results in report.grid.items():
            if rows != 4_000_000 or (name, 1_000_000, dim) not in report.grid:
                continue
            small = report.grid[name, 1_000_000, dim]
            for mode in modes:
                value = _ratio_value(
                    results.get(("ours", mode)), small.get(("ours", mode))
                )
                if value is not None and (worst is None or value > worst):
                    worst, where = value, f"{name}, dim {dim}, {mode}"
        if worst is not None:
            add(
                f"4M rows / 1M rows, worst ({where})",
                worst,
                "≤ 1.2x",
                _status(worst, 1.2, 1.2),
            )
        worst, where = None, ""
        for (name, rows, dim), results in report.grid.items():
            value = _ratio_value(
                results.get(("ours", "xla")), results.get(("ours", "graph"))
            )
            if value is not None and (worst is None or value > worst):
                worst, where = value, f"{name}, {_size(rows)} x {dim}"
        if worst is not None:
            add(
                f"XLA / graph over the grid, worst ({where})",
                worst,
                "≤ 1.5x",
                _status(worst, 1.5, 1.5),
            )
    if report.dense:
        worst, where = None, ""
        for name, results in report.dense.items():
            for mode in modes:
                value = _ratio_value(
                    results.get(("ours", mode)), results.get(("keras", mode))
                )
                if value is not None and (worst is None or value > worst):
                    worst, where = value, f"{name}, {mode}"
        add(
            f"Dense step ours / Keras, worst ({where})",
            worst,
            "≤ 1.1x",
            _status(worst, 1.1, 1.1),
        )
    if report.imports.get(IMPORT_ADDED):
        added = statistics.median(report.imports[IMPORT_ADDED])
        add(
            "Import time added by tf_tpu_embed_opt",
            added,
            "< 0.3 s",
            "met" if added < 0.3 else "MISSED",
            fmt=" s",
        )
    return lines


# --------------------------------------------------------------------------
# Command line.


def _list(text: str) -> List[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


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
    args = parser.parse_args(argv)
    if args.quick:
        defaults = {
            "optimizers": ",".join(ENTRIES),
            "rows": "1M,4M,10M",
            "dims": "16,64,128",
            "repeats": 30,
            "import_runs": 7,
            "seconds": 2.0,
            "min_repeats": 5,
            "dense_optimizers": ",".join(DENSE_PAIRS),
            "keras_modes": "graph,xla",
            "quiet_wait": 60.0,
        }
        quick = {
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
        for name, value in quick.items():
            if getattr(args, name) == defaults[name]:  # Not set by the user.
                setattr(args, name, value)
    return args


def main(argv: Optional[Sequence[str]] = None) -> str:
    """Runs the benchmark; prints and returns the Markdown report."""
    args = parse_args(argv)
    sections = set(_list(args.sections))
    modes = [m for m in _list(args.modes) if m in MODES]
    names = _list(args.optimizers)
    grid_names = _list(args.grid_optimizers)
    for name in names + grid_names:
        if name not in ENTRIES:
            raise SystemExit(f"unknown optimizer {name!r}; known: {', '.join(ENTRIES)}")
    rows_list = sorted(_parse_size(r) for r in _list(args.rows))
    dims = [int(d) for d in _list(args.dims)]
    base_rows = _parse_size(args.base_rows)
    smallest = min(rows_list + [base_rows]) if "grid" in sections else base_rows
    id_range = min(_parse_size(args.id_range), smallest)
    settings = Settings(
        repeats=args.repeats,
        min_repeats=min(args.min_repeats, args.repeats),
        warmup=args.warmup,
        seconds=args.seconds,
        memory_budget=int(_available_memory() * args.memory_fraction),
        verbose=not args.quiet,
        quiet_wait=args.quiet_wait,
    )
    global MONITOR
    MONITOR = CpuMonitor()
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
            keras_modes=_list(args.keras_modes),
        )
        del problem
    if "grid" in sections and grid_names:
        section_grid(grid_names, rows_list, dims, modes, ids, settings, report)
    if "dense" in sections:
        section_dense(
            _list(args.dense_optimizers),
            modes,
            _parse_size(args.dense_rows),
            args.dense_dim,
            settings,
            report,
        )
    if "import" in sections:
        _log(settings, "[import]")
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


if __name__ == "__main__":
    main()
