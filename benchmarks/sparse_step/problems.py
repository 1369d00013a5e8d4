"""The problem, the subjects timed and the table of optimizers (`ENTRIES`)."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import keras
import numpy as np
import tensorflow as tf

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
