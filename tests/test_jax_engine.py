"""The `jax-tpu-embedding` engine: specs exact or refused, twins against its code.

Oracles:

* jax-tpu-embedding's own per-row updates, lowered by its primitives and run on
  the CPU (`jte_oracle.py`), with the hyperparameters its specs compute at each
  step: every twin `to_keras(spec)` gives must follow them step by step, on the
  looked-up rows only, with duplicate ids summed.
* keras-rs's own JAX conversion (`keras_to_jte_optimizer`): what it builds
  where the conversion is exact must equal `to_embedding(...,
  engine="jax-tpu-embedding")`, and every way it changes the math must be
  named by `check_engine`.
* Keras's own optimizers for keras-rs's default-device tables
  (`keras_optimizer`).

Runs on either Keras backend (TensorFlow or JAX); the TensorFlow engines'
refusals need TensorFlow.
"""

# Runs without TensorFlow.

import math
import subprocess
import sys
import warnings

import numpy as np
import pytest

keras = pytest.importorskip("keras")

import row_steps  # noqa: E402
from conftest import needs_tensorflow  # noqa: E402

import tf_tpu_embed_opt as teo  # noqa: E402
from tf_tpu_embed_opt.definitions import registry  # noqa: E402

pytestmark = pytest.mark.oracle("jax-tpu-embedding")

ENGINE = "jax-tpu-embedding"
BACKEND = keras.backend.backend()


def _spec_module():
    from jax_tpu_embedding.sparsecore.lib.nn import embedding_spec

    return embedding_spec


def _oracle():
    import jte_oracle

    return jte_oracle


# Spec class name and keyword arguments: defaults and corners of each rule.
SPECS = {
    "sgd": ("SGDOptimizerSpec", {"learning_rate": 0.3}),
    "adagrad": ("AdagradOptimizerSpec", {"learning_rate": 0.2}),
    "adagrad-a0": (
        "AdagradOptimizerSpec",
        {"learning_rate": 0.05, "initial_accumulator_value": 0.5},
    ),
    "adam": ("AdamOptimizerSpec", {"learning_rate": 0.05}),
    "adam-eps": (
        "AdamOptimizerSpec",
        {"learning_rate": 0.1, "beta_1": 0.5, "beta_2": 0.8, "epsilon": 0.3},
    ),
    "ftrl": (
        "FTRLOptimizerSpec",
        {
            "learning_rate": 0.2,
            "l1_regularization_strength": 0.05,
            "l2_regularization_strength": 0.1,
            "beta": 0.3,
        },
    ),
    "ftrl-linear-by-lr": (
        "FTRLOptimizerSpec",
        {
            "learning_rate": 0.2,
            "learning_rate_power": -0.7,
            "l1_regularization_strength": 0.01,
            "initial_linear_value": 0.4,
            "initial_accumulator_value": 0.3,
            "multiply_linear_by_learning_rate": True,
        },
    ),
    "adagrad-momentum": ("AdagradMomentumOptimizerSpec", {"learning_rate": 0.1}),
    "adagrad-momentum-nesterov": (
        "AdagradMomentumOptimizerSpec",
        {
            "learning_rate": 0.1,
            "momentum": 0.5,
            "beta2": 0.9,
            "epsilon": 1e-3,
            "exponent": 3.0,
            "use_nesterov": True,
            "initial_accumulator_value": 0.2,
            "initial_momentum_value": 0.1,
        },
    ),
    # The engine computes (a + ε)^(−1/k) for any k but 0; its tests use −0.5.
    "adagrad-momentum-negative-exponent": (
        "AdagradMomentumOptimizerSpec",
        {"learning_rate": 0.01, "momentum": 0.5, "exponent": -0.5},
    ),
    # ε = 0: √v + 0, as the engine's tests have it.
    "adam-eps0": ("AdamOptimizerSpec", {"learning_rate": 0.05, "epsilon": 0.0}),
    "laprop": ("LaPropOptimizerSpec", {"learning_rate": 0.05}),
    "laprop-slots": (
        "LaPropOptimizerSpec",
        {
            "learning_rate": 0.1,
            "b1": 0.6,
            "b2": 0.8,
            "eps": 1e-4,
            "initial_slot_value": 0.2,
        },
    ),
    "f2a": ("F2AOptimizerSpec", {"learning_rate": 0.1}),
    "f2a-regularized": (
        "F2AOptimizerSpec",
        {
            "learning_rate": 0.1,
            "rho": 0.8,
            "initial_local_step_value": 1.0,
            "l1_regularization_strength": 0.02,
            "l2_regularization_strength": 0.05,
            "max_lr_multiplier": 2.0,
        },
    ),
}

ROWS, DIM, STEPS = 6, 3, 4
# Per step: the looked-up ids (duplicates included) and their gradients.
RNG = np.random.default_rng(21)
STEP_IDS = [[0, 2, 2, 5], [2, 3], [0, 0, 4, 5, 5], [1, 2]]
STEP_GRADS = [RNG.normal(size=(len(ids), DIM)).astype("float32") for ids in STEP_IDS]
INITIAL = RNG.normal(size=(ROWS, DIM)).astype("float32")


def _make(name):
    cls_name, kwargs = SPECS[name]
    return getattr(_spec_module(), cls_name)(**kwargs)


def _twin_run(twin):
    table, _ = row_steps.twin_run(keras, twin, INITIAL, STEP_IDS, STEP_GRADS)
    return table, twin


def _oracle_run(spec):
    return row_steps.oracle_run(_oracle(), spec, INITIAL, STEP_IDS, STEP_GRADS)


# Where the twin of a spec and the oracle may round differently, and why.
# Everywhere else the twin runs the lowering's operations in its order, with
# the hyperparameters as float32 operands (`rounding="jax-tpu-embedding"`),
# and the oracle compiles the lowering as written (no FMA, no rewrites): the
# rows are bit-identical.
# - On JAX, XLA turns a division by the (scalar) learning rate into a
#   multiplication by its reciprocal; the lowering divides by a row of
#   operands. FTRL divides by η unless multiply_linear_by_learning_rate.
# - On TensorFlow, pow is the C library's powf; the oracle's is XLA's. FTRL
#   and AdagradMomentum call pow.
ROUNDS_APART = {
    "jax": {"ftrl"},
    "tensorflow": {
        "ftrl",
        "ftrl-linear-by-lr",
        "adagrad-momentum",
        "adagrad-momentum-nesterov",
        "adagrad-momentum-negative-exponent",
    },
}


def _assert_rows(actual, expected, name, what):
    # FTRL's denominator is > 1 in SPECS, so its weights move no more than
    # `linear` does (row_steps.assert_rows gives the bound).
    bounded = name in ROUNDS_APART.get(BACKEND, ())
    row_steps.assert_rows(actual, expected, INITIAL, STEPS, bounded=bounded, what=what)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_twin_of_each_spec_follows_jax_tpu_embeddings_own_update(name):
    spec = _make(name)
    expected, expected_slots = _oracle_run(spec)
    actual, twin = _twin_run(teo.to_keras(spec))
    _assert_rows(actual, expected, name, "table")
    definition = twin._definition
    for ours, theirs in definition.jax_slots.items():
        index = twin._get_variable_index(twin._trainable_variables[0])
        slot = twin._slot_variables[ours][index]
        _assert_rows(
            keras.ops.convert_to_numpy(slot.value),
            expected_slots[theirs],
            name,
            f"slot {theirs}",
        )
    # Rows never looked up keep their values (the engine is lazy).
    untouched = sorted(set(range(ROWS)) - {i for ids in STEP_IDS for i in ids})
    np.testing.assert_array_equal(actual[untouched], INITIAL[untouched])


def test_every_spec_class_is_read():
    module = _spec_module()
    specs = {
        name
        for name in dir(module)
        if name.endswith("OptimizerSpec") and name not in ("OptimizerSpec",)
    }
    known = {d.jax.spec_class for d in registry.ALL if d.jax is not None}
    assert specs - known == {"CustomOptimizerSpec"}
    assert {SPECS[n][0] for n in SPECS} == known


@pytest.mark.parametrize("name", sorted(SPECS))
def test_spec_round_trips_through_the_twin(name):
    spec = _make(name)
    back = teo.to_embedding(teo.to_keras(spec), engine=ENGINE)
    assert type(back) is type(spec)
    assert hash(back) == hash(spec), (vars(back), vars(spec))


def test_a_schedule_comes_back_from_a_round_trip_itself():
    optax = pytest.importorskip("optax")
    schedule = optax.exponential_decay(0.1, transition_steps=10, decay_rate=0.9)
    spec = _spec_module().AdagradOptimizerSpec(learning_rate=schedule)
    back = teo.to_embedding(teo.to_keras(spec), engine=ENGINE)
    assert back.learning_rate is schedule
    assert back == spec


@needs_tensorflow("TensorFlow's engines need TensorFlow")
@pytest.mark.parametrize(
    "name, refused",
    [
        ("adagrad-momentum-negative-exponent", r"`exponent` must be > 0.*-0\.5"),
        ("adam-eps0", r"`epsilon` must be > 0.*0\.0"),
    ],
)
def test_values_only_jax_tpu_embedding_takes_are_refused_by_tensorflows_engines(
    name, refused
):
    twin = teo.to_keras(_make(name))
    for engine in ("TPUEmbedding", "TPUEmbeddingV2"):
        # strict=False lets the other settings pass (with warnings): the
        # value itself is refused, with the embedding face's reason.
        with warnings.catch_warnings(), pytest.raises(ValueError, match=refused):
            warnings.simplefilter("ignore", UserWarning)
            teo.to_embedding(twin, engine=engine, strict=False)


def test_exponent_zero_is_refused_naming_the_domain():
    with pytest.raises(ValueError, match=r"`exponent`.*any real number but 0"):
        teo.optimizers.AdagradMomentum(0.1, exponent=0.0)


def test_a_learning_rate_of_the_step_is_called_with_keras_rs_step():
    # jax-tpu-embedding calls it with the step keras-rs gives it, 0 first.
    seen = []

    def rate(step):
        seen.append(int(step))
        return 0.1 / (1.0 + step)

    spec = _spec_module().SGDOptimizerSpec(learning_rate=rate)
    expected, _ = _oracle_run(spec)
    seen.clear()
    actual, _ = _twin_run(teo.to_keras(spec))
    np.testing.assert_array_equal(actual, expected)


def test_a_spec_field_given_as_a_0_d_array_is_read_as_its_number():
    import jax.numpy as jnp

    spec_class = _spec_module().AdagradOptimizerSpec
    for value in (np.array(0.25, np.float32), jnp.float32(0.25)):
        spec = spec_class(learning_rate=0.1, initial_accumulator_value=value)
        config = teo.to_keras(spec).get_config()
        assert type(config["initial_accumulator_value"]) is float
        assert config["initial_accumulator_value"] == 0.25
    # An array of one element is no number: refused, naming the argument.
    spec = spec_class(learning_rate=0.1, initial_accumulator_value=np.array([0.25]))
    with pytest.raises(TypeError, match="`initial_accumulator_value` must be a real"):
        teo.to_keras(spec)


def test_a_spec_learning_rate_that_is_no_number_is_refused_by_to_keras():
    """`to_keras` took `True` as 1.0, and failed on a string with Python's
    "could not convert string to float: 'x'"."""
    spec_class = _spec_module().SGDOptimizerSpec
    for rate in (True, "0.1", [0.1]):
        with pytest.raises(
            TypeError,
            match=r"^to_keras: a jax-tpu-embedding spec's `learning_rate` must be "
            r"a real number, a callable of the step or a Keras "
            r"LearningRateSchedule; received .* of type (bool|str|list)\.$",
        ):
            teo.to_keras(spec_class(learning_rate=rate))
    # A number of any kind is its value (a NumPy scalar, an int).
    for rate, value in ((np.float32(0.25), 0.25), (2, 2.0)):
        twin = teo.to_keras(spec_class(learning_rate=rate))
        assert twin.get_config()["learning_rate"] == value


def test_check_engine_refuses_spec_values_outside_the_algorithms_domain():
    """jax-tpu-embedding's specs take any value, and `check_engine` said
    "exact" of each: a learning rate of "0.1" (the engine fails computing
    with it), `True`, -0.1, or an Adam beta_2 of 1.5, which the engine
    steps with and which no twin takes (`to_keras` refuses them alike)."""
    specs = _spec_module()
    cases = (
        (
            specs.SGDOptimizerSpec(learning_rate="0.1"),
            "learning_rate='0.1': SGDOptimizerSpec: argument `learning_rate` "
            "must be a real number >= 0; received '0.1' of type str.",
        ),
        (
            specs.SGDOptimizerSpec(learning_rate=-0.1),
            "learning_rate=-0.1: SGDOptimizerSpec: argument `learning_rate` "
            "must be >= 0; received -0.1.",
        ),
        (
            specs.AdamOptimizerSpec(learning_rate=0.1, beta_2=1.5),
            "beta_2=1.5: AdamOptimizerSpec: argument `beta_2` must be in "
            "[0, 1); received 1.5.",
        ),
    )
    for spec, refusal in cases:
        report = teo.check_engine(spec, "jax-tpu-embedding")
        assert not report.runs
        assert [s.describe() for s in report.tables[0].rejected] == [refusal]
    # In the domain, a 0-d array or a callable learning rate: it runs.
    for rate in (np.array(0.1, np.float32), lambda step: 0.1):
        report = teo.check_engine(
            specs.AdamOptimizerSpec(learning_rate=rate), "jax-tpu-embedding"
        )
        assert report.runs and report.tables[0].rejected == ()


def test_custom_spec_is_refused():
    spec = _spec_module().CustomOptimizerSpec()
    with pytest.raises(TypeError, match="CustomOptimizerSpec"):
        teo.to_keras(spec)
    report = teo.check_engine(spec, ENGINE)
    assert not report.runs


def test_an_object_of_jax_tpu_embedding_that_is_no_spec_is_no_optimizer():
    # Told from a spec by its class, not by its module: SGD's slot variables
    # (an empty tuple of jax-tpu-embedding's) are not read as a spec whose
    # update is the user's own.
    slots = _spec_module().SGDSlotVariables()
    for engine in (None, ENGINE):
        with pytest.raises(TypeError, match="`embedding_opt` must be an embedding"):
            teo.to_keras(slots, engine=engine)
    with pytest.raises(TypeError, match="argument `obj` must be"):
        teo.check_engine(slots, ENGINE)


@needs_tensorflow("the embedding face's classes are TensorFlow's")
def test_the_embedding_face_runs_the_engines_own_spec_where_its_twin_does():
    # Where an embedding optimizer's engine math is a jax-tpu-embedding
    # spec's, check_engine names that spec (Adagrad's epsilon 0, FTRL's lack of
    # shrinkage are the TensorFlow engines' too); elsewhere (Adam corrects no
    # bias on TensorFlow's engines, the others have no spec) a custom spec
    # runs its twin. The twin converts to the same kind of spec.
    own = {
        "SGD": "SGDOptimizerSpec",
        "Adagrad": "AdagradOptimizerSpec",
        "AdagradMomentum": "AdagradMomentumOptimizerSpec",
        "FTRL": "FTRLOptimizerSpec",
    }
    for definition in registry.ALL:
        cls = getattr(teo.embedding, definition.name, None)
        if cls is None:
            continue
        optimizer = cls(0.1)
        report = teo.check_engine(optimizer, ENGINE)
        assert report.exact, definition.name
        kind = report.tables[0].received[0]
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            converted = teo.to_embedding(teo.to_keras(optimizer), engine=ENGINE)
        if definition.name in own:
            assert kind == ("spec", own[definition.name])
            assert report.tables[0].custom == ()
            assert type(converted).__name__ == own[definition.name]
        else:
            assert report.tables[0].custom, definition.name
            assert kind == (
                "spec",
                f"RuleOptimizerSpec (CustomOptimizerSpec) running {definition.name}",
            )
            assert type(converted).__name__ == "RuleOptimizerSpec", definition.name


@needs_tensorflow("the embedding face's classes are TensorFlow's")
def test_check_engine_says_why_an_embedding_optimizer_runs_as_a_custom_spec():
    report = teo.check_engine(
        teo.embedding.Adagrad(0.1, weight_decay_factor=0.1, clipvalue=1.0), ENGINE
    ).tables[0]
    assert report.received == (
        ("spec", "RuleOptimizerSpec (CustomOptimizerSpec) running Adagrad"),
    )
    assert report.custom == (
        "clip_gradient_min=-1.0: the specs have no gradient clipping",
        "clip_gradient_max=1.0: the specs have no gradient clipping",
        "weight_decay_factor=0.1: the specs have no weight decay",
    )
    # A factor of 0 decays nothing: the engine's own spec runs it.
    report = teo.check_engine(
        teo.embedding.Adagrad(0.1, weight_decay_factor=0.0), ENGINE
    ).tables[0]
    assert report.received == (("spec", "AdagradOptimizerSpec"),)
    assert report.custom == ()


def test_check_engine_refuses_what_it_cannot_read():
    with pytest.raises(TypeError, match="`obj`"):
        teo.check_engine("adagrad", ENGINE)
    with pytest.raises(TypeError, match="sparse_core_embedding_config"):
        teo.check_engine(_make("sgd"), ENGINE, sparse_core_embedding_config=object())


def test_spec_with_another_engine_is_refused():
    with pytest.raises(ValueError, match="jax-tpu-embedding"):
        teo.to_keras(_make("sgd"), engine="TPUEmbeddingV2")


# keras-rs's silent changes (issue #21): each one refused by to_embedding and
# named by check_engine.
SILENT_CHANGES = {
    "adam-weight-decay": (
        lambda: keras.optimizers.Adam(1e-3, weight_decay=0.1),
        "weight_decay=0.1",
    ),
    "adagrad-clipvalue": (
        lambda: keras.optimizers.Adagrad(0.1, clipvalue=1.0),
        "clipvalue=1.0",
    ),
    "adagrad-epsilon": (
        lambda: keras.optimizers.Adagrad(0.1, initial_accumulator_value=1e-4),
        "epsilon=1e-07",
    ),
    "adam-dense": (lambda: keras.optimizers.Adam(1e-3), "lazy=False"),
    "adam-epsilon": (
        lambda: keras.optimizers.Adam(1e-3),
        "algorithm_1_epsilon=False",
    ),
}


# The changes a custom spec computes exactly (the others stay refused), and
# how check_engine's report names them in that spec.
EXACT_ALTERNATIVE = {
    "adagrad-clipvalue": "clip_gradient_max=1.0",
    "adagrad-epsilon": "epsilon=1e-07",
}


@pytest.mark.parametrize("case", sorted(SILENT_CHANGES))
def test_keras_rs_silent_changes_are_refused_and_reported(case):
    make, named = SILENT_CHANGES[case]
    if case in EXACT_ALTERNATIVE:
        spec = teo.to_embedding(make(), engine=ENGINE)
        assert type(spec).__name__ == "RuleOptimizerSpec"
    else:
        refused = "lazy=False" if case == "adam-epsilon" else named
        with pytest.raises(ValueError, match=refused):
            teo.to_embedding(make(), engine=ENGINE)
    from keras_rs.src.layers.embedding.jax import config_conversion

    converted = config_conversion.keras_to_jte_optimizer(make())  # no error
    assert teo.check_engine(converted, ENGINE).exact  # the engine runs it...
    features = _keras_rs_features(make(), "sparsecore")
    report = teo.check_engine(features, ENGINE)
    table = report.tables[0]
    # ... but not what the Keras optimizer says, and check_engine says so.
    assert not table.exact and table.runs
    assert EXACT_ALTERNATIVE.get(case, named) in table.dropped[0].reason
    assert "keras-rs maps" in table.dropped[0].reason
    with pytest.raises(ValueError, match=EXACT_ALTERNATIVE.get(case, named)):
        teo.check_engine(features, ENGINE, strict=True)


def test_default_adagrad_epsilon_is_reported_as_negligible():
    features = _keras_rs_features(keras.optimizers.Adagrad(0.1), "sparsecore")
    table = teo.check_engine(features, ENGINE).tables[0]
    assert table.exact
    assert any("epsilon=1e-07" in w and "negligible" in w for w in table.warnings)


EXACT = {
    "sgd": lambda: keras.optimizers.SGD(0.25),
    "adagrad": lambda: keras.optimizers.Adagrad(0.1),
    "adagrad-a0": lambda: keras.optimizers.Adagrad(0.05, initial_accumulator_value=0.5),
    "sgd-schedule": lambda: keras.optimizers.SGD(
        keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)
    ),
}


@pytest.mark.parametrize("case", sorted(EXACT))
def test_exact_conversions_are_what_keras_rs_builds(case):
    from keras_rs.src.layers.embedding.jax import config_conversion

    ours = teo.to_embedding(EXACT[case](), engine=ENGINE)
    theirs = config_conversion.keras_to_jte_optimizer(EXACT[case]())
    assert type(ours) is type(theirs)
    for field in vars(theirs):
        a, b = getattr(ours, field), getattr(theirs, field)
        if isinstance(a, float):
            assert np.float32(a) == np.float32(b), field
        elif field == "learning_rate" and not isinstance(a, float):
            assert a.get_config() == b.get_config()
        else:
            assert a == b, field
    features = _keras_rs_features(EXACT[case](), "sparsecore")
    assert teo.check_engine(features, ENGINE, strict=True).exact


def test_exact_twins_convert_to_specs():
    spec = teo.to_embedding(
        teo.optimizers.Adam(0.01, lazy=True, algorithm_1_epsilon=True), engine=ENGINE
    )
    assert type(spec).__name__ == "AdamOptimizerSpec" and spec.epsilon == 1e-7
    laprop = teo.to_embedding(teo.optimizers.LaProp(0.01, beta_2=0.9), engine=ENGINE)
    assert (laprop.b1, laprop.b2, laprop.eps) == (0.9, 0.9, 1e-30)
    f2a = teo.to_embedding(teo.optimizers.F2A(0.01, rho=0.25), engine=ENGINE)
    assert f2a.rho == 0.25 and f2a.max_lr_multiplier == 1e6


@pytest.mark.parametrize(
    "optimizer",
    [
        lambda: teo.optimizers.RMSprop(lazy=True),
        lambda: teo.optimizers.Momentum(0.1),
        lambda: teo.optimizers.SGD(0.1, clip_weight_min=-1.0),
        lambda: teo.optimizers.Adagrad(0.1, epsilon=0.0, weight_decay_factor=0.1),
        lambda: teo.optimizers.SGD(0.1, momentum=0.9, lazy=True),
        lambda: teo.optimizers.Adam(amsgrad=True, lazy=True),
    ],
)
def test_what_the_engines_specs_cannot_hold_runs_as_a_custom_spec(optimizer):
    # tests/test_jax_custom_specs.py pins what such a spec computes.
    spec = teo.to_embedding(optimizer(), engine=ENGINE)
    assert type(spec).__name__ == "RuleOptimizerSpec"
    assert isinstance(spec, _spec_module().CustomOptimizerSpec)


def test_a_weight_decay_factor_of_zero_keeps_the_engines_own_spec():
    # A factor of 0 decays nothing (the rules and TensorFlow's classes take it
    # for none): the engine's own spec computes it, as it does from the
    # embedding face; the Keras face asked for a custom spec.
    plain = teo.to_embedding(teo.optimizers.Adagrad(0.1), engine=ENGINE)
    for options in (
        {"weight_decay_factor": 0.0},
        {
            "weight_decay_factor": 0.0,
            "multiply_weight_decay_factor_by_learning_rate": True,
        },
    ):
        twin = teo.optimizers.Adagrad(0.1, **options)
        spec = teo.to_embedding(twin, engine=ENGINE)
        assert type(spec) is type(plain), options
        assert vars(spec) == vars(plain), options
        report = teo.check_engine(twin, ENGINE)
        assert report.exact, options
        assert report.tables[0].received[0] == ("spec", "AdagradOptimizerSpec")
    decaying = teo.optimizers.Adagrad(0.1, weight_decay_factor=0.1)
    spec = teo.to_embedding(decaying, engine=ENGINE)
    assert type(spec).__name__ == "RuleOptimizerSpec"


@pytest.mark.parametrize(
    "optimizer",
    [
        lambda: keras.optimizers.RMSprop(),
        lambda: keras.optimizers.SGD(0.1, momentum=0.9),
        lambda: keras.optimizers.Adam(amsgrad=True),
        lambda: keras.optimizers.Ftrl(0.1),
    ],
)
def test_what_no_row_rule_computes_is_refused(optimizer):
    # Keras steps every row of a sparse gradient here; the engine only the
    # looked-up rows (the reason is the JAX engine's, not the TPU engine's).
    with pytest.raises(
        ValueError,
        match="lazy=False: jax-tpu-embedding updates only the looked-up rows",
    ):
        teo.to_embedding(optimizer(), engine=ENGINE)


def test_keras_weight_decay_is_refused_with_the_specs_reason():
    # Not the TensorFlow engines' reason (their weight_decay_factor decays
    # the looked-up rows): jax-tpu-embedding's specs have none.
    with pytest.raises(
        ValueError, match="weight_decay=0.01: the specs have no weight decay"
    ):
        teo.to_embedding(keras.optimizers.SGD(0.1, weight_decay=0.01), engine=ENGINE)


def test_a_value_the_twin_refuses_is_named_by_to_embedding():
    # Stock Keras takes beta_1=1.0; the twin the custom spec runs does not.
    # The refusal came without `to_embedding`'s name on this engine alone.
    optimizer = keras.optimizers.Adam(0.1, beta_1=1.0)
    with pytest.warns(UserWarning, match="lazy=False"):  # strict=False
        with pytest.raises(
            ValueError, match=r"^to_embedding: Adam: argument `beta_1` must be in"
        ):
            teo.to_embedding(optimizer, engine=ENGINE, strict=False)


def test_a_twin_of_a_rate_of_the_step_refuses_to_be_saved_saying_why():
    # jax-tpu-embedding calls a learning rate with the step; Keras cannot
    # save the Python function the twin's schedule wraps.
    spec = _spec_module().SGDOptimizerSpec(learning_rate=lambda step: 0.1 * 0.9**step)
    twin = teo.to_keras(spec)
    assert float(twin.learning_rate) == pytest.approx(0.1)
    with pytest.raises(
        NotImplementedError, match="wraps a Python function, which Keras cannot"
    ):
        twin.get_config()


class _RateOfTheStep:
    def __call__(self, step):
        return 0.1 * 0.5**step


class _ConstantRate:
    def __call__(self):
        return 0.25


def test_a_callable_objects_rate_is_read_by_its_arguments_as_the_engine_does():
    # As jax-tpu-embedding counts them: `self` is not an argument.
    spec_module = _spec_module()
    stepped = teo.to_keras(spec_module.SGDOptimizerSpec(learning_rate=_RateOfTheStep()))
    assert type(stepped._learning_rate).__name__ == "StepLearningRate"
    assert float(stepped._learning_rate(2)) == pytest.approx(0.025)
    constant = _ConstantRate()
    twin = teo.to_keras(spec_module.SGDOptimizerSpec(learning_rate=constant))
    assert twin._learning_rate is constant
    assert float(twin.learning_rate) == pytest.approx(0.25)


def test_strict_false_converts_and_warns():
    with pytest.warns(UserWarning, match="weight_decay=0.1"):
        spec = teo.to_embedding(
            keras.optimizers.Adagrad(0.1, weight_decay=0.1),
            engine=ENGINE,
            strict=False,
        )
    assert type(spec).__name__ == "AdagradOptimizerSpec"


def _keras_rs_features(optimizer, placement, table="items", rows=ROWS, feature="items"):
    import keras_rs

    config = keras_rs.layers.TableConfig(
        name=table,
        vocabulary_size=rows,
        embedding_dim=DIM,
        optimizer=optimizer,
        placement=placement,
    )
    return {
        feature: keras_rs.layers.FeatureConfig(
            name=feature, table=config, input_shape=(4,), output_shape=(4, DIM)
        )
    }


def test_what_keras_rs_refuses_is_reported():
    # keras-rs takes only Adagrad's default epsilon; the exact conversion
    # takes this one too (negligible: 1e-8 / (2·0.1) <= 1e-6).
    optimizer = keras.optimizers.Adagrad(0.1, epsilon=1e-8)
    assert type(teo.to_embedding(optimizer, engine=ENGINE)).__name__ == (
        "AdagradOptimizerSpec"
    )
    table = teo.check_engine(_keras_rs_features(optimizer, "sparsecore"), ENGINE)
    assert table.tables[0].verdict("optimizer") == "rejected"
    assert "keras-rs refuses it" in str(table)
    # The optimizer by its class, as every report names a Keras optimizer
    # (it showed its repr, an address).
    assert (
        "  refuses optimizer='Adagrad': keras-rs refuses it: Unsupported "
        "optimizer option `epsilon`."
    ) in str(table).splitlines()


def test_a_table_given_a_spec_is_refused_as_keras_rs_fails_on_it():
    """A table's optimizer is converted by keras-rs, which takes Keras
    optimizers only: given the spec `to_embedding` makes for this engine, it
    fails with AttributeError. check_engine raised that AttributeError, and
    the ValueError of an optimizer name Keras does not know."""
    spec = teo.to_embedding(keras.optimizers.Adagrad(0.1), engine=ENGINE)
    conversion = pytest.importorskip(
        "keras_rs.src.layers.embedding.jax.config_conversion"
    )
    with pytest.raises(AttributeError, match="_learning_rate"):
        conversion.keras_to_jte_optimizer(spec)
    report = teo.check_engine(_keras_rs_features(spec, "sparsecore"), ENGINE)
    assert not report.runs
    (refusal,) = report.tables[0].rejected
    assert (refusal.name, refusal.value) == ("optimizer", spec)
    assert refusal.reason.startswith(
        "keras-rs's JAX layer fails on it (AdagradOptimizerSpec is no Keras "
        "optimizer; AttributeError: "
    )
    # A name keras-rs cannot read is its refusal too (check_engine raised).
    with pytest.raises(ValueError, match="nonsense"):
        conversion.keras_to_jte_optimizer("nonsense")
    report = teo.check_engine(_keras_rs_features("nonsense", "sparsecore"), ENGINE)
    assert report.tables[0].verdict("optimizer") == "rejected"
    assert "nonsense" in report.tables[0].rejected[0].reason


@pytest.mark.parametrize(
    "engine",
    [
        pytest.param("TPUEmbedding", marks=needs_tensorflow("its engine")),
        pytest.param("TPUEmbeddingV2", marks=needs_tensorflow("its engine")),
        ENGINE,
    ],
)
def test_a_keras_optimizer_no_engine_runs_is_refused_in_the_same_words(engine):
    """The refusal is to_embedding's, without its function's prefix, on every
    engine (TensorFlow's kept the prefix, as no other report line does)."""
    with pytest.raises(TypeError) as raised:
        teo.to_embedding(keras.optimizers.Lion(0.1), engine=engine)
    message = str(raised.value)
    assert message.startswith("to_embedding: argument `keras_opt` is ")
    report = teo.check_engine(keras.optimizers.Lion(0.1), engine)
    (refusal,) = report.tables[0].rejected
    assert (refusal.name, refusal.value) == ("optimizer", "Lion")
    assert refusal.reason == message.removeprefix("to_embedding: ").rstrip(".")
    assert not report.runs


def test_keras_rs_without_its_jax_conversion_is_named(monkeypatch):
    """Where keras-rs's JAX conversion cannot be imported, check_engine says
    what it needs."""
    module = "keras_rs.src.layers.embedding.jax.config_conversion"
    monkeypatch.setitem(sys.modules, module, None)  # as if not importable
    with pytest.raises(
        ValueError,
        match=r"^check_engine: reading a keras-rs configuration for engine "
        r"'jax-tpu-embedding' needs keras-rs's JAX conversion",
    ):
        teo.check_engine(_keras_rs_features("sgd", "sparsecore"), ENGINE)


def test_a_global_optimizer_is_refused_where_the_jax_engine_has_none():
    """keras-rs's JAX layer takes no `optimizer=` (its TensorFlow layer does),
    and a spec is itself an optimizer: check_engine ignored the argument."""
    import keras_rs

    features = _keras_rs_features(keras.optimizers.SGD(0.1), "default_device")
    if keras.backend.backend() == "jax":
        with pytest.raises(ValueError, match="Unrecognized keyword arguments"):
            keras_rs.layers.DistributedEmbedding(
                features, optimizer=keras.optimizers.Adagrad(0.1)
            )
    global_optimizer = keras.optimizers.Adagrad(0.1)
    with pytest.raises(
        ValueError, match=r"argument `optimizer` stands for the DistributedEmbedding"
    ):
        teo.check_engine(features, ENGINE, optimizer=global_optimizer)
    spec = teo.to_embedding(keras.optimizers.SGD(0.1), engine=ENGINE)
    with pytest.raises(ValueError, match="has no table to apply to"):
        teo.check_engine(spec, ENGINE, optimizer=global_optimizer)
    assert teo.check_engine(features, ENGINE).runs


def test_a_table_without_optimizer_is_refused_with_keras_rs_reason():
    # keras-rs's JAX conversion itself fails on None (AttributeError).
    report = teo.check_engine(_keras_rs_features(None, "sparsecore"), ENGINE)
    assert report.tables[0].verdict("optimizer") == "rejected"
    assert "cannot train a table without an optimizer" in str(report)
    assert not report.runs


def _two_keras_rs_tables(placements):
    """Two keras-rs tables named "t", unlike in all else, one feature each."""
    features = {}
    for feature, rows, optimizer, placement in zip(
        ("a", "b"),
        (ROWS, 2 * ROWS),
        (keras.optimizers.SGD(0.1), keras.optimizers.Adagrad(0.5)),
        placements,
    ):
        features.update(_keras_rs_features(optimizer, placement, "t", rows, feature))
    return features


def test_keras_rs_tables_of_one_name_are_refused_as_keras_rs_merges_them():
    """keras-rs's JAX conversion gives every feature of the tables named "t"
    the first table's spec: the second table (its rows, its Adagrad) is
    gone, without a word. check_engine said both ran, exactly."""
    from keras_rs.src.layers.embedding.jax import config_conversion

    features = _two_keras_rs_tables(("sparsecore", "sparsecore"))
    specs = config_conversion.keras_to_jte_feature_configs(features)
    assert specs["b"].table_spec is specs["a"].table_spec
    assert specs["b"].table_spec.vocabulary_size == ROWS
    assert type(specs["b"].table_spec.optimizer).__name__ == "SGDOptimizerSpec"
    report = teo.check_engine(features, ENGINE)
    assert not report.runs
    assert [t.verdict("name") for t in report.tables] == ["rejected"] * 2
    assert "keras-rs's JAX conversion makes one table of those named 't'" in (
        str(report)
    )
    with pytest.raises(ValueError, match="rejected name='t'"):
        teo.check_engine(features, ENGINE, strict=True)
    # A table on the default device is a layer of its own (keras-rs keys
    # those by the TableConfig), whatever its name.
    features = _two_keras_rs_tables(("sparsecore", "default_device"))
    report = teo.check_engine(features, ENGINE)
    assert [t.verdict("name") for t in report.tables] == ["passed"] * 2


def test_keras_rs_float32_step_counter_is_warned_where_the_math_reads_it():
    # keras-rs's `iteration` weight is float32: step + 1 stops at 2**24.
    assert np.float32(2**24) + np.float32(1) == np.float32(2**24)
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, 1000, 0.9)
    for optimizer, uses in (
        (keras.optimizers.Adam(0.01), "Adam's step terms"),
        (keras.optimizers.SGD(schedule), "the learning-rate schedule"),
        (keras.optimizers.Adagrad(0.1), None),
    ):
        features = _keras_rs_features(optimizer, "sparsecore")
        table = teo.check_engine(features, ENGINE).tables[0]
        counter = [w for w in table.warnings if "float32" in w]
        if uses is None:
            assert counter == [], counter
        else:
            assert len(counter) == 1 and "16,777,216" in counter[0], counter
            assert uses in counter[0]


def test_default_device_tables_are_reported():
    features = _keras_rs_features(keras.optimizers.Adagrad(0.1), "default_device")
    table = teo.check_engine(features, ENGINE).tables[0]
    assert table.verdict("placement") == "changed"
    assert "model's optimizer" in table.dropped[0].reason
    assert "teo.layers.row_sparse_tables" in table.dropped[0].reason
    auto = teo.check_engine(_keras_rs_features("sgd", "auto"), ENGINE).tables[0]
    assert auto.exact and "placement='auto'" in auto.warnings[0]


@pytest.mark.parametrize(
    "optimizer, named", [("adam", "optimizer 'adam'"), ("instance", "Adagrad")]
)
def test_a_default_device_table_names_the_optimizer_it_leaves_unused(optimizer, named):
    """keras-rs never reads a default-device table's optimizer: the report
    names it as given (a name is not even resolved)."""
    if optimizer == "instance":
        optimizer = keras.optimizers.Adagrad(0.1)
    features = _keras_rs_features(optimizer, "default_device")
    (dropped,) = teo.check_engine(features, ENGINE).tables[0].dropped
    assert (
        "keras-rs builds a plain embedding layer for this table, which the "
        f"model's optimizer trains; the table's {named} is not used."
    ) in dropped.reason


def _keras_rs_model(table_optimizer, seed=3):
    import keras_rs

    tables = {
        name: keras_rs.layers.TableConfig(
            name=name,
            vocabulary_size=size,
            embedding_dim=4,
            optimizer=optimizer,
            placement="default_device",
            # keras-rs's default initializer is one instance made when
            # keras-rs is imported, with a seed drawn then: the starting
            # tables differed from run to run (the flaky failure of issue #29).
            initializer=keras.initializers.VarianceScaling(
                mode="fan_out", seed=seed + offset
            ),
        )
        for offset, (name, size, optimizer) in enumerate(
            (
                ("users", 20, table_optimizer),
                ("items", 30, "sgd"),
            )
        )
    }
    features = {
        name: keras_rs.layers.FeatureConfig(
            name=name, table=table, input_shape=(8,), output_shape=(8, 4)
        )
        for name, table in tables.items()
    }
    keras.utils.set_random_seed(seed)
    inputs = {
        name: keras.Input(shape=(), dtype="int32", batch_size=8, name=name)
        for name in features
    }
    outputs = keras_rs.layers.DistributedEmbedding(features)(inputs)
    joined = keras.layers.Concatenate()([outputs["users"], outputs["items"]])
    model = keras.Model(inputs, keras.layers.Dense(1)(joined))
    return model, features


def _fit_one_step(model, optimizer):
    # Distinct users: stock Keras Adagrad, the oracle below, squares each
    # duplicate of a sparse (TensorFlow) gradient apart.
    data = {
        "users": np.array([0, 1, 2, 3, 5, 8, 13, 19], "int32"),
        "items": np.array([0, 4, 4, 4, 7, 9, 11, 29], "int32"),
    }
    model.compile(optimizer=optimizer, loss="mse")
    model.fit(data, np.ones((8, 1), "float32"), batch_size=8, epochs=1, verbose=0)
    return {
        v.path.split("/", 1)[-1]: keras.ops.convert_to_numpy(v.value)
        for v in model.trainable_variables
    }


def _assert_same_step(got, want, before, path):
    """`got` is `want` to the last bit on JAX; on TensorFlow within the
    rounding of one step's arithmetic.

    On TensorFlow the two differ in how the step is rounded, not in what it
    computes: the twin sums a row's duplicate gradients before it multiplies
    by the learning rate, Keras subtracts each duplicate's step apart, and
    Grappler may rewrite Keras's `x / sqrt(y)` (not the twin's gathered rows)
    as `x * rsqrt(y)`. Each is a few float32 roundings of quantities no larger
    than |w| + |step|, so the results differ by at most a few units of
    float32's epsilon of that sum (measured: at most 5), never relative to a
    result that cancels towards zero. On JAX both run the same operations in
    the same order.
    """
    if keras.backend.backend() == "jax":
        np.testing.assert_array_equal(got, want, err_msg=path)
        return
    scale = np.abs(before) + np.abs(want - before)
    bound = 8 * np.finfo(np.float32).eps * scale
    excess = np.abs(got - want) - bound
    assert (excess <= 0).all(), (
        f"{path}: {np.count_nonzero(excess > 0)} elements differ by more than "
        f"8 eps * (|w| + |step|); worst excess {excess.max()}"
    )


def test_keras_rs_default_device_tables_keep_their_optimizer():
    # keras-rs alone: the table's Adagrad(0.1) is ignored, SGD(0.5) trains it.
    model, _ = _keras_rs_model(keras.optimizers.Adagrad(0.1))
    ignored = _fit_one_step(model, keras.optimizers.SGD(0.5))
    model, _ = _keras_rs_model(keras.optimizers.SGD(0.5))
    as_sgd = _fit_one_step(model, keras.optimizers.SGD(0.5))
    np.testing.assert_array_equal(
        ignored["users/embeddings"], as_sgd["users/embeddings"]
    )
    # keras_optimizer: each table trains with its own optimizer, the rest with
    # SGD(0.5) - as Keras's own MultiOptimizer built by hand computes it.
    model, features = _keras_rs_model(keras.optimizers.Adagrad(0.1))
    before = {
        v.path.split("/", 1)[-1]: keras.ops.convert_to_numpy(v.value)
        for v in model.trainable_variables
    }
    ours = _fit_one_step(
        model, teo.keras_optimizer(features, keras.optimizers.SGD(0.5))
    )
    model, _ = _keras_rs_model(keras.optimizers.Adagrad(0.1))
    by_hand = keras.optimizers.MultiOptimizer(
        keras.optimizers.OptimizerMap(
            keras.optimizers.SGD(0.5),
            {
                ".*/users/embeddings": keras.optimizers.Adagrad(0.1),
                # The items table's own optimizer is "sgd": Keras's SGD().
                ".*/items/embeddings": keras.optimizers.SGD(),
            },
        )
    )
    expected = _fit_one_step(model, by_hand)
    assert ours.keys() == expected.keys()
    for path in ours:
        _assert_same_step(ours[path], expected[path], before[path], path)
    assert not np.allclose(ours["users/embeddings"], as_sgd["users/embeddings"])


def test_keras_optimizer_gives_keras_rs_tables_the_twins_of_stock_optimizers():
    """A table's stock Keras optimizer becomes its twin (duplicate ids summed,
    the engine's math where asked), the same class for any other Keras
    optimizer: on dense gradients both compute alike, so the step alone
    (above) cannot tell the twin from a copy of the stock class."""
    _, features = _keras_rs_model(keras.optimizers.Adagrad(0.1))
    multi = teo.keras_optimizer(features, keras.optimizers.SGD(0.5))
    assert [type(o) for o in multi.optimizers] == [
        teo.optimizers.SGD,  # the items table's "sgd"
        teo.optimizers.Adagrad,
        keras.optimizers.SGD,  # the dense layers' own, as given
    ]


def test_keras_optimizer_can_follow_the_sparsecore_job():
    _, features = _keras_rs_model(keras.optimizers.Adam(0.01))
    multi = teo.keras_optimizer(features, keras.optimizers.SGD(0.5), engine=ENGINE)
    adam = [o for o in multi.optimizers if type(o).__name__ == "Adam"][0]
    # keras-rs hands SparseCore the engine's lazy Adam, epsilon after the
    # bias correction: that is what the CPU/GPU run computes then.
    assert adam._arguments["lazy"] and adam._arguments["algorithm_1_epsilon"]
    with pytest.raises(ValueError, match="engine"):
        teo.keras_optimizer(features, keras.optimizers.SGD(), engine="TPUEmbedding")


def _keras_rs_feature(name, table, optimizer):
    import keras_rs

    table = keras_rs.layers.TableConfig(
        name=table, vocabulary_size=ROWS, embedding_dim=DIM, optimizer=optimizer
    )
    return keras_rs.layers.FeatureConfig(
        name=name, table=table, input_shape=(4,), output_shape=(4, DIM)
    )


@pytest.mark.parametrize(
    "features, error, words",
    [
        (
            lambda: {"a": _keras_rs_feature("a", "t", "sgd"), "b": 3},
            TypeError,
            r"^keras_optimizer: the configuration mixes keras-rs FeatureConfigs "
            "with other objects",
        ),
        (
            lambda: {
                "a": _keras_rs_feature("a", "t", "sgd"),
                "b": _keras_rs_feature("b", "t", "adagrad"),
            },
            ValueError,
            r"Tables must have unique names; repeated: \['t'\]",
        ),
        (
            lambda: {"a": _keras_rs_feature("a", "t", 3)},
            TypeError,
            r"^Table 't': a keras-rs table's optimizer must be a Keras optimizer "
            "or its name; received 3 of type int",
        ),
    ],
)
@pytest.mark.parametrize("engine", [None, ENGINE])
def test_keras_optimizer_refuses_keras_rs_tables_it_cannot_read(
    features, error, words, engine
):
    # Following the SparseCore job (engine=ENGINE), a table's optimizer that
    # is no Keras one raised keras-rs's AttributeError.
    with pytest.raises(error, match=words):
        teo.keras_optimizer(features(), keras.optimizers.SGD(0.5), engine=engine)


def test_keras_optimizer_refuses_a_global_optimizer_beside_keras_rs_tables():
    features = {"a": _keras_rs_feature("a", "t", "sgd")}
    with pytest.raises(TypeError, match="^keras_optimizer: `embedding_optimizer` is"):
        teo.keras_optimizer(
            features,
            keras.optimizers.SGD(0.5),
            embedding_optimizer=keras.optimizers.Adagrad(0.1),
        )


def test_keras_optimizer_following_the_sparsecore_job_names_what_keras_rs_refuses():
    features = {
        "a": _keras_rs_feature("a", "t", keras.optimizers.SGD(0.1, momentum=0.9))
    }
    teo.keras_optimizer(features, keras.optimizers.SGD(0.5))  # its own math
    with pytest.raises(
        ValueError,
        match=r"^Table 't': keras-rs refuses it: Unsupported optimizer option "
        "`momentum`",
    ):
        teo.keras_optimizer(features, keras.optimizers.SGD(0.5), engine=ENGINE)


@needs_tensorflow("the TensorFlow engines need it")
@pytest.mark.parametrize("engine", ["TPUEmbedding", "TPUEmbeddingV2"])
@pytest.mark.parametrize("name", ["LaProp", "F2A"])
def test_tensorflow_engines_refuse_the_jax_only_algorithms_by_name(engine, name):
    twin = getattr(teo.optimizers, name)(0.1)
    with pytest.raises(ValueError, match=f"{name} exists only on jax-tpu-embedding"):
        teo.to_embedding(twin, engine=engine)
    report = teo.check_engine(twin, engine)
    assert not report.runs and name in str(report)


@needs_tensorflow("the embedding face needs it")
def test_embedding_optimizers_on_the_jax_engine():
    E = teo.embedding
    assert teo.check_engine(E.Adagrad(0.1), ENGINE).exact
    twin = teo.to_keras(E.FTRL(0.1, beta=0.5), engine=ENGINE)
    spec = teo.to_embedding(twin, engine=ENGINE)
    assert type(spec).__name__ == "FTRLOptimizerSpec" and spec.beta == 0.5
    # What the engine's own specs cannot hold runs as a custom spec
    # (tests/test_jax_custom_specs.py pins its math).
    for opt in (E.Adam(0.1), E.SGD(0.1, clipvalue=1.0), E.RMSProp(0.1)):
        table = teo.check_engine(opt, ENGINE).tables[0]
        assert table.exact and "RuleOptimizerSpec" in dict(table.received)["spec"]
        twin = teo.to_keras(opt, engine=ENGINE)
        assert twin.get_config()["rounding"] == ENGINE
        spec = teo.to_embedding(twin, engine=ENGINE)
        assert type(spec).__name__ == "RuleOptimizerSpec"
    assert (
        teo.to_keras(E.SGD(0.1, clipvalue=1.0), engine=ENGINE)._options[
            "clip_gradient_max"
        ]
        == 1.0
    )
    # What no row rule computes is refused by name.
    dense = teo.check_engine(E.Adam(0.1, lazy_adam=False), ENGINE).tables[0]
    assert dense.verdict("lazy_adam") == "rejected"
    per_sample = E.Adagrad(0.1, use_gradient_accumulation=False)
    table = teo.check_engine(per_sample, ENGINE).tables[0]
    assert table.verdict("use_gradient_accumulation") == "rejected"
    with pytest.raises(ValueError, match="use_gradient_accumulation"):
        teo.to_keras(per_sample, engine=ENGINE)


def test_describe_on_the_jax_engine():
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "tf_tpu_embed_opt",
            "describe",
            "laprop",
            "--beta-2",
            "0.9",
            "--engine",
            ENGINE,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("LaPropOptimizerSpec(learning_rate=0.001, b1=0.9")
    assert (
        "tf_tpu_embed_opt.optimizers.LaProp(beta_2=0.9, rounding='jax-tpu-embedding')"
        in run.stdout
    )
    refused = subprocess.run(
        [sys.executable, "-m", "tf_tpu_embed_opt", "describe", "f2a"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert refused.returncode == 2
    assert "F2A exists only on jax-tpu-embedding" in refused.stdout


def test_laprop_decay_schedule_is_the_specs():
    definition = registry.BY_NAME["LaProp"]
    spec = _spec_module().LaPropOptimizerSpec(b2=0.8)
    for step in range(4):
        ours = definition.step_hypers(
            type("xp", (), {"power": staticmethod(np.power)}),
            np.float32(step + 1),
            {"beta_2": 0.8},
        )["decay_rate"]
        theirs = float(spec.get_decay_rate(step))
        assert math.isclose(ours, theirs, rel_tol=1e-6, abs_tol=1e-7), step


# docs/tpu_semantics.md, "jax-tpu-embedding", golden rows: row 0 after each
# step, row 1 after the last (computed by jax-tpu-embedding's own functions).
GOLDEN_ROWS = {
    "AdamOptimizerSpec": ({}, [0.9, 0.87336636, 0.8075557], 0.9361191),
    "LaPropOptimizerSpec": ({}, [0.956411, 0.9449636, 0.869717], 0.92638105),
    "F2AOptimizerSpec": (
        {"l2_regularization_strength": 0.01},
        [0.91448456, 0.94109416, 0.8714525],
        0.86416006,
    ),
}


@pytest.mark.parametrize("name", sorted(GOLDEN_ROWS))
def test_golden_rows_of_the_semantics_document(name):
    kwargs, row_0, row_1 = GOLDEN_ROWS[name]
    spec = getattr(_spec_module(), name)(learning_rate=0.1, **kwargs)
    twin = teo.to_keras(spec)
    variable = keras.Variable(np.ones((2, 1), "float32"))
    seen = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for step, g in enumerate([0.5, -0.25, 1.0]):
            ids = [0, 1] if step == 2 else [0]
            grads = np.full((len(ids), 1), g, "float32")
            if BACKEND == "tensorflow":
                import tensorflow as tf

                gradient = tf.IndexedSlices(
                    tf.constant(grads), tf.constant(ids, tf.int64), tf.constant([2, 1])
                )
            else:
                from jax.experimental import sparse as jax_sparse

                gradient = jax_sparse.BCOO(
                    (grads, np.asarray(ids, "int32").reshape(-1, 1)), shape=(2, 1)
                )
            twin.apply_gradients([(gradient, variable)])
            seen.append(keras.ops.convert_to_numpy(variable.value)[:, 0].copy())
    # As against the oracle: the twin's float32 operations come in another
    # order than the engine's (Adam: β₁·m + (1−β₁)·g against m + (1−β₁)·(g−m)).
    np.testing.assert_allclose([s[0] for s in seen], row_0, rtol=2e-6)
    np.testing.assert_allclose(seen[-1][1], row_1, rtol=2e-6)


@pytest.mark.skipif(
    BACKEND != "jax", reason="the benchmark runs on Keras's JAX backend"
)
def test_benchmark_of_the_jax_only_twins_runs():
    import importlib
    import pathlib

    # benchmarks/ is not installed: the checkout's, after the installed package.
    root = str(pathlib.Path(__file__).resolve().parents[1])
    if root not in sys.path:
        sys.path.append(root)
    jax_engine_rules = importlib.import_module("benchmarks.jax_engine_rules")

    # Tiny sizes: the harness, and the agreement it checks before timing.
    results = jax_engine_rules.measure(tuple(jax_engine_rules.CASES), 64, 4, 1, 2)
    text = jax_engine_rules.report(results, 64, 4)
    assert "| LaProp |" in text and "| F2A |" in text


@pytest.mark.parametrize("engine", ["TPUEmbeddingV2", "TPUEmbedding"])
def test_tensorflow_engines_without_tensorflow_say_so(monkeypatch, engine):
    """`check_engine` on a TensorFlow engine (`TPUEmbeddingV2` is its default)
    and `keras_optimizer` of TPUEmbedding's tables raise
    `TensorFlowNotInstalled` naming what needed it, where TensorFlow is not
    installed (simulated where it is): it was a bare `ModuleNotFoundError`.
    A jax-tpu-embedding spec on a TensorFlow engine is refused for that, with
    TensorFlow or without."""
    from tf_tpu_embed_opt import errors

    monkeypatch.setattr(errors, "tensorflow_installed", lambda: False)
    with pytest.raises(teo.TensorFlowNotInstalled) as raised:
        teo.check_engine(keras.optimizers.Adagrad(0.1), engine)
    assert str(raised.value).startswith(
        f"check_engine(..., engine={engine!r}) (engine='jax-tpu-embedding' runs "
        "without it) needs TensorFlow"
    )
    with pytest.raises(teo.TensorFlowNotInstalled) as raised:
        teo.keras_optimizer({"t": None}, keras.optimizers.SGD(0.1))
    assert str(raised.value).startswith(
        "keras_optimizer of TPUEmbedding's tables (a feature config, TableConfigs "
        "or {table name: embedding optimizer}; keras-rs's FeatureConfigs run "
        "without it) needs TensorFlow"
    )
    pytest.importorskip("jax_tpu_embedding.sparsecore.lib.nn.embedding_spec")
    spec = _spec_module().AdamOptimizerSpec(learning_rate=0.01)
    monkeypatch.undo()
    for engine_ in (engine, None):
        with pytest.raises(ValueError) as raised:
            teo.check_engine(spec, *([engine_] if engine_ else []))
        assert str(raised.value) == (
            "check_engine: AdamOptimizerSpec is a jax-tpu-embedding spec; it runs "
            f"on engine 'jax-tpu-embedding', not {engine_ or 'TPUEmbeddingV2'!r}."
        )
