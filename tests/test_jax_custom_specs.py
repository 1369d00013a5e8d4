"""Every engine algorithm on SparseCore from JAX: custom specs from the definitions.

`to_embedding(twin, engine="jax-tpu-embedding")` gives a `RuleOptimizerSpec`
(a jax-tpu-embedding `CustomOptimizerSpec`) for the twins that
jax-tpu-embedding has no spec of its own for. Oracles:

* jax-tpu-embedding's own lowering of the custom optimizer
  (`sparse_dense_matmul_optimizer_grad.py`, which lowers the traced row
  function into the SparseCore program), cut out and run on the CPU
  (`jte_oracle.py`): the twin must step the looked-up rows as it does, with
  duplicate ids summed and the other rows untouched.
* TensorFlow's fused sparse training kernels
  (`ResourceSparseApply{Momentum,RMSProp,CenteredRMSProp,Adadelta,
  ProximalAdagrad}`), given each step's distinct ids with their summed
  gradients (the engine sums duplicates first): what the lowering computes
  must be what TensorFlow computes. A planted bug per algorithm (one argument
  off) must be caught.
"""

# Runs without TensorFlow.
# The comparisons with TensorFlow's kernels need it (`needs_tensorflow`).

import numpy as np
import pytest

keras = pytest.importorskip("keras")
pytest.importorskip("jax_tpu_embedding")

import row_steps  # noqa: E402
from conftest import needs_tensorflow  # noqa: E402

import tf_tpu_embed_opt as teo  # noqa: E402

pytestmark = pytest.mark.oracle("jax-tpu-embedding")

ENGINE = "jax-tpu-embedding"

# Twin class and arguments; the name of TensorFlow's fused sparse kernel (or
# None) with the engine arguments it takes.
CASES = {
    "momentum": ("Momentum", {"momentum": 0.9}),
    "momentum-nesterov": ("Momentum", {"momentum": 0.5, "use_nesterov": True}),
    "rms-prop": (
        "RMSprop",
        {"rho": 0.8, "momentum": 0.5, "epsilon": 1e-3, "lazy": True},
    ),
    "centered-rms-prop": (
        "RMSprop",
        {"rho": 0.8, "momentum": 0.5, "epsilon": 1e-3, "centered": True, "lazy": True},
    ),
    "adadelta": ("Adadelta", {"rho": 0.8, "epsilon": 1e-3, "lazy": True}),
    "proximal-adagrad": (
        "ProximalAdagrad",
        {
            "l1_regularization_strength": 0.01,
            "l2_regularization_strength": 0.02,
            "initial_accumulator_value": 0.1,
        },
    ),
    "proximal-yogi": ("ProximalYogi", {"l1_regularization_strength": 0.01}),
    # Keras-named twins whose math jax-tpu-embedding's own specs do not hold.
    "keras-adam-lazy": ("Adam", {"lazy": True}),
    "keras-sgd-momentum-lazy": ("SGD", {"momentum": 0.9, "lazy": True}),
    "keras-adagrad-epsilon": ("Adagrad", {"epsilon": 1e-3}),
    "momentum-clipped-decayed": (
        "Momentum",
        {
            "momentum": 0.9,
            "clip_gradient_min": -0.5,
            "clip_weight_max": 0.8,
            "weight_decay_factor": 0.01,
        },
    ),
}
RATES = {"adadelta": 1.0, "keras-adam-lazy": 0.05}

ROWS, DIM, STEPS = 6, 3, 4
RNG = np.random.default_rng(28)
STEP_IDS = [[0, 2, 2, 5], [2, 3], [0, 0, 4, 5, 5], [1, 2]]
STEP_GRADS = [RNG.normal(size=(len(ids), DIM)).astype("float32") for ids in STEP_IDS]
INITIAL = RNG.normal(size=(ROWS, DIM)).astype("float32")
UNTOUCHED = sorted(set(range(ROWS)) - {i for ids in STEP_IDS for i in ids})


def _twin(name, **changes):
    cls_name, arguments = CASES[name]
    arguments = {**arguments, **changes}
    return getattr(teo.optimizers, cls_name)(RATES.get(name, 0.1), **arguments)


def _spec(name, **changes):
    spec = teo.to_embedding(_twin(name, **changes), engine=ENGINE)
    assert type(spec).__name__ == "RuleOptimizerSpec"
    return spec


def _lowering_run(spec):
    import jte_oracle

    return row_steps.oracle_run(jte_oracle, spec, INITIAL, STEP_IDS, STEP_GRADS)


def _twin_run(twin):
    table, variable = row_steps.twin_run(keras, twin, INITIAL, STEP_IDS, STEP_GRADS)
    index = twin._get_variable_index(variable)
    slots = {
        name: keras.ops.convert_to_numpy(variables[index].value)
        for name, variables in twin._slot_variables.items()
    }
    return table, slots


# Where the twin and the lowering round apart (else: bit-identical, the same
# operations in the same order on float32 operands, on both backends).
# ProximalAdagrad and ProximalYogi divide the learning rate by √a: where the
# twin's row step is compiled as one computation (its row-sparse path), XLA's
# algebraic simplifier rewrites η/√a into η·rsqrt(a), which differs from the
# division by an ulp on about 40% of values (measured); the oracle turns that
# rewrite off. The rules are the same (the TensorFlow comparison below).
ROUNDS_APART = {"proximal-adagrad", "proximal-yogi"}


def _assert_rows(actual, expected, bounded, what):
    row_steps.assert_rows(actual, expected, INITIAL, STEPS, bounded=bounded, what=what)


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_twin_steps_rows_as_the_engines_lowering_of_its_spec(name):
    spec = _spec(name)
    expected, expected_slots = _lowering_run(spec)
    actual, slots = _twin_run(teo.to_keras(spec))
    tolerance = name in ROUNDS_APART
    _assert_rows(actual, expected, tolerance, "table")
    for slot, value in slots.items():
        _assert_rows(value, expected_slots[slot], tolerance, f"slot {slot}")
    np.testing.assert_array_equal(actual[UNTOUCHED], INITIAL[UNTOUCHED])


@pytest.mark.parametrize("name", sorted(CASES))
def test_specs_come_back_equal_from_a_round_trip(name):
    spec = _spec(name)
    twin = teo.to_keras(spec)
    assert twin.get_config()["rounding"] == ENGINE
    back = teo.to_embedding(twin, engine=ENGINE)
    assert back == spec  # jax-tpu-embedding's own ==
    assert back.custom_computation_fn is spec.custom_computation_fn
    assert back.slot_variables_initializers() == spec.slot_variables_initializers()
    expected = {**_twin(name).get_config(), "rounding": ENGINE}
    del expected["name"]  # Keras numbers the instances
    assert {k: v for k, v in twin.get_config().items() if k != "name"} == expected


def test_different_settings_give_different_specs():
    assert _spec("momentum") != _spec("momentum", momentum=0.8)
    assert _spec("momentum") != _spec("momentum-nesterov")


def test_slots_are_named_and_start_as_the_twins():
    spec = _spec("proximal-yogi", initial_accumulator_value=0.25)
    initializers = spec.slot_variables_initializers()
    assert initializers._fields == ("v", "m")
    import jax

    values = [
        np.asarray(i(jax.random.key(0), (2, 2), np.float32)) for i in initializers
    ]
    np.testing.assert_array_equal(values[0], 0.25)
    np.testing.assert_array_equal(values[1], 0.0)


def test_what_no_row_rule_runs_is_refused_by_name():
    with pytest.raises(ValueError, match=r"lazy=False: jax-tpu-embedding updates only"):
        teo.to_embedding(teo.optimizers.Momentum(0.1, lazy=False), engine=ENGINE)
    with pytest.raises(ValueError, match="clipnorm"):
        teo.to_embedding(teo.optimizers.Momentum(0.1, clipnorm=1.0), engine=ENGINE)
    with pytest.raises(TypeError, match="ClippyAdagrad.*sees one row at a time"):
        teo.to_embedding(teo.optimizers.ClippyAdagrad(0.1), engine=ENGINE)


def test_a_custom_spec_refuses_a_step_scaled_per_variable():
    """Built by name (as a checkpoint's spec record is read), not only
    through `to_embedding`."""
    from tf_tpu_embed_opt.engines import jax_custom

    with pytest.raises(ValueError, match="ClippyAdagrad cannot run as a custom"):
        jax_custom.RuleOptimizerSpec("ClippyAdagrad", 0.1)


def test_a_custom_spec_names_where_an_unknown_name_was_given():
    from tf_tpu_embed_opt.engines import jax_custom

    with pytest.raises(
        TypeError,
        match=r"^RuleOptimizerSpec: argument `arguments` has \['bogus'\], which "
        r"Momentum does not take there; `arguments` takes momentum, "
        r"use_nesterov, lazy\.$",
    ):
        jax_custom.RuleOptimizerSpec("Momentum", 0.1, {"bogus": 1.0})
    with pytest.raises(
        TypeError,
        match=r"^RuleOptimizerSpec: argument `arguments` has \['clip_weight_max'\], "
        r"which Momentum does not take there; .*; \['clip_weight_max'\] go in "
        r"`options`\.$",
    ):
        jax_custom.RuleOptimizerSpec(
            "Momentum", 0.1, {"momentum": 0.5, "clip_weight_max": 1.0}
        )
    with pytest.raises(
        TypeError,
        match=r"^RuleOptimizerSpec: argument `options` has \['lazy'\], which "
        r"Momentum does not take there; `options` takes clip_weight_min, "
        r"clip_weight_max, clip_gradient_min, clip_gradient_max, "
        r"weight_decay_factor, multiply_weight_decay_factor_by_learning_rate; "
        r"\['lazy'\] go in `arguments`\.$",
    ):
        jax_custom.RuleOptimizerSpec("Momentum", 0.1, None, {"lazy": True})
    # Each in its place, the engine's rounding included, is taken.
    jax_custom.RuleOptimizerSpec(
        "Momentum",
        0.1,
        {"momentum": 0.5},
        {"clip_weight_max": 1.0, "rounding": "jax-tpu-embedding"},
    )


def test_a_custom_specs_learning_rate_is_checked_as_it_is_built():
    """It was taken as given: -0.1 (the SparseCore would step up the
    gradient), NaN, a string (the engine failing later), `True`."""
    from tf_tpu_embed_opt.engines import jax_custom

    for rate, error, message in (
        (-0.1, ValueError, r"must be >= 0; received -0\.1\."),
        (float("nan"), ValueError, r"must be finite and >= 0; received nan\."),
        (
            "0.1",
            TypeError,
            r"must be a real number >= 0; received '0\.1' of type str\.",
        ),
        (True, TypeError, r"must be a real number >= 0; received True of type bool\."),
    ):
        with pytest.raises(
            error, match=r"^RuleOptimizerSpec: argument `learning_rate` " + message
        ):
            jax_custom.RuleOptimizerSpec("Momentum", rate)
    # A number, or a callable of the step (jax-tpu-embedding's convention).
    assert jax_custom.RuleOptimizerSpec("Momentum", 1).learning_rate == 1

    def rate(step):
        return 0.1 / (1 + step)

    assert jax_custom.RuleOptimizerSpec("Momentum", rate).learning_rate is rate


def test_check_engine_says_the_spec_runs():
    report = teo.check_engine(_spec("centered-rms-prop"), ENGINE)
    assert report.runs
    assert report.tables[0].algorithm == "CenteredRMSProp"
    assert report.tables[0].custom == (
        "jax-tpu-embedding has no spec of its own for CenteredRMSProp (its own: "
        "SGD, Adagrad, AdagradMomentum, Adam, FTRL, LaProp, F2A)",
    )


def test_check_engine_says_what_a_custom_spec_carries_and_why():
    """Every setting the spec runs, engine options included, and each reason
    its engine's own spec would not do, as `to_embedding` decided."""
    twin = teo.optimizers.Adagrad(
        0.1, epsilon=0.01, weight_decay_factor=0.05, clip_weight_max=3.0
    )
    spec = teo.to_embedding(twin, engine=ENGINE)
    assert type(spec).__name__ == "RuleOptimizerSpec"
    report = teo.check_engine(twin, ENGINE).tables[0]
    assert report.exact
    received = dict(report.received)
    assert received["epsilon"] == "0.01"
    assert received["weight_decay_factor"] == "0.05"
    assert received["clip_weight_max"] == "3.0"
    # Options at their defaults are not listed.
    assert "clip_weight_min" not in received
    assert "multiply_weight_decay_factor_by_learning_rate" not in received
    assert [reason.split(":")[0] for reason in report.custom] == [
        "clip_weight_max=3.0",
        "weight_decay_factor=0.05",
        "epsilon=0.01",
    ]
    assert "without epsilon" in report.custom[2]
    assert "custom, because weight_decay_factor=0.05: the specs have no weight " in (
        str(teo.check_engine(spec, ENGINE))
    )
    # Where the engine's own spec computes it, no reason: a spec made by hand
    # for what AdagradOptimizerSpec runs.
    from tf_tpu_embed_opt.engines import jax_custom

    plain = jax_custom.RuleOptimizerSpec("Adagrad", 0.1, {"epsilon": 0.0})
    assert teo.check_engine(plain, ENGINE).tables[0].custom == ()
    assert (
        teo.check_engine(
            teo.to_embedding(teo.optimizers.Adagrad(0.1, epsilon=0.0), engine=ENGINE),
            ENGINE,
        )
        .tables[0]
        .custom
        == ()
    )
    # A decay factor of 0 decays nothing: no reason.
    zero = jax_custom.RuleOptimizerSpec(
        "Momentum", 0.1, {"lazy": True}, {"weight_decay_factor": 0.0}
    )
    assert [
        r.split(" (")[0] for r in teo.check_engine(zero, ENGINE).tables[0].custom
    ] == ["jax-tpu-embedding has no spec of its own for Momentum"]


# --------------------------------------------------------------------------
# TensorFlow's fused sparse kernels.

KERNELS = {
    "momentum": "Momentum",
    "momentum-nesterov": "Momentum",
    "rms-prop": "RMSProp",
    "centered-rms-prop": "CenteredRMSProp",
    "adadelta": "Adadelta",
    "proximal-adagrad": "ProximalAdagrad",
}
# One planted bug per algorithm: an argument off by a little.
PLANTED = {
    "momentum": {"momentum": 0.89},
    "momentum-nesterov": {"use_nesterov": False},
    "rms-prop": {"rho": 0.81},
    "centered-rms-prop": {"centered": False},
    "adadelta": {"epsilon": 2e-3},
    "proximal-adagrad": {"l1_regularization_strength": 0.02},
}


# Each kernel's slot inputs, and its float inputs by the twin's argument names.
_RMS_PROP = {"rho": "rho", "momentum": "momentum", "epsilon": "epsilon"}
KERNEL_INPUTS = {
    "Momentum": (("accum",), {"momentum": "momentum"}),
    "RMSProp": (("ms", "mom"), _RMS_PROP),
    "CenteredRMSProp": (("mg", "ms", "mom"), _RMS_PROP),
    "Adadelta": (("accum", "accum_update"), {"rho": "rho", "epsilon": "epsilon"}),
    "ProximalAdagrad": (
        ("accum",),
        {"l1": "l1_regularization_strength", "l2": "l2_regularization_strength"},
    ),
}


def _kernel_run(name):
    tf = pytest.importorskip("tensorflow")
    _, arguments = CASES[name]
    kernel = KERNELS[name]
    slots, inputs = KERNEL_INPUTS[kernel]
    hypers = {key: np.float32(arguments[a]) for key, a in inputs.items()}
    if kernel == "Momentum":
        hypers["use_nesterov"] = arguments.get("use_nesterov", False)
    table = tf.Variable(INITIAL.copy())
    initial = arguments.get("initial_accumulator_value", 0.0)
    variables = {
        s: tf.Variable(np.full_like(INITIAL, initial if s == "accum" else 0.0))
        for s in slots
    }
    apply = getattr(tf.raw_ops, f"ResourceSparseApply{kernel}")
    for ids, grads in zip(STEP_IDS, STEP_GRADS):
        rows = row_steps.summed(ids, grads)
        apply(
            var=table.handle,
            lr=np.float32(RATES.get(name, 0.1)),
            grad=tf.constant(np.stack([rows[i] for i in sorted(rows)])),
            indices=tf.constant(sorted(rows), tf.int64),
            **{s: v.handle for s, v in variables.items()},
            **hypers,
        )
    return table.numpy()


def _assert_as_tensorflow(name, table):
    # TensorFlow's kernels order some operations differently (RMSProp's
    # ms + (g² − ms)·(1 − ρ), Adadelta's update, the proximal step) and
    # round each one once: a few ulps per step (see _assert_rows).
    _assert_rows(table, _kernel_run(name), True, f"{name} against TensorFlow")


@needs_tensorflow("TensorFlow's kernels need TensorFlow")
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_the_engines_lowering_computes_tensorflows_fused_sparse_kernel(name):
    table, _ = _lowering_run(_spec(name))
    _assert_as_tensorflow(name, table)
    np.testing.assert_array_equal(table[UNTOUCHED], INITIAL[UNTOUCHED])


@needs_tensorflow("TensorFlow's kernels need TensorFlow")
@pytest.mark.parametrize("name", sorted(PLANTED))
def test_a_planted_bug_is_caught(name):
    table, _ = _lowering_run(_spec(name, **PLANTED[name]))
    with pytest.raises(AssertionError):
        _assert_as_tensorflow(name, table)


def test_the_spec_refuses_a_rounding_it_would_not_use():
    # The row step is rounded as jax-tpu-embedding rounds; another `rounding`
    # is refused (it used to be dropped without a word).
    from tf_tpu_embed_opt.engines import jax_custom

    with pytest.raises(ValueError) as raised:
        jax_custom.RuleOptimizerSpec("Momentum", 0.1, options={"rounding": "keras"})
    assert str(raised.value) == (
        "RuleOptimizerSpec: argument `options` sets rounding='keras'; the "
        "SparseCore steps each row rounded as jax-tpu-embedding rounds, so only "
        "'jax-tpu-embedding' is allowed (or leave it out)."
    )
    lazy = {"lazy": True}
    given = jax_custom.RuleOptimizerSpec(
        "Momentum", 0.1, lazy, options={"rounding": ENGINE}
    )
    assert given == jax_custom.RuleOptimizerSpec("Momentum", 0.1, lazy)
    # A twin that rounds as Keras converts: the spec rounds as the engine.
    twin = teo.optimizers.Momentum(0.1, lazy=True, rounding="keras")
    assert teo.to_embedding(twin, engine=ENGINE) == given
