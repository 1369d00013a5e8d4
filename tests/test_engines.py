"""The engine preflight agrees with TensorFlow's own TPUEmbeddingV2 code path.

Every verdict is read from TensorFlow itself: `sparsecore_oracle` builds the
real `TPUEmbeddingV2` on CPU and runs its `apply_gradients` with the SparseCore
ops replaced by recorders. A setting is "passed" when changing it changes what
the op receives, "dropped" when it does not, "rejected" when TensorFlow raises.
"""

import inspect
import re
import warnings

import keras
import pytest
import sparsecore_oracle as oracle
import tensorflow as tf
from proto_oracle import expected_proto

import tf_tpu_embed_opt as teo
from tf_tpu_embed_opt import embedding, engines
from tf_tpu_embed_opt.conversions import preflight_jax
from tf_tpu_embed_opt.definitions import registry

pytestmark = pytest.mark.skipif(
    oracle.available() is not None, reason=str(oracle.available())
)

E = tf.tpu.experimental.embedding


def _tf_verdict(monkeypatch, baseline, variant):
    base = oracle.run_step(monkeypatch, baseline)
    assert base[0] == "called", base
    result = oracle.run_step(monkeypatch, variant)
    if result[0] == "raised":
        return "rejected"
    assert result[1] == base[1]
    return "dropped" if oracle.same_arguments(base[2], result[2]) else "passed"


def _report_verdict(opt, name):
    return teo.check_engine(opt, "TPUEmbeddingV2").tables[0].verdict(name)


def _other_value(cls, hyper, baseline_kwargs):
    """A valid non-default value for `hyper` (bools flipped)."""
    if hyper.kind == "bool":
        candidates = [not hyper.default]
    else:
        d = hyper.default
        candidates = [d * 0.5 if d else 0.5, d + 0.25, d - 0.25, 0.5, 3.0]
    for value in candidates:
        if hyper.kind != "bool" and hyper.bounds and not hyper.bounds.contains(value):
            continue
        try:
            cls(**baseline_kwargs, **{hyper.name: value})
        except (TypeError, ValueError):
            continue
        return value
    raise AssertionError(f"no valid value for {hyper.name}")


SUPPORTED = [d for d in registry.DEFINITIONS if d.name in engines.SPARSECORE_OPTIMIZERS]
UNSUPPORTED = [
    d for d in registry.DEFINITIONS if d.name not in engines.SPARSECORE_OPTIMIZERS
]

# The engine options of the issue; each applies to every algorithm.
OPTIONS = {
    "clipvalue": {"clipvalue": 1.0},
    "clip_weight_min": {"clip_weight_min": -1.0},
    "clip_weight_max": {"clip_weight_max": 1.0},
    "weight_decay_factor": {"weight_decay_factor": 0.1},
    "multiply_weight_decay_factor_by_learning_rate": {
        "weight_decay_factor": 0.1,
        "multiply_weight_decay_factor_by_learning_rate": True,
    },
    "use_gradient_accumulation": {"use_gradient_accumulation": False},
    "low_dimensional_packing_status": {"low_dimensional_packing_status": True},
}


def test_every_definition_is_classified():
    assert len(SUPPORTED) + len(UNSUPPORTED) == len(registry.DEFINITIONS) == 11
    assert {d.name for d in SUPPORTED} == {
        "SGD",
        "Adagrad",
        "AdagradMomentum",
        "Adam",
        "FTRL",
    }


@pytest.mark.parametrize("definition", SUPPORTED, ids=lambda d: d.name)
@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_engine_option_verdict_matches_tensorflow(monkeypatch, definition, option):
    cls = embedding.class_for(definition)
    baseline = cls(learning_rate=0.1)
    variant = cls(learning_rate=0.1, **OPTIONS[option])
    expected = _tf_verdict(monkeypatch, baseline, variant)
    assert _report_verdict(variant, option) == expected
    if expected == "rejected":
        report = teo.check_engine(variant, "TPUEmbeddingV2")
        assert not report.runs
        with pytest.raises(ValueError, match=option):
            teo.check_engine(variant, "TPUEmbeddingV2", strict=True)


@pytest.mark.parametrize("definition", SUPPORTED, ids=lambda d: d.name)
def test_hyperparameter_verdicts_match_tensorflow(monkeypatch, definition):
    """Each hyperparameter (lazy_adam, sum_inside_sqrt, slot initial values, ...)."""
    cls = embedding.class_for(definition)
    baseline = cls(learning_rate=0.1)
    assert _tf_verdict(monkeypatch, baseline, cls(learning_rate=0.1)) == "dropped"
    seen = []
    for hyper in definition.hypers:
        variant = cls(learning_rate=0.1, **{hyper.name: _other_value(cls, hyper, {})})
        expected = _tf_verdict(monkeypatch, baseline, variant)
        assert _report_verdict(variant, hyper.name) == expected, hyper.name
        seen.append((hyper.name, expected))
    if definition.name == "Adam":
        assert dict(seen)["lazy_adam"] == "dropped"
        assert dict(seen)["sum_inside_sqrt"] == "passed"
    if definition.name in ("Adagrad", "FTRL"):
        # The slot initial value reaches the engine through the slots.
        assert dict(seen)["initial_accumulator_value"] == "passed"


@pytest.mark.parametrize("definition", SUPPORTED, ids=lambda d: d.name)
def test_dynamic_learning_rate_is_passed(monkeypatch, definition):
    cls = embedding.class_for(definition)
    variant = cls(learning_rate=lambda: 0.5)
    expected = _tf_verdict(monkeypatch, cls(learning_rate=0.1), variant)
    assert expected == "passed"
    assert _report_verdict(variant, "learning_rate") == "passed"
    received = dict(teo.check_engine(variant).tables[0].received)
    assert "called at every apply_gradients" in received["learning_rate"]


@pytest.mark.parametrize("definition", UNSUPPORTED, ids=lambda d: d.name)
def test_other_algorithms_are_rejected_like_tensorflow(monkeypatch, definition):
    opt = embedding.class_for(definition)(learning_rate=0.1)
    result = oracle.run_step(monkeypatch, opt)
    assert result[0] == "raised"
    assert "Unsupported optimizer" in str(result[1])
    report = teo.check_engine(opt, "TPUEmbeddingV2")
    assert not report.runs
    assert report.tables[0].rejected[0].name == "optimizer"
    with pytest.raises(ValueError, match="Unsupported optimizer in minibatching"):
        teo.check_engine(opt, "TPUEmbeddingV2", strict=True)
    # The same optimizer is fine on the TensorCore engine.
    assert teo.check_engine(opt, "TPUEmbedding").exact


@pytest.mark.parametrize("definition", UNSUPPORTED, ids=lambda d: d.name)
@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_other_algorithms_with_options(monkeypatch, definition, option):
    cls = embedding.class_for(definition)
    try:
        opt = cls(learning_rate=0.1, **OPTIONS[option])
    except ValueError:  # e.g. packing, refused by the class itself
        return
    result = oracle.run_step(monkeypatch, opt)
    assert result[0] == "raised"
    table = teo.check_engine(opt).tables[0]
    assert not table.runs
    # TensorFlow stops at the first refusal: weight decay when it is built,
    # else the algorithm at the first step.
    if isinstance(result[1], NotImplementedError):
        assert table.verdict(option) == "rejected"
    else:
        assert "Unsupported optimizer" in str(result[1])
        assert table.verdict("optimizer") == "rejected"


def test_tensorflow_classes_are_checked_like_ours(monkeypatch):
    opt = E.Adam(0.1, lazy_adam=False, clipvalue=2.0)
    report = teo.check_engine(opt).tables[0]
    assert {s.name for s in report.dropped} == {"lazy_adam", "clipvalue"}
    assert _tf_verdict(monkeypatch, E.Adam(0.1), opt) == "dropped"


@pytest.mark.skipif(
    not hasattr(E, "CustomOptimizer"), reason="no tf CustomOptimizer here"
)
def test_tensorflow_custom_optimizer_is_rejected_like_tensorflow(monkeypatch):
    opt = E.CustomOptimizer(lambda g, w, lr: w - lr * g)
    result = oracle.run_step(monkeypatch, opt)
    assert result[0] == "raised" and "Unsupported optimizer" in str(result[1])
    assert teo.check_engine(opt).tables[0].verdict("optimizer") == "rejected"


def test_user_subclass_of_a_tensorflow_class(monkeypatch):
    class WarmAdam(E.Adam):
        pass

    opt = WarmAdam(0.1, clip_weight_max=1.0)
    assert oracle.run_step(monkeypatch, opt)[0] == "called"
    report = teo.check_engine(opt).tables[0]
    assert report.runs and report.algorithm == "Adam"
    assert _tf_verdict(monkeypatch, WarmAdam(0.1), opt) == "dropped"
    assert report.verdict("clip_weight_max") == "dropped"


def _features(*tables, shape=(16,)):
    return {
        f"f_{t.name}": E.FeatureConfig(t, output_shape=list(shape), name=f"f_{t.name}")
        for t in tables
    }


def test_stacking_is_tensorflows(monkeypatch):
    adagrad = teo.embedding.Adagrad(0.1)
    tables = [
        E.TableConfig(64, 8, optimizer=adagrad, name="a"),
        E.TableConfig(32, 6, optimizer=teo.embedding.Adagrad(0.1), name="b"),
        E.TableConfig(32, 8, optimizer=teo.embedding.Adagrad(0.2), name="c"),
        E.TableConfig(32, 16, optimizer=adagrad, name="d"),
        E.TableConfig(32, 8, optimizer=teo.embedding.SGD(0.1), name="e"),
        E.TableConfig(16, 4, optimizer=E.SGD(0.1), name="f"),
    ]
    config = _features(*tables)
    emb = oracle.build(monkeypatch, config)
    expected = {
        stack: tuple(t.name for t in members)
        for stack, members in emb._stacked_table_to_tables.items()
    }
    report = teo.check_engine(config)
    assert dict(report.stacks) == expected
    # Equal hashes stack (this package's classes hash as TensorFlow's); the
    # width is padded to 8; another learning rate is another stack.
    assert ("a", "b") in expected.values() and ("e", "f") in expected.values()
    for table in report.tables:
        assert table.table in expected[table.stack]
    # The report says so: each table's stack under it, and a line for each
    # stack of several tables (none for a table alone).
    lines = report.lines()
    for table in report.tables:
        at = next(
            i for i, x in enumerate(lines) if x.startswith(f"table {table.table}:")
        )
        assert lines[at + 1] == f"  stacked table: {table.stack}"
    together = sorted(x for x in lines if x.startswith("stacked together"))
    assert together == sorted(
        f"stacked together in {stack}: {', '.join(members)}"
        for stack, members in expected.items()
        if len(members) > 1
    )
    assert len(together) < len(expected)  # single tables make no line
    # The table configs the user passed are untouched.
    assert [t.dim for t in tables] == [8, 6, 8, 16, 8, 4]
    assert all(t.layout is None for t in tables)


def test_sparse_core_embedding_config(monkeypatch):
    shared = E.Adagrad(0.1)
    tables = [E.TableConfig(64, 8, optimizer=shared, name=n) for n in "ab"]
    config = E.SparseCoreEmbeddingConfig(
        disable_table_stacking=True, allow_id_dropping=True
    )
    emb = oracle.build(monkeypatch, _features(*tables), config=config)
    report = teo.check_engine(_features(*tables), sparse_core_embedding_config=config)
    assert dict(report.stacks) == {
        stack: tuple(t.name for t in members)
        for stack, members in emb._stacked_table_to_tables.items()
    }
    assert len(report.stacks) == 2
    assert all(t.verdict("allow_id_dropping") == "changed" for t in report.tables)
    assert not report.exact and report.runs
    stacked = teo.check_engine(_features(*tables))
    assert list(stacked.stacks.values()) == [("a", "b")] and stacked.exact
    with pytest.raises(TypeError, match="`sparse_core_embedding_config`"):
        teo.check_engine(shared, sparse_core_embedding_config={"x": 1})


def test_stacking_fallback_agrees_without_tensorflows_stacker(monkeypatch):
    from tensorflow.python.tpu import tpu_embedding_v3

    tables = [
        E.TableConfig(64, 8, optimizer=E.Adagrad(0.1), name="a"),
        E.TableConfig(32, 5, optimizer=E.Adagrad(0.1), name="b"),
        E.TableConfig(32, 8, optimizer=E.Adam(0.1), name="c"),
    ]
    config = _features(*tables)
    emb = oracle.build(monkeypatch, config)
    expected = {
        stack: tuple(t.name for t in members)
        for stack, members in emb._stacked_table_to_tables.items()
    }
    monkeypatch.delattr(
        tpu_embedding_v3, "_stack_tables_with_same_table_dim_and_optimizer"
    )
    assert dict(teo.check_engine(config).stacks) == expected


def test_stacking_of_older_tensorflow(monkeypatch):
    """TensorFlow before the module-level stacker grouped by exact dim."""
    from tensorflow.python.tpu import tpu_embedding_v3

    monkeypatch.delattr(
        tpu_embedding_v3, "_stack_tables_with_same_table_dim_and_optimizer"
    )
    monkeypatch.setattr(
        tpu_embedding_v3.TPUEmbeddingV2,
        "_stack_tables_with_same_table_dim_and_optimizer",
        lambda self: None,
        raising=False,
    )
    tables = [
        E.TableConfig(64, 8, optimizer=E.Adagrad(0.1), name="a"),
        E.TableConfig(32, 5, optimizer=E.Adagrad(0.1), name="b"),
        E.TableConfig(32, 8, optimizer=E.Adam(0.1), name="c"),
        E.TableConfig(16, 8, optimizer=E.Adagrad(0.1), name="d"),
    ]
    stacks = teo.check_engine(_features(*tables)).stacks
    assert sorted(stacks.values()) == [("a", "d"), ("b",), ("c",)]


def test_feature_config_report_per_table(monkeypatch):
    tables = [
        E.TableConfig(64, 8, optimizer=E.Adagrad(0.1, clipvalue=1.0), name="a"),
        E.TableConfig(64, 8, optimizer=None, name="b"),
        E.TableConfig(64, 8, optimizer=teo.embedding.RMSProp(0.1), name="c"),
    ]
    report = teo.check_engine(_features(*tables), optimizer=E.SGD(0.5))
    assert [t.table for t in report.tables] == ["a", "b", "c"]
    assert [s.name for s in report.table("a").dropped] == ["clipvalue"]
    assert report.table("b").algorithm == "SGD" and report.table("b").exact
    assert not report.table("c").runs
    assert report.stacks == {}  # TPUEmbeddingV2 would not get past the refusal
    text = str(report)
    assert "drops clipvalue" in text and "refuses optimizer='RMSProp'" in text
    with pytest.raises(ValueError) as raised:
        teo.check_engine(_features(*tables), optimizer=E.SGD(0.5), strict=True)
    assert "table 'a'" in str(raised.value) and "table 'c'" in str(raised.value)


@pytest.mark.parametrize("clipvalue", [(None, 1.0), (-1.0, None), 1.0])
def test_sparsecore_drops_a_gradient_clip_of_either_side(clipvalue):
    # The SparseCore ops have no gradient clip: one bound is dropped as well.
    report = teo.check_engine(E.SGD(0.1, clipvalue=clipvalue), "TPUEmbeddingV2")
    ((table,),) = [report.tables]
    assert [s.name for s in table.dropped] == ["clipvalue"]
    assert table.runs and not table.exact


@pytest.mark.parametrize("optimizer, exact", [(E.SGD, True), (E.Adagrad, False)])
def test_sparsecore_summing_first_changes_only_a_rule_not_linear_in_it(
    optimizer, exact
):
    # SparseCore always sums a row's gradient before the step: without
    # accumulation SGD's step is the same sum, Adagrad's is not.
    report = teo.check_engine(
        optimizer(0.1, use_gradient_accumulation=False), "TPUEmbeddingV2"
    )
    ((table,),) = [report.tables]
    assert [s.name for s in table.dropped] == ["use_gradient_accumulation"]
    assert table.runs and table.exact is exact


def test_a_table_config_is_reported_under_its_name_with_its_own_optimizer():
    # As TPUEmbedding: a table's own optimizer wins over the global one,
    # which only tables without one take.
    table = E.TableConfig(64, 8, optimizer=E.Adagrad(0.1), name="items")
    for engine in ("TPUEmbedding", "TPUEmbeddingV2"):
        report = teo.check_engine(table, engine, optimizer=E.Adam(0.1))
        ((reported,),) = [report.tables]
        assert (reported.table, reported.algorithm) == ("items", "Adagrad")
        assert "table items: Adagrad" in str(report)
    bare = E.TableConfig(64, 8, optimizer=None, name="bare")
    assert teo.check_engine(bare, optimizer=E.Adam(0.1)).table("bare").algorithm == (
        "Adam"
    )


def test_bad_arguments():
    with pytest.raises(
        ValueError, match=r"`engine`.*TPUEmbeddingV2.*received 'TPUEmbeddingV3'"
    ):
        teo.check_engine(E.SGD(0.1), "TPUEmbeddingV3")
    with pytest.raises(ValueError, match="`engine`"):
        teo.to_embedding(keras.optimizers.SGD(), engine="sparsecore")
    with pytest.raises(ValueError, match="`engine`"):
        teo.to_keras(E.SGD(0.1), engine="SparseCore")
    with pytest.raises(TypeError, match="`obj`"):
        teo.check_engine("adam")
    with pytest.raises(TypeError, match="`strict`"):
        teo.check_engine(E.SGD(0.1), strict="yes")
    with pytest.raises(ValueError, match="`num_partitions`"):
        teo.check_engine(E.SGD(0.1), num_partitions=0)


@pytest.mark.parametrize("engine", ["TPUEmbedding", "TPUEmbeddingV2"])
def test_a_global_optimizer_is_checked_as_tpu_embedding_configuration_checks_it(
    engine,
):
    # Before, check_engine ignored a global optimizer of any kind where every
    # table had its own, or where `obj` was itself an optimizer.
    table = tf.tpu.experimental.embedding.TableConfig(
        8, 4, name="t", optimizer=embedding.Adagrad(0.1)
    )
    features = {"f": tf.tpu.experimental.embedding.FeatureConfig(table=table)}
    for global_optimizer in (3, "sgd", keras.optimizers.SGD(0.1)):
        with pytest.raises(TypeError, match=r"argument `optimizer` \(the global"):
            teo.check_engine(features, engine, optimizer=global_optimizer)
    report = teo.check_engine(features, engine, optimizer=embedding.SGD(0.1))
    assert isinstance(report, engines.EngineReport)
    for obj in (embedding.Adagrad(0.1), keras.optimizers.Adagrad(0.1)):
        with pytest.raises(ValueError, match=r"\(Adagrad\), so the global one"):
            teo.check_engine(obj, engine, optimizer=embedding.SGD(0.1))


def test_keras_optimizers_are_read_as_to_embedding_converts_them():
    report = teo.check_engine(keras.optimizers.Adam(0.01)).tables[0]
    assert report.algorithm == "Adam" and report.runs
    assert report.verdict("lazy_adam") == "dropped"  # Keras Adam is non-lazy
    exact = teo.check_engine(teo.optimizers.Adam(0.01, lazy=True))
    assert exact.exact
    changed = teo.check_engine(keras.optimizers.Adam(0.01, amsgrad=True)).tables[0]
    assert changed.verdict("optimizer") == "changed"
    assert "amsgrad" in changed.dropped[-1].reason
    refused = teo.check_engine(keras.optimizers.SGD(0.1, momentum=0.9)).tables[0]
    assert refused.verdict("optimizer") == "rejected"  # Momentum: not on SparseCore
    # Stock Keras momentum steps every row (non-lazy); the engine only the
    # looked-up ones: a change of the math, not exact. The lazy twin is exact.
    stock = teo.check_engine(keras.optimizers.SGD(0.1, momentum=0.9), "TPUEmbedding")
    assert not stock.exact
    assert any("lazy" in s.describe() for s in stock.tables[0].dropped)
    assert teo.check_engine(
        teo.optimizers.SGD(0.1, momentum=0.9, lazy=True), "TPUEmbedding"
    ).exact
    clippy = teo.check_engine(teo.optimizers.ClippyAdagrad(0.1)).tables[0]
    assert clippy.verdict("optimizer") == "rejected" and not clippy.runs


# --- to_embedding(engine="TPUEmbeddingV2") ----------------------------------


def test_stock_keras_adam_is_refused_for_sparsecore():
    # Keras Adam updates every row; SparseCore Adam only looked-up rows.
    with pytest.raises(ValueError, match="lazy_adam=False"):
        teo.to_embedding(keras.optimizers.Adam(0.01), engine="TPUEmbeddingV2")
    with pytest.warns(UserWarning, match="lazy_adam=False"):
        teo.to_embedding(
            keras.optimizers.Adam(0.01), engine="TPUEmbeddingV2", strict=False
        )
    # On the TensorCore engine it converts exactly (non-lazy).
    assert not teo.to_embedding(keras.optimizers.Adam(0.01)).lazy_adam


def test_a_report_asked_for_a_table_it_lacks_names_those_it_has():
    # It raised KeyError('user') alone.
    report = teo.check_engine(embedding.Adagrad(0.1), "TPUEmbedding")
    with pytest.raises(
        KeyError, match=r"no table 'user' in the report; its tables: \[None\]"
    ):
        report.table("user")
    assert report.table(None).algorithm == "Adagrad"


@pytest.mark.parametrize(
    "keras_opt, algorithm",
    [
        (lambda: keras.optimizers.SGD(0.1, momentum=0.9), "Momentum"),
        (lambda: keras.optimizers.RMSprop(0.1), "RMSProp"),
        (lambda: teo.optimizers.Momentum(0.1), "Momentum"),
    ],
    ids=["SGD-momentum", "RMSprop", "Momentum"],
)
@pytest.mark.parametrize("strict", [True, False])
def test_an_algorithm_sparsecore_lacks_is_refused_whatever_strict(
    keras_opt, algorithm, strict
):
    # With strict=False it was "converted without" the algorithm's name as a
    # setting: the result was Momentum or RMSProp, which TPUEmbeddingV2
    # refuses at its first step ('Unsupported optimizer in minibatching
    # mode.'). Nothing can be left out to run it there.
    with pytest.raises(
        ValueError, match=rf"converts to {algorithm}, which TPUEmbeddingV2 cannot run"
    ):
        teo.to_embedding(keras_opt(), engine="TPUEmbeddingV2", strict=strict)
    # On the TensorCore engine it converts (Keras's non-lazy SGD and RMSprop
    # with strict=False only, as before).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        converted = teo.to_embedding(keras_opt(), strict=False)
    assert type(converted).__name__ == algorithm


def test_lazy_keras_adam_converts_exactly_with_bias_correction(monkeypatch):
    keras_opt = teo.optimizers.Adam(0.01, lazy=True)
    opt = teo.to_embedding(keras_opt, engine="TPUEmbeddingV2")
    assert opt.lazy_adam and not opt.sum_inside_sqrt
    # TPUEmbeddingV2 calls the learning rate at every step: the bias
    # correction reaches the op (t = 1: 0.01·sqrt(1-0.999)/(1-0.9)).
    result = oracle.run_step(monkeypatch, opt)
    assert result[0] == "called"
    assert result[2]["learning_rate"] == pytest.approx(
        0.01 * (1 - 0.999) ** 0.5 / (1 - 0.9), rel=1e-5
    )
    assert result[2]["use_sum_inside_sqrt"] is False
    assert teo.check_engine(opt).exact


@pytest.mark.parametrize(
    "keras_opt, problem",
    [
        (lambda: teo.optimizers.SGD(0.1, momentum=0.9, lazy=True), "Momentum"),
        (lambda: teo.optimizers.RMSprop(0.1, lazy=True), "RMSProp"),
        (lambda: teo.optimizers.Adagrad(0.1, epsilon=0.0, clipvalue=1.0), "clipvalue"),
        (
            lambda: teo.optimizers.SGD(0.1, weight_decay_factor=0.01),
            "weight_decay_factor",
        ),
        (
            lambda: teo.optimizers.Ftrl(0.1, clip_weight_max=1.0, lazy=True),
            "clip_weight_max",
        ),
    ],
)
def test_to_embedding_refuses_what_sparsecore_changes(keras_opt, problem):
    opt = keras_opt()
    teo.to_embedding(opt)  # exact on the TensorCore engine
    with pytest.raises(ValueError, match=problem):
        teo.to_embedding(opt, engine="TPUEmbeddingV2")


@pytest.mark.parametrize(
    "keras_opt",
    [
        lambda: keras.optimizers.SGD(0.1),
        lambda: keras.optimizers.Adagrad(0.1, epsilon=0.0),
        lambda: teo.optimizers.Ftrl(0.1, l1_regularization_strength=0.01, lazy=True),
        lambda: teo.optimizers.AdagradMomentum(0.1, momentum=0.9),
        lambda: teo.optimizers.Adam(0.1, lazy=True, bias_correction=False),
    ],
)
def test_to_embedding_exact_on_sparsecore(keras_opt):
    opt = teo.to_embedding(keras_opt(), engine="TPUEmbeddingV2")
    assert teo.check_engine(opt).exact
    assert opt == teo.to_embedding(keras_opt())


# --- to_keras(engine="TPUEmbeddingV2") --------------------------------------


def test_to_keras_drops_what_sparsecore_drops():
    opt = E.Adam(0.1, lazy_adam=False, clipvalue=1.0, clip_weight_min=-0.5)
    with pytest.warns(UserWarning) as caught:
        twin = teo.to_keras(opt, engine="TPUEmbeddingV2")
    message = str(caught[0].message)
    for name in ("lazy_adam", "clipvalue", "clip_weight_min"):
        assert name in message
    assert caught[0].filename == __file__  # the line that called to_keras
    config = twin.get_config()
    assert config["lazy"] is True
    assert config["clip_gradient_min"] is None and config["clip_weight_min"] is None
    tc = teo.to_keras(opt).get_config()
    assert tc["lazy"] is False and tc["clip_gradient_min"] == -1.0


def test_to_keras_without_accumulation_is_sparsecores_summed_step():
    opt = E.Adagrad(0.1, use_gradient_accumulation=False)
    with pytest.raises(ValueError, match="use_gradient_accumulation"):
        teo.to_keras(opt)
    with pytest.warns(UserWarning, match="use_gradient_accumulation=False"):
        twin = teo.to_keras(opt, engine="TPUEmbeddingV2")
    assert twin.get_config() | {"name": "x"} == teo.to_keras(
        E.Adagrad(0.1)
    ).get_config() | {"name": "x"}


def test_sparsecore_equivalent_drops_what_sparsecore_drops_and_refuses_the_rest():
    # `engines.sparsecore_equivalent` is public; a non-optimizer was reported
    # as an algorithm SparseCore cannot run, with its type name as the
    # optimizer's.
    with pytest.raises(TypeError, match=r"argument `opt` must be an embedding"):
        engines.sparsecore_equivalent(3)
    with pytest.raises(ValueError, match="TPUEmbeddingV2 cannot run"):
        engines.sparsecore_equivalent(embedding.Momentum(0.1))
    clipped = embedding.Adagrad(0.1, clipvalue=1.0, clip_weight_max=2.0)
    assert engines.sparsecore_equivalent(clipped) == embedding.Adagrad(
        0.1, use_gradient_accumulation=True
    )


def test_to_keras_refuses_what_sparsecore_refuses():
    with pytest.raises(ValueError, match="Unsupported optimizer"):
        teo.to_keras(teo.embedding.Momentum(0.1), engine="TPUEmbeddingV2")
    with pytest.raises(ValueError, match="weight_decay_factor"):
        teo.to_keras(E.SGD(0.1, weight_decay_factor=0.1), engine="TPUEmbeddingV2")


@pytest.mark.parametrize("multiplied", [False, True])
def test_a_twins_weight_decay_factor_of_zero_converts_for_both_engines(multiplied):
    # A factor of 0 decays nothing; TensorFlow writes no decay for it. The
    # conversion passes None, which TPUEmbeddingV2 also takes (it raises for
    # any other value, 0.0 included): it refused the twin.
    twin = teo.optimizers.Adagrad(
        0.05,
        epsilon=0.0,
        weight_decay_factor=0.0,
        multiply_weight_decay_factor_by_learning_rate=multiplied,
    )
    expected = expected_proto(
        "Adagrad",
        {
            "learning_rate": 0.05,
            "initial_accumulator_value": 0.1,
            "weight_decay_factor": 0.0,
            "multiply_weight_decay_factor_by_learning_rate": multiplied,
        },
    )
    for engine in ("TPUEmbedding", "TPUEmbeddingV2"):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            converted = teo.to_embedding(twin, engine=engine)
        assert converted.weight_decay_factor is None, engine
        assert teo.to_proto(converted) == expected, engine
        assert teo.check_engine(twin, engine).exact, engine
    # Given to TPUEmbeddingV2 as 0.0, it is refused as TensorFlow refuses it.
    report = teo.check_engine(
        embedding.Adagrad(0.05, weight_decay_factor=0.0), "TPUEmbeddingV2"
    )
    assert [s.name for s in report.tables[0].rejected] == ["weight_decay_factor"]


def test_to_keras_exact_optimizer_is_unchanged():
    opt = E.FTRL(0.1, l1_regularization_strength=0.01, beta=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        twin = teo.to_keras(opt, engine="TPUEmbeddingV2")
    assert twin.get_config() == teo.to_keras(opt).get_config() | {
        "name": twin.get_config()["name"]
    }


@pytest.mark.parametrize(
    "shape, error",
    [(None, ValueError), ([None], TypeError), ([16, None], TypeError), ([], TypeError)],
)
def test_a_feature_without_a_known_output_shape_is_refused_like_tensorflow(
    monkeypatch, shape, error
):
    table = E.TableConfig(64, 8, optimizer=teo.embedding.Adagrad(0.1), name="t")
    other = E.TableConfig(32, 8, optimizer=teo.embedding.SGD(0.1), name="u")
    config = {
        "f": E.FeatureConfig(table, output_shape=shape, name="f"),
        "g": E.FeatureConfig(other, output_shape=[16], name="g"),
    }
    with pytest.raises(error):
        oracle.build(monkeypatch, config)
    report = teo.check_engine(config)
    assert not report.runs
    assert report.table("t").verdict("output_shape") == "rejected"
    assert "'f'" in str(report)
    assert report.table("u").runs
    # TensorCore's TPUEmbedding takes such features (its shapes come later).
    assert teo.check_engine(config, "TPUEmbedding").runs


def test_a_feature_without_gradient_on_an_unpadded_table_is_warned_about(monkeypatch):
    """TensorFlow 2.21 fails on it; check_engine says so (the table runs)."""
    odd = E.TableConfig(32, 5, optimizer=teo.embedding.SGD(0.1), name="odd")
    even = E.TableConfig(32, 8, optimizer=teo.embedding.SGD(0.1), name="even")
    config = {
        "a": E.FeatureConfig(odd, output_shape=[8], name="a"),
        "b": E.FeatureConfig(even, output_shape=[8], name="b"),
    }
    # TensorFlow's own TPUEmbeddingV2, built on CPU, on a step without the
    # gradient of a feature: the table of width 5 fails, the one of 8 does not.
    emb = oracle.build(monkeypatch, config)
    with pytest.raises(tf.errors.InvalidArgumentError, match="reshape"):
        emb._stack_gradients({"a": None, "b": tf.zeros((8, 8))})
    emb._stack_gradients({"a": tf.zeros((8, 5)), "b": None})
    report = teo.check_engine(config)
    assert report.runs and report.exact
    (warning,) = report.table("odd").warnings
    assert "dim 5 is not a multiple of 8" in warning and "None" in warning
    assert report.table("even").warnings == ()
    assert "warns: dim 5" in str(report)
    assert teo.check_engine(config, "TPUEmbedding").table("odd").warnings == ()


@pytest.mark.parametrize("dim", [1, 5, 7, 9, 12, 17])
def test_the_padded_width_warned_about_is_tensorflows(monkeypatch, dim):
    """The warning names the width TPUEmbeddingV2 pads the table to, read
    from TensorFlow's own table after it is built."""
    table = E.TableConfig(32, dim, optimizer=teo.embedding.SGD(0.1), name="t")
    config = {"a": E.FeatureConfig(table, output_shape=[8])}
    (warning,) = teo.check_engine(config).table("t").warnings
    (padded,) = oracle.build(monkeypatch, config)._table_config
    assert padded.dim != dim and padded.dim % 8 == 0
    assert f"(padded to {padded.dim} columns)" in warning


def _two_tables(first, second):
    """A config of two Adagrad tables of those names (None: unnamed)."""
    return {
        feature: E.FeatureConfig(
            E.TableConfig(32, 8, optimizer=teo.embedding.Adagrad(0.1), name=name),
            output_shape=[8],
        )
        for feature, name in (("a", first), ("b", second))
    }


@pytest.mark.parametrize(
    "first, second, name", [("t", "t", "t"), (None, "table_0", "table_0")]
)
def test_two_tables_of_one_name_are_refused_as_tensorflow_refuses_them(
    monkeypatch, first, second, name
):
    """TensorFlow's TPUEmbedding and TPUEmbeddingV2 raise for a name two
    tables share, an unnamed table's `table_<index>` included: check_engine
    said they ran."""
    tensorflow_says = (
        rf"Tables must have a unique name\. Multiple tables with name {name} found\."
    )
    with pytest.raises(ValueError, match=tensorflow_says):
        E.TPUEmbedding(_two_tables(first, second), teo.embedding.SGD(0.1))
    with pytest.raises(ValueError, match=tensorflow_says):
        oracle.build(monkeypatch, _two_tables(first, second))
    for engine in ("TPUEmbedding", "TPUEmbeddingV2"):
        report = teo.check_engine(_two_tables(first, second), engine)
        assert not report.runs and report.stacks == {}
        assert [t.table for t in report.tables] == [name, name]
        for table in report.tables:
            (refusal,) = table.rejected
            assert (refusal.name, refusal.value) == ("name", name)
            assert f"{engine}.__init__ raises ValueError" in refusal.reason
            assert re.search(tensorflow_says, refusal.reason)
        with pytest.raises(ValueError, match=f"rejected name='{name}'"):
            teo.check_engine(_two_tables(first, second), engine, strict=True)
    # Named apart, they run.
    assert teo.check_engine(_two_tables("t", "u"), "TPUEmbeddingV2").runs
    assert teo.check_engine(_two_tables(None, None), "TPUEmbedding").runs


@pytest.mark.parametrize(
    "preflight",
    [engines.check_configuration, preflight_jax.check_jax_engine],
    ids=["check_configuration", "check_jax_engine"],
)
def test_each_engines_preflight_takes_check_engines_defaults(preflight):
    """`engines.check_configuration` (the embedding face) and `check_jax_engine`
    are documented as `check_engine`: each argument's default is its."""
    ours = inspect.signature(preflight).parameters
    public = inspect.signature(teo.check_engine).parameters
    assert set(ours) <= set(public)
    for name, parameter in ours.items():
        assert (name, parameter.default) == (name, public[name].default)
        assert parameter.kind == public[name].kind


def test_an_unnamed_unpadded_table_is_warned_about_by_the_name_it_is_given(
    monkeypatch,
):
    """TPUEmbeddingV2 names an unnamed table `table_<index>`; its report and
    its warning both go by that name (the warning was lost)."""
    odd = E.TableConfig(32, 5, optimizer=teo.embedding.SGD(0.1))
    even = E.TableConfig(32, 8, optimizer=teo.embedding.SGD(0.1))
    config = {
        "a": E.FeatureConfig(even, output_shape=[8]),
        "b": E.FeatureConfig(odd, output_shape=[8]),
    }
    report = teo.check_engine(config)
    assert [t.table for t in report.tables] == ["table_0", "table_1"]
    assert report.table("table_0").warnings == ()
    (warning,) = report.table("table_1").warnings
    assert "dim 5 is not a multiple of 8" in warning
    # TensorFlow's own TPUEmbeddingV2 gives its copies of the tables those
    # names, in that order, and fails on the second one only.
    emb = oracle.build(monkeypatch, config)
    assert [t.name for t in emb._table_config] == ["table_0", "table_1"]
    assert emb._feature_config["b"].table.name == "table_1"
    with pytest.raises(tf.errors.InvalidArgumentError, match="reshape"):
        emb._stack_gradients({"a": tf.zeros((8, 8)), "b": None})
    emb._stack_gradients({"a": None, "b": tf.zeros((8, 5))})
