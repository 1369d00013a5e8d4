"""SparseCore checkpoints: unshard and shard exactly as TensorFlow does.

Oracles, all TensorFlow's own code run on CPU:
- the layout arithmetic: `_shard_from_cpu_to_sc` and `_unshard_from_sc_to_cpu`
  of `tpu_embedding_v3_checkpoint_adapter`, and `EmbeddingReshardCallback`;
- the layouts: `_stack_tables_with_same_table_dim_and_optimizer`, the function
  `TPUEmbeddingV2.__init__` stacks and pads tables with;
- the checkpoint form: variables tracked as `TPUEmbeddingV2._create_variables`
  tracks them, saved per device by TensorFlow's `TPUEmbeddingShardedSaveable`,
  and the layouts by `SparseCoreLayoutsTrackable`, written by
  `tf.train.Checkpoint`; `TpuEmbeddingV3CheckpointAdapter.create_from_checkpoint`
  and `TPUEmbeddingForServing` read what this package writes.
"""

import inspect
import os

import numpy as np
import pytest

pb2 = pytest.importorskip(
    "tensorflow.core.tpu.kernels.sparse_core_layout_pb2",
    reason="this TensorFlow has no SparseCore layout proto",
)
adapter = pytest.importorskip(
    "tensorflow.python.tpu.tpu_embedding_v3_checkpoint_adapter",
    reason="this TensorFlow has no SparseCore checkpoint adapter (the oracle)",
)

import tensorflow as tf  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from tensorflow.python.tpu import tpu_embedding_v3 as v3  # noqa: E402
from tensorflow.python.tpu import tpu_embedding_v3_utils as v3_utils  # noqa: E402
from tensorflow.python.trackable import autotrackable  # noqa: E402
from tensorflow.python.trackable import base as trackable_base  # noqa: E402

from tf_tpu_embed_opt import checkpoints, embedding  # noqa: E402
from tf_tpu_embed_opt.checkpoints import sparsecore as scl  # noqa: E402
from tf_tpu_embed_opt.checkpoints.shared import keys as checkpoint_keys  # noqa: E402
from tf_tpu_embed_opt.checkpoints.shared import stacks as shared_stacks  # noqa: E402
from tf_tpu_embed_opt.checkpoints.sparsecore import reader as sparsecore_reader  # noqa: E402
from tf_tpu_embed_opt.definitions import registry  # noqa: E402

E = tf.tpu.experimental.embedding

# TensorFlow 2.20 (tensorflow-tpu 2.20, a CI leg) lays SparseCore checkpoints
# out as 2.21 does: `_shard_from_cpu_to_sc`, `unshuffle_from_sc_to_cpu`,
# `remove_padding_from_sc` and the saved variables are the
# same code. Two contracts of its adapter differ (2.20 wheel,
# tpu_embedding_v3_checkpoint_adapter.py):
# - `_unshard_from_sc_to_cpu(stacked_table, layouts)` takes what restore_v2
#   returns, a list of tensors, and unshards `stacked_table[0]` (l. 137-176);
#   2.21 takes the tensor itself. `tf_unshard` passes each its own.
# - its resharding plan (l. 440-481) keys one callback per stack of the
#   checkpoint and reshards it into the target's stack of the same name: it
#   changes the number of SparseCores and devices, not which tables are stacked
#   together (a target's stack of another name gets no callback). 2.21 gathers
#   each target stack's tables from any checkpoint stacks.
TF_MINOR = tuple(int(part) for part in tf.__version__.split(".")[:2])
ADAPTER_2_20 = TF_MINOR < (2, 21)


def tf_unshard(stacked, ordered):
    """TensorFlow's unshard of the stacked value `stacked` (numpy) into tables."""
    value = tf.constant(stacked)
    return adapter._unshard_from_sc_to_cpu([value] if ADAPTER_2_20 else value, ordered)


_ORACLES = {
    "tpu_embedding_v3_checkpoint_adapter": (
        adapter,
        [
            "_shard_from_cpu_to_sc",
            "_unshard_from_sc_to_cpu",
            "_reorg_layouts",
            "EmbeddingReshardCallback",
            "TpuEmbeddingV3CheckpointAdapter",
        ],
    ),
    "tpu_embedding_v3": (
        v3,
        [
            "_stack_tables_with_same_table_dim_and_optimizer",
            "TPUEmbeddingShardedSaveable",
        ],
    ),
    "tpu_embedding_v3_utils": (v3_utils, ["SparseCoreLayoutsTrackable"]),
}
_MISSING = [
    f"{module}.{name}"
    for module, (value, names) in _ORACLES.items()
    for name in names
    if not hasattr(value, name)
]
_STACKING_ARGUMENTS = [
    "table_config",
    "flat_features",
    "num_partitions",
    "num_sc_per_partition",
    "sparse_core_embedding_config",
]
if _MISSING or (
    list(
        inspect.signature(v3._stack_tables_with_same_table_dim_and_optimizer).parameters
    )
    != _STACKING_ARGUMENTS
):
    pytest.skip(
        "this TensorFlow lacks the SparseCore oracles this file uses "
        f"({_MISSING or 'another stacking signature'})",
        allow_module_level=True,
    )
# TPUEmbeddingForServing restores SparseCore checkpoints from TF 2.17 or so on.
SERVING_READS_SPARSECORE = hasattr(
    E.TPUEmbeddingForServing, "_create_variables_from_stacked_tables"
)
RNG = np.random.default_rng(20261123)


# --------------------------------------------------------------------------
# Helpers: random layouts, TensorFlow's layouts, TensorFlow's checkpoint form


@st.composite
def stacks(draw, name="stack", prefix="t"):
    """One stacked table as TPUEmbeddingV2 lays it out, with random geometry."""
    cores = draw(st.integers(1, 8))
    partitions = draw(
        st.sampled_from([p for p in range(1, cores + 1) if cores % p == 0])
    )
    count = draw(st.integers(1, 4))
    widths = [draw(st.integers(1, 6)) for _ in range(count)]
    padded_width = max(widths) + draw(st.integers(0, 3))
    layouts, offset = [], 0
    for index in draw(st.permutations(range(count))):
        rows = draw(st.integers(1, 30))
        per_shard = -(-rows // cores) + draw(st.integers(0, 2))
        layouts.append(
            pb2.SparseCoreTableLayout(
                table_name=f"{prefix}{index}",
                stacked_table_name=name,
                num_sparse_cores=cores,
                num_partitions=partitions,
                unsharded_shape=[rows, widths[index]],
                unsharded_padded_shape=[per_shard * cores, padded_width],
                sparse_core_shard_row_offset=offset,
                sparse_core_shard_rotation=draw(st.integers(0, cores - 1)),
            )
        )
        offset += per_shard
    for layout in layouts:
        layout.total_rows_per_sparse_core_shard = offset
    return layouts


def random_tables(layouts):
    return {
        layout.table_name: RNG.standard_normal(tuple(layout.unsharded_shape)).astype(
            np.float32
        )
        for layout in layouts
    }


def tf_shard(tables, layouts, device=None):
    """TensorFlow's sharded value (of one device, or all) for a stack."""
    ordered = sorted(layouts, key=lambda t: t.sparse_core_shard_row_offset)
    rows = ordered[0].num_sparse_cores * ordered[0].total_rows_per_sparse_core_shard
    columns = ordered[0].unsharded_padded_shape[1]
    start, length = 0, rows
    if device is not None:
        length = rows // ordered[0].num_partitions
        start = device * length
    return adapter._shard_from_cpu_to_sc(
        [tf.constant(tables[t.table_name]) for t in ordered],
        f"{rows} {columns} {start},{length}:0,{columns}",
        ordered,
    ).numpy()


def tensorflow_layouts(
    specs, partitions=2, cores_per_partition=4, batch=16, config=None
):
    """Layouts computed by TPUEmbeddingV2's own stacking function.

    `specs`: (name, vocabulary_size, dim, TensorFlow optimizer) per table.
    """
    tables = [
        E.TableConfig(vocabulary_size=v, dim=d, name=n, optimizer=o)
        for n, v, d, o in specs
    ]
    features = [
        (t.name, E.FeatureConfig(table=t, output_shape=[batch], name=t.name))
        for t in tables
    ]
    stacking = v3._stack_tables_with_same_table_dim_and_optimizer(
        tables, features, partitions, cores_per_partition, config
    )
    return list(stacking.table_to_layout.values())


class _ShardedStackedVariable(trackable_base.Trackable):
    """Saves like `TPUEmbeddingShardedVariable`: one slice per device.

    `_gather_saveables_for_checkpoint` is the one of
    tensorflow/python/tpu/tpu_embedding_v3.py (`TPUEmbeddingShardedVariable`,
    l. 248-270 in TF 2.21), with TensorFlow's own `TPUEmbeddingShardedSaveable`
    (l. 141) per device variable.
    """

    def __init__(self, shards):
        self.shards = shards

    def _gather_saveables_for_checkpoint(self):
        def factory(name):
            return [
                v3.TPUEmbeddingShardedSaveable(var, i, len(self.shards), 0, name)
                for i, var in enumerate(self.shards)
            ]

        return {trackable_base.VARIABLE_VALUE_KEY: factory}


def track_layouts(holder, layouts):
    """Tracks `layouts` (layout messages, or the bytes to store) on `holder`
    as `TPUEmbeddingV2._track_restore_info_for_cpu` does (TF 2.21
    tpu_embedding_v3.py l. 1100-1114), replacing any there."""
    if not isinstance(layouts, bytes):
        layouts = pb2.SparseCoreTableLayouts(tables=layouts).SerializeToString()
    holder._track_trackable(
        v3_utils.SparseCoreLayoutsTrackable(tf.constant(layouts, dtype=tf.string)),
        v3_utils.SPARSECORE_LAYOUTS_CHECKPOINT_KEY,
        overwrite=True,
    )


def tensorflow_style_embedding(layouts, states, slot_names, values=True):
    """An object with TPUEmbeddingV2's checkpoint dependencies.

    As in `TPUEmbeddingV2._create_variables` (tpu_embedding_v3.py l. 1034-1058
    in TF 2.21) the stacked table is tracked as `<stacked>` and each slot as
    `<stacked>/<slot>` (`_add_variable_with_custom_getter` ->
    `_track_trackable`), and as in `_track_restore_info_for_cpu` (l. 1100-1114)
    the layouts as `_sparse_core_table_layouts`.
    The values are TensorFlow's `_shard_from_cpu_to_sc` of `states` (zeros
    when `values` is False, for restoring into).
    """
    stacks = {}
    for layout in layouts:
        stacks.setdefault(layout.stacked_table_name, []).append(layout)
    holder = autotrackable.AutoTrackable()
    variables = {}
    for stacked, members in sorted(stacks.items()):
        for slot in ["parameters"] + slot_names:
            shards = []
            for device in range(members[0].num_partitions):
                value = tf_shard(
                    {t.table_name: states[t.table_name][slot] for t in members},
                    members,
                    device,
                )
                shards.append(tf.Variable(value if values else np.zeros_like(value)))
            local = stacked if slot == "parameters" else f"{stacked}/{slot}"
            holder._track_trackable(_ShardedStackedVariable(shards), name=local)
            variables[(stacked, slot)] = shards
    track_layouts(holder, layouts)
    return holder, variables


def random_states(layouts, slot_names):
    return {
        layout.table_name: {
            slot: RNG.standard_normal(tuple(layout.unsharded_shape)).astype(np.float32)
            for slot in ["parameters"] + slot_names
        }
        for layout in layouts
    }


MIXED = [
    ("apps", 100, 8, E.Adam(learning_rate=0.1)),
    ("users", 37, 5, E.Adam(learning_rate=0.1)),
    ("videos", 9, 8, E.Adam(learning_rate=0.1)),
    ("words", 50, 8, E.Adagrad(learning_rate=0.1)),
]


@pytest.fixture(scope="module")
def tensorflow_checkpoint(tmp_path_factory):
    """A checkpoint in TPUEmbeddingV2's form, written by TensorFlow's savers."""
    layouts = tensorflow_layouts(MIXED)
    by_table = {n: o for n, _, _, o in MIXED}
    states = {}
    for layout in layouts:
        slots = by_table[layout.table_name]._slot_names()
        states.update(random_states([layout], slots))
    holder = autotrackable.AutoTrackable()
    for stacked in sorted({t.stacked_table_name for t in layouts}):
        mine = [t for t in layouts if t.stacked_table_name == stacked]
        slots = by_table[mine[0].table_name]._slot_names()
        part, _ = tensorflow_style_embedding(mine, states, slots)
        for name, child in part._trackable_children().items():
            holder._track_trackable(child, name=name, overwrite=True)
    # One layouts proto for all tables, as TPUEmbeddingV2 saves it.
    track_layouts(holder, layouts)
    path = tf.train.Checkpoint(embedding=holder).save(
        str(tmp_path_factory.mktemp("tf") / "ckpt")
    )
    optimizers = {n: o for n, _, _, o in MIXED}
    return path, layouts, states, optimizers


# --------------------------------------------------------------------------
# The layout arithmetic equals TensorFlow's


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stacks())
def test_shard_and_unshard_equal_tensorflows(layouts):
    tables = random_tables(layouts)
    stacked = scl.shard_tables(tables, layouts)
    np.testing.assert_array_equal(stacked, tf_shard(tables, layouts))
    per_device = stacked.shape[0] // layouts[0].num_partitions
    for device in range(layouts[0].num_partitions):
        np.testing.assert_array_equal(
            stacked[device * per_device : (device + 1) * per_device],
            tf_shard(tables, layouts, device),
        )
    # Unsharding anything (padding holding noise too) is TensorFlow's unshard.
    noisy = RNG.standard_normal(stacked.shape).astype(np.float32)
    ordered = sorted(layouts, key=lambda t: t.sparse_core_shard_row_offset)
    for source in (stacked, noisy):
        expected = tf_unshard(source, ordered)
        for layout, table in zip(ordered, expected):
            mine = scl.unshard_table(source, layout)
            np.testing.assert_array_equal(mine, table.numpy())
            if source is stacked:
                np.testing.assert_array_equal(mine, tables[layout.table_name])


def test_layouts_of_tensorflows_stacker_round_trip():
    layouts = tensorflow_layouts(MIXED, partitions=4, cores_per_partition=2)
    grouped = scl.group_layouts(layouts)
    assert sorted(grouped) == ["apps_users_videos", "words"]
    tables = random_tables(layouts)
    for members in grouped.values():
        stacked = scl.shard_tables(
            {t.table_name: tables[t.table_name] for t in members}, members
        )
        np.testing.assert_array_equal(stacked, tf_shard(tables, members))
        for layout in members:
            np.testing.assert_array_equal(
                scl.unshard_table(stacked, layout), tables[layout.table_name]
            )


def test_slot_names_are_the_ones_tensorflow_creates():
    # TPUEmbeddingV2 names slot variables by the optimizer's `_slot_names()`;
    # the definitions' `Slot.name` must be those for every algorithm.
    for definition in registry.DEFINITIONS:
        opt = getattr(embedding, definition.name)(learning_rate=0.1)
        assert opt._slot_names() == [s.name for s in definition.slots]
        if definition.tensorflow_class:
            theirs = getattr(E, definition.tensorflow_class)(learning_rate=0.1)
            assert theirs._slot_names() == [s.name for s in definition.slots]


def test_checkpoint_key_escapes_as_tensorflow():
    from tensorflow.python.trackable import trackable_utils

    for stacked, slot in [("a_b", "momenta"), ("x.y", "ms"), ("t", "parameters")]:
        local = stacked if slot == "parameters" else f"{stacked}/{slot}"
        expected = (
            f"model/my..emb/{trackable_utils.escape_local_name(local)}"
            "/.ATTRIBUTES/VARIABLE_VALUE"
        )
        assert scl.checkpoint_key("model/my.emb", stacked, slot) == expected
    # The shared escaping (tf_tpu_embed_opt.checkpoints.shared.keys) is TensorFlow's,
    # and `unescape` undoes it, also on names made of escape characters.
    for name in ["a.b/c", ".S", "..", "./.", "x.S/y..z", "", "S"]:
        escaped = checkpoint_keys.escape(name)
        assert escaped == trackable_utils.escape_local_name(name)
        assert checkpoint_keys.unescape(escaped) == name


# --------------------------------------------------------------------------
# Reading checkpoints in TPUEmbeddingV2's form


def test_read_tensorflow_written_checkpoint(tensorflow_checkpoint):
    path, layouts, states, optimizers = tensorflow_checkpoint
    seen = []
    for name, state in scl.read_tables(path, optimizers):
        seen.append(name)
        assert sorted(state) == sorted(["parameters"] + optimizers[name]._slot_names())
        for slot, value in state.items():
            assert value.dtype == np.float32
            np.testing.assert_array_equal(value, states[name][slot])
    assert seen == ["apps", "users", "videos", "words"]
    object_path, read = scl.read_layouts(path)
    assert object_path == "embedding"
    assert {t.table_name: t for t in read} == {t.table_name: t for t in layouts}


def test_read_is_lazy_one_stack_at_a_time(tensorflow_checkpoint):
    path, _, _, optimizers = tensorflow_checkpoint
    tables = scl.read_tables(path, optimizers)
    first_name, _ = next(tables)
    assert first_name == "apps"
    assert [name for name, _ in tables] == ["users", "videos", "words"]


# --------------------------------------------------------------------------
# Writing: what TensorFlow reads back


def test_written_checkpoint_matches_tensorflows_form(tmp_path, tensorflow_checkpoint):
    tf_path, layouts, states, optimizers = tensorflow_checkpoint
    path = scl.write_checkpoint(str(tmp_path / "ckpt"), layouts, states, optimizers)
    ours = tf.train.load_checkpoint(path)
    theirs = tf.train.load_checkpoint(tf_path)
    our_keys = set(ours.get_variable_to_shape_map())
    their_keys = set(theirs.get_variable_to_shape_map())
    # tf.train.Checkpoint.save adds a save counter; the rest is the same.
    assert their_keys - our_keys == {"save_counter/.ATTRIBUTES/VARIABLE_VALUE"}
    assert our_keys < their_keys
    for key in our_keys - {"_CHECKPOINTABLE_OBJECT_GRAPH"}:
        np.testing.assert_array_equal(ours.get_tensor(key), theirs.get_tensor(key))
    # TensorFlow's adapter finds the layouts TPUEmbeddingV2 would compare.
    found = adapter.TpuEmbeddingV3CheckpointAdapter.create_from_checkpoint(path)
    assert found._checkpoint_layouts == {t.table_name: t for t in layouts}


def test_written_checkpoint_restores_into_tensorflows_objects(tmp_path):
    layouts = tensorflow_layouts(MIXED[:3], partitions=2, cores_per_partition=4)
    slots = ["momenta", "velocities"]
    states = random_states(layouts, slots)
    path = scl.write_checkpoint(str(tmp_path / "ckpt"), layouts, states, E.Adam(0.1))
    target, variables = tensorflow_style_embedding(layouts, states, slots, values=False)
    tf.train.Checkpoint(embedding=target).read(path).assert_existing_objects_matched()
    for (stacked, slot), shards in variables.items():
        members = [t for t in layouts if t.stacked_table_name == stacked]
        expected = tf_shard(
            {t.table_name: states[t.table_name][slot] for t in members}, members
        )
        np.testing.assert_array_equal(
            np.concatenate([v.numpy() for v in shards]), expected
        )


@pytest.mark.skipif(
    not SERVING_READS_SPARSECORE,
    reason="this TensorFlow's TPUEmbeddingForServing does not read SparseCore "
    "checkpoints",
)
def test_tpu_embedding_for_serving_restores_written_tables(tmp_path):
    layouts = tensorflow_layouts(MIXED[:3])
    states = random_states(layouts, ["momenta", "velocities"])
    path = scl.write_checkpoint(str(tmp_path / "ckpt"), layouts, states, "Adam")
    configs = {
        t.table_name: E.TableConfig(
            vocabulary_size=t.unsharded_shape[0],
            dim=t.unsharded_shape[1],
            name=t.table_name,
        )
        for t in layouts
    }
    features = {n: E.FeatureConfig(table=c, name=n) for n, c in configs.items()}
    serving = E.TPUEmbeddingForServing(features, E.Adam(learning_rate=0.1))
    # Slots are not restored by the serving class; only the tables are bound.
    status = tf.train.Checkpoint(embedding=serving).read(path)
    serving.build()
    status.expect_partial()
    for config, variable in serving.embedding_tables.items():
        np.testing.assert_array_equal(
            variable.numpy(), states[config.name]["parameters"]
        )
    # Saved again, it keeps the layouts and the stack as a scalar, and its
    # tables unstacked without slots: no TPUEmbeddingV2 checkpoint, refused
    # so (it was "has shape [] in the checkpoint; ... need [256, 8]").
    again = tf.train.Checkpoint(embedding=serving).save(str(tmp_path / "again" / "c"))
    saved = dict(tf.train.list_variables(again))
    assert saved["embedding/apps_users_videos/.ATTRIBUTES/VARIABLE_VALUE"] == []
    assert saved[
        "embedding/_variables/users/parameters/.ATTRIBUTES/VARIABLE_VALUE"
    ] == [
        37,
        5,
    ]
    refusal = (
        r"holds stacked table 'apps_users_videos' as a scalar and its tables "
        r"\['apps', 'users', 'videos'\] unstacked, under "
        r"'embedding/_variables/<table>/parameters', without optimizer slots: a "
        r"TPUEmbeddingForServing saves so after restoring a SparseCore checkpoint"
    )
    for call in (
        lambda: checkpoints.open_checkpoint(again),
        lambda: checkpoints.open_checkpoint(again, algorithms="Adam"),
        lambda: list(scl.read_tables(again, "Adam")),
    ):
        with pytest.raises(ValueError, match=refusal):
            call()


# TensorFlow logs "Table stacking is disabled." with the deprecated logging.warn.
@pytest.mark.filterwarnings("ignore:The 'warn' function is deprecated")
@pytest.mark.parametrize("unstacked", [False, True], ids=["stacked", "unstacked"])
def test_tensorflows_adapter_reshards_written_checkpoint(tmp_path, unstacked):
    # What TPUEmbeddingV2's restore does with a checkpoint of other layouts:
    # the adapter plans from the checkpoint's layouts, its callbacks read and
    # reshard whole stacks (tpu_embedding_v3_checkpoint_adapter.py).
    source = tensorflow_layouts(MIXED[:3], partitions=2, cores_per_partition=4)
    target = tensorflow_layouts(
        MIXED[:3],
        partitions=1,
        cores_per_partition=2,
        config=v3.SparseCoreEmbeddingConfig(disable_table_stacking=unstacked),
    )
    states = random_states(source, ["momenta", "velocities"])
    path = scl.write_checkpoint(str(tmp_path / "ckpt"), source, states, "Adam")
    reader = tf.train.load_checkpoint(path)
    plan = adapter.TpuEmbeddingV3CheckpointAdapter.create_from_checkpoint(path)
    plan.initialize_reshard_callbacks({t.table_name: t for t in target})
    stacks = scl.group_layouts(target)
    assert len(stacks) == (3 if unstacked else 1)
    for stacked, members in stacks.items():
        rows, columns = (
            members[0].num_sparse_cores * members[0].total_rows_per_sparse_core_shard,
            members[0].unsharded_padded_shape[1],
        )
        spec = f"{rows} {columns} 0,{rows}:0,{columns}"
        for slot in ["parameters", "momenta", "velocities"]:
            local = stacked if slot == "parameters" else f"{stacked}/{slot}"
            callback = plan.get_reshard_callback(local)
            if ADAPTER_2_20 and unstacked:
                # TensorFlow 2.20 does not restack on restore (README, "SparseCore
                # checkpoints"): no callback, so `write_checkpoint` in the target
                # layouts is the way there.
                assert callback is None
                continue
            keys, _ = callback.update_restore_inputs(
                scl.checkpoint_key("embedding", stacked, slot), spec
            )
            values = [tf.constant(reader.get_tensor(k)) for k in keys]
            resharded = callback.reshard(values, spec).numpy()
            expected = scl.shard_tables(
                {t.table_name: states[t.table_name][slot] for t in members}, members
            )
            np.testing.assert_array_equal(resharded, expected)


@pytest.mark.parametrize(
    "definition", [d for d in registry.DEFINITIONS], ids=lambda d: d.name
)
def test_every_algorithm_round_trips(tmp_path, definition):
    layouts = tensorflow_layouts(
        [("a", 20, 4, E.SGD(0.1)), ("b", 7, 3, E.SGD(0.1))], 1, 4
    )
    slots = [s.name for s in definition.slots]
    states = random_states(layouts, slots)
    optimizer = getattr(embedding, definition.name)(learning_rate=0.1)
    path = scl.write_checkpoint(
        str(tmp_path / "ckpt"), layouts, states, optimizer, object_path="model/emb"
    )
    read = dict(scl.read_tables(path, optimizer))
    assert sorted(read) == ["a", "b"]
    for name, state in read.items():
        assert sorted(state) == sorted(["parameters"] + slots)
        for slot, value in state.items():
            np.testing.assert_array_equal(value, states[name][slot])


def test_states_may_be_a_function_called_once_per_table(tmp_path):
    layouts = tensorflow_layouts(MIXED)
    adam = [t for t in layouts if t.table_name != "words"]
    states = random_states(adam, ["momenta", "velocities"])
    states.update(
        random_states([t for t in layouts if t not in adam], ["accumulators"])
    )
    calls = []

    def state_of(name):
        calls.append(name)
        return states[name]

    optimizers = {n: o for n, _, _, o in MIXED}
    path = scl.write_checkpoint(str(tmp_path / "c"), layouts, state_of, optimizers)
    assert calls == ["apps", "users", "videos", "words"]
    for name, state in scl.read_tables(path, optimizers):
        for slot, value in state.items():
            np.testing.assert_array_equal(value, states[name][slot])


# --------------------------------------------------------------------------
# Refusals


def _listing(directory):
    return sorted(os.listdir(directory))


def test_read_refuses_another_algorithms_slots(tensorflow_checkpoint):
    path, _, _, optimizers = tensorflow_checkpoint
    wrong = dict(optimizers, words=E.Adam(learning_rate=0.1))
    with pytest.raises(ValueError, match=r"share stacked table|no slot 'momenta'"):
        list(scl.read_tables(path, wrong))
    adagrad_everywhere = {n: E.Adagrad(learning_rate=0.1) for n in optimizers}
    with pytest.raises(
        ValueError, match=r"slot 'accumulators' of stacked table 'apps_users_videos'"
    ):
        list(scl.read_tables(path, adagrad_everywhere))
    sgd_everywhere = {n: E.SGD(learning_rate=0.1) for n in optimizers}
    with pytest.raises(
        ValueError, match=r"'apps_users_videos'.*slots \['momenta', 'velocities'\]"
    ):
        list(scl.read_tables(path, sgd_everywhere))


def test_read_refuses_unknown_and_missing_tables(tensorflow_checkpoint):
    path, _, _, optimizers = tensorflow_checkpoint
    with pytest.raises(ValueError, match=r"tables \['ads'\] that the SparseCore"):
        list(scl.read_tables(path, dict(optimizers, ads=E.SGD(0.1))))
    partial = dict(optimizers)
    del partial["users"]
    with pytest.raises(ValueError, match=r"no optimizer for tables \['users'\]"):
        list(scl.read_tables(path, partial))
    with pytest.raises(ValueError, match="unknown algorithm 'Adamax'"):
        list(scl.read_tables(path, "Adamax"))
    with pytest.raises(TypeError, match="`optimizer`"):
        list(scl.read_tables(path, 3.0))


def _checkpoint_with_layouts(tmp_path, layouts_value, states_layouts=None):
    """A TPUEmbeddingV2-form checkpoint whose layouts proto is replaced."""
    layouts = tensorflow_layouts(MIXED[:3])
    states = random_states(layouts, [])
    holder, _ = tensorflow_style_embedding(states_layouts or layouts, states, [])
    track_layouts(holder, layouts_value)
    return tf.train.Checkpoint(embedding=holder).write(str(tmp_path / "bad"))


def test_read_refuses_layouts_that_do_not_match_the_tensors(tmp_path):
    layouts = tensorflow_layouts(MIXED[:3])
    bigger = [type(t)() for t in layouts]
    for new, old in zip(bigger, layouts):
        new.CopyFrom(old)
        new.total_rows_per_sparse_core_shard += 4
    path = _checkpoint_with_layouts(
        tmp_path, pb2.SparseCoreTableLayouts(tables=bigger).SerializeToString()
    )
    with pytest.raises(
        ValueError,
        match=r"stacked table 'apps_users_videos' \(tables \['apps', 'users', "
        r"'videos'\]\) has shape \[256, 8\].*need \[288, 8\]",
    ):
        list(scl.read_tables(path, "SGD"))


def test_read_refuses_corrupted_layouts(tmp_path):
    path = _checkpoint_with_layouts(tmp_path, b"\xff\xff\xff garbage")
    with pytest.raises(ValueError, match="not a serialized SparseCoreTableLayouts"):
        list(scl.read_tables(path, "SGD"))
    layouts = tensorflow_layouts(MIXED[:3])
    layouts[1].sparse_core_shard_row_offset = 1
    path = _checkpoint_with_layouts(
        tmp_path, pb2.SparseCoreTableLayouts(tables=layouts).SerializeToString()
    )
    with pytest.raises(ValueError, match=r"Table '(users|videos)' of stacked table"):
        list(scl.read_tables(path, "SGD"))


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("num_sparse_cores", 0, "num_sparse_cores must be >= 1"),
        ("num_partitions", 3, "num_partitions must be >= 1 and divide"),
        ("unsharded_padded_shape", [8, 8], "at least unsharded_shape"),
        ("sparse_core_shard_rotation", -1, "must be >= 0"),
        ("table_name", "", "no table_name"),
        ("stacked_table_name", "", "stacked_table_name is empty"),
        ("unsharded_shape", [0, 8], r"unsharded_shape must be \[rows >= 1"),
        ("unsharded_padded_shape", [101, 8], "not a multiple of num_sparse_cores"),
        ("total_rows_per_sparse_core_shard", 3, "exceed total_rows"),
    ],
)
def test_parse_layouts_names_the_bad_field(field, value, message):
    layout = tensorflow_layouts(MIXED[:1])[0]
    if isinstance(value, list):
        del getattr(layout, field)[:]
        getattr(layout, field).extend(value)
    else:
        setattr(layout, field, value)
    with pytest.raises(ValueError, match=message):
        scl.parse_layouts([layout])
    with pytest.raises(ValueError, match="two SparseCore layouts"):
        scl.parse_layouts(tensorflow_layouts(MIXED[:1]) * 2)


def test_parse_layouts_refuses_a_stack_of_two_geometries_and_what_is_no_layout():
    layouts = tensorflow_layouts(MIXED[:3])
    stacks = shared_stacks.group_layouts(layouts)
    ((stacked, members),) = [(k, v) for k, v in stacks.items() if len(v) > 1]
    # Each layout is consistent in itself; the stack's shards then differ.
    members[-1].total_rows_per_sparse_core_shard += 8
    with pytest.raises(
        ValueError,
        match=rf"Tables '{members[0].table_name}' and '{members[-1].table_name}' "
        rf"of stacked table '{stacked}' disagree on \(num_sparse_cores",
    ):
        scl.parse_layouts(layouts)
    with pytest.raises(TypeError, match="Expected SparseCoreTableLayout messages; "):
        scl.parse_layouts([layouts[0], "apps"])
    with pytest.raises(TypeError, match="must be a SparseCoreTableLayouts proto"):
        scl.parse_layouts("apps")


def test_read_refuses_non_checkpoints(tmp_path, tensorflow_checkpoint):
    with pytest.raises(ValueError, match="not a readable TensorFlow checkpoint"):
        list(scl.read_tables(str(tmp_path / "nothing"), "SGD"))
    (tmp_path / "text.index").write_bytes(b"not an index")
    with pytest.raises(ValueError, match="not a readable TensorFlow checkpoint"):
        list(scl.read_tables(str(tmp_path / "text"), "SGD"))
    # A truncated data file: every read fails with an error naming the path.
    path = tensorflow_checkpoint[0]
    copy = tmp_path / "copy"
    for name in os.listdir(os.path.dirname(path)):
        if name.startswith(os.path.basename(path) + "."):
            data = open(os.path.join(os.path.dirname(path), name), "rb").read()
            if ".data-" in name:
                data = data[: len(data) // 2]
            (tmp_path / ("copy" + name[len(os.path.basename(path)) :])).write_bytes(
                data
            )
    with pytest.raises(ValueError, match="copy"):
        list(scl.read_tables(str(copy), tensorflow_checkpoint[3]))
    plain = tf.train.Checkpoint(v=tf.Variable(1.0)).write(str(tmp_path / "plain"))
    with pytest.raises(ValueError, match="no SparseCore layouts"):
        list(scl.read_tables(plain, "SGD"))


def _one_stack_checkpoint(tmp_path):
    """An Adagrad table 'a' alone in its stack, written by the package: its
    path, the data file holding the stack, and the table's state."""
    layouts = tensorflow_layouts([("a", 20, 4, E.Adagrad(0.1))], 1, 4)
    states = random_states(layouts, ["accumulators"])
    path = checkpoints.write_checkpoint(
        str(tmp_path / "ckpt"),
        states,
        format="sparsecore",
        layouts=layouts,
        algorithms="Adagrad",
    )
    # The largest data file: the one holding the stacked table and its slot.
    data = max(tf.io.gfile.glob(path + ".data-*"), key=os.path.getsize)
    return path, data, states


def test_a_cut_data_file_is_refused_when_the_checkpoint_is_opened(tmp_path):
    path, data, _ = _one_stack_checkpoint(tmp_path)
    size = os.path.getsize(data)
    with open(data, "r+b") as file:
        file.truncate(size // 4)
    truncated = (
        rf"The checkpoint '{path}' is truncated: its data files hold \d+ bytes, "
        r"its tensors need at least \d+\."
    )
    # Before anything is read: the call itself refuses, not its iteration.
    with pytest.raises(ValueError, match=truncated):
        scl.read_tables(path, "Adagrad")
    with pytest.raises(ValueError, match=truncated):
        scl.SparseCoreCheckpointReader(path, "Adagrad")
    with pytest.raises(ValueError, match=truncated):
        sparsecore_reader.describe_stacks(path)


@pytest.mark.parametrize("damage", ["last byte cut", "a byte flipped"])
def test_a_damaged_tensor_is_refused_naming_the_path_and_the_key(tmp_path, damage):
    """What the sizes cannot tell (the data files also hold the layouts and
    the object graph) is found when the tensor is read."""
    path, data, _ = _one_stack_checkpoint(tmp_path)
    payload = bytearray(open(data, "rb").read())
    if damage == "last byte cut":
        payload = payload[:-1]
    else:
        payload[len(payload) // 2] ^= 0xFF
    open(data, "wb").write(bytes(payload))
    source = scl.SparseCoreCheckpointReader(path, "Adagrad")
    with pytest.raises(ValueError) as error:
        source.read("a")
    message = str(error.value)
    assert message.startswith("Cannot read 'embedding/a"), message
    assert f"from the checkpoint {path!r} (corrupted or truncated?): " in message


def _hand_made(tmp_path, layouts, variables, root="embedding"):
    """A checkpoint holding `layouts` and only `variables` (local name under
    the embedding object, tracked by the root as `root` -> value)."""
    holder = autotrackable.AutoTrackable()
    for local, value in variables.items():
        holder._track_trackable(tf.Variable(value), name=local)
    track_layouts(holder, layouts)
    return tf.train.Checkpoint(**{root: holder}).write(str(tmp_path / "hand"))


def test_a_stack_of_another_dtype_or_without_its_parameters(tmp_path):
    layouts = tensorflow_layouts([("a", 20, 4, E.Adagrad(0.1))], 1, 4)
    shape = shared_stacks.stacked_shape(layouts[0])
    half = _hand_made(tmp_path / "half", layouts, {"a": np.zeros(shape, np.float16)})
    with pytest.raises(
        ValueError,
        match=r"The stacked table 'a' \(tables \['a'\]\) has dtype float16 in the "
        r"checkpoint; TPUEmbeddingV2 stores float32\.",
    ):
        scl.read_tables(half, "SGD")
    # Only the slot: described with no shape, its bytes the slot's; refused
    # when read.
    slot_only = _hand_made(
        tmp_path / "slot", layouts, {"a/accumulators": np.zeros(shape, np.float32)}
    )
    (described,) = sparsecore_reader.describe_stacks(slot_only)
    assert described["shape"] is None
    assert described["slots"] == ["accumulators"]
    assert described["bytes"] == shape[0] * shape[1] * 4
    with pytest.raises(ValueError, match="has no stacked table 'a'"):
        scl.read_tables(slot_only, "Adagrad")
    # Slotless SGD: the shape is the stacked variable's.
    sgd = _hand_made(tmp_path / "sgd", layouts, {"a": np.zeros(shape, np.float32)})
    (described,) = sparsecore_reader.describe_stacks(sgd)
    assert described["shape"] == list(shape) and described["slots"] == []
    assert described["algorithms"] == ["SGD"]


def test_the_reader_reads_a_stack_once_for_its_tables_in_turn(tensorflow_checkpoint):
    path, _, states, optimizers = tensorflow_checkpoint
    source = scl.SparseCoreCheckpointReader(path, optimizers)
    reads = []
    get = source._reader.get
    source._reader.get = lambda key: reads.append(key) or get(key)
    for name in ["apps", "users", "videos", "words", "apps"]:
        state = source.read(name)
        for slot, value in state.items():
            np.testing.assert_array_equal(value, states[name][slot])
    # apps, users and videos share a stack of parameters and 2 Adam slots;
    # words is Adagrad's (parameters and 1 slot). Only the last stack is kept.
    assert len(reads) == 3 + 2 + 3, reads
    assert len(set(reads[:3])) == 3 and reads[:3] == reads[5:]


@pytest.mark.parametrize(
    "mutate, error, message",
    [
        (lambda s: s.pop("users"), ValueError, r"no state for tables \['users'\]"),
        (lambda s: s.update(ads=s["apps"]), ValueError, r"tables \['ads'\] that"),
        (
            lambda s: s["videos"].pop("velocities"),
            ValueError,
            "'videos' has no 'velocities'",
        ),
        (
            lambda s: s["videos"].update(accumulators=s["videos"]["momenta"]),
            ValueError,
            r"'videos' has \['accumulators'\]",
        ),
        (
            lambda s: s["videos"].update(momenta=s["videos"]["momenta"][:3]),
            ValueError,
            r"'momenta' of table 'videos' has shape \(3, 8\)",
        ),
        (
            lambda s: s["videos"].update(
                momenta=s["videos"]["momenta"].astype(np.float64)
            ),
            ValueError,
            "'momenta' of table 'videos' has dtype float64",
        ),
    ],
)
def test_write_refuses_and_leaves_nothing(tmp_path, mutate, error, message):
    layouts = tensorflow_layouts(MIXED[:3] + [("zeta", 5, 8, E.Adam(0.2))])
    states = random_states(layouts, ["momenta", "velocities"])
    existing = scl.write_checkpoint(str(tmp_path / "ckpt"), layouts, states, "Adam")
    before = {n: (tmp_path / n).read_bytes() for n in _listing(tmp_path)}
    broken = {name: dict(state) for name, state in states.items()}
    mutate(broken)
    with pytest.raises(error, match=message):
        scl.write_checkpoint(existing, layouts, broken, "Adam")
    assert {n: (tmp_path / n).read_bytes() for n in _listing(tmp_path)} == before


def test_write_takes_pairs_as_every_writer_does(tmp_path):
    """`write_checkpoint` takes a pair as a tuple or a list of two, for every
    format; the SparseCore writer took only tuples from pairs that came one
    by one."""
    layouts = tensorflow_layouts([("a", 20, 4, E.SGD(0.1)), ("b", 9, 4, E.SGD(0.1))])
    states = random_states(layouts, [])
    for pairs in (
        [["a", states["a"]], ["b", states["b"]]],
        iter([["b", states["b"]], ("a", states["a"])]),
    ):
        path = checkpoints.write_checkpoint(
            str(tmp_path / "lists"),
            pairs,
            format="sparsecore",
            layouts=layouts,
            algorithms="SGD",
        )
        for name, state in scl.read_tables(path, "SGD"):
            np.testing.assert_array_equal(
                state["parameters"], states[name]["parameters"]
            )
    # The deprecated writer's own refusals, where no front door checked first.
    with pytest.warns(DeprecationWarning):
        with pytest.raises(TypeError, match=r"received an item \('a', \{'parameters'"):
            scl.write_checkpoint(
                str(tmp_path / "three"), layouts, iter([("a", states["a"], 1)]), "SGD"
            )
        for bad in ("ab", 3):
            kind = type(bad).__name__
            with pytest.raises(
                TypeError, match=rf"`states` must be a mapping.*; received {kind}\."
            ):
                scl.write_checkpoint(str(tmp_path / "bad"), layouts, bad, "SGD")
        # A function of the table name (the deprecated writer's own form).
        with pytest.raises(
            TypeError,
            match=r"The state of table 'a' must be a mapping .*; received int",
        ):
            scl.write_checkpoint(str(tmp_path / "bad"), layouts, lambda name: 3, "SGD")
    # Nothing of the refused writes is left.
    assert not [n for n in os.listdir(tmp_path) if n.startswith(("three", "bad"))]


def test_write_interrupted_midway_leaves_nothing(tmp_path):
    # The second stacked table fails after the first was written to disk.
    layouts = tensorflow_layouts(MIXED)
    states = random_states(layouts, ["momenta", "velocities"])

    def state_of(name):
        if name == "words":
            raise RuntimeError("disk full")
        return states[name]

    optimizers = {n: "Adam" for n, _, _, _ in MIXED}
    optimizers["words"] = "Momentum"
    with pytest.raises(RuntimeError, match="disk full"):
        scl.write_checkpoint(str(tmp_path / "ckpt"), layouts, state_of, optimizers)
    assert _listing(tmp_path) == []
    with pytest.raises(ValueError, match="share stacked table"):
        scl.write_checkpoint(
            str(tmp_path / "ckpt"), layouts, states, dict(optimizers, users="Adagrad")
        )
    assert _listing(tmp_path) == []


@pytest.mark.parametrize("format", ["sparsecore", "tpu-embedding"])
def test_writes_to_a_file_system_url_as_to_a_local_path(tmp_path, format):
    # A remote prefix (gs://...) goes through TensorFlow's file systems from
    # the temporary directory to the published index; TensorFlow's in-memory
    # one stands in here. (SparseCore's writer used to stage it under a local
    # directory named "ram:".)
    from tf_tpu_embed_opt import checkpoints
    from tf_tpu_embed_opt.checkpoints.shared import bundles

    layouts = tensorflow_layouts(MIXED[:2])
    states = random_states(layouts, ["momenta", "velocities"])
    options = {"layouts": layouts} if format == "sparsecore" else {}
    written = {}
    for where in (str(tmp_path / "ckpt"), f"ram://{tmp_path.name}/{format}/ckpt"):
        prefix = checkpoints.write_checkpoint(
            where,
            states,
            format=format,
            algorithms=dict.fromkeys(states, "Adam"),
            **options,
        )
        # TensorFlow's own reader, by prefix: on this file system any prefix
        # of a file is also a directory, which `load_checkpoint` would take.
        reader = tf.compat.v1.train.NewCheckpointReader(prefix)
        # The readers' truncation check sees the remote data files too.
        present, needed = bundles.bytes_present_and_needed(reader, prefix)
        assert present >= needed > 0, (where, present, needed)
        written[where] = {
            key: reader.get_tensor(key)
            for key in reader.get_variable_to_shape_map()
            if key != "_CHECKPOINTABLE_OBJECT_GRAPH"
        }
    local, remote = written.values()
    assert sorted(local) == sorted(remote)
    for key, value in local.items():
        np.testing.assert_array_equal(value, remote[key], err_msg=key)
    # The checkpoint alone: no temporary directory is left on either side.
    remote_names = tf.io.gfile.listdir(f"ram://{tmp_path.name}/{format}")
    assert sorted(remote_names) == _listing(tmp_path)
    assert "ckpt.index" in remote_names
    assert all(name.startswith("ckpt.") for name in remote_names), remote_names


def test_object_path_escaping_and_choice(tmp_path):
    layouts = tensorflow_layouts(MIXED[:2], 1, 2)
    states = random_states(layouts, [])
    path = scl.write_checkpoint(
        str(tmp_path / "one"), layouts, states, "SGD", object_path="model/my.emb/x"
    )
    assert scl.read_layouts(path)[0] == "model/my.emb/x"
    assert sorted(dict(scl.read_tables(path, "SGD"))) == ["apps", "users"]
    first, _ = tensorflow_style_embedding(layouts, states, [])
    second, _ = tensorflow_style_embedding(layouts, states, [])
    both = tf.train.Checkpoint(a=first, b=second).write(str(tmp_path / "two"))
    with pytest.raises(ValueError, match="several SparseCore embeddings"):
        scl.read_layouts(both)
    with pytest.raises(ValueError, match="no SparseCore layouts under object path 'c'"):
        scl.read_layouts(both, object_path="c")
    read = dict(scl.read_tables(both, "SGD", object_path="b"))
    np.testing.assert_array_equal(
        read["users"]["parameters"], states["users"]["parameters"]
    )
    with pytest.raises(ValueError, match="`object_path` must be local names"):
        scl.write_checkpoint(
            str(tmp_path / "x"), layouts, states, "SGD", object_path="a//b"
        )


def test_stack_layouts_are_tensorflows_and_leave_the_configs_alone():
    videos = E.TableConfig(vocabulary_size=1000, dim=16, name="videos")
    users = E.TableConfig(
        vocabulary_size=300, dim=13, name="users", optimizer=embedding.Adam(0.01)
    )
    genres = E.TableConfig(vocabulary_size=50, dim=16, name="genres")
    features = {
        "v": E.FeatureConfig(table=videos, output_shape=[32]),
        "u": E.FeatureConfig(table=users, output_shape=[32]),
        "g": E.FeatureConfig(table=genres, output_shape=[32]),
    }
    layouts = scl.stack_layouts(features, embedding.Adagrad(0.1), num_replicas=2)
    # The configs are untouched (TPUEmbeddingV2 also stacks copies).
    assert (videos.vocabulary_size, users.dim, videos.optimizer) == (1000, 13, None)
    expected = tensorflow_layouts(
        [
            ("genres", 50, 16, embedding.Adagrad(0.1)),
            ("users", 300, 13, embedding.Adam(0.01)),
            ("videos", 1000, 16, embedding.Adagrad(0.1)),
        ],
        batch=32,
    )
    by_name = {t.table_name: t for t in expected}
    assert [t.table_name for t in layouts] == ["genres", "users", "videos"]
    for layout in layouts:
        assert layout == by_name[layout.table_name]
    assert layouts[0].stacked_table_name == layouts[2].stacked_table_name
    assert list(layouts[1].unsharded_padded_shape)[1] == 16


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_replicas": 0}, "`num_replicas` must be a positive int"),
        ({"num_replicas": 2, "sparse_cores_per_chip": 2.0}, "`sparse_cores_per_chip`"),
    ],
)
def test_stack_layouts_refuses_bad_counts(kwargs, message):
    table = E.TableConfig(vocabulary_size=10, dim=4, name="t")
    features = [E.FeatureConfig(table=table, output_shape=[8])]
    with pytest.raises(ValueError, match=message):
        scl.stack_layouts(features, E.SGD(0.1), **kwargs)


def test_stack_layouts_needs_output_shapes():
    table = E.TableConfig(vocabulary_size=10, dim=4, name="t")
    with pytest.raises(ValueError, match="feature 'f' needs a fully defined"):
        scl.stack_layouts(
            [E.FeatureConfig(table=table, name="f")], E.SGD(0.1), num_replicas=1
        )


@pytest.mark.parametrize("stacker", [None, lambda table_config, flat_features: None])
def test_stack_layouts_refuses_a_tensorflow_of_another_stacker(monkeypatch, stacker):
    """A TensorFlow without the stacking function, or with one of other
    arguments, is refused before it is called, naming the arguments needed."""
    name = "_stack_tables_with_same_table_dim_and_optimizer"
    if stacker is None:
        monkeypatch.delattr(v3, name)
    else:
        monkeypatch.setattr(v3, name, stacker)
    table = E.TableConfig(vocabulary_size=10, dim=4, name="t")
    features = [E.FeatureConfig(table=table, output_shape=[8])]
    with pytest.raises(NotImplementedError, match=rf"\({name}\) with the arguments"):
        scl.stack_layouts(features, E.SGD(0.1), num_replicas=1)


def test_describe_checkpoint_lists_stacks_slots_and_fitting_algorithms(
    tensorflow_checkpoint,
):
    path, layouts, _, _ = tensorflow_checkpoint
    described = {d["stacked_table"]: d for d in scl.describe_checkpoint(path)}
    assert sorted(described) == ["apps_users_videos", "words"]
    adam, adagrad = described["apps_users_videos"], described["words"]
    assert adam["slots"] == ["momenta", "velocities"]
    assert adam["algorithms"] == ["Adam"]
    assert adagrad["slots"] == ["accumulators"]
    # Adagrad's slots also fit ProximalAdagrad: the checkpoint cannot tell.
    assert adagrad["algorithms"] == ["Adagrad", "ProximalAdagrad"]
    assert adam["tables"] == {"apps": [100, 8], "users": [37, 5], "videos": [9, 8]}
    rows = 8 * layouts[0].total_rows_per_sparse_core_shard
    assert adam["shape"] == [rows, 8]
    assert adam["bytes"] == rows * 8 * 4 * 3


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stacks(name="s1", prefix="a"), stacks(name="s2", prefix="b"))
def test_random_layouts_write_and_read_back(tmp_path_factory, first, second):
    # Arbitrary geometry (1..8 SparseCores, any partition count, rotations,
    # padding): TensorFlow's reader and unshard see what was written.
    layouts = first + second
    states = random_states(layouts, ["accumulators", "momenta"])
    path = scl.write_checkpoint(
        str(tmp_path_factory.mktemp("random") / "ckpt"),
        layouts,
        states,
        "AdagradMomentum",
    )
    reader = tf.train.load_checkpoint(path)
    for members in (first, second):
        ordered = sorted(members, key=lambda t: t.sparse_core_shard_row_offset)
        for slot in ["parameters", "accumulators", "momenta"]:
            stacked = reader.get_tensor(
                scl.checkpoint_key("embedding", members[0].stacked_table_name, slot)
            )
            theirs = tf_unshard(stacked, ordered)
            for layout, table in zip(ordered, theirs):
                np.testing.assert_array_equal(
                    table.numpy(), states[layout.table_name][slot]
                )
    for name, state in scl.read_tables(path, "AdagradMomentum"):
        for slot, value in state.items():
            np.testing.assert_array_equal(value, states[name][slot])


def test_reads_stacks_saved_whole(tmp_path):
    # A stack saved as one tensor (no per-device slices, e.g. re-saved from
    # plain variables on CPU) reads the same.
    layouts = tensorflow_layouts(MIXED[:3])
    states = random_states(layouts, ["momenta", "velocities"])
    variables = {
        "apps_users_videos" + ("" if slot == "parameters" else f"/{slot}"): tf_shard(
            {n: s[slot] for n, s in states.items()}, layouts
        )
        for slot in ["parameters", "momenta", "velocities"]
    }
    path = _hand_made(tmp_path, layouts, variables, root="model")
    read = dict(scl.read_tables(path, E.Adam(learning_rate=0.1)))
    for name, state in states.items():
        for slot, value in state.items():
            np.testing.assert_array_equal(read[name][slot], value)


@pytest.mark.filterwarnings("ignore:The 'warn' function is deprecated")
def test_reshard_on_the_host_from_read_tables(tmp_path):
    # read_tables of one layout straight into write_checkpoint of another.
    source = tensorflow_layouts(MIXED[:3], partitions=2, cores_per_partition=4)
    target = tensorflow_layouts(
        MIXED[:3],
        partitions=1,
        cores_per_partition=2,
        config=v3.SparseCoreEmbeddingConfig(disable_table_stacking=True),
    )
    states = random_states(source, ["momenta", "velocities"])
    first = scl.write_checkpoint(str(tmp_path / "a"), source, states, "Adam")
    second = scl.write_checkpoint(
        str(tmp_path / "b"), target, scl.read_tables(first, "Adam"), "Adam"
    )
    assert len(scl.describe_checkpoint(second)) == 3
    for name, state in scl.read_tables(second, "Adam"):
        for slot, value in state.items():
            np.testing.assert_array_equal(value, states[name][slot])
    pairs = list(scl.read_tables(first, "Adam"))
    for bad, message in [
        (pairs + pairs[:1], "table 'apps' twice"),
        (pairs[1:], "no state for table 'apps'"),
        (pairs + [("ads", pairs[0][1])], "table 'ads', which the SparseCore"),
        ([pairs[0][1]], r"\(table name, state\) pairs"),
    ]:
        error = TypeError if "pairs" in message else ValueError
        with pytest.raises(error, match=message):
            scl.write_checkpoint(str(tmp_path / "c"), target, iter(bad), "Adam")
    assert not any(name.startswith("c") for name in os.listdir(tmp_path))


def test_shard_tables_refuses_tables_that_do_not_fit_the_stack():
    layouts = tensorflow_layouts(MIXED)  # Adam's stack and Adagrad's
    first = min(layout.stacked_table_name for layout in layouts)
    one = [x for x in layouts if x.stacked_table_name == first]
    tables = random_tables(one)
    with pytest.raises(ValueError, match="must describe one stacked table"):
        scl.shard_tables(random_tables(layouts), layouts)
    with pytest.raises(ValueError, match=r"tables \['elsewhere'\] are not in"):
        scl.shard_tables({**tables, "elsewhere": np.zeros((1, 1))}, one)
    name = one[0].table_name
    with pytest.raises(
        ValueError, match=rf"table {name!r} of stacked table .* missing"
    ):
        scl.shard_tables({k: v for k, v in tables.items() if k != name}, one)
    wrong = {**tables, name: tables[name][:-1]}
    with pytest.raises(ValueError, match=rf"Table {name!r} has shape"):
        scl.shard_tables(wrong, one)
    # Placed table by table (a memory-mapped stack, say) into the wrong array.
    with pytest.raises(ValueError, match=r"has shape \(1, 8\); its layout needs"):
        shared_stacks.place_table(np.zeros((1, 8), np.float32), tables[name], one[0])


def test_unshard_table_refuses_a_stack_of_another_shape():
    layout = tensorflow_layouts(MIXED[:1])[0]
    rows = layout.num_sparse_cores * layout.total_rows_per_sparse_core_shard
    table = scl.unshard_table(tf.zeros([rows, 8]), layout)
    assert table.shape == (100, 8)
    with pytest.raises(ValueError, match=r"'apps'.*has shape \(8, 8\).*needs"):
        scl.unshard_table(np.zeros((8, 8), np.float32), layout)


def test_sparsecore_checkpoint_continues_training_in_keras(tmp_path):
    # A SparseCore checkpoint -> Keras variables and the twin's slots
    # (through `load_into_keras`, the TensorCore path's loader), then one
    # sparse step with a duplicate id equals the engine's Adam by hand.
    import keras

    import tf_tpu_embed_opt as teo
    from tf_tpu_embed_opt.checkpoints.keras import state as keras_state

    table_opt = E.Adam(learning_rate=0.1)
    layouts = tensorflow_layouts(
        [("apps", 100, 8, table_opt), ("videos", 9, 8, table_opt)], 1, 4
    )
    states = random_states(layouts, ["momenta", "velocities"])
    for state in states.values():
        state["velocities"] = np.abs(state["velocities"])
    path = scl.write_checkpoint(str(tmp_path / "ckpt"), layouts, states, table_opt)
    source = scl.SparseCoreCheckpointReader(path, table_opt)
    assert sorted(source.tables) == ["apps", "videos"]
    assert source.tables["videos"].shape == (9, 8)
    variables = {
        name: keras.Variable(np.zeros(states[name]["parameters"].shape, np.float32))
        for name in states
    }
    twin = teo.to_keras(table_opt)
    twin.build(list(variables.values()))
    loaded = teo.load_into_keras(source, variables, twin)
    assert {name: d.name for name, d in loaded.items()} == {
        "apps": "Adam",
        "videos": "Adam",
    }
    tables = keras_state.keras_tables(variables, twin)
    for name, state in keras_state.keras_table_states(tables):
        for slot, value in state.items():
            np.testing.assert_array_equal(value, states[name][slot])

    ids = np.array([3, 1, 3], np.int32)
    values = RNG.standard_normal((3, 8)).astype(np.float32)
    gradient = tf.IndexedSlices(tf.constant(values), tf.constant(ids), (9, 8))
    twin.apply_gradients([(gradient, variables["videos"])])
    before = states["videos"]
    rows = np.array([1, 3])
    g = np.stack([values[1], values[0] + values[2]])
    m = 0.9 * before["momenta"][rows] + 0.1 * g
    v = 0.999 * before["velocities"][rows] + 0.001 * g * g
    w = before["parameters"][rows] - 0.1 * m / np.sqrt(v + 1e-7**2)
    after = variables["videos"].numpy()
    np.testing.assert_allclose(after[rows], w, rtol=1e-6, atol=1e-6)
    untouched = [i for i in range(9) if i not in rows]
    np.testing.assert_array_equal(after[untouched], before["parameters"][untouched])


def test_sparsecore_reader_refuses_another_algorithm_and_unknown_tables(tmp_path):
    layouts = tensorflow_layouts([("a", 20, 4, E.Adam(0.1))], 1, 4)
    states = random_states(layouts, ["momenta", "velocities"])
    path = scl.write_checkpoint(str(tmp_path / "ckpt"), layouts, states, "Adam")
    with pytest.raises(ValueError, match="no slot .accumulators. of stacked table .a."):
        scl.SparseCoreCheckpointReader(path, E.Adagrad(0.1))
    source = scl.SparseCoreCheckpointReader(path, "Adam")
    with pytest.raises(ValueError, match="no table 'b'"):
        source.read("b")


def test_cli_inspects_a_sparsecore_checkpoint(tmp_path, capsys):
    import json

    from tf_tpu_embed_opt import cli

    layouts = tensorflow_layouts(
        [("apps", 100, 8, E.Adam(0.1)), ("videos", 9, 8, E.Adam(0.1))], 1, 4
    )
    states = random_states(layouts, ["momenta", "velocities"])
    path = scl.write_checkpoint(str(tmp_path / "ckpt"), layouts, states, "Adam")
    assert cli.main(["checkpoint", "inspect", path, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["layout"] == "TPUEmbeddingV2"
    (stack,) = report["stacked_tables"]
    assert stack["tables"] == {"apps": [100, 8], "videos": [9, 8]}
    assert stack["slots"] == ["momenta", "velocities"]
    assert "Adam" in stack["algorithms"]
    rows, columns = stack["shape"]
    assert rows >= 109 and columns >= 8  # padded for the SparseCores
    assert stack["bytes"] == report["bytes"] == rows * columns * 4 * 3
    assert cli.main(["checkpoint", "inspect", path]) == 0
    text = capsys.readouterr().out
    assert "stacked table" in text and "  videos: 9 x 8" in text
    assert "total: 2 tables in 1 stacked table," in text


def test_inspect_says_the_step_a_sparsecore_checkpoint_records(tmp_path, capsys):
    """A TPUEmbeddingV2 job's `tf.train.Checkpoint(..., step=...)`: its step
    is described, as `Checkpoint.step` reads it; a checkpoint of tables alone
    (what the package writes) records none."""
    from tf_tpu_embed_opt import cli

    layouts = tensorflow_layouts([("apps", 100, 8, E.Adagrad(0.1))], 1, 4)
    states = random_states(layouts, ["accumulators"])
    part, _ = tensorflow_style_embedding(layouts, states, ["accumulators"])
    track_layouts(part, layouts)
    step = tf.Variable(41, dtype=tf.int64)
    path = tf.train.Checkpoint(embedding=part, step=step).save(
        str(tmp_path / "job" / "ckpt")
    )
    assert checkpoints.describe_checkpoint(path)["step"] == 41
    assert checkpoints.open_checkpoint(path, algorithms="Adagrad").step == 41
    assert cli.main(["checkpoint", "inspect", path]) == 0
    assert capsys.readouterr().out.splitlines()[2] == "step: 41"
    # A step saved elsewhere, beside a `step` that is no step, is read where
    # `step_path` says, by the API and both command lines.
    both = tf.train.Checkpoint(
        embedding=part, step=tf.Variable(0.5), global_step=tf.Variable(9)
    ).save(str(tmp_path / "both" / "ckpt"))
    document = checkpoints.describe_checkpoint(both, step_path="global_step")
    assert (document["step"], document["step_path"]) == (9, "global_step")
    opened = checkpoints.open_checkpoint(
        both, algorithms="Adagrad", step_path="global_step"
    )
    assert opened.step == 9
    with pytest.raises(ValueError, match="the variable at 'step' is no step"):
        checkpoints.open_checkpoint(both, algorithms="Adagrad").step  # noqa: B018
    argv = ["checkpoint", "inspect", both, "--step-path", "global_step"]
    assert cli.main(argv) == 0
    assert capsys.readouterr().out.splitlines()[2] == "step: 9 (at global_step)"
    argv = ["checkpoint", "convert", both, str(tmp_path / "tc" / "ckpt")]
    argv += ["--algorithm", "adagrad", "--step-path", "global_step"]
    assert cli.main(argv) == 0
    assert capsys.readouterr().out.endswith(", step 9 at global_step\n")
    converted = checkpoints.open_checkpoint(str(tmp_path / "tc" / "ckpt"))
    assert converted.read_scalar("global_step") == 9
    with pytest.raises(
        TypeError, match="^SparseCoreCheckpointReader: argument `step_path`"
    ):
        scl.SparseCoreCheckpointReader(both, "Adagrad", step_path=3)
    alone = scl.write_checkpoint(str(tmp_path / "ckpt"), layouts, states, "Adagrad")
    assert checkpoints.describe_checkpoint(alone)["step"] is None
    assert cli.main(["checkpoint", "inspect", alone]) == 0
    assert capsys.readouterr().out.splitlines()[2] == "step: none recorded"


def test_cli_converts_a_sparsecore_checkpoint_to_the_tpu_embedding_layout(
    tmp_path, capsys
):
    # Oracle: TensorFlow's TPUEmbeddingForServing restores the result with
    # every table and slot matched, and holds the unpadded states.
    from tensorflow.python.tpu.tpu_embedding_for_serving import (
        TPUEmbeddingForServing,
    )

    import tf_tpu_embed_opt as teo
    from tf_tpu_embed_opt import cli

    layouts = tensorflow_layouts(
        [("apps", 100, 8, E.Adam(0.1)), ("videos", 9, 8, E.Adam(0.1))], 1, 4
    )
    states = random_states(layouts, ["momenta", "velocities"])
    path = scl.write_checkpoint(str(tmp_path / "sc"), layouts, states, "Adam")
    destination = str(tmp_path / "tc" / "ckpt")
    assert cli.main(["checkpoint", "convert", path, destination]) == 2
    assert "--algorithm NAME" in capsys.readouterr().err
    assert not os.path.exists(destination + ".index")
    assert (
        cli.main(
            ["checkpoint", "convert", path, destination, "--algorithm", "adam"]
            + ["--step-path", "step"]
        )
        == 2
    )
    assert "has no variable at 'step'" in capsys.readouterr().err
    argv = ["checkpoint", "convert", path, destination, "--algorithm", "games=adam"]
    assert cli.main(argv) == 2
    assert capsys.readouterr().err == (
        "tf-tpu-embed-opt: error: --algorithm: tables ['games'] are not in the "
        "checkpoint, which has ['apps', 'videos'].\n"
    )
    code = cli.main(["checkpoint", "convert", path, destination, "--algorithm", "adam"])
    assert code == 0, capsys.readouterr().err
    tables = {
        name: E.TableConfig(rows, dim, name=name, optimizer=teo.embedding.Adam(0.1))
        for name, rows, dim in (("apps", 100, 8), ("videos", 9, 8))
    }
    serving = TPUEmbeddingForServing(
        [E.FeatureConfig(table=t) for t in tables.values()], None
    )
    serving.build()
    tf.train.Checkpoint(embedding=serving).restore(
        destination
    ).assert_existing_objects_matched()
    for name, state in states.items():
        for slot, value in state.items():
            np.testing.assert_array_equal(serving._variables[name][slot].numpy(), value)


def test_cli_converts_the_tpu_embedding_layout_back_into_sparsecore_layouts(
    tmp_path, capsys
):
    # SparseCore -> TPUEmbedding layout -> SparseCore with the first
    # checkpoint's layouts: the tables and slots read back unchanged.
    from tf_tpu_embed_opt import cli

    layouts = tensorflow_layouts(
        [("apps", 100, 8, E.Adagrad(0.1)), ("videos", 9, 8, E.Adagrad(0.1))], 1, 4
    )
    states = random_states(layouts, ["accumulators"])
    source = scl.write_checkpoint(str(tmp_path / "sc"), layouts, states, "Adagrad")
    middle = str(tmp_path / "tc" / "ckpt")
    back = str(tmp_path / "back" / "ckpt")
    to_middle = ["checkpoint", "convert", source, middle, "--algorithm", "adagrad"]
    assert cli.main(to_middle) == 0
    argv = ["checkpoint", "convert", middle, back, "--layouts-from", source]
    assert cli.main(argv) == 2
    assert "give --algorithm NAME" in capsys.readouterr().err
    assert cli.main(argv + ["--algorithm", "adagrad"]) == 0, capsys.readouterr().err
    read = dict(scl.read_tables(back, "Adagrad"))
    assert sorted(read) == ["apps", "videos"]
    for name, state in read.items():
        for slot, value in state.items():
            np.testing.assert_array_equal(value, states[name][slot])
