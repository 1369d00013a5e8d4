"""Benchmark of the twins of the rules the JAX engine runs (issues #21, #28).

Each twin is timed against a NumPy transcription of its per-row update,
written here: LaProp and F2A from jax-tpu-embedding's
`sparse_dense_matmul_grad_with_{laprop,f2a}.py` and the specs'
`get_hyperparameters`; Momentum, RMSProp, CenteredRMSProp, Adadelta,
ProximalAdagrad and ProximalYogi, which run there as custom optimizers
(`RuleOptimizerSpec`), from TensorFlow's training kernels
(`training_ops.cc`) and, for ProximalYogi, the TPU engine's
`optimization_parameters.proto`. In one process, on one dense float32 gradient over a
`rows x dim` table: the twin as `fit` runs it on JAX (one `jax.jit`-compiled
`optimizer.stateless_apply`, variables donated), the transcription as
vectorized NumPy. After `--warmup` steps, the steps are timed round-robin
with `time.perf_counter` and the median reported (the harness of
`jax_dense_step`); the ratio is the twin's over NumPy's. Before timing,
the two are run for three steps from the same state and must agree (rtol
1e-5): the reference is a reference.

Run from the repository root, with `KERAS_BACKEND=jax`:

    KERAS_BACKEND=jax python -m benchmarks.jax_engine_rules [--rows N] [--dim D]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import platform
import sys
from typing import Any, Callable, Dict, List, Sequence, Tuple

os.environ.setdefault("KERAS_BACKEND", "jax")

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

if __package__ in (None, ""):
    # Run as a file (`python benchmarks/jax_engine_rules.py`): `benchmarks` is the
    # checkout's folder, which Python does not put on the path then.
    sys.path.append(str(pathlib.Path(__file__).resolve().parent.parent))

import tf_tpu_embed_opt  # noqa: E402
from benchmarks import jax_dense_step  # noqa: E402
from tf_tpu_embed_opt import optimizers as teo  # noqa: E402

LEARNING_RATE = 0.01


def laprop_numpy(w, slots, g, step, b1=0.9, b2=0.95, eps=1e-30):
    """jax-tpu-embedding's LaProp step (`step`: 0 at the first)."""
    decay = np.float32(b2 * (1.0 - b2**step) / (1.0 - b2 ** (step + 1.0)))
    nu = slots["nu"] * decay + (np.float32(1) - decay) * (g * g + np.float32(eps))
    mu = np.float32(b1) * slots["mu"] + np.float32(np.sqrt(1 - b1 * b1)) * (
        g / np.sqrt(nu)
    )
    return w - np.float32(LEARNING_RATE) * mu, {"mu": mu, "nu": nu}


def f2a_numpy(w, slots, g, step, rho=0.5, l1=0.0, l2=0.0, max_multiplier=1e6):
    """jax-tpu-embedding's F2A step (`step`: 0 at the first)."""
    local = slots["local_step"] + np.float32(1)
    ratio = np.float32(max(step, 1.0)) / local
    boost = np.minimum(np.power(ratio, np.float32(rho)), np.float32(max_multiplier))
    a = slots["accumulator"] + g * g
    update = g * boost / np.sqrt(a) + np.float32(l1) * np.sign(w) + np.float32(l2) * w
    return w - np.float32(LEARNING_RATE) * update, {
        "accumulator": a,
        "local_step": local,
    }


def momentum_numpy(w, slots, g, step, momentum=0.9, nesterov=False):
    """TensorFlow's ApplyMomentum."""
    m = np.float32(momentum) * slots["momenta"] + g
    update = g + np.float32(momentum) * m if nesterov else m
    return w - np.float32(LEARNING_RATE) * update, {"momenta": m}


def rms_prop_numpy(w, slots, g, step, rho=0.9, momentum=0.5, eps=1e-7, centered=False):
    """TensorFlow's ApplyRMSProp and ApplyCenteredRMSProp."""
    ms = slots["ms"] + (g * g - slots["ms"]) * np.float32(1 - rho)
    new = {"ms": ms}
    denominator = ms + np.float32(eps)
    if centered:
        mg = slots["mg"] + (g - slots["mg"]) * np.float32(1 - rho)
        denominator = denominator - mg * mg
        new["mg"] = mg
    mom = np.float32(momentum) * slots["mom"] + np.float32(LEARNING_RATE) * g / np.sqrt(
        denominator
    )
    new["mom"] = mom
    return w - mom, new


def adadelta_numpy(w, slots, g, step, rho=0.95, eps=1e-7):
    """TensorFlow's ApplyAdadelta."""
    acc = np.float32(rho) * slots["accumulators"] + np.float32(1 - rho) * g * g
    update = (
        np.sqrt(slots["updates"] + np.float32(eps)) / np.sqrt(acc + np.float32(eps)) * g
    )
    upd = np.float32(rho) * slots["updates"] + np.float32(1 - rho) * update * update
    return w - np.float32(LEARNING_RATE) * update, {"accumulators": acc, "updates": upd}


def _proximal(prox, rate, l1, l2):
    shrunk = np.maximum(np.abs(prox) - rate * np.float32(l1), np.float32(0))
    return np.sign(prox) * shrunk / (np.float32(1) + rate * np.float32(l2))


def proximal_adagrad_numpy(w, slots, g, step, l1=0.01, l2=0.01):
    """TensorFlow's ApplyProximalAdagrad."""
    a = slots["accumulators"] + g * g
    rate = np.float32(LEARNING_RATE) / np.sqrt(a)
    return _proximal(w - rate * g, rate, l1, l2), {"accumulators": a}


def proximal_yogi_numpy(
    w, slots, g, step, b1=0.9, b2=0.999, eps=1e-3, l1=0.01, l2=0.01
):
    """The TPU engine's ProximalYogi (optimization_parameters.proto)."""
    m = np.float32(b1) * slots["m"] + np.float32(1 - b1) * g
    g2 = g * g
    v = slots["v"] + np.float32(1 - b2) * np.sign(g2 - slots["v"]) * g2
    rate = np.float32(LEARNING_RATE) / (np.sqrt(v) + np.float32(eps))
    return _proximal(w - rate * m, rate, l1, l2), {"v": v, "m": m}


# label -> (twin class, its arguments, NumPy step, initial slots by name)
CASES: Dict[str, Tuple[str, Dict[str, Any], Callable[..., Any], Dict[str, float]]] = {
    "LaProp": ("LaProp", {}, laprop_numpy, {"mu": 0.0, "nu": 0.0}),
    "F2A": (
        "F2A",
        {"l2_regularization_strength": 0.01},
        lambda w, s, g, t: f2a_numpy(w, s, g, t, l2=0.01),
        {"accumulator": 0.1, "local_step": 0.0},
    ),
    "Momentum": ("Momentum", {"momentum": 0.9}, momentum_numpy, {"momenta": 0.0}),
    "RMSProp": (
        "RMSprop",
        {"momentum": 0.5},
        rms_prop_numpy,
        {"ms": 0.0, "mom": 0.0},
    ),
    "CenteredRMSProp": (
        "RMSprop",
        {"momentum": 0.5, "centered": True},
        lambda w, s, g, t: rms_prop_numpy(w, s, g, t, centered=True),
        {"ms": 0.0, "mom": 0.0, "mg": 0.0},
    ),
    "Adadelta": ("Adadelta", {}, adadelta_numpy, {"accumulators": 0.0, "updates": 0.0}),
    "ProximalAdagrad": (
        "ProximalAdagrad",
        {"l1_regularization_strength": 0.01, "l2_regularization_strength": 0.01},
        proximal_adagrad_numpy,
        {"accumulators": 0.1},
    ),
    "ProximalYogi": (
        "ProximalYogi",
        {"l1_regularization_strength": 0.01, "l2_regularization_strength": 0.01},
        proximal_yogi_numpy,
        {"v": 1e-6, "m": 0.0},
    ),
}


def _numpy_runner(step_fn, slots0: Dict[str, float], shape, gradient) -> Any:
    state = {
        "w": np.ones(shape, "float32"),
        "slots": {k: np.full(shape, v, "float32") for k, v in slots0.items()},
        "step": 0,
    }

    def run() -> None:
        state["w"], state["slots"] = step_fn(
            state["w"], state["slots"], gradient, state["step"]
        )
        state["step"] += 1

    return run, lambda: state["w"]


def measure(
    labels: Sequence[str], rows: int, dim: int, warmup: int, repeats: int
) -> List[Tuple[str, float, float]]:
    """(label, twin median seconds, NumPy median seconds) per algorithm."""
    results = []
    for label in labels:
        name, arguments, step_fn, slots0 = CASES[label]
        optimizer = getattr(teo, name)(LEARNING_RATE, lazy=False, **arguments)
        twin = jax_dense_step._step(optimizer, (rows, dim))
        numpy_run, numpy_weights = _numpy_runner(
            step_fn, slots0, (rows, dim), twin.gradient
        )
        # Agreement first, from the same state.
        for _ in range(3):
            twin()
            numpy_run()
        np.testing.assert_allclose(twin.weights(), numpy_weights(), rtol=1e-5)
        medians = jax_dense_step._median_times(
            {"twin": twin, "numpy": numpy_run}, warmup, repeats
        )
        results.append((label, medians["twin"], medians["numpy"]))
    return results


def report(results: Sequence[Tuple[str, float, float]], rows: int, dim: int) -> str:
    lines = [
        f"Dense step on Keras's JAX backend against NumPy, {rows:,} x {dim} "
        f"float32 (jax {jax.__version__}, keras {keras.__version__}, numpy "
        f"{np.__version__}, tf_tpu_embed_opt {tf_tpu_embed_opt.__version__}, "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs)",
        "",
        "| optimizer | twin (ms) | NumPy (ms) | twin / NumPy |",
        "|---|--:|--:|--:|",
    ]
    for label, ours, reference in results:
        lines.append(
            f"| {label} | {ours * 1e3:.2f} | {reference * 1e3:.2f} | "
            f"{ours / reference:.2f} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    if keras.backend.backend() != "jax":
        parser.error(
            f"Keras runs on {keras.backend.backend()!r}; set KERAS_BACKEND=jax"
        )
    results = measure(tuple(CASES), args.rows, args.dim, args.warmup, args.repeats)
    print(report(results, args.rows, args.dim))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
