"""`tf-tpu-embed-opt checkpoint inspect|convert`: embedding checkpoints.

Both open their path with `checkpoints.open_checkpoint`, so they take every
format it reads (`checkpoints.formats.READ`: TensorFlow's `TPUEmbedding` and
`TPUEmbeddingV2` layouts, jax-tpu-embedding, keras-rs and Keras
`OrbaxCheckpoint` steps). `inspect PATH` lists the tables with their shapes,
dtypes, slots, the engine algorithms those slots fit, and bytes, and of
SparseCore's and jax-tpu-embedding's stacked layouts each stack.
`convert SRC DST` rewrites one table at a time: by default into the
`TPUEmbedding` layout under another object path (e.g. from a Keras model's
nested embedding to the `embedding` a TPU job restores), with
`--layouts-from` into the SparseCore layout, with `--to-jax` into a
jax-tpu-embedding or keras-rs orbax step of any topology
(`checkpoint_jax`); optionally renaming or selecting tables and checking
each table's slots against an algorithm. DST appears only once complete.

TensorFlow is imported inside `run`, so that `--help` stays fast.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Dict, List, Optional, Tuple

from tf_tpu_embed_opt.checkpoints import formats
from tf_tpu_embed_opt.checkpoints.shared.keys import STEP_PATH
from tf_tpu_embed_opt.checkpoints.shared.table_info import engine_state
from tf_tpu_embed_opt.cli import checkpoint_jax
from tf_tpu_embed_opt.cli.checkpoint_parser import add_parser
from tf_tpu_embed_opt.cli.parser import PROG, counted, parse_pairs, step_line
from tf_tpu_embed_opt.errors import require_tensorflow, tensorflow_op_errors

__all__ = ["add_parser", "run"]


def _error(message: str) -> int:
    print(f"{PROG}: error: {' '.join(message.split())}", file=sys.stderr)
    return 2


def _algorithm(name: str) -> Any:
    from tf_tpu_embed_opt.definitions import registry

    for definition in registry.DEFINITIONS:
        if name.lower() in (definition.name.lower(), definition.proto_oneof):
            return definition
    known = ", ".join(d.name.lower() for d in registry.DEFINITIONS)
    raise ValueError(f"--algorithm: unknown algorithm {name!r}; known: {known}.")


def _print_stacks(
    document: Dict[str, Any],
    *,
    description: str,
    where: Any,
    table_line: Any,
    unfit: str = "no engine algorithm",
) -> int:
    """`inspect`'s report of a checkpoint of stacked tables (SparseCore's,
    jax-tpu-embedding's): one line per stack, with `where(stack)` (after the
    name, after the shape), and one per table."""
    stacks = document["stacked_tables"]
    print(f"checkpoint: {document['checkpoint']}")
    print(f"layout: {document['layout']} ({description})")
    print(step_line(document))
    for stack in stacks:
        shape = stack["shape"]
        after_name, after_shape = where(stack)
        print(
            f"stacked table {stack['stacked_table']}{after_name}: "
            + (" x ".join(str(d) for d in shape) if shape else "missing")
            + f"{after_shape}, slots {', '.join(stack['slots']) or '-'}, fits "
            + (", ".join(stack["algorithms"]) or unfit)
            + "".join(
                f", optimizer record {kind}"
                for kind in stack.get("optimizer_records", ())
            )
            + f", {stack['bytes']:,} bytes"
        )
        for table, value in stack["tables"].items():
            print(f"  {table}: {table_line(table, value)}")
    tables = sum(len(stack["tables"]) for stack in stacks)
    print(
        f"total: {counted(tables, 'table')} in "
        f"{counted(len(stacks), 'stacked table')}, "
        f"{document['bytes']:,} bytes "
        "(tf_tpu_embed_opt.checkpoints.open_checkpoint reads them per table)"
    )
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from tf_tpu_embed_opt.checkpoints import reader as checkpoint_reader

    found = checkpoint_reader.format_of(args.path, "`PATH`")
    if found.orbax and args.step_path is not None:
        raise ValueError(
            f"--step-path: {args.path!r} is {found.words}, whose step is its "
            "directory's number, not a variable; leave --step-path out."
        )
    document = checkpoint_reader.describe_checkpoint(
        args.path,
        format=found.name,
        object_path=args.object_path,
        embedding_spec=checkpoint_jax.keras_rs_spec(args),
        step_path=args.step_path,
    )
    if args.json:
        print(json.dumps(document, indent=2))
        return 0
    stacked = formats.with_layout(document.get("layout"))
    if stacked is formats.KERAS_RS:
        return checkpoint_jax.print_keras_rs(document)
    if stacked is formats.SPARSECORE:
        return _print_stacks(
            document,
            description="SparseCore: stacked, padded and sharded tables",
            where=lambda stack: ("", ""),
            table_line=lambda table, shape: f"{shape[0]} x {shape[1]}",
        )
    if stacked is formats.JAX_TPU_EMBEDDING:
        return _print_stacks(
            document,
            description="orbax; stacked, padded, mod-sharded and rotated tables",
            where=lambda stack: (
                f" (item {stack['item']})",
                f" over {stack['num_sparsecores']} SparseCores",
            ),
            table_line=lambda table, place: (
                f"{place['shape'][0]} x {place['shape'][1]}, row offset "
                f"{place['row_offset_in_shard']}, rotation "
                f"{place['shard_rotation']}"
            ),
            unfit="no algorithm",
        )
    print(f"checkpoint: {document['checkpoint']}")
    if found is formats.KERAS:
        step = document["step"]
        print(
            "format: keras.callbacks.OrbaxCheckpoint step; the tables of the "
            "row-sparse layers, step "
            + (str(step) if step is not None else "unknown (their counters differ)")
        )
    else:
        print(f"object path: {document['object_path']}")
        print(step_line(document))
    header = ("table", "shape", "dtype", "slots", "fits", "bytes")
    lines = [header] + [
        (
            r["table"],
            " x ".join(str(d) for d in r["shape"]),
            r["dtype"],
            ", ".join(r["slots"]) or "-",
            ", ".join(r["algorithms"]) or "no engine algorithm",
            f"{r['bytes']:,}",
        )
        for r in document["tables"]
    ]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line in lines:
        cells = (cell.ljust(width) for cell, width in zip(line, widths))
        print("  ".join(cells).rstrip())
    tables = counted(len(document["tables"]), "table")
    print(f"total: {tables}, {document['bytes']:,} bytes")
    return 0


def _algorithm_choices(args: argparse.Namespace) -> Tuple[List[str], Dict[str, str]]:
    """--algorithm's default (a list of at most one name) and TABLE=NAME pairs."""
    every = [a for a in args.algorithm if "=" not in a]
    per_table = parse_pairs([a for a in args.algorithm if "=" in a], "--algorithm")
    if len(every) > 1:
        raise ValueError(f"--algorithm: several defaults given: {every}.")
    return every, per_table


def _sparsecore_reader(args: argparse.Namespace) -> Any:
    """SRC, a `TPUEmbeddingV2` checkpoint, read per table with --algorithm's."""
    from tf_tpu_embed_opt.checkpoints import reader as checkpoint_reader

    every, per_table = _algorithm_choices(args)
    document = checkpoint_reader.describe_checkpoint(
        args.source,
        format="sparsecore",
        object_path=args.object_path,
        step_path=args.step_path,
    )
    names = [t for stack in document["stacked_tables"] for t in stack["tables"]]
    unknown = sorted(set(per_table) - set(names))
    if unknown:
        raise ValueError(
            f"--algorithm: tables {unknown} are not in the checkpoint, which has "
            f"{sorted(names)}."
        )
    missing = sorted(n for n in names if n not in per_table and not every)
    if missing:
        raise ValueError(
            f"{args.source!r} is a SparseCore (TPUEmbeddingV2) checkpoint, whose "
            "slots do not name the algorithm (Adagrad and ProximalAdagrad both "
            "keep `accumulators`): give --algorithm NAME (or TABLE=NAME) for "
            f"tables {missing}."
        )
    optimizer = {
        name: _algorithm(per_table.get(name, every[0] if every else "")).name
        for name in names
    }
    return checkpoint_reader.open_checkpoint(
        args.source,
        format="sparsecore",
        algorithms=optimizer,
        object_path=args.object_path,
        step_path=args.step_path,
    )


def _convert(args: argparse.Namespace) -> int:
    from tf_tpu_embed_opt.checkpoints.shared import paths

    # Usage errors first, before TensorFlow loads and anything is read: where
    # DST cannot be written, malformed --rename, unknown --algorithm names.
    topology = checkpoint_jax.topology(args)
    if topology is None:
        paths.writable_prefix(args.destination, "DST")
    else:
        paths.writable_root(args.destination, "`DST`")
    if args.step is not None and args.step < 0:
        raise ValueError(f"--step: a step is >= 0; received {args.step}.")
    renames = parse_pairs(args.rename, "--rename")
    if args.algorithm:
        every, per_table = _algorithm_choices(args)
        for name in [*every, *per_table.values()]:
            _algorithm(name)

    source, target_spec = _convert_source(args, topology)
    reader = source.reader
    names = _converted_tables(args, reader, renames)
    algorithms = _converted_algorithms(args, reader, names, renames)
    step = _converted_step(args, source)

    def tables():
        for name in names:
            yield renames.get(name, name), engine_state(reader.read(name))

    if topology is not None:
        return checkpoint_jax.write(
            args, topology, reader, names, renames, algorithms, step, target_spec
        )
    # After the usage errors and reading SRC: a DST in TensorFlow's layouts.
    require_tensorflow(
        f"`{PROG} checkpoint convert` into TensorFlow's layouts (a DST "
        "without --to-jax; `inspect` and `convert --to-jax` run without "
        "TensorFlow)"
    )
    if args.layouts_from:
        return _write_sparsecore(args, reader, names, renames, algorithms)
    from tf_tpu_embed_opt import checkpoints

    # Tables without --algorithm are copied with whatever slots they hold;
    # DST records the algorithms where SRC or --algorithm tells each.
    checkpoints.write_checkpoint(
        args.destination,
        tables(),
        format="tpu-embedding",
        object_path=args.to_object_path,
        step=step,
        step_path=args.step_path or STEP_PATH,
        algorithms=_known_algorithms(source, names, renames, algorithms),
    )
    total = sum(reader.tables[n].engine_nbytes for n in names)
    print(
        f"wrote {args.destination}: {counted(len(names), 'table')}, "
        f"{total:,} bytes, object "
        f"path {args.to_object_path}"
        + (f", step {step} at {args.step_path or 'step'}" if step is not None else "")
    )
    return 0


def _convert_source(
    args: argparse.Namespace, topology: Optional[Tuple[int, int]]
) -> Tuple[Any, Any]:
    """(SRC opened as a `Checkpoint`, DST's keras-rs spec or None)."""
    from tf_tpu_embed_opt.checkpoints import reader as checkpoint_reader

    keras_rs_spec = checkpoint_jax.keras_rs_spec(args)
    found = checkpoint_reader.format_of(args.source, "`SRC`")
    target_spec = None
    if keras_rs_spec is not None and found is not formats.KERAS_RS:
        # The keras-rs options describe DST (a keras-rs job's step).
        target_spec = checkpoint_jax.keras_rs_target(args, topology, keras_rs_spec)
        keras_rs_spec = None
    if found is formats.SPARSECORE:
        return _sparsecore_reader(args), target_spec
    if found.layout is None:
        source = checkpoint_reader.open_checkpoint(
            args.source,
            format=found.name,
            object_path=args.object_path,
            # An orbax step's step is its number; --step-path is then DST's.
            step_path=None if found.orbax else args.step_path,
        )
        return source, target_spec
    if args.object_path:
        raise ValueError(
            f"--object-path: {args.source!r} is a jax-tpu-embedding or "
            "keras-rs checkpoint step, which has no object paths."
        )
    if found is formats.KERAS_RS and keras_rs_spec is None:
        raise ValueError(
            f"{args.source!r} is a keras-rs step, which does not record "
            "which table is where: give --keras-rs-features MODULE:NAME and "
            "--keras-rs-topology DxS (and --keras-rs-table-stacking where "
            "the job set table_stacking)."
        )
    source = checkpoint_reader.open_checkpoint(
        args.source, format=found.name, embedding_spec=keras_rs_spec
    )
    return source, target_spec


def _converted_tables(
    args: argparse.Namespace, reader: Any, renames: Dict[str, str]
) -> List[str]:
    """The tables --tables chooses (all by default), --rename checked."""
    names = sorted(reader.tables)
    if args.tables is not None:
        names = [n for n in args.tables.split(",") if n]
        if not names:
            # An empty value (`--tables "$UNSET"`) meant every table.
            raise ValueError(
                f"--tables: expected table names, T1,T2; received {args.tables!r}."
            )
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"--tables: {repeated} named more than once.")
        unknown = sorted(set(names) - set(reader.tables))
        if unknown:
            raise ValueError(
                f"--tables: {unknown} are not in the checkpoint, which has "
                f"{sorted(reader.tables)}."
            )
    unknown = sorted(set(renames) - set(names))
    if unknown:
        raise ValueError(f"--rename: tables {unknown} are not being converted.")
    targets = [renames.get(n, n) for n in names]
    if len(set(targets)) != len(targets):
        raise ValueError(f"--rename: two tables would be named alike: {targets}.")
    return names


def _converted_algorithms(
    args: argparse.Namespace,
    reader: Any,
    names: List[str],
    renames: Dict[str, str],
) -> Dict[str, Any]:
    """Each DST table's --algorithm, where one is given, checked against the
    slots SRC holds."""
    algorithms: Dict[str, Any] = {}
    if not args.algorithm:
        return algorithms
    every, per_table = _algorithm_choices(args)
    unknown = sorted(set(per_table) - set(names))
    if unknown:
        raise ValueError(f"--algorithm: tables {unknown} are not being converted.")
    for name in names:
        chosen = per_table.get(name, every[0] if every else None)
        if chosen is None:
            continue
        target = renames.get(name, name)
        algorithms[target] = _algorithm(chosen)
        held = list(reader.tables[name].slots)
        expected = {s.name for s in algorithms[target].slots}
        if set(held) != expected:
            raise ValueError(
                f"Table {name!r}: the checkpoint holds slots {held}, not those "
                f"of {algorithms[target].name} ({sorted(expected)})."
            )
    return algorithms


def _known_algorithms(
    source: Any, names: List[str], renames: Dict[str, str], given: Dict[str, Any]
) -> Optional[Dict[str, Any]]:
    """Each DST table's algorithm, from --algorithm or else from SRC where
    it says one (`None` where neither does); None where none is known."""
    known = dict(given)
    for name in names:
        target = renames.get(name, name)
        if target not in known:
            found = source.algorithms(name)
            known[target] = found[0] if len(found) == 1 else None
    return known if any(known.values()) else None


def _converted_step(args: argparse.Namespace, source: Any) -> Optional[int]:
    """DST's step: --step, or the step SRC records (`Checkpoint.step`: an
    orbax step's, or a TensorFlow SRC's at --step-path, by default `step`)."""
    if args.step is not None:
        return args.step
    step = source.step
    read = formats.found(source.format)
    if step is None and read is not None and read.orbax:
        why = (
            ": the step counters of its tables and of its model's optimizer differ"
            if read is formats.KERAS
            else " is not named by its step (orbax names step directories by number)"
        )
        raise ValueError(f"{args.source!r}{why}; give --step N.")
    return step


def _write_sparsecore(
    args: argparse.Namespace,
    reader: Any,
    names: List[str],
    renames: Dict[str, str],
    algorithms: Dict[str, Any],
) -> int:
    """Writes DST in the SparseCore layouts stored in --layouts-from."""
    from tf_tpu_embed_opt import checkpoints
    from tf_tpu_embed_opt.checkpoints import sparsecore as sparsecore_layout

    if args.step_path:
        raise ValueError(
            "--step-path: a SparseCore checkpoint written here holds the tables "
            "and slots only; restore the step separately."
        )
    targets = [renames.get(n, n) for n in names]
    missing = sorted(t for t in targets if t not in algorithms)
    if missing:
        raise ValueError(
            f"--layouts-from: give --algorithm NAME (or TABLE=NAME) for tables "
            f"{missing}: SparseCore stacks tables by optimizer, and slots alone "
            "do not name it."
        )
    _, layouts = sparsecore_layout.read_layouts(args.layouts_from)

    def tables():
        for name in names:
            yield renames.get(name, name), engine_state(reader.read(name))

    checkpoints.write_checkpoint(
        args.destination,
        tables(),
        format="sparsecore",
        layouts=layouts,
        algorithms={target: algorithms[target] for target in targets},
        object_path=args.to_object_path,
    )
    total = sum(reader.tables[n].engine_nbytes for n in names)
    print(
        f"wrote {args.destination}: {counted(len(names), 'table')}, "
        f"{total:,} bytes "
        f"(unpadded), SparseCore layouts of {args.layouts_from}, object path "
        f"{args.to_object_path}"
    )
    return 0


def run(args: argparse.Namespace) -> int:
    """Runs `checkpoint inspect` or `checkpoint convert`.

    Returns:
      0 on success, 2 when the input is refused (one line on stderr).
    """
    try:
        if args.checkpoint_command == "inspect":
            return _inspect(args)
        return _convert(args)
    except BrokenPipeError:
        raise  # stdout's reader is gone (`... | head`): `main` stops quietly
    except (ValueError, TypeError, KeyError, OSError, *tensorflow_op_errors()) as error:
        return _error(_one_line(error))
    except ImportError as error:
        # A package missing is the command line's to explain; one too old
        # (orbax for writing) is said here.
        if isinstance(error, ModuleNotFoundError):
            raise
        return _error(str(error))


def _one_line(error: Exception) -> str:
    if isinstance(error, KeyError) and error.args:
        return str(error.args[0])  # str(KeyError) quotes its message
    if isinstance(error, (ValueError, TypeError)):
        return str(error)
    from tf_tpu_embed_opt.checkpoints.shared.paths import first_line

    # TensorFlow's and the OS's errors: the first line, with the class.
    return first_line(error)
