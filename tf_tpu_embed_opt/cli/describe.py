"""`describe`: what the TPU engine receives for an optimizer, and its cost.

`describe ALGORITHM [--hyper-parameter VALUE ...] [--vocabulary-size N --dim
D]` builds an embedding optimizer (options derived from its single definition,
validated by its class) and prints the `OptimizationParameters` the TPU engine
receives, its slot variables with their initial values, its TPU-exact Keras
twin and, given a table size, the memory of the table plus slots.
`describe --from FILE` does the same for an `OptimizerSpec` in text format or
serialized (embedding or Keras face; a Keras optimizer is converted for the
engine, `to_embedding(..., engine=...)`, or reported with the reason it cannot
run there). `--engine` names the engine (TPUEmbedding where none is named) and
asks its verdict: status 2 where it cannot run the optimizer. `describe` alone
lists the algorithms.

Parsing (`describe_parser`) needs only the definitions; TensorFlow is
imported by `run`.
"""

from __future__ import annotations

import argparse
import functools
import pathlib
import sys
from typing import Any, Dict, List, Optional, Tuple

from tf_tpu_embed_opt.cli.describe_parser import (
    add_parser,
    algorithm_list,
    normalize_arguments,
    parameters,
    update_words,
)
from tf_tpu_embed_opt.cli.parser import (
    MAX_TABLE_ELEMENTS,
    PROG,
    UsageError,
    option,
    out,
    with_options,
)
from tf_tpu_embed_opt.definitions import spec
from tf_tpu_embed_opt.definitions.spec import Definition
from tf_tpu_embed_opt.errors import is_tensorflow_missing, require_tensorflow

__all__ = [
    "add_parser",
    "normalize_arguments",
    "parameters",
    "run",
    "memory_bytes",
    "keras_call",
]

# float32: every table and slot element takes 4 bytes on the TPU.
_BYTES_PER_VALUE = 4

# An OptimizerSpec takes a few hundred bytes; reading stops well above that, so
# that `--from /dev/zero` is an error, not an endless read.
_MAX_SPEC_BYTES = 2**20


class _DynamicLearningRate:
    """Stands for a spec's dynamic learning rate, known only by its tag."""

    def __init__(self, tag: int) -> None:
        self.tag = tag

    def __call__(self) -> float:
        raise RuntimeError(
            f"the dynamic learning rate (tag {self.tag}) of an OptimizerSpec has "
            "no value outside TPUEmbedding"
        )

    def __repr__(self) -> str:
        return f"<dynamic learning rate, tag {self.tag}>"


def _rate_text(rate: Any) -> str:
    from tf_tpu_embed_opt.definitions.rules import shortest_float

    if isinstance(rate, float):
        return repr(shortest_float(rate))
    if isinstance(rate, dict) and "class_name" in rate:  # a serialized schedule
        config = rate.get("config", {})
        shown = ", ".join(f"{k}={v!r}" for k, v in config.items() if k != "name")
        return f"{rate['class_name']}({shown})"
    return repr(rate)


def keras_call(opt: Any, learning_rate: Any = None) -> str:
    """`Class(arguments)` for a Keras optimizer: the learning rate and non-defaults.

    Args:
      opt: The Keras optimizer.
      learning_rate: Shown instead of the configured learning rate, if given.
    """
    config = opt.get_config()
    defaults = type(opt)().get_config()
    rate = config.get("learning_rate") if learning_rate is None else learning_rate
    shown = [f"learning_rate={_rate_text(rate)}"]
    for key, value in config.items():
        if key in ("learning_rate", "name") or key not in defaults:
            continue
        if value != defaults[key]:
            shown.append(f"{key}={value!r}")
    return f"{type(opt).__name__}({', '.join(shown)})"


def _twin(opt: Any, engine: spec.Engine = spec.TPU_EMBEDDING) -> Tuple[Any, str]:
    """The Keras twin of `opt` on `engine` (None where it is refused) and
    the line that shows it (or why there is none)."""
    import warnings

    from tf_tpu_embed_opt.conversions import faces as convert
    from tf_tpu_embed_opt.embedding import parameters as embedding

    arguments = embedding.arguments(opt)
    rate = arguments["learning_rate"]
    if callable(rate):
        # A Keras optimizer cannot report its config with a plain callable
        # learning rate; describe the twin of the same optimizer at rate 1.
        arguments["learning_rate"] = 1.0
        opt = embedding.class_for(embedding.definition_of(opt))(**arguments)
    try:
        with warnings.catch_warnings():
            # What the engine drops is listed above, with the report.
            warnings.simplefilter("ignore", UserWarning)
            twin = convert.to_keras(opt, engine=engine)
    except ValueError as error:
        return None, f"Keras twin: none. {error}"
    call = keras_call(twin, rate if callable(rate) else None)
    if engine.whole_proto:
        how = "the engine's math on CPU/GPU, tf_tpu_embed_opt.to_keras"
    else:
        how = (
            f"what {engine} computes, on CPU/GPU: tf_tpu_embed_opt.to_keras(..., "
            f"engine={engine!r})"
        )
    return twin, f"Keras twin ({how}):\n  tf_tpu_embed_opt.optimizers.{call}"


def memory_bytes(
    definition: Definition,
    vocabulary_size: int,
    dim: int,
    slot_count: Optional[int] = None,
) -> Dict[str, int]:
    """float32 bytes of one table and its slots on the TPU.

    The engine's hidden gradient accumulator is not counted.

    Args:
      definition: The algorithm.
      vocabulary_size, dim: The table's shape.
      slot_count: The slots kept, where the settings drop some (a custom
        spec keeps the twin's: RMSprop's `mom` only with momentum);
        `None`: every slot of the definition.

    Returns:
      `{"table": ..., "slots": ..., "total": ...}`.
    """
    table = vocabulary_size * dim * _BYTES_PER_VALUE
    if slot_count is None:
        slot_count = len(definition.slots)
    slots = slot_count * table
    return {"table": table, "slots": slots, "total": table + slots}


def _memory_lines(
    opt: Any,
    definition: Definition,
    vocabulary_size: int,
    dim: int,
    slot_count: Optional[int] = None,
) -> List[str]:
    sizes = memory_bytes(definition, vocabulary_size, dim, slot_count)
    table, slots, total = sizes["table"], sizes["slots"], sizes["total"]
    count = slots // table if table else len(definition.slots)
    rows = [
        (f"table  {vocabulary_size:,} x {dim} x 4", table, ""),
        (f"slots  {count} x {table:,}", slots, ""),
        ("total", total, f" ({total / 2**20:,.1f} MiB)"),
    ]
    label_width = max(len(label) for label, _, _ in rows)
    number_width = len(f"{total:,}")
    lines = [
        f"Memory of one {vocabulary_size:,} x {dim} table and its slots (float32, "
        "4 bytes a value):"
    ]
    for label, value, suffix in rows:
        lines.append(
            f"  {label:<{label_width}} = {value:>{number_width},} bytes{suffix}"
        )
    if opt is not None and opt.use_gradient_accumulation:
        lines.append(
            f"  Not counted: the engine's hidden gradient accumulator ({table:,} "
            "bytes more while use_gradient_accumulation=True)."
        )
    return lines


def _describe_embedding(
    opt: Any,
    sizes: Optional[Tuple[int, int]],
    learning_rate_tag: Optional[int] = None,
    engine: spec.Engine = spec.TPU_EMBEDDING,
) -> None:
    """Prints what `engine` receives for `opt`, its slots, twin and memory.

    For `TPUEmbedding` what it receives is the `OptimizationParameters` proto;
    for `TPUEmbeddingV2` it is what `check_engine` lists (the SparseCore op
    and the settings it is handed, drops and refuses), and the twin computes
    what SparseCore computes.
    """
    from google.protobuf import text_format

    from tf_tpu_embed_opt.embedding import parameters as embedding
    from tf_tpu_embed_opt.embedding import proto

    definition = embedding.definition_of(opt)
    if callable(opt.learning_rate) and learning_rate_tag is None:
        learning_rate_tag = 0
    parameters = proto.to_proto(opt, learning_rate_tag=learning_rate_tag)
    out(repr(opt))
    out(f"  tf_tpu_embed_opt.embedding.{definition.name}: {definition.summary}")
    # The twin computes what the engine does, clipping and decay included.
    twin, twin_line = _twin(opt, engine)
    math = definition.math if twin is None else twin.rule.math
    out(f"  Update per looked-up row: {math}")
    out()
    if not engine.whole_proto:
        from tf_tpu_embed_opt import engines

        out(f"What {engine} receives (it takes no OptimizationParameters proto):")
        for line in engines.check_configuration(opt, engine).lines():
            out(line)
    else:
        out("OptimizationParameters (what the TPU engine receives):")
        sys.stdout.write(text_format.MessageToString(parameters))
    if callable(opt.learning_rate) and engine.whole_proto:
        out(
            f"(learning_rate.dynamic.tag {learning_rate_tag}: TPUEmbedding calls "
            f"the learning-rate callable at every step: {opt.learning_rate!r})"
        )
    out()
    hypers = {h.name: getattr(opt, h.name) for h in definition.hypers}
    if definition.slots:
        out(
            "Slots (one float32 variable the shape of the table each; names of "
            f"the {definition.load_op} inputs):"
        )
        width = max(len(s.name) for s in definition.slots)
        for slot in definition.slots:
            start = slot.initial_value(hypers)
            source = f" ({slot.initial})" if isinstance(slot.initial, str) else ""
            out(f"  {slot.name:<{width}}  initial value {start!r}{source}. {slot.doc}")
    else:
        out("Slots: none.")
    out()
    out(twin_line)
    if sizes is not None:
        out()
        for line in _memory_lines(opt, definition, *sizes):
            out(line)


def _looks_like_text(data: bytes) -> bool:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    # A serialized OptimizerSpec starts with the tag byte 0x08 (spec_version).
    return not any(ord(c) < 32 and c not in "\t\n\r\f\v" for c in text)


def _read_spec(path: str) -> Any:
    """The `OptimizerSpec` in `path` (text format or serialized; '-': stdin)."""
    from google.protobuf import message as protobuf_message
    from google.protobuf import text_format

    from tf_tpu_embed_opt import optimizer_spec

    try:
        if path == "-":
            data = sys.stdin.buffer.read(_MAX_SPEC_BYTES + 1)
        else:
            with pathlib.Path(path).open("rb") as file:
                data = file.read(_MAX_SPEC_BYTES + 1)
    except OSError as error:
        reason = error.strerror or str(error)
        raise UsageError(f"--from {path}: cannot read the file: {reason}") from None
    if len(data) > _MAX_SPEC_BYTES:
        raise UsageError(
            f"--from {path}: more than 1 MiB; an OptimizerSpec takes a few "
            "hundred bytes"
        )
    if not data.strip():
        raise UsageError(
            f"--from {path}: the file is empty; expected an OptimizerSpec in "
            "protobuf text format or serialized (see tf_tpu_embed_opt.to_spec)"
        )
    message = optimizer_spec.OptimizerSpec()
    if _looks_like_text(data):
        try:
            text_format.Parse(data.decode("utf-8"), message)
        except text_format.ParseError as error:
            raise UsageError(
                f"--from {path}: not an OptimizerSpec in protobuf text format: {error}"
            ) from None
        return message
    try:
        message.ParseFromString(data)
    except protobuf_message.DecodeError as error:
        raise UsageError(
            f"--from {path}: neither an OptimizerSpec in text format nor a "
            f"serialized one: {error}"
        ) from None
    return message


def _describe_from(
    path: str,
    sizes: Optional[Tuple[int, int]],
    engine: spec.Engine,
    asked: bool,
) -> int:
    """Describes the spec in `path` on `engine`; returns the exit status.

    A Keras optimizer is converted for `engine` (`to_embedding(...,
    engine=engine)`), so what is described is exact on it, or refused: status
    2 where `asked` (the engine was named), else 0. One of an algorithm no
    engine runs is described as `describe ALGORITHM` describes it.
    """
    import keras

    from tf_tpu_embed_opt import optimizer_spec
    from tf_tpu_embed_opt.conversions import faces as convert

    message = _read_spec(path)
    tag: Optional[int] = None
    rate = None
    if (
        message.face == optimizer_spec.Face.EMBEDDING
        and message.learning_rate.WhichOneof("source") == "dynamic_tag"
    ):
        tag = message.learning_rate.dynamic_tag
        rate = _DynamicLearningRate(tag)
    try:
        opt = optimizer_spec.from_spec(message, learning_rate=rate)
    except (TypeError, ValueError) as error:
        raise UsageError(f"--from {path}: {error}") from None
    if not isinstance(opt, keras.optimizers.Optimizer):
        out(f"From {path}: an embedding optimizer (OptimizerSpec face EMBEDDING).")
        out()
        if not engine.tensorflow:
            if tag is not None:
                out(
                    f"Its learning rate is dynamic, known only by TPUEmbedding's tag "
                    f"{tag}: {engine} has no tags (its spec takes the callable "
                    "itself). Pass the callable: tf_tpu_embed_opt.from_spec(spec, "
                    "learning_rate=...)."
                )
                out()
            # As `describe ALGORITHM --engine jax-tpu-embedding` describes it.
            return _describe_jax_spec(opt, sizes)
        _describe_embedding(opt, sizes, tag, engine)
        return _engine_status(opt, engine)
    out(f"From {path}: a Keras optimizer (OptimizerSpec face KERAS).")
    out(f"  tf_tpu_embed_opt.optimizers.{keras_call(opt)}")
    definition = opt.rule.definition  # a spec's Keras face is a twin
    if definition.engine_refusal is not None:
        # As `describe ALGORITHM` describes it: no engine to convert it for.
        return _describe_keras_state(definition, opt, sizes, engine, asked)
    name = type(opt).__name__
    call = "" if engine.whole_proto else f", engine={engine!r}"
    try:
        engine_opt = convert.to_embedding(opt, engine=engine)
    except (TypeError, ValueError) as error:
        out()
        out(f"{engine} cannot run {name}: {error}")
        if sizes is not None:
            out("No memory estimate: the engine cannot hold this optimizer's state.")
        return 2 if asked else 0
    what = "embedding optimizer" if engine.tensorflow else "spec"
    out(
        f"  {engine} runs it exactly as the {what} below "
        f"(tf_tpu_embed_opt.to_embedding(...{call}))."
    )
    out()
    if not engine.tensorflow:
        return _describe_jax_spec(engine_opt, sizes)
    _describe_embedding(engine_opt, sizes, engine=engine)
    return _engine_status(engine_opt, engine)


def _engine_status(opt: Any, engine: spec.Engine) -> int:
    """0 if `engine` runs `opt` (described above), 2 if it cannot."""
    if engine.whole_proto:
        return 0
    from tf_tpu_embed_opt import engines

    return 0 if engines.check_configuration(opt, engine).runs else 2


def _list_algorithms() -> None:
    out("Algorithms (embedding class, engine proto name, summary):")
    out(algorithm_list())
    out()
    out(f"Options of one: {PROG} describe ALGORITHM --help")


def run(args: argparse.Namespace) -> int:
    """Runs `describe`; returns the exit status (usage errors raise)."""
    sizes = None
    given = [
        name
        for name in ("vocabulary_size", "dim")
        if getattr(args, name, None) is not None
    ]
    if len(given) == 1:
        missing = "--dim" if given == ["vocabulary_size"] else "--vocabulary-size"
        present = option(given[0])
        raise UsageError(
            f"{present} needs {missing} too: give both or neither "
            "(the memory estimate needs the table's rows and dimension)"
        )
    if given:
        sizes = (args.vocabulary_size, args.dim)
        if args.vocabulary_size * args.dim > MAX_TABLE_ELEMENTS:
            raise UsageError(
                f"--vocabulary-size {args.vocabulary_size:,} x --dim {args.dim:,} "
                f"is {args.vocabulary_size * args.dim:,} values, above the largest "
                f"table this tool describes: 2**40 = {MAX_TABLE_ELEMENTS:,} "
                "(4 TiB of float32)"
            )
    definition = getattr(args, "definition", None)
    # The engine named once, here; the rest asks it what it is. Its verdict
    # (status 2 where it cannot run the optimizer) only where it was named.
    asked = args.engine is not None
    args.engine = spec.engine_named(
        args.engine or spec.TPU_EMBEDDING, "describe --engine"
    )
    if args.list:
        if args.source is not None:
            raise UsageError("give either --list or --from, not both")
        _list_algorithms()
        return 0
    if args.source is not None:
        # An OptimizerSpec holds TensorFlow's OptimizationParameters: it is
        # read with TensorFlow whatever the engine.
        require_tensorflow(
            f"`{PROG} describe --from` (an OptimizerSpec is read with "
            "TensorFlow's protos, on every engine; `describe ALGORITHM --engine "
            f"{spec.JAX_ENGINE}` runs without TensorFlow)"
        )
        return _describe_from(args.source, sizes, args.engine, asked)
    if definition is None:
        if sizes is not None:
            raise UsageError("--vocabulary-size and --dim need ALGORITHM or --from")
        _list_algorithms()
        return 0
    arguments = {
        name: getattr(args, name)
        for name, _ in parameters(definition)
        if hasattr(args, name)
    }
    if definition.engine_refusal is not None:
        return _describe_keras_only(definition, arguments, sizes, args.engine, asked)
    if not args.engine.tensorflow or not definition.tensorflow_engines:
        return _describe_jax(definition, arguments, sizes, args.engine)
    require_tensorflow(
        f"`{PROG} describe {definition.name}` on engine {args.engine} (its "
        f"parameter class and OptimizationParameters; `--engine {spec.JAX_ENGINE}` "
        "runs without TensorFlow)"
    )
    from tf_tpu_embed_opt.embedding import parameters as embedding

    try:
        opt = embedding.class_for(definition)(**arguments)
    except (TypeError, ValueError) as error:
        raise UsageError(with_options(str(error), definition)) from None
    _describe_embedding(opt, sizes, engine=args.engine)
    return _engine_status(opt, args.engine)


def _describe_keras_only(
    definition: Definition,
    arguments: Dict[str, Any],
    sizes: Optional[Tuple[int, int]],
    engine: spec.Engine,
    asked: bool,
) -> int:
    """An algorithm that no engine runs (`Definition.engine_refusal`): its
    Keras class, its slots (and their memory, given `sizes`) and why; status
    2 where `engine`'s verdict was asked for (`asked`: it was named)."""
    from tf_tpu_embed_opt.optimizers import twins

    try:
        twin = twins.class_for(definition)(**arguments)
    except (TypeError, ValueError) as error:
        raise UsageError(with_options(str(error), definition)) from None
    out(f"tf_tpu_embed_opt.optimizers.{keras_call(twin)}")
    return _describe_keras_state(definition, twin, sizes, engine, asked)


def _describe_keras_state(
    definition: Definition,
    twin: Any,
    sizes: Optional[Tuple[int, int]],
    engine: spec.Engine,
    asked: bool,
) -> int:
    """Says what `twin` (of an algorithm no engine runs) computes, its slots
    (their memory, given `sizes` and no engine `asked`) and why no engine
    runs it; returns the exit status."""
    out(f"  {definition.summary}")
    out(f"  {update_words(definition)}: {twin.rule.math}")
    out()
    out("Slots (Keras variables; [rows, 1] for one value per row):")
    slots = twin.rule.slots()
    for slot in slots:
        start = twin.rule.slot_initial(slot)
        shape = "[rows, 1]" if slot.per_row else "the table's shape"
        out(
            f"  {slot.keras_variable_name}  {shape}, initial value {start!r} "
            f"({slot.initial}). {slot.doc}"
        )
    if sizes is not None and not asked:  # no engine's verdict asked
        rows, dim = sizes
        table = rows * dim * 4
        state = sum(rows * (1 if slot.per_row else dim) * 4 for slot in slots)
        out()
        out(f"Memory (float32, {rows:,} x {dim}):")
        out(f"  table  {table / 2**20:,.1f} MiB")
        out(f"  slots  {state / 2**20:,.1f} MiB ({state / table:.3g}x the table)")
    # Said from the definition: no engine's class is needed (nor TensorFlow).
    instead = ""
    if definition.state_of:
        instead = f", or use {definition.state_of} on an engine"
    out()
    out(
        f"No engine runs {definition.name}: {definition.engine_refusal}. Train "
        f"the tables with it on CPU/GPU{instead}."
    )
    if sizes is not None and asked:
        out(f"No memory estimate on {engine}: it cannot hold this state.")
    return 2 if asked else 0


def _describe_jax(
    definition: Definition,
    arguments: Dict[str, Any],
    sizes: Optional[Tuple[int, int]],
    engine: str,
) -> int:
    from tf_tpu_embed_opt.cli import describe_jax

    try:
        return describe_jax.describe(definition, arguments, sizes, _jax_memory, engine)
    except ImportError as error:  # jax-tpu-embedding not installed
        if is_tensorflow_missing(error):
            raise  # Keras on its TensorFlow backend: the command line says so
        raise UsageError(str(error)) from None
    except (TypeError, ValueError) as error:
        raise UsageError(with_options(str(error), definition)) from None


# The memory table of a jax-tpu-embedding spec: no embedding optimizer's.
_jax_memory = functools.partial(_memory_lines, None)


def _describe_jax_spec(opt: Any, sizes: Optional[Tuple[int, int]]) -> int:
    """Prints the jax-tpu-embedding spec `opt` (one `to_embedding` made of a
    Keras optimizer), or that of embedding optimizer `opt`; returns the exit
    status (2 where the engine cannot run it)."""
    from tf_tpu_embed_opt.cli import describe_jax
    from tf_tpu_embed_opt.embedding import parameters as embedding

    if isinstance(opt, embedding.EmbeddingOptimizer):
        opt = describe_jax.spec_of_embedding(opt, embedding.definition_of(opt))
        if opt is None:
            return 2
    describe_jax.describe_spec(opt, sizes, _jax_memory)
    return 0
