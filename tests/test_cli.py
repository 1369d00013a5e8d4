"""The command line: `describe`, `demo`, and one-line errors for bad input.

Oracles: the library's own objects built directly in Python (the CLI must print
exactly what `to_proto` gives for the optimizer the options describe), the
issue's memory figure (Adam on 1,000,000 x 64 float32 = 768,000,000 bytes),
and the engine's slot names from the README table.
"""

import errno
import io
import os
import pathlib
import re
import sys

import keras
import pytest
from demo_output import demo_losses
from google.protobuf import text_format
from tensorflow.core.protobuf.tpu import (
    optimization_parameters_pb2,
    tpu_embedding_configuration_pb2,
)

import tf_tpu_embed_opt as teo
from tf_tpu_embed_opt import cli
from tf_tpu_embed_opt.definitions import registry

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROTO_HEADING = "OptimizationParameters (what the TPU engine receives):\n"
CONFIG_HEADING = re.compile(r"TPUEmbeddingConfiguration .*:\n")


def run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def printed_proto(out):
    """The OptimizationParameters block of `describe`'s output, parsed."""
    block = out.split(PROTO_HEADING, 1)[1].split("\n\n", 1)[0]
    block = "\n".join(line for line in block.splitlines() if not line.startswith("("))
    return text_format.Parse(
        block, optimization_parameters_pb2.OptimizationParameters()
    )


def slot_lines(out):
    """{slot name: its line} from the Slots section."""
    section = out.split("Slots", 1)[1].split("\n\n", 1)[0]
    lines = section.splitlines()[1:]
    return {line.split()[0]: line for line in lines}


def assert_one_line_error(code, out, err, *fragments):
    assert code == 2
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("tf-tpu-embed-opt: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, err)
    assert "Traceback" not in err and out == ""


# --- describe -----------------------------------------------------------------


def test_describe_adam_with_table_size(capsys):
    code, out, err = run(
        capsys, "describe", "adam", "--vocabulary-size", "1000000", "--dim", "64"
    )
    assert code == 0 and err == ""
    expected = teo.embedding.Adam()
    assert out.splitlines()[0] == repr(expected)
    assert printed_proto(out) == teo.to_proto(expected)
    assert list(slot_lines(out)) == ["momenta", "velocities"]
    # Table 256,000,000 + two slots 512,000,000 (the figure).
    assert re.search(r"table .*= +256,000,000 bytes", out)
    assert re.search(r"slots .*= +512,000,000 bytes", out)
    assert re.search(r"total .*= +768,000,000 bytes", out)
    assert "gradient accumulator" in out  # says what is not counted


def test_describe_adagrad(capsys):
    code, out, _ = run(
        capsys,
        "describe",
        "Adagrad",
        "--learning-rate",
        "0.05",
        "--initial-accumulator-value",
        "0.2",
        "--clipvalue",
        "5",
    )
    assert code == 0
    expected = teo.embedding.Adagrad(0.05, initial_accumulator_value=0.2, clipvalue=5.0)
    assert printed_proto(out) == teo.to_proto(expected)
    slots = slot_lines(out)
    assert list(slots) == ["accumulators"]
    assert "initial value 0.2" in slots["accumulators"]
    assert "Keras twin" in out and "epsilon=0.0" in out


@pytest.mark.parametrize("spelling", ["RMSProp", "rmsprop", "rms_prop", "RMS-PROP"])
def test_describe_rmsprop_any_spelling(capsys, spelling):
    code, out, _ = run(capsys, "describe", spelling, "--momentum", "0.9")
    assert code == 0
    assert printed_proto(out) == teo.to_proto(teo.embedding.RMSProp(momentum=0.9))
    slots = slot_lines(out)
    assert list(slots) == ["ms", "mom"]
    assert all("initial value 0.0" in line for line in slots.values())


def test_describe_ftrl_initial_accumulator(capsys):
    code, out, _ = run(
        capsys,
        "describe",
        "ftrl",
        "--initial-accumulator-value",
        "0.5",
        "--l1-regularization-strength",
        "0.01",
        "--multiply-linear-by-learning-rate",
        "true",
    )
    assert code == 0
    expected = teo.embedding.FTRL(
        initial_accumulator_value=0.5,
        l1_regularization_strength=0.01,
        multiply_linear_by_learning_rate=True,
    )
    assert out.splitlines()[0] == repr(expected)
    assert printed_proto(out) == teo.to_proto(expected)
    slots = slot_lines(out)
    assert "initial value 0.5" in slots["accumulators"]
    assert "initial value 0.0" in slots["linears"]


def test_describe_proximal_yogi(capsys):
    code, out, _ = run(
        capsys, "describe", "proximal_yogi", "--vocabulary-size", "1_000", "--dim", "8"
    )
    assert code == 0
    assert printed_proto(out) == teo.to_proto(teo.embedding.ProximalYogi())
    slots = slot_lines(out)
    assert list(slots) == ["v", "m"]
    assert "initial value 1e-06" in slots["v"]
    # 1,000 x 8 x 4 bytes, plus two slots of the same size.
    assert re.search(r"total .*= +96,000 bytes", out)


@pytest.mark.parametrize(
    "definition", registry.DEFINITIONS, ids=[d.name for d in registry.DEFINITIONS]
)
def test_describe_every_algorithm_with_defaults(capsys, definition):
    code, out, err = run(
        capsys, "describe", definition.name, "--vocabulary-size", "10", "--dim", "4"
    )
    assert code == 0 and err == ""
    expected = teo.embedding.class_for(definition)()
    assert printed_proto(out) == teo.to_proto(expected)
    if definition.slots:
        assert list(slot_lines(out)) == expected._slot_names()
    else:
        assert "Slots: none." in out
    total = 10 * 4 * 4 * (1 + len(definition.slots))
    assert re.search(rf"total .*= +{total:,} bytes", out)


def test_describe_values_bools_none_and_clip_ranges(capsys):
    code, out, _ = run(
        capsys,
        "describe",
        "adam",
        "--lazy-adam",
        "FALSE",
        "--clipvalue",
        "-1,2",
        "--weight-decay-factor",
        "none",
        "--clip-weight-max",
        "3",
    )
    assert code == 0
    expected = teo.embedding.Adam(
        lazy_adam=False, clipvalue=(-1.0, 2.0), clip_weight_max=3.0
    )
    assert printed_proto(out) == teo.to_proto(expected)
    code, out, _ = run(capsys, "describe", "sgd", "--clipvalue", ",2")
    assert code == 0
    assert printed_proto(out) == teo.to_proto(teo.embedding.SGD(clipvalue=(None, 2.0)))


def test_describe_options_before_the_algorithm(capsys):
    code, out, _ = run(
        capsys, "describe", "--dim", "64", "adam", "--vocabulary-size", "1000000"
    )
    assert code == 0 and "768,000,000 bytes" in out


@pytest.mark.parametrize("argv", [["describe"], ["describe", "--list"]])
def test_describe_lists_algorithms(capsys, argv):
    code, out, _ = run(capsys, *argv)
    assert code == 0
    for definition in registry.DEFINITIONS:
        assert definition.name in out and definition.proto_oneof in out


# --- bad input: one line on stderr, exit 2 ---------------------------------------


@pytest.mark.parametrize(
    "argv, fragments",
    [
        (["describe", "nope"], ["unknown algorithm 'nope'", "Adagrad"]),
        (["describe", "adma"], ["unknown algorithm", "did you mean Adam"]),
        (["describe", "adam", "--beta-1", "1.5"], ["beta_1", "--beta-1", "1.5"]),
        (["describe", "adam", "--learning-rate", "abc"], ["--learning-rate", "'abc'"]),
        (["describe", "adam", "--learning-rate", "nan"], ["--learning-rate", "'nan'"]),
        (["describe", "adagrad", "--clipvalue", "-1"], ["clipvalue", "-1"]),
        (["describe", "adagrad", "--clipvalue", "3,2"], ["clipvalue", "min <= max"]),
        (["describe", "adagrad", "--clipvalue", "1,2,3"], ["--clipvalue"]),
        (["describe", "adam", "--dim", "64"], ["--dim", "--vocabulary-size"]),
        (["describe", "adam", "--vocabulary-size", "10"], ["--dim"]),
        (["describe", "adam", "--dim", "0", "--vocabulary-size", "1"], ["--dim"]),
        (["describe", "adam", "--lazy-adam", "yes"], ["--lazy-adam", "true or false"]),
        (["describe", "sgd", "--beta-1", "0.5"], ["unrecognized", "--beta-1"]),
        (["describe", "adam", "--beta", "0.5"], ["unrecognized", "--beta"]),
        (["describe", "ftrl", "--initial-accumulator-value", "0"], ["initial_acc"]),
        (
            ["describe", "adam", "--lazy-adam", "false"]
            + ["--use-gradient-accumulation", "false"],
            ["lazy_adam", "use_gradient_accumulation"],
        ),
        (["describe", "adam", "--from", "x.txtpb"], ["ALGORITHM", "--from"]),
        (["describe", "--from", "/nonexistent/spec.txtpb"], ["cannot read"]),
        ([], ["COMMAND"]),
        (["frobnicate"], ["frobnicate"]),
        (["demo", "--optimizer", "nope"], ["--optimizer", "unknown algorithm"]),
        (["demo", "--epochs", "0"], ["--epochs"]),
        (["demo", "--learning-rate", "-1"], ["learning_rate", "-1"]),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, argv, fragments):
    assert_one_line_error(*run(capsys, *argv), *fragments)


def test_unreadable_and_garbage_spec_files(capsys, tmp_path):
    assert_one_line_error(
        *run(capsys, "describe", "--from", str(tmp_path)), "cannot read"
    )
    garbage = tmp_path / "garbage.txtpb"
    garbage.write_text("this is { not a spec")
    assert_one_line_error(
        *run(capsys, "describe", "--from", str(garbage)), str(garbage), "text format"
    )
    binary = tmp_path / "garbage.bin"
    binary.write_bytes(b"\xff\xfe\x00\x01garbage\x80")
    assert_one_line_error(
        *run(capsys, "describe", "--from", str(binary)), "OptimizerSpec"
    )
    invalid = tmp_path / "invalid.txtpb"
    spec = teo.to_spec(teo.embedding.Adam(0.1))
    spec.ClearField("optimization_parameters")
    next(a for a in spec.arguments if a.name == "beta_1").number = 1.5
    invalid.write_text(text_format.MessageToString(spec))
    assert_one_line_error(*run(capsys, "describe", "--from", str(invalid)), "beta_1")
    partial = tmp_path / "partial.txtpb"
    partial.write_text(
        'spec_version: 1 face: EMBEDDING algorithm: "Adam" '
        'learning_rate { constant: 0.1 } arguments { name: "beta_1" number: 0.5 }'
    )
    assert_one_line_error(
        *run(capsys, "describe", "--from", str(partial)), "lacks", "`beta_2`"
    )


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--list", "--from", "x.txtpb"], "give either --list or --from, not both"),
        (["--vocabulary-size", "10", "--dim", "2"], "need ALGORITHM or --from"),
        (["ClippyAdagrad", "--epsilon", "-1"], "epsilon"),
        (["RowWiseAdagrad", "--learning-rate", "-0.1"], "learning_rate"),
    ],
    ids=["list-and-from", "sizes-alone", "clippy-epsilon", "row-wise-rate"],
)
def test_describe_refuses_what_it_cannot_describe(capsys, argv, fragment):
    assert_one_line_error(*run(capsys, "describe", *argv), fragment)


@pytest.mark.parametrize(
    "algorithm, slots",
    [
        # Slots the table's shape: as many bytes as the table.
        ("ClippyAdagrad", "slots  244.1 MiB (1x the table)"),
        # One value per row: 1/64 of a 64-wide table.
        ("RowWiseAdagrad", "slots  3.8 MiB (0.0156x the table)"),
    ],
)
def test_the_keras_state_of_an_algorithm_no_engine_runs_is_counted(
    capsys, algorithm, slots
):
    code, out, err = run(
        capsys, "describe", algorithm, "--vocabulary-size", "1e6", "--dim", "64"
    )
    assert (code, err) == (0, "")
    assert "  table  244.1 MiB\n" in out and f"  {slots}\n" in out


def test_the_list_says_where_each_algorithm_runs(capsys):
    code, out, err = run(capsys, "describe", "--list")
    assert (code, err) == (0, "")
    rows = {line.split()[0]: line for line in out.splitlines()[1:] if line}
    for definition in registry.ALL:
        row = rows[definition.name].split(None, 1)[1]
        if definition.tensorflow_engines:
            where = definition.proto_oneof
        elif definition.engine_refusal is not None:
            where = "(no engine; Keras only)"
        else:
            where = "(jax-tpu-embedding only)"
        assert row.startswith(where + " "), (definition.name, row)
        assert row.endswith(definition.summary)


@pytest.mark.parametrize(
    "algorithm, defaults, update",
    [
        ("adam", "Defaults are those of tf_tpu_embed_opt.embedding.Adam.", "per"),
        ("LaProp", "defaults are those of its LaPropOptimizerSpec.", "per"),
        (
            "RowWiseAdagrad",
            "are those of tf_tpu_embed_opt.optimizers.RowWiseAdagrad.",
            "per",
        ),
        (
            "ClippyAdagrad",
            "are those of tf_tpu_embed_opt.optimizers.ClippyAdagrad.",
            "scaled",
        ),
    ],
)
def test_an_algorithms_help_says_where_its_defaults_and_update_come_from(
    capsys, algorithm, defaults, update
):
    """Where the defaults come from; the update is per row, or scaled per
    variable (ClippyAdagrad, whose clipping factor is over the variable);
    the words on MIN,MAX under --clipvalue alone."""
    code, out, err = run(capsys, "describe", algorithm, "--help")
    assert (code, err) == (0, "")
    flat = " ".join(out.split())
    assert defaults in flat
    if algorithm in ("RowWiseAdagrad", "ClippyAdagrad"):
        assert "No engine runs it: " in flat
    words = {
        "per": "Update per looked-up row",
        "scaled": "Update of the looked-up rows, scaled per variable",
    }
    other = "scaled" if update == "per" else "per"
    assert words[update] in flat and words[other] not in flat
    assert flat.count("Written C or MIN,MAX") == ("--clipvalue" in flat)


def test_the_algorithm_is_found_in_every_spelling_of_the_options(capsys):
    """`--` ends the options: what follows it is ALGORITHM. A flag without a
    value (`--verbose`) or an option written with `=` before ALGORITHM does
    not take ALGORITHM for its value. (`--verbose` may add log lines to
    stderr; the rest is compared whole.)"""
    plain = run(capsys, "describe", "adam", "--vocabulary-size", "5", "--dim", "3")
    assert plain[0] == 0
    for argv in (
        ["--", "adam", "--vocabulary-size", "5", "--dim", "3"],
        ["--vocabulary-size", "5", "--dim", "3", "--", "adam"],
        ["--verbose", "adam", "--vocabulary-size", "5", "--dim", "3"],
        ["--dim=3", "--vocabulary-size=5", "adam"],
        ["--dim", "3", "adam", "--vocabulary-size=5"],
    ):
        given = run(capsys, "describe", *argv)
        if "--verbose" in argv:
            given = (*given[:2], plain[2])
        assert given == plain, argv


def test_an_option_without_its_value_at_the_end_is_one_line(capsys):
    assert_one_line_error(
        *run(capsys, "describe", "adam", "--dim"), "--dim", "expected one argument"
    )


def test_a_spec_without_slots_on_jax_says_none(capsys):
    pytest.importorskip("jax_tpu_embedding.sparsecore.lib.nn.embedding_spec")
    code, out, err = run(capsys, "describe", "sgd", "--engine", "jax-tpu-embedding")
    assert (code, err) == (0, "")
    assert "jax-tpu-embedding's names):\n  none\n" in out
    code, out, err = run(capsys, "describe", "adagrad", "--engine", "jax-tpu-embedding")
    assert "jax-tpu-embedding's names):\n  accumulator " in out
    assert "  none" not in out


@pytest.mark.parametrize("name", ["LaProp", "F2A"])
def test_an_algorithm_of_jax_alone_is_its_own_spec_class(capsys, name):
    pytest.importorskip("jax_tpu_embedding.sparsecore.lib.nn.embedding_spec")
    code, out, err = run(capsys, "describe", name, "--engine", "jax-tpu-embedding")
    assert (code, err) == (0, "")
    assert out.startswith(f"{name}OptimizerSpec(learning_rate=")
    assert "CustomOptimizerSpec" not in out


def test_spec_file_errors_say_which(capsys, tmp_path):
    """Each way a spec file fails is told apart, with the system's own
    reason for a file it cannot read."""
    missing = tmp_path / "missing.txtpb"
    code, out, err = run(capsys, "describe", "--from", str(missing))
    assert_one_line_error(code, out, err)
    assert err.rstrip("\n").endswith(
        f"--from {missing}: cannot read the file: {os.strerror(errno.ENOENT)}"
    )
    garbage = tmp_path / "garbage.txtpb"
    garbage.write_text("this is { not a spec")
    assert_one_line_error(
        *run(capsys, "describe", "--from", str(garbage)),
        f"--from {garbage}: not an OptimizerSpec in protobuf text format: ",
    )


def test_a_spec_of_exactly_the_bound_is_read(capsys, tmp_path):
    """1 MiB is read; one byte more is refused (test_first_hour)."""
    text = text_format.MessageToString(teo.to_spec(teo.embedding.SGD(0.1)))
    path = tmp_path / "padded.txtpb"
    path.write_text(text + " " * (2**20 - len(text)))
    assert path.stat().st_size == 2**20
    code, out, err = run(capsys, "describe", "--from", str(path))
    assert (code, err) == (0, "") and "tf_tpu_embed_opt.embedding.SGD" in out


def test_a_spec_is_read_from_standard_input(capsys, monkeypatch):
    text = text_format.MessageToString(teo.to_spec(teo.embedding.Adagrad(0.3)))
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))
    code, out, err = run(capsys, "describe", "--from", "-")
    assert (code, err) == (0, "")
    assert out.startswith("From -: an embedding optimizer") and "0.3" in out
    huge = io.BytesIO(b" " * (2**20 + 1))
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(huge))
    assert_one_line_error(*run(capsys, "describe", "--from", "-"), "more than 1 MiB")


@pytest.mark.parametrize(
    "keras_opt, dynamic",
    [
        (lambda: teo.optimizers.Adam(0.01), True),  # bias correction
        (lambda: teo.optimizers.Adagrad(0.1, epsilon=0.0), False),
    ],
    ids=["Adam", "Adagrad"],
)
def test_a_keras_spec_is_described_with_the_proto_it_records(
    capsys, tmp_path, keras_opt, dynamic
):
    """The proto printed for a Keras spec is the one `to_spec` recorded in
    it (a callable rate's dynamic tag 0 included), and the line on the
    dynamic tag shows only where the rate is callable."""
    opt = keras_opt()
    spec = teo.to_spec(opt)
    code, out, err = run(capsys, "describe", "--from", write_spec(tmp_path, opt))
    assert (code, err) == (0, "")
    printed = out.split(PROTO_HEADING)[1].split("\n\n")[0]
    if dynamic:
        printed = printed.rsplit("\n(learning_rate.dynamic.tag 0: ", 1)[0]
    assert (
        text_format.Parse(printed, optimization_parameters_pb2.OptimizationParameters())
        == spec.optimization_parameters
    )
    assert ("learning_rate.dynamic.tag" in out) is dynamic


def test_a_refused_keras_spec_without_sizes_gives_no_memory_line(capsys, tmp_path):
    path = write_spec(tmp_path, teo.optimizers.Adam(0.01))
    code, out, _ = run(capsys, "describe", "--from", path, "--engine", "TPUEmbeddingV2")
    assert code == 2 and "TPUEmbeddingV2 cannot run Adam" in out
    assert "memory" not in out.lower()
    code, out, _ = run(
        capsys,
        "describe",
        "--from",
        path,
        "--engine",
        "TPUEmbeddingV2",
        "--vocabulary-size",
        "10",
        "--dim",
        "2",
    )
    assert code == 2 and "No memory estimate" in out


# --- describe --from ----------------------------------------------------------


def write_spec(tmp_path, opt, **kwargs):
    path = tmp_path / "spec.txtpb"
    path.write_text(text_format.MessageToString(teo.to_spec(opt, **kwargs)))
    return str(path)


def test_from_embedding_spec(capsys, tmp_path):
    opt = teo.embedding.Adam(0.01, clipvalue=1.0, lazy_adam=False)
    code, out, _ = run(
        capsys,
        "describe",
        "--from",
        write_spec(tmp_path, opt),
        "--vocabulary-size",
        "1000000",
        "--dim",
        "64",
    )
    assert code == 0
    assert "face EMBEDDING" in out
    assert printed_proto(out) == teo.to_proto(opt)
    assert "768,000,000 bytes" in out
    # The spec's gradient clipping stands in the step (`rules.step_math`).
    assert "  Update per looked-up row: g ← clamp(g, -1.0, 1.0);  m ← " in out


def test_from_serialized_spec(capsys, tmp_path):
    opt = teo.embedding.Momentum(0.1, momentum=0.5)
    path = tmp_path / "spec.pb"
    path.write_bytes(teo.to_spec(opt).SerializeToString())
    code, out, _ = run(capsys, "describe", "--from", str(path))
    assert code == 0
    assert printed_proto(out) == teo.to_proto(opt)


def test_from_embedding_spec_with_dynamic_learning_rate(capsys, tmp_path):
    opt = teo.embedding.Adagrad(lambda: 0.1)
    code, out, _ = run(
        capsys, "describe", "--from", write_spec(tmp_path, opt, learning_rate_tag=3)
    )
    assert code == 0
    assert printed_proto(out) == teo.to_proto(opt, learning_rate_tag=3)


def test_from_keras_spec_that_converts(capsys, tmp_path):
    opt = teo.optimizers.Ftrl(0.05, l1_regularization_strength=0.01, lazy=True)
    code, out, _ = run(capsys, "describe", "--from", write_spec(tmp_path, opt))
    assert code == 0
    assert "face KERAS" in out and "runs it exactly" in out
    assert printed_proto(out) == teo.to_proto(teo.to_embedding(opt))


def test_from_keras_adam_spec_gets_a_dynamic_learning_rate(capsys, tmp_path):
    code, out, _ = run(
        capsys, "describe", "--from", write_spec(tmp_path, teo.optimizers.Adam(0.01))
    )
    assert code == 0
    params = printed_proto(out)
    assert params.adam.use_non_lazy_adam
    assert params.learning_rate.HasField("dynamic")


def test_from_keras_spec_with_a_schedule_shows_the_schedule(capsys, tmp_path):
    """A Keras spec's schedule is shown as its class and config (its
    serialized form, not the dict), without the schedule's name."""
    schedule = keras.optimizers.schedules.ExponentialDecay(
        0.1, decay_steps=1000, decay_rate=0.5, name="my_decay"
    )
    path = write_spec(tmp_path, teo.optimizers.Adagrad(schedule))
    code, out, err = run(capsys, "describe", "--from", path)
    assert (code, err) == (0, "")
    assert out.splitlines()[1] == (
        "  tf_tpu_embed_opt.optimizers.Adagrad(learning_rate=ExponentialDecay("
        "initial_learning_rate=0.1, decay_steps=1000, decay_rate=0.5, "
        "staircase=False))"
    )


@pytest.mark.parametrize(
    "opt, fragments",
    [
        # No engine runs it: said as `describe ClippyAdagrad` says it.
        (
            lambda: teo.optimizers.ClippyAdagrad(0.1),
            ["No engine runs ClippyAdagrad", "clipping factor"],
        ),
        (lambda: teo.optimizers.Adam(0.01, amsgrad=True), ["amsgrad"]),
        (lambda: teo.optimizers.Adagrad(weight_decay=0.01), ["weight_decay"]),
    ],
    ids=["ClippyAdagrad", "amsgrad", "weight_decay"],
)
def test_from_keras_spec_the_engine_cannot_run(capsys, tmp_path, opt, fragments):
    code, out, err = run(
        capsys,
        "describe",
        "--from",
        write_spec(tmp_path, opt()),
        "--vocabulary-size",
        "10",
        "--dim",
        "2",
    )
    assert code == 0 and err == ""
    verdict = [
        line
        for line in out.splitlines()
        if "cannot run" in line or line.startswith("No engine runs")
    ]
    assert len(verdict) == 1
    for fragment in fragments:
        assert fragment in verdict[0]
    assert PROTO_HEADING not in out


# --- help, entry points -----------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["describe", "--help"],
        ["describe", "adam", "--help"],
        ["describe", "--help", "rms_prop"],
        ["demo", "-h"],
    ],
)
def test_help_exits_0(capsys, argv):
    code, out, err = run(capsys, *argv)
    assert code == 0 and err == ""
    assert out.startswith("usage: tf-tpu-embed-opt")


def test_algorithm_help_lists_its_options(capsys):
    _, out, _ = run(capsys, "describe", "adam", "--help")
    for option in ("--learning-rate", "--beta-1", "--lazy-adam", "--clipvalue"):
        assert option in out
    assert "--slot-variable-creation-fn" not in out
    assert "--initial-accumulator-value" not in out


def test_version(capsys):
    code, out, _ = run(capsys, "--version")
    assert code == 0 and teo.__version__ in out


def test_main_reads_sys_argv(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["tf-tpu-embed-opt", "describe", "sgd"])
    assert cli.main() == 0
    assert "stochastic_gradient_descent" in capsys.readouterr().out


# --- demo ------------------------------------------------------------------------


def printed_configuration(out):
    text = CONFIG_HEADING.split(out, 1)[1].split("\n\n", 1)[0]
    return text_format.Parse(
        text, tpu_embedding_configuration_pb2.TPUEmbeddingConfiguration()
    )


def test_demo_loss_falls_and_prints_the_tpu_configuration(capsys):
    code, out, err = run(
        capsys,
        "demo",
        "--epochs",
        "2",
        "--optimizer",
        "adagrad",
        "--show-configuration",
    )
    assert code == 0, err
    losses = demo_losses(out)
    assert len(losses) == 2 and losses[1] < losses[0]
    assert "Verdict: the TPU-exact twin learnt, its tables and the dense" in out
    assert "table_descriptor" in out
    config = printed_configuration(out)
    tables = {t.name: t for t in config.table_descriptor}
    assert {n: (t.vocabulary_size, t.dimension) for n, t in tables.items()} == {
        "user_id": (2000, 16),
        "item_id": (1000, 16),
        "category": (50, 8),
    }
    for table in tables.values():
        assert table.optimization_parameters.WhichOneof("parameters") == "adagrad"
    assert config.num_tensor_cores == 8 and config.num_hosts == 1
    assert all(list(f.input_shape) == [32] for f in config.feature_descriptor)


def test_demo_says_when_the_tables_did_not_move(capsys):
    # Learning rate 0: only the dense layers learn; the verdict says so and
    # the run does not count as the twin at work (issue #29, item 17).
    argv = ["demo", "--epochs", "1", "--optimizer", "adagrad", "--learning-rate", "0"]
    code, out, err = run(capsys, *argv)
    assert code == 1, err
    assert "tables did not move" in out and "learnt, its tables" not in out


def test_demo_with_another_optimizer(capsys):
    code, out, _ = run(
        capsys,
        "demo",
        "--optimizer",
        "FTRL",
        "--learning-rate",
        "3",
        "--epochs",
        "2",
        "--seed",
        "7",
        "--show-configuration",
    )
    assert code == 0
    losses = demo_losses(out)
    assert losses[1] < losses[0]
    params = printed_configuration(out).table_descriptor[0].optimization_parameters
    assert params == teo.to_proto(teo.embedding.FTRL(3.0))


def test_demo_sums_up_the_tpu_configuration_in_one_line(capsys):
    """Without --show-configuration the demo ends with one sentence of the
    configuration (about 90 lines of protobuf text were noise to a
    newcomer)."""
    code, out, _ = run(capsys, "demo", "--epochs", "1", "--optimizer", "adagrad")
    assert code == 0
    assert "table_descriptor" not in out
    summary = out.split("TPUEmbeddingConfiguration the same tables", 1)[1]
    summary = " ".join(summary.split("\n\n", 1)[0].split())
    assert (
        "3 tables (category 50 x 8, item_id 1,000 x 16, user_id 2,000 x 16), "
        "optimization_parameters adagrad, 3 features. --show-configuration "
        "prints it in full."
    ) in summary


@pytest.mark.parametrize("algorithm", ["adagrad", "laprop"])
def test_the_jax_engine_without_its_extra_is_one_line_naming_it(
    capsys, monkeypatch, algorithm
):
    """Where jax-tpu-embedding is not installed (Python 3.9 and 3.10, or no
    `[jax]` extra), describing on it says which extra it needs, in one line."""
    names = [name for name in sys.modules if name.split(".")[0] == "jax_tpu_embedding"]
    for name in names or ["jax_tpu_embedding"]:
        monkeypatch.setitem(sys.modules, name, None)
    code, out, err = run(capsys, "describe", algorithm, "--engine", "jax-tpu-embedding")
    assert_one_line_error(
        code, out, err, "needs the package's `[jax]` extra", "jax_tpu_embedding"
    )
