"""Tables larger than memory: read shard by shard, written block by block.

Oracle: jax-tpu-embedding's own `stack_and_shard_tables` (the stacked arrays
a streamed conversion must equal bit for bit, NaN padding included) and
`unshard_and_unstack_tables`, and orbax's own restore of what is written.
What streaming promises beyond the values is checked on the reads and
writes themselves: no read of more than one block of rows, no whole-array
read, arrays stored in chunks of at most the writer's chunk size, and an
item orbax writes as chunk files (OCDBT gathers a step in memory).
"""

# Runs without TensorFlow.

import json
import os

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("jax_tpu_embedding")
ocp = pytest.importorskip("orbax.checkpoint")

import jax_checkpoints  # noqa: E402
from conftest import benchmark_harness, same_in_the_jax_leg  # noqa: E402
from jax_checkpoints import TABLES, save_step, table_values  # noqa: E402
from jax_tpu_embedding.sparsecore.lib.nn import table_stacking  # noqa: E402

from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import assembly as stack_assembly  # noqa: E402
from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import reader as jax_orbax  # noqa: E402
from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import writer as jax_orbax_writer  # noqa: E402
from tf_tpu_embed_opt.checkpoints.shared import orbax_arrays  # noqa: E402
from tf_tpu_embed_opt.checkpoints.shared import stacks as sparsecore_stacks  # noqa: E402

# Neither TensorFlow nor Keras's backend: the JAX leg runs it alike.
pytestmark = [pytest.mark.oracle("jax-tpu-embedding"), same_in_the_jax_leg]

ADAM = {name: "Adam" for name in TABLES}
TOPOLOGIES = [(1, 4), (2, 4), (4, 2), (3, 2)]


@pytest.mark.parametrize("devices, cores", TOPOLOGIES)
@pytest.mark.parametrize("block_rows", [1, 3, 1000])
def test_shard_blocks_give_every_row_once_contiguous_in_its_shard(
    devices, cores, block_rows
):
    spec = jax_orbax_writer.embedding_spec_for(
        TABLES,
        num_devices=devices,
        sparsecores_per_device=cores,
        stacks={"a_b_c": ["a", "b", "c"]},
    )
    for layout in jax_orbax.layouts(spec):
        vocabulary = layout.unsharded_shape[0]
        shard_rows = layout.total_rows_per_sparse_core_shard
        seen = []
        for rows, first in sparsecore_stacks.shard_blocks(layout, block_rows):
            assert 1 <= len(rows) <= block_rows
            # The block's stacked rows, by the layout's one index computation.
            stacked = sparsecore_stacks.stacked_index(layout, rows)
            np.testing.assert_array_equal(stacked, np.arange(first, first + len(rows)))
            assert len(set(stacked // shard_rows)) == 1  # one SparseCore shard
            seen.extend(rows.tolist())
        assert sorted(seen) == list(range(vocabulary))


def _spy_reads(monkeypatch):
    """Records every read of a stored array: the number of rows of a read
    by rows, "read" for a whole read, "take" for an index read."""
    reads = []
    original = {
        n: getattr(orbax_arrays.StoredArray, n) for n in ("rows", "read", "take")
    }

    def rows(self, start, stop, columns):
        reads.append(stop - start)
        return original["rows"](self, start, stop, columns)

    def read(self):
        reads.append("read")
        return original["read"](self)

    def take(self, rows, columns):
        reads.append("take")
        return original["take"](self, rows, columns)

    for method in (rows, read, take):
        monkeypatch.setattr(orbax_arrays.StoredArray, method.__name__, method)
    return reads


@pytest.mark.parametrize("source, target", [((1, 4), (4, 2)), ((2, 4), (3, 2))])
def test_a_table_streamed_shard_by_shard_is_jax_tpu_embeddings_restack(
    tmp_path, monkeypatch, source, target
):
    values = table_values(seed=21)
    step, *_ = save_step(tmp_path / "src", *source, values)
    reads = _spy_reads(monkeypatch)
    # Chunks of 4 rows of the widest stack (16 float32 columns).
    monkeypatch.setattr(stack_assembly, "CHUNK_BYTES", 4 * 16 * 4)
    reader = jax_orbax.JaxCheckpointReader(step, cache_bytes=0)
    block_bytes = 5 * 8 * 4  # 5 rows of the 8-column tables
    spec = jax_orbax_writer.retarget_embedding_spec(
        reader.embedding_spec, num_devices=target[0], sparsecores_per_device=target[1]
    )
    written = jax_orbax_writer.write_jax_checkpoint(
        tmp_path / "dst",
        1000,
        ((n, reader.streams(n, block_bytes=block_bytes)) for n in reader.tables),
        spec,
        ADAM,
        items_from=step,
        spill_bytes=0,
    )
    # Only reads by rows, each of one block at most (5 rows of an 8-column
    # table, 2 of the 16-column one).
    assert reads and all(isinstance(r, int) for r in reads), reads
    assert max(reads) <= 5
    # Written as zarr chunk files of at most CHUNK_BYTES, not as OCDBT.
    item = os.path.join(written, "model")
    assert not os.path.exists(os.path.join(item, "manifest.ocdbt"))
    stored = [
        os.path.join(root, name)
        for root, _, names in os.walk(item)
        for name in names
        if name in (".zarray", "zarr.json")
    ]
    assert len(stored) == 1 + 3 * 2  # the dense kernel, two stacks of 3 arrays
    for path in stored:
        metadata = json.load(open(path))
        chunks = (
            metadata.get("chunks")
            or metadata["chunk_grid"]["configuration"]["chunk_shape"]
        )
        if metadata["shape"][-1] >= 8:  # a stack, not the dense kernel
            assert np.prod(chunks) * 4 <= stack_assembly.CHUNK_BYTES, path
            assert chunks[0] < metadata["shape"][0], path
    # The values: jax-tpu-embedding's own stacking for the target, bit for
    # bit, restored by orbax as jax-tpu-embedding restores its steps.
    theirs, specs = jax_checkpoints.their_stacks(*target, values)
    manager = ocp.CheckpointManager(tmp_path / "dst")
    model = manager.restore(
        1000, args=ocp.args.Composite(model=ocp.args.PyTreeRestore())
    ).model
    manager.close()
    stacks = model["embedding_layer"]["embedding_table"]["value"]
    jax_checkpoints.assert_same_bits(stacks, theirs)
    unstacked = table_stacking.unshard_and_unstack_tables(
        specs, {k: v["table"] for k, v in stacks.items()}, target[0] * target[1]
    )
    for name in TABLES:
        np.testing.assert_array_equal(
            np.asarray(unstacked[name]), values["table"][name]
        )
    np.testing.assert_array_equal(
        model["dense"]["kernel"], jax_checkpoints.DENSE_KERNEL
    )
    # The step written in chunk files is read back the same way.
    again = jax_orbax.JaxCheckpointReader(written, cache_bytes=0)
    for name in TABLES:
        np.testing.assert_array_equal(
            again.read_tensor(name, "momenta"), values["momentum"][name]
        )


# spill_bytes at exactly what the stacks take: every stack assembled in
# memory, the item written as OCDBT; a byte less: the last stack spills to
# memory-mapped files, the item written as zarr chunk files. The bytes are
# those of jax-tpu-embedding's own stacked arrays for the target.
@pytest.mark.parametrize("short", [0, 1])
def test_stacks_spill_to_files_only_beyond_spill_bytes(tmp_path, short):
    values = table_values(seed=23)
    step, *_ = save_step(tmp_path / "src", 1, 4, values)
    reader = jax_orbax.JaxCheckpointReader(step)
    theirs, _ = jax_checkpoints.their_stacks(2, 4, values)
    stacks_bytes = sum(
        np.asarray(array).nbytes for part in theirs.values() for array in part.values()
    )
    spec = jax_orbax_writer.retarget_embedding_spec(
        reader.embedding_spec, num_devices=2, sparsecores_per_device=4
    )
    written = jax_orbax_writer.write_jax_checkpoint(
        tmp_path / "dst",
        1000,
        ((name, reader.read(name)) for name in reader.tables),
        spec,
        ADAM,
        spill_bytes=stacks_bytes - short,
    )
    ocdbt = os.path.exists(os.path.join(written, "model", "manifest.ocdbt"))
    assert ocdbt == (short == 0)
    restored = ocp.PyTreeCheckpointer().restore(os.path.join(written, "model"))
    stacks = restored["embedding_layer"]["embedding_table"]["value"]
    jax_checkpoints.assert_same_bits(stacks, theirs)
    assert not [n for n in os.listdir(tmp_path / "dst") if n != "1000"]


def test_a_stream_of_a_damaged_array_is_refused_naming_table_and_slot(tmp_path):
    step, *_ = save_step(tmp_path, 1, 4, table_values(seed=22))
    jax_checkpoints.cut_data_file(step)
    reader = jax_orbax.JaxCheckpointReader(step, cache_bytes=0)
    spec = jax_orbax_writer.retarget_embedding_spec(
        reader.embedding_spec, num_devices=2, sparsecores_per_device=2
    )
    with pytest.raises(ValueError, match=r"Table '\w', \w+: cannot be read from"):
        jax_orbax_writer.write_jax_checkpoint(
            tmp_path / "dst",
            1,
            ((n, reader.streams(n)) for n in reader.tables),
            spec,
            ADAM,
            spill_bytes=0,
        )
    assert not os.path.exists(tmp_path / "dst")


def test_bad_block_sizes_are_refused_by_name(tmp_path):
    step, *_ = save_step(tmp_path, 1, 4, table_values())
    reader = jax_orbax.JaxCheckpointReader(step)
    for value in (0, -5, 2.5, True):
        with pytest.raises(ValueError, match="`block_bytes` must be an int >= 1"):
            reader.stream("a", "parameters", block_bytes=value)
        with pytest.raises(ValueError, match="`block_rows` must be an int >= 1"):
            list(sparsecore_stacks.shard_blocks(reader.layout("a"), value))
    with pytest.raises(KeyError, match="has no 'accumulators'"):
        reader.stream("a", "accumulators")
    # A budget below one row still reads a row at a time.
    blocks = list(reader.stream("d", "parameters", block_bytes=1).blocks())
    assert {len(rows) for rows, _ in blocks} == {1}


def _layout():
    spec = jax_orbax_writer.embedding_spec_for(
        {"t": (10, 8)}, num_devices=1, sparsecores_per_device=2
    )
    return jax_orbax.layouts(spec)[0]


def _stream(blocks, shape=(10, 8), dtype=np.float32):
    return sparsecore_stacks.RowStream(shape, dtype, lambda: iter(blocks))


def _rows(*rows, dtype=np.float32, columns=8):
    return np.array(rows), np.zeros((len(rows), columns), dtype)


@pytest.mark.parametrize(
    "stream, match",
    [
        (_stream([_rows(*range(10)), _rows(3)]), r"row 3 comes more than once"),
        (_stream([_rows(1, 1, *range(2, 10)), _rows(0)]), r"row 1 comes more than"),
        (_stream([_rows(*range(9))]), r"miss 1 of its 10 rows \(the first: 9\)"),
        (_stream([_rows(10)]), r"rows outside \[0, 10\)"),
        (_stream([_rows(0, columns=4)]), r"each block must be \(rows, 8\)"),
        (_stream([_rows(0, dtype=np.float64)]), r"holds float64 values; the str"),
        (_stream([], shape=(10, 4)), r"has shape \(10, 4\); its layout says"),
    ],
)
def test_a_stream_that_does_not_fit_its_table_is_refused(stream, match):
    layout = _layout()
    stacked = np.zeros(sparsecore_stacks.stacked_shape(layout), np.float32)
    with pytest.raises(ValueError, match=r"Table 't'.*" + match):
        sparsecore_stacks.place_table(stacked, stream, layout)


def test_checkpoint_convert_streams_with_spill_bytes(tmp_path, capsys, monkeypatch):
    from tf_tpu_embed_opt import cli

    values = table_values(seed=23)
    step, *_ = save_step(tmp_path / "src", 2, 4, values)
    reads = _spy_reads(monkeypatch)
    destination = str(tmp_path / "dst")
    command = ["checkpoint", "convert", step, destination, "--to-jax", "1x4"]
    assert cli.main([*command, "--spill-bytes", "0"]) == 0
    assert not os.path.exists(
        os.path.join(destination, "1000", "model", "manifest.ocdbt")
    )
    theirs, _ = jax_checkpoints.their_stacks(1, 4, values)
    restored = ocp.PyTreeCheckpointer().restore(
        os.path.join(destination, "1000", "model")
    )
    jax_checkpoints.assert_same_bits(
        restored["embedding_layer"]["embedding_table"]["value"], theirs
    )
    # The source's stacks fit the reader's cache here: read whole, once each.
    assert reads.count("read") == 2 * 3 and "take" not in reads
    for arguments, match in [
        (["--spill-bytes", "0"], "--spill-bytes goes with --to-jax"),
        (["--to-jax", "1x4", "--spill-bytes", "-1"], "--spill-bytes: must be >= 0"),
    ]:
        capsys.readouterr()
        target = str(tmp_path / "refused")
        assert cli.main(["checkpoint", "convert", step, target, *arguments]) == 2
        assert match in capsys.readouterr().err
        assert not os.path.exists(target)


@benchmark_harness
def test_the_larger_than_memory_benchmark_checks_every_row(tmp_path):
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parent.parent
    if not (root / "benchmarks" / "jax_table_larger_than_memory.py").is_file():
        pytest.skip("no benchmarks/ next to tests/")
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.jax_table_larger_than_memory"]
        + ["--table-gib", "0.005", "--memory-gib", "4", "--directory", str(tmp_path)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = int(0.005 * 2**30) // (128 * 4)
    assert f"checked: all {2 * rows:,} rows of the table and the slot" in (
        result.stdout
    )
    assert "--spill-bytes 0" in result.stdout and "exit 0" in result.stdout


def _restore_as_jax_tpu_embedding_head(root, step, abstract):
    """What jax-tpu-embedding's newest `checkpoint_utils.restore_checkpoint`
    does with orbax (its code, `lib/flax/nnx/checkpoint_utils.py`; that
    release is not installable here): a read-only CheckpointManager with
    StandardCheckpointHandler for `model` and `optimizer` and
    ProtoCheckpointHandler for `embedding_spec`; the step's item metadata
    must name all three; then a StandardRestore of the model and optimizer
    states to the job's abstract ones."""
    from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import (
        spec_proto as jax_spec_proto,
    )

    registry = ocp.DefaultCheckpointHandlerRegistry()
    standard = ocp.StandardCheckpointHandler()
    registry.add("model", ocp.args.StandardRestore, standard)
    registry.add("optimizer", ocp.args.StandardRestore, standard)
    registry.add("embedding_spec", ocp.args.ProtoRestore, ocp.ProtoCheckpointHandler())
    manager = ocp.CheckpointManager(
        root,
        options=ocp.CheckpointManagerOptions(read_only=True),
        handler_registry=registry,
    )
    try:
        assert step in manager.all_steps()
        metadata = manager.item_metadata(step)
        for key in ("model", "optimizer", "embedding_spec"):
            if key not in metadata:
                raise ValueError(f'No "{key}" found in checkpoint metadata.')
        return manager.restore(
            step,
            args=ocp.args.Composite(
                model=ocp.args.StandardRestore(abstract["model"]),
                optimizer=ocp.args.StandardRestore(abstract["optimizer"]),
                embedding_spec=ocp.args.ProtoRestore(
                    jax_spec_proto.message_class("EmbeddingSpecProto")
                ),
            ),
        )
    finally:
        manager.close()


def _abstract(step_dir, item):
    restored = ocp.PyTreeCheckpointer().restore(os.path.join(step_dir, item))
    return jax.tree_util.tree_map(
        lambda leaf: jax.ShapeDtypeStruct(np.shape(leaf), np.asarray(leaf).dtype),
        restored,
    )


# A step written from tables alone (from Keras state, or TensorFlow's
# layouts) holds the tables and the spec; the target job's own step gives
# the rest (--items-from), which jax-tpu-embedding's restore_checkpoint needs.
@pytest.mark.parametrize("spill", ["0", None])
def test_jax_tpu_embeddings_restore_reads_a_step_given_the_jobs_items(
    tmp_path, capsys, spill
):
    from tf_tpu_embed_opt import cli

    job, *_ = save_step(tmp_path / "job", 2, 4, table_values(seed=24))
    values = table_values(seed=25)
    spec = jax_orbax_writer.embedding_spec_for(
        TABLES,
        num_devices=1,
        sparsecores_per_device=4,
        stacks={"a_b_c": ["a", "b", "c"]},
    )
    states = [
        (
            n,
            {
                "parameters": values["table"][n],
                "momenta": values["momentum"][n],
                "velocities": values["velocity"][n],
            },
        )
        for n in TABLES
    ]
    alone = jax_orbax_writer.write_jax_checkpoint(
        tmp_path / "alone", 7, states, spec, ADAM
    )
    abstract = {item: _abstract(job, item) for item in ("model", "optimizer")}
    with pytest.raises(ValueError, match='No "optimizer" found'):
        _restore_as_jax_tpu_embedding_head(tmp_path / "alone", 7, abstract)
    destination = str(tmp_path / "dst")
    arguments = ["checkpoint", "convert", alone, destination, "--to-jax", "2x4"]
    arguments += ["--spec-from", job, "--items-from", job]
    if spill is not None:
        arguments += ["--spill-bytes", spill]
    assert cli.main(arguments) == 0, capsys.readouterr().err
    restored = _restore_as_jax_tpu_embedding_head(destination, 7, abstract)
    theirs, _ = jax_checkpoints.their_stacks(2, 4, values)
    jax_checkpoints.assert_same_bits(
        restored.model["embedding_layer"]["embedding_table"]["value"], theirs
    )
    np.testing.assert_array_equal(
        restored.model["dense"]["kernel"], jax_checkpoints.DENSE_KERNEL
    )
    np.testing.assert_array_equal(
        restored.optimizer["mu"]["kernel"],
        jax_checkpoints.DENSE_OPTIMIZER_STATE["mu"]["kernel"],
    )
    assert restored.embedding_spec.stacked_table_specs[0].num_sparsecores == 8
