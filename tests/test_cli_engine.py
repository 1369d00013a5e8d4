"""`describe --engine TPUEmbeddingV2`: what SparseCore receives, drops, refuses."""

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


@pytest.mark.parametrize(
    "make, code, fragment",
    [
        (lambda: teo.optimizers.Adam(0.01), 0, "drops lazy_adam=False"),
        (lambda: embedding.Momentum(0.1), 2, "refuses optimizer='Momentum'"),
        (lambda: embedding.FTRL(0.1), 0, "FTRL - exact"),
    ],
)
def test_from_spec_with_engine(capsys, tmp_path, make, code, fragment):
    path = tmp_path / "spec.txtpb"
    path.write_text(text_format.MessageToString(teo.to_spec(make())))
    result = run(capsys, "describe", "--from", str(path), "--engine", "TPUEmbeddingV2")
    assert result[0] == code, result[2]
    assert fragment in result[1]


def test_from_spec_no_engine_can_run(capsys, tmp_path):
    path = tmp_path / "spec.txtpb"
    spec = teo.to_spec(teo.optimizers.ClippyAdagrad(0.1))
    path.write_text(text_format.MessageToString(spec))
    assert run(capsys, "describe", "--from", str(path))[0] == 0
    code, out, _ = run(
        capsys, "describe", "--from", str(path), "--engine", "TPUEmbeddingV2"
    )
    assert code == 2 and "cannot run ClippyAdagrad" in out


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
