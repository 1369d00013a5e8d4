"""`checkpoint convert` to and from jax-tpu-embedding's orbax checkpoints.

SRC may be a jax-tpu-embedding checkpoint step (read without TensorFlow);
with `--to-jax DEVICESxSPARSECORES`, DST is an orbax root directory that gets
the step in the layout of a job of that topology: the stacks of a
jax-tpu-embedding SRC (or of `--spec-from`, or `--stack`) retargeted with
jax-tpu-embedding's arithmetic (`checkpoints.jax_tpu_embedding.writer`).
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Dict, List, Optional, Tuple

from tf_tpu_embed_opt.checkpoints.shared.table_info import engine_state
from tf_tpu_embed_opt.cli.parser import counted, parse_pairs, step_line

__all__ = [
    "add_arguments",
    "add_keras_rs_arguments",
    "keras_rs_spec",
    "print_keras_rs",
    "topology",
    "write",
]


def add_arguments(convert: argparse.ArgumentParser) -> None:
    """Adds the jax-tpu-embedding options to `checkpoint convert`."""
    jax = convert.add_argument_group(
        "jax-tpu-embedding",
        "SRC may be a jax-tpu-embedding orbax step directory (read without "
        "TensorFlow). With --to-jax, DST is an orbax root directory that gets "
        "the step, stacked and sharded for the given topology.",
    )
    jax.add_argument(
        "--to-jax",
        metavar="DEVICESxSPARSECORES",
        help=(
            "Write DST as a jax-tpu-embedding orbax checkpoint for a job of "
            "DEVICES chips with SPARSECORES SparseCores each (e.g. 4x4)."
        ),
    )
    jax.add_argument(
        "--rotation",
        type=int,
        metavar="N",
        help=(
            "The target job's stack_tables(rotation=N). Default: jax-tpu-"
            "embedding's, the SparseCores per device."
        ),
    )
    jax.add_argument(
        "--stack",
        action="append",
        default=[],
        metavar="NAME=T1,T2",
        help=(
            "Stack these tables (as named in DST) into one, in this order "
            "(repeatable); other tables are stacks of their own. Default for a "
            "jax-tpu-embedding SRC: its stacks."
        ),
    )
    jax.add_argument(
        "--spec-from",
        metavar="STEP_DIR",
        help=(
            "Take the stacks (and the rest of the embedding spec) from this "
            "jax-tpu-embedding checkpoint step, e.g. one the target job wrote."
        ),
    )
    jax.add_argument(
        "--items-from",
        metavar="STEP_DIR",
        help=(
            "Carry the rest of this step (one the target job wrote) into DST: "
            "dense leaves and items such as the optimizer state, which "
            "jax-tpu-embedding's restore_checkpoint needs. Default: a "
            "jax-tpu-embedding SRC (without --tables)."
        ),
    )
    jax.add_argument(
        "--spill-bytes",
        type=int,
        metavar="N",
        help=(
            "Hold DST's stacks in memory up to N bytes, the rest in "
            "memory-mapped files beside it (tables larger than memory "
            "convert). Default: half of this machine's memory."
        ),
    )
    jax.add_argument(
        "--step",
        type=int,
        metavar="N",
        help=(
            "The step to write. Default: a jax-tpu-embedding SRC's own step, "
            "or the value at --step-path."
        ),
    )


def add_keras_rs_arguments(parser: argparse.ArgumentParser) -> None:
    """The options that give the layout of a keras-rs step (which records
    none): the job's feature configs, topology and table stacking."""
    group = parser.add_argument_group(
        "keras-rs",
        "A keras-rs step records no layout: it is derived from the job's "
        "feature configs, topology and table_stacking, as DistributedEmbedding "
        "does, and checked against the stored shapes. They describe SRC when "
        "it is a keras-rs step, else DST (over --items-from's step).",
    )
    group.add_argument(
        "--keras-rs-features",
        metavar="MODULE:NAME",
        help=(
            "The job's nested keras_rs.layers.FeatureConfigs: attribute NAME "
            "of the Python module MODULE (imported, the current directory "
            "first on the path), or a function there that returns them."
        ),
    )
    group.add_argument(
        "--keras-rs-topology",
        metavar="DEVICESxSPARSECORES",
        help="The job's devices x SparseCores per device (e.g. 4x4).",
    )
    group.add_argument(
        "--keras-rs-table-stacking",
        default="auto",
        metavar="auto|none|T1,T2[;T3,T4]",
        help=(
            "The job's DistributedEmbedding(table_stacking=...): auto (keras-"
            "rs's default), none, or stacks of table names. Default: auto."
        ),
    )


def _devices_by_cores(value: str, option: str) -> Tuple[int, int]:
    devices, sep, cores = value.lower().partition("x")
    if not (sep and devices.isdigit() and cores.isdigit()) or not (
        int(devices) and int(cores)
    ):
        raise ValueError(
            f"{option}: expected DEVICESxSPARSECORES with positive numbers (e.g. "
            f"4x4); received {value!r}."
        )
    from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding.writer import (
        JAX_SPARSECORES_PER_DEVICE,
    )

    if int(cores) not in JAX_SPARSECORES_PER_DEVICE:
        allowed = " or ".join(str(n) for n in JAX_SPARSECORES_PER_DEVICE)
        raise ValueError(
            f"{option}: SPARSECORES must be {allowed} (jax-tpu-embedding lays "
            f"tables out for those only: TPU v5p and v5e have 4, v6e and TPU7x "
            f"2); received {value!r}."
        )
    return int(devices), int(cores)


def keras_rs_spec(args: argparse.Namespace) -> Any:
    """The layout of a keras-rs step from the keras-rs options, or None when
    none is given."""
    given = (args.keras_rs_features, args.keras_rs_topology)
    if not any(given):
        return None
    if not all(given):
        raise ValueError(
            "--keras-rs-features and --keras-rs-topology: give both (the "
            "layout of a keras-rs step depends on each)."
        )
    import importlib
    import sys

    from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import (
        keras_rs as keras_rs_orbax,
    )

    module_name, sep, attribute = args.keras_rs_features.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(
            f"--keras-rs-features: expected MODULE:NAME; received "
            f"{args.keras_rs_features!r}."
        )
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    finally:
        sys.path.remove(os.getcwd())
    if not hasattr(module, attribute):
        raise ValueError(
            f"--keras-rs-features: module {module_name!r} has no {attribute!r}."
        )
    features = getattr(module, attribute)
    if callable(features):
        features = features()
    devices, cores = _devices_by_cores(args.keras_rs_topology, "--keras-rs-topology")
    stacking: Any = args.keras_rs_table_stacking
    if stacking == "none":
        stacking = None
    elif stacking != "auto":
        groups = [[t for t in g.split(",") if t] for g in stacking.split(";")]
        if not all(groups):
            raise ValueError(
                "--keras-rs-table-stacking: expected auto, none or T1,T2[;T3,T4]; "
                f"received {args.keras_rs_table_stacking!r}."
            )
        stacking = groups
    return keras_rs_orbax.embedding_spec(
        features,
        num_devices=devices,
        sparsecores_per_device=cores,
        table_stacking=stacking,
    )


def topology(args: argparse.Namespace) -> Any:
    """(devices, SparseCores per device) of --to-jax, or None; the options
    that only go with it refused without it."""
    if args.to_jax is None:
        for option, value in (
            ("--rotation", args.rotation is not None),
            ("--stack", args.stack),
            ("--spec-from", args.spec_from),
            ("--spill-bytes", args.spill_bytes is not None),
            ("--items-from", args.items_from),
        ):
            if value:
                raise ValueError(f"{option} goes with --to-jax.")
        return None
    devices, cores = _devices_by_cores(args.to_jax, "--to-jax")
    if args.layouts_from:
        raise ValueError("--layouts-from does not go with --to-jax.")
    if args.step_path and args.step is not None:
        raise ValueError("--step and --step-path: give one (the step of DST).")
    if args.spec_from and args.stack:
        raise ValueError("--stack and --spec-from: give one (the stacks of DST).")
    if args.items_from and not os.path.isdir(args.items_from):
        raise ValueError(
            f"--items-from: {args.items_from!r} is not an orbax step directory."
        )
    if args.spill_bytes is not None and args.spill_bytes < 0:
        raise ValueError(
            f"--spill-bytes: must be >= 0 (bytes); received {args.spill_bytes}."
        )
    return devices, cores


def keras_rs_target(
    args: argparse.Namespace, topology: Optional[Tuple[int, int]], spec: Any
) -> Any:
    """DST's layout when the keras-rs options are given and SRC is no keras-rs
    step: a keras-rs job's, written over a step of that job (--items-from),
    since Keras restores a model's whole state."""
    if topology is None:
        raise ValueError(
            "--keras-rs-features: SRC is not a keras-rs step, so the keras-rs "
            "options describe DST, which needs --to-jax."
        )
    if _devices_by_cores(args.keras_rs_topology, "--keras-rs-topology") != topology:
        raise ValueError(
            f"--keras-rs-topology {args.keras_rs_topology} and --to-jax "
            f"{args.to_jax} differ: both give DST's topology."
        )
    for option, value in (("--stack", args.stack), ("--spec-from", args.spec_from)):
        if value:
            raise ValueError(
                f"{option} and the keras-rs options: give one (the stacks of DST)."
            )
    from tf_tpu_embed_opt.checkpoints.shared import orbax_items

    # (topology() has refused an --items-from that is no directory.)
    if not args.items_from or not orbax_items.keras_rs_weights(args.items_from):
        raise ValueError(
            "--keras-rs-features: DST is a keras-rs job's step, which Keras "
            "restores whole (the model's other weights, the optimizer): give "
            "--items-from a step of the job."
        )
    return spec


def write(
    args: argparse.Namespace,
    topology: Tuple[int, int],
    reader: Any,
    names: List[str],
    renames: Dict[str, str],
    algorithms: Dict[str, Any],
    step: Any,
    target_spec: Any = None,
) -> int:
    """Writes DST as a jax-tpu-embedding orbax step for --to-jax's topology
    (in `target_spec`'s layout when given: a keras-rs job's)."""
    from tf_tpu_embed_opt import checkpoints
    from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import reader as jax_orbax

    if step is None:
        raise ValueError(
            "--to-jax: the step to write is not known; give --step N (or "
            "--step-path where SRC holds it)."
        )
    targets = {renames.get(n, n): n for n in names}
    for target, name in targets.items():
        if target not in algorithms:
            candidates = reader.algorithms_of(name)
            if len(candidates) != 1:
                raise ValueError(
                    f"--to-jax: table {name!r} holds slots "
                    f"{list(reader.tables[name].slots)}, which fit "
                    f"{[d.name for d in candidates] or 'no algorithm'}; give "
                    "--algorithm NAME (or TABLE=NAME): jax-tpu-embedding names "
                    "slots by algorithm."
                )
            algorithms[target] = candidates[0]
    devices, cores = topology
    if target_spec is not None:
        spec = target_spec
    else:
        spec = _dst_spec(args, topology, reader, targets, renames)
    items_from = args.items_from
    if items_from is None and not args.tables:
        if isinstance(reader, jax_orbax.JaxCheckpointReader):
            items_from = args.source
    # A jax-tpu-embedding SRC streams shard by shard; TensorFlow's
    # checkpoints are read a whole table at a time.
    read = getattr(reader, "streams", None) or (
        lambda name: engine_state(reader.read(name))
    )
    spill_bytes = args.spill_bytes
    if spill_bytes is None:
        spill_bytes = jax_orbax.machine_memory_bytes() // 2
    written = checkpoints.write_checkpoint(
        args.destination,
        ((t, read(n)) for t, n in targets.items()),
        format="jax-tpu-embedding",
        step=step,
        embedding_spec=spec,
        algorithms=algorithms,
        items_from=items_from,
        spill_bytes=spill_bytes,
    )
    total = sum(reader.tables[n].engine_nbytes for n in names)
    print(
        f"wrote {written}: {counted(len(names), 'table')}, {total:,} bytes "
        "(unpadded), "
        f"jax-tpu-embedding layout for {counted(devices, 'device')} x "
        f"{counted(cores, 'SparseCore')}, "
        f"step {step}"
    )
    return 0


def _dst_spec(
    args: argparse.Namespace,
    topology: Tuple[int, int],
    reader: Any,
    targets: Dict[str, str],
    renames: Dict[str, str],
) -> Any:
    """DST's embedding spec: --spec-from's stacks, or a jax-tpu-embedding
    SRC's, retargeted to --to-jax's topology; else from the tables' shapes
    and --stack."""
    from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import reader as jax_orbax
    from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import (
        writer as jax_orbax_writer,
    )

    devices, cores = topology
    source_spec = None
    if args.spec_from:
        source_spec = jax_orbax.read_embedding_spec(args.spec_from)
    elif isinstance(reader, jax_orbax.JaxCheckpointReader) and not args.stack:
        if args.tables or renames:
            raise ValueError(
                "--to-jax: --tables and --rename change the stacks of SRC's "
                "embedding spec; give the stacks of DST with --stack."
            )
        source_spec = reader.embedding_spec
    if source_spec is not None:
        return jax_orbax_writer.retarget_embedding_spec(
            source_spec,
            num_devices=devices,
            sparsecores_per_device=cores,
            rotation=args.rotation,
        )
    stacks = {
        stack: [m for m in members.split(",") if m]
        for stack, members in parse_pairs(args.stack, "--stack", "NAME=T1,T2").items()
    }
    return jax_orbax_writer.embedding_spec_for(
        {t: tuple(reader.tables[n].shape) for t, n in targets.items()},
        num_devices=devices,
        sparsecores_per_device=cores,
        stacks=stacks,
        rotation=args.rotation,
    )


def print_keras_rs(document: Dict[str, Any]) -> int:
    """`inspect` of a keras-rs step without the keras-rs options: its stacks
    (`describe_checkpoint`'s document); which table is where is not recorded
    there."""
    stacks = document["stacked_tables"]
    total = document["bytes"]
    print(f"checkpoint: {document['checkpoint']}")
    print(
        "layout: keras-rs (orbax; DistributedEmbedding weights, stacked and "
        "sharded; the layout is not recorded)"
    )
    print(step_line(document))
    for stack in stacks:
        print(
            f"stacked table {stack['stacked_table']} (item {stack['item']}, "
            f"{stack['weights']}): {' x '.join(map(str, stack['shape']))}, slots "
            f"{', '.join(stack['slots']) or '-'}, fits "
            f"{', '.join(stack['algorithms']) or 'no algorithm'}, "
            f"{stack['bytes']:,} bytes"
        )
    print(
        f"total: {counted(len(stacks), 'stacked table')}, {total:,} bytes; "
        "which table is "
        "where depends on the job's feature configs, table_stacking and "
        "topology: give --keras-rs-features and --keras-rs-topology (or read it "
        "with checkpoints.jax_tpu_embedding.keras_rs.embedding_spec)"
    )
    return 0
