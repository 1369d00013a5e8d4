"""`describe --engine`: what SparseCore receives, drops, refuses; a Keras
optimizer's spec converted for the engine named; status 2 where a named engine
cannot run the optimizer."""

import pytest
from google.protobuf import text_format

import tf_tpu_embed_opt as teo
from tf_tpu_embed_opt import cli, embedding


def run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_default_engine_output_is_unchanged(capsys):
    plain = run(capsys, "describe", "adagrad")
    explicit = run(capsys, "describe", "adagrad", "--engine", "TPUEmbedding")
    assert plain == explicit
    assert "TPUEmbeddingV2" not in plain[1]


def test_sparsecore_lists_received_and_dropped(capsys):
    code, out, err = run(
        capsys,
        "describe",
        "adam",
        "--engine",
        "TPUEmbeddingV2",
        "--lazy-adam",
        "false",
        "--clipvalue",
        "1",
        "--learning-rate",
        "0.05",
    )
    assert code == 0, err
    section = out.split("engine: TPUEmbeddingV2", 1)[1].split("\n\n", 1)[0]
    opt = embedding.Adam(0.05, lazy_adam=False, clipvalue=1.0)
    expected = teo.check_engine(opt, "TPUEmbeddingV2").lines()[1:]
    assert section.strip().splitlines() == expected
    assert "receives sum_inside_sqrt (as use_sum_inside_sqrt) = True" in section
    assert "drops lazy_adam=False" in section
    assert "drops clipvalue=(-1.0, 1.0)" in section


def test_the_update_shown_is_the_step_the_engine_runs(capsys):
    """The clipping and decay the engine applies stand in the update line
    (`rules.step_math`, the twin's); TPUEmbeddingV2 drops gradient and
    weight clipping, so its line has neither."""
    options = ("--clipvalue", "1", "--clip-weight-max", "2")
    code, out, err = run(
        capsys, "describe", "adagrad", *options, "--weight-decay-factor", "0.1"
    )
    assert code == 0, err
    assert out.splitlines()[2] == (
        "  Update per looked-up row: g ← clamp(g, -1.0, 1.0);  w ← w − 0.1·w;  "
        "a ← a + g²;  w ← w − η·g/√a;  w ← min(w, 2.0)"
    )
    code, out, err = run(
        capsys, "describe", "adagrad", *options, "--engine", "TPUEmbeddingV2"
    )
    assert code == 0, err
    assert "drops clipvalue=(-1.0, 1.0)" in out
    assert "drops clip_weight_max=2.0" in out
    assert (
        out.splitlines()[2] == "  Update per looked-up row: a ← a + g²;  w ← w − η·g/√a"
    )


@pytest.mark.parametrize("algorithm", ["momentum", "rmsprop", "proximal_yogi"])
def test_sparsecore_cannot_run_exits_2(capsys, algorithm):
    code, out, err = run(capsys, "describe", algorithm, "--engine", "TPUEmbeddingV2")
    assert code == 2
    assert "refused" in out and "Unsupported optimizer in minibatching mode" in out


def test_weight_decay_is_refused(capsys):
    code, out, _ = run(
        capsys,
        "describe",
        "sgd",
        "--weight-decay-factor",
        "0.01",
        "--engine",
        "TPUEmbeddingV2",
    )
    assert code == 2
    assert "refuses weight_decay_factor=0.01" in out


def test_engine_before_algorithm_and_bad_engine(capsys):
    code, out, _ = run(capsys, "describe", "--engine", "TPUEmbeddingV2", "ftrl")
    assert code == 0 and "FTRL - exact" in out
    code, out, err = run(capsys, "describe", "sgd", "--engine", "SparseCore")
    assert code == 2 and out == ""
    assert "--engine" in err and "SparseCore" in err and "TPUEmbeddingV2" in err
    assert len(err.strip().splitlines()) == 1


def _spec_file(tmp_path, optimizer):
    path = tmp_path / "spec.txtpb"
    path.write_text(text_format.MessageToString(teo.to_spec(optimizer)))
    return str(path)


@pytest.mark.parametrize(
    "make, code, fragment",
    [
        # An embedding optimizer is what SparseCore is handed: it drops what
        # it lacks.
        (lambda: embedding.Adam(0.01, lazy_adam=False), 0, "drops lazy_adam=False"),
        (lambda: embedding.Momentum(0.1), 2, "refuses optimizer='Momentum'"),
        (lambda: embedding.FTRL(0.1), 0, "FTRL - exact"),
        # A Keras optimizer is converted for the engine named, exactly.
        (
            lambda: teo.optimizers.Adam(0.01, lazy=True),
            0,
            "TPUEmbeddingV2 runs it exactly as the embedding optimizer below "
            "(tf_tpu_embed_opt.to_embedding(..., engine='TPUEmbeddingV2')).",
        ),
    ],
)
def test_from_spec_with_engine(capsys, tmp_path, make, code, fragment):
    path = _spec_file(tmp_path, make())
    result = run(capsys, "describe", "--from", path, "--engine", "TPUEmbeddingV2")
    assert result[0] == code, result[2]
    assert fragment in result[1]


@pytest.mark.parametrize(
    "make, engine",
    [
        # Keras's Adam steps every row; SparseCore and jax-tpu-embedding only
        # the looked-up ones. It was described as TPUEmbedding's lazy_adam=False
        # Adam, which SparseCore then ran with other math (status 0).
        (lambda: teo.optimizers.Adam(0.01), "TPUEmbeddingV2"),
        (lambda: teo.optimizers.Adam(0.01), "jax-tpu-embedding"),
        (lambda: teo.optimizers.SGD(0.1, momentum=0.9), "TPUEmbeddingV2"),
        (lambda: teo.optimizers.LaProp(0.01), "TPUEmbedding"),
    ],
    ids=["Adam-TPUEmbeddingV2", "Adam-jax", "SGD-momentum-TPUEmbeddingV2", "LaProp"],
)
def test_a_keras_spec_is_refused_as_to_embedding_refuses_it(
    capsys, tmp_path, make, engine
):
    optimizer = make()
    with pytest.raises(ValueError) as refusal:
        teo.to_embedding(optimizer, engine=engine)
    path = _spec_file(tmp_path, optimizer)
    code, out, err = run(capsys, "describe", "--from", path, "--engine", engine)
    assert code == 2, err
    name = type(optimizer).__name__
    assert f"{engine} cannot run {name}: {refusal.value}" in out.splitlines()


@pytest.mark.parametrize("name", ["LaProp", "F2A"])
def test_a_keras_spec_of_an_algorithm_only_jax_has_is_described_there(
    capsys, tmp_path, name
):
    """LaProp and F2A, which only jax-tpu-embedding runs, are described on it
    as its own spec class (they were refused as TPUEmbedding refuses them),
    with its twin and the memory of its slots; without --engine, TPUEmbedding
    says it cannot run them (status 0: no verdict was asked)."""
    jte = pytest.importorskip("jax_tpu_embedding.sparsecore.lib.nn.embedding_spec")
    path = _spec_file(tmp_path, getattr(teo.optimizers, name)(0.01))
    sizes = ("--vocabulary-size", "1000", "--dim", "8")
    code, out, err = run(
        capsys, "describe", "--from", path, *sizes, "--engine", "jax-tpu-embedding"
    )
    assert code == 0, err
    lines = out.splitlines()
    assert lines[2] == (
        "  jax-tpu-embedding runs it exactly as the spec below "
        "(tf_tpu_embed_opt.to_embedding(..., engine='jax-tpu-embedding'))."
    )
    # Every field shown is that of jax-tpu-embedding's own spec class made
    # with the learning rate alone: the Keras class's defaults are its.
    theirs = getattr(jte, f"{name}OptimizerSpec")(learning_rate=0.01)
    call = f"{name}OptimizerSpec("
    assert lines[4].startswith(call) and lines[4].endswith(")")
    fields = dict(item.split("=") for item in lines[4][len(call) : -1].split(", "))
    assert len(fields) > 1
    for field, shown in fields.items():
        assert float(shown) == pytest.approx(getattr(theirs, field), rel=1e-7), field
    slots = len(getattr(teo.optimizers, name)(0.01).rule.slots())
    assert f"  slots  {slots} x 32,000" in out
    twin = [line for line in lines if "tf_tpu_embed_opt.optimizers." in line][-1]
    assert twin.startswith(f"  tf_tpu_embed_opt.optimizers.{name}(")
    assert twin.endswith("rounding='jax-tpu-embedding')")
    code, out, err = run(capsys, "describe", "--from", path)
    assert code == 0, err
    assert f"TPUEmbedding cannot run {name}: " in out


@pytest.mark.parametrize("algorithm", ["ClippyAdagrad", "RowWiseAdagrad"])
def test_from_spec_no_engine_can_run(capsys, tmp_path, algorithm):
    """A Keras spec of an algorithm no engine runs is described as `describe
    ALGORITHM` describes it, line for line after the spec's header: with no
    engine named, its Keras state's memory (it said "TPUEmbedding cannot run
    it" and "No memory estimate"); with one, that engine's verdict, status 2."""
    path = _spec_file(tmp_path, getattr(teo.optimizers, algorithm)(0.1))
    sizes = ("--vocabulary-size", "10", "--dim", "4")
    for engine in ((), ("--engine", "TPUEmbedding"), ("--engine", "jax-tpu-embedding")):
        code, out, err = run(capsys, "describe", "--from", path, *sizes, *engine)
        direct = run(
            capsys, "describe", algorithm, "--learning-rate", "0.1", *sizes, *engine
        )
        assert (code, err) == direct[0::2] == (2 if engine else 0, "")
        header, twin, *rest = out.splitlines()
        assert header == f"From {path}: a Keras optimizer (OptimizerSpec face KERAS)."
        assert [twin.strip(), *rest] == direct[1].splitlines()
        assert (f"No engine runs {algorithm}: " in out) and "cannot run" not in out
        assert ("Memory (float32, 10 x 4):" in out) == (not engine)


@pytest.mark.parametrize("algorithm", ["ClippyAdagrad", "RowWiseAdagrad"])
def test_an_algorithm_no_engine_runs_exits_2_where_an_engine_is_named(
    capsys, algorithm
):
    """--engine asks its verdict, TPUEmbedding's too (it exited 0 there, as
    where no engine is named); without it, the Keras state's memory."""
    sizes = ("--vocabulary-size", "10", "--dim", "4")
    code, out, err = run(capsys, "describe", algorithm, *sizes)
    assert code == 0, err
    assert "Memory (float32, 10 x 4):" in out and "No memory estimate" not in out
    for engine in ("TPUEmbedding", "TPUEmbeddingV2", "jax-tpu-embedding"):
        code, out, err = run(capsys, "describe", algorithm, *sizes, "--engine", engine)
        assert code == 2, (engine, err)
        assert f"No engine runs {algorithm}: " in out
        assert f"No memory estimate on {engine}: it cannot hold this state." in out
        assert "Memory (" not in out


def test_sparsecore_story_is_consistent(capsys):
    """No TensorCore proto and no clipping twin when SparseCore drops it."""
    code, out, err = run(
        capsys,
        "describe",
        "adagrad",
        "--clipvalue",
        "0.5",
        "--engine",
        "TPUEmbeddingV2",
    )
    assert code == 0, err
    assert "OptimizationParameters (what" not in out
    assert "gradient_clipping_limits" not in out
    assert "What TPUEmbeddingV2 receives" in out
    assert "drops clipvalue=(-0.5, 0.5)" in out
    twin = out.split("Keras twin (", 1)[1]
    assert "engine='TPUEmbeddingV2'" in twin
    assert "clip_gradient" not in twin
    # The twin printed is what to_keras gives for SparseCore.
    with pytest.warns(UserWarning, match="drops"):
        expected = teo.to_keras(
            embedding.Adagrad(0.001, clipvalue=0.5), engine="TPUEmbeddingV2"
        )
    assert expected.get_config()["clip_gradient_min"] is None
    # The TensorCore story keeps the proto and the clipping twin.
    code, out, _ = run(capsys, "describe", "adagrad", "--clipvalue", "0.5")
    assert "gradient_clipping_limits" in out and "clip_gradient_min=-0.5" in out


@pytest.mark.parametrize(
    "make, argv, code",
    [
        (
            lambda: embedding.FTRL(0.1, beta=0.5),
            ["ftrl", "--learning-rate", "0.1", "--beta", "0.5"],
            0,
        ),
        (lambda: embedding.Momentum(0.1), ["momentum", "--learning-rate", "0.1"], 0),
        (
            lambda: embedding.Adam(0.1, lazy_adam=False),
            ["adam", "--learning-rate", "0.1", "--lazy-adam", "false"],
            2,
        ),
    ],
    ids=["FTRL", "Momentum", "Adam-not-lazy"],
)
def test_an_embedding_spec_on_jax_is_described_as_its_algorithm_is(
    capsys, tmp_path, make, argv, code
):
    """On jax-tpu-embedding an embedding optimizer's spec is described as
    `describe ALGORITHM --engine jax-tpu-embedding` describes its class: the
    engine's spec, its slots by the engine's names, the twin (it was described
    by TPUEmbedding's slot names, without the spec)."""
    pytest.importorskip("jax_tpu_embedding.sparsecore.lib.nn.embedding_spec")
    engine = ("--engine", "jax-tpu-embedding")
    path = _spec_file(tmp_path, make())
    from_spec = run(capsys, "describe", "--from", path, *engine)
    from_options = run(capsys, "describe", *argv, *engine)
    assert from_spec[0] == from_options[0] == code, from_spec[2]
    assert from_spec[1].split("\n", 2)[2] == from_options[1]


def test_a_dynamic_tag_on_jax_is_said_to_mean_nothing_there(capsys, tmp_path):
    """An embedding spec's dynamic learning rate is only TPUEmbedding's tag:
    on jax-tpu-embedding, which has no tags, the description says so and how
    to give the callable; the TensorFlow engines show the tag in the proto."""
    pytest.importorskip("jax_tpu_embedding.sparsecore.lib.nn.embedding_spec")
    path = tmp_path / "spec.pb"
    spec = teo.to_spec(teo.embedding.Adagrad(lambda: 0.1), learning_rate_tag=3)
    path.write_bytes(spec.SerializeToString())
    code, out, err = run(
        capsys, "describe", "--from", str(path), "--engine", "jax-tpu-embedding"
    )
    assert code == 0, err
    lines = out.split("\n")
    assert lines[2] == (
        "Its learning rate is dynamic, known only by TPUEmbedding's tag 3: "
        "jax-tpu-embedding has no tags (its spec takes the callable itself). "
        "Pass the callable: tf_tpu_embed_opt.from_spec(spec, learning_rate=...)."
    )
    assert lines[3] == ""
    assert lines[4].startswith(
        "AdagradOptimizerSpec(learning_rate=<dynamic learning rate, tag 3>"
    )
    for engine in ("TPUEmbedding", "TPUEmbeddingV2"):
        code, out, err = run(
            capsys, "describe", "--from", str(path), "--engine", engine
        )
        assert code == 0 and "has no tags" not in out, err


def test_a_keras_spec_on_jax_shows_the_keras_update_it_runs(capsys, tmp_path):
    """Keras's SGD momentum runs on jax-tpu-embedding as a custom spec: the
    update shown is the twin's, its momentum included."""
    pytest.importorskip("jax_tpu_embedding.sparsecore.lib.nn.embedding_spec")
    optimizer = teo.optimizers.SGD(0.1, momentum=0.9, lazy=True)
    path = _spec_file(tmp_path, optimizer)
    code, out, err = run(
        capsys, "describe", "--from", path, "--engine", "jax-tpu-embedding"
    )
    assert code == 0, err
    update = [line for line in out.splitlines() if "Update per looked-up row" in line]
    assert update == [
        "  Update per looked-up row: w ← w − η·g;  with momentum=0.9: Keras "
        "momentum: m ← μ·m − η·g; w ← w + m (Keras-only; the engine's TensorFlow "
        "1 form is `Momentum`)"
    ]
