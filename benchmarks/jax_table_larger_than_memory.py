"""A table larger than memory moved to another topology (issue #27).

One Adagrad table of `--table-gib` GiB (128 float32 columns; its
`accumulator` slot as large again) is written as a jax-tpu-embedding step of
a job of 2 devices x 4 SparseCores, from a stream of row blocks (the values
a function of the row, so that any row can be checked later). Then, in a
process whose memory is capped at `--memory-gib` GiB,

    tf-tpu-embed-opt checkpoint convert SRC DST --to-jax 1x4 --spill-bytes 0

reads the table and its slot shard by shard and writes them restacked for 4
SparseCores. Reported: whether the capped process finished, its time, its
peak anonymous memory (sampled; file pages it maps are not counted, the
kernel writes them back and drops them under the cap) and the cap's own
peak count (page cache included). Finally every row of the table and the
slot is read back from DST, shard by shard, and compared with its value.

The cap is a memory cgroup (v1 `memory.limit_in_bytes` or v2
`memory.max`); where this process cannot make one, the conversion runs
uncapped and the report says so. Disk: about 3x (table + slot) GiB under
`--directory` (default: a temporary directory, removed afterwards). No
TensorFlow is needed.

Run from the repository root:

    python -m benchmarks.jax_table_larger_than_memory --table-gib 8 --memory-gib 2
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import List, Optional, Tuple

import numpy as np

COLUMNS = 128
BLOCK_ROWS = 1 << 16
SOURCE = (2, 4)
TARGET = (1, 4)


def values(rows: np.ndarray, slot: bool) -> np.ndarray:
    """The value of each of `rows` (a function of the row alone): uniform in
    [0, 1) for the table, [1, 2) for the accumulator."""
    rows = np.asarray(rows, np.uint64)
    columns = np.arange(COLUMNS, dtype=np.uint64)
    mixed = (rows[:, None] * np.uint64(0x9E3779B97F4A7C15)) ^ (
        columns[None, :] * np.uint64(0xBF58476D1CE4E5B9)
    )
    mixed ^= mixed >> np.uint64(29)
    mixed *= np.uint64(0x94D049BB133111EB)
    mixed ^= mixed >> np.uint64(32)
    unit = (mixed >> np.uint64(40)).astype(np.float32) / np.float32(1 << 24)
    return unit + np.float32(1.0 if slot else 0.0)


def _source(directory: str, rows: int) -> str:
    from tf_tpu_embed_opt import checkpoints
    from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import (
        writer as jax_orbax_writer,
    )
    from tf_tpu_embed_opt.checkpoints.shared import stacks as sparsecore_stacks

    def stream(slot: bool) -> sparsecore_stacks.RowStream:
        def blocks():
            for start in range(0, rows, BLOCK_ROWS):
                block = np.arange(start, min(rows, start + BLOCK_ROWS))
                yield block, values(block, slot)

        return sparsecore_stacks.RowStream((rows, COLUMNS), np.float32, blocks)

    spec = jax_orbax_writer.embedding_spec_for(
        {"big": (rows, COLUMNS)},
        num_devices=SOURCE[0],
        sparsecores_per_device=SOURCE[1],
    )
    return checkpoints.write_checkpoint(
        directory,
        [("big", {"parameters": stream(False), "accumulators": stream(True)})],
        format="jax-tpu-embedding",
        step=1,
        embedding_spec=spec,
        algorithms={"big": "Adagrad"},
        spill_bytes=0,
    )


def _cgroup(limit: int, suffix: str = "") -> Optional[Tuple[str, str]]:
    """A memory cgroup capped at `limit` bytes: (its directory, the file of
    its peak), or None where none can be made here. `suffix` tells apart
    the groups one process makes."""
    name = f"tf_tpu_embed_opt_bench_{os.getpid()}{suffix}"
    for base, cap, peak in (
        ("/sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.max_usage_in_bytes"),
        ("/sys/fs/cgroup", "memory.max", "memory.peak"),
    ):
        if not os.path.isfile(os.path.join(base, "cgroup.procs")):
            continue
        directory = os.path.join(base, name)
        try:
            os.mkdir(directory)
            with open(os.path.join(directory, cap), "w") as handle:
                handle.write(str(limit))
            return directory, os.path.join(directory, peak)
        except OSError:
            if os.path.isdir(directory):
                os.rmdir(directory)
    return None


def _convert(source: str, target: str, limit: int) -> dict:
    command = [
        sys.executable,
        "-m",
        "tf_tpu_embed_opt",
        "checkpoint",
        "convert",
        source,
        target,
        "--to-jax",
        f"{TARGET[0]}x{TARGET[1]}",
        "--spill-bytes",
        "0",
    ]
    group = _cgroup(limit)
    joined = f"echo $$ > {group[0]}/cgroup.procs && " if group else ""
    shell = joined + "exec " + " ".join(command)
    started = time.perf_counter()
    process = subprocess.Popen(["sh", "-c", shell], stdout=subprocess.PIPE, text=True)
    anonymous = 0
    while process.poll() is None:
        try:
            with open(f"/proc/{process.pid}/status") as handle:
                for line in handle:
                    if line.startswith("RssAnon:"):
                        anonymous = max(anonymous, int(line.split()[1]) * 1024)
        except OSError:
            pass
        time.sleep(0.05)
    seconds = time.perf_counter() - started
    output = process.stdout.read()
    peak = None
    if group:
        with open(group[1]) as handle:
            peak = int(handle.read())
        os.rmdir(group[0])
    return {
        "returncode": process.returncode,
        "seconds": seconds,
        "anonymous": anonymous,
        "capped": group is not None,
        "cgroup_peak": peak,
        "output": output.strip(),
    }


def _check(target_step: str, rows: int) -> int:
    """Every row of the table and of the slot, read back from the converted
    step shard by shard (nothing cached) and compared with its value;
    returns how many rows were compared."""
    from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import reader as jax_orbax

    reader = jax_orbax.JaxCheckpointReader(target_step, cache_bytes=0)
    compared = 0
    for key, slot in (("parameters", False), ("accumulators", True)):
        for block, got in reader.stream("big", key).blocks():
            if not np.array_equal(got, values(block, slot)):
                raise AssertionError(f"{key}: rows {block[:4]}... differ")
            compared += len(block)
    if compared != 2 * rows:
        raise AssertionError(f"compared {compared} rows of {2 * rows}")
    return compared


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table-gib", type=float, default=8.0)
    parser.add_argument("--memory-gib", type=float, default=2.0)
    parser.add_argument("--directory")
    args = parser.parse_args(argv)
    rows = int(args.table_gib * 2**30) // (COLUMNS * 4)
    directory = args.directory or tempfile.mkdtemp(prefix="teo-large-table-")
    try:
        started = time.perf_counter()
        source = _source(os.path.join(directory, "src"), rows)
        written = time.perf_counter() - started
        target = os.path.join(directory, "dst")
        result = _convert(source, target, int(args.memory_gib * 2**30))
        gib = rows * COLUMNS * 4 / 2**30
        print(
            f"table: {rows:,} rows x {COLUMNS} float32 = {gib:.2f} GiB, and its "
            f"Adagrad accumulator as large; source ({SOURCE[0]}x{SOURCE[1]}) "
            f"written in {written:.1f} s"
        )
        cap = f"capped at {args.memory_gib:g} GiB" if result["capped"] else "UNCAPPED"
        print(
            f"convert --to-jax {TARGET[0]}x{TARGET[1]} --spill-bytes 0 ({cap}): "
            f"exit {result['returncode']}, {result['seconds']:.1f} s, peak "
            f"anonymous memory {result['anonymous'] / 2**30:.2f} GiB"
            + (
                f", cgroup peak {result['cgroup_peak'] / 2**30:.2f} GiB"
                if result["cgroup_peak"] is not None
                else ""
            )
        )
        if result["returncode"] != 0:
            print(result["output"])
            return 1
        started = time.perf_counter()
        checked = _check(os.path.join(target, "1"), rows)
        print(
            f"checked: all {checked:,} rows of the table and the slot read back "
            f"(streamed) equal their values, in {time.perf_counter() - started:.1f} s"
        )
    finally:
        if not args.directory:
            shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
