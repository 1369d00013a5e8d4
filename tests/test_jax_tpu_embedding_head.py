"""jax-tpu-embedding's own save and restore, on both sides of the package.

jax-tpu-embedding 0.2.0 (Python 3.12 and later) saves and restores its flax
NNX jobs with `lib/flax/nnx/checkpoint_utils.py` (`save_checkpoint`,
`restore_checkpoint`); 0.1.0 has no such module. The test runs the installed
module where there is one; elsewhere (Python 3.11) it runs that module from a
checkout of jax-tpu-embedding's repository, over the installed package, when
`JAX_TPU_EMBEDDING_CHECKPOINT_UTILS` names the file (e.g.
`.../jax_tpu_embedding/sparsecore/lib/flax/nnx/checkpoint_utils.py`), and is
skipped otherwise. A model with jax-tpu-embedding's own `SparseCoreEmbed`
(Adam tables stacked by its code) is built on CPU as on a TPU of 1 device x 4
SparseCores (only the probe of SparseCores per device is answered); its
`save_checkpoint` writes the step the package reads, and its
`restore_checkpoint` reads back the step the package writes over it (in
memory, and spilled to chunk files).
"""

# Runs without TensorFlow.

import importlib
import importlib.util
import os

import numpy as np
import pytest

HEAD = os.environ.get("JAX_TPU_EMBEDDING_CHECKPOINT_UTILS")
INSTALLED = "jax_tpu_embedding.sparsecore.lib.flax.nnx.checkpoint_utils"


def _installed_module():
    try:
        return importlib.util.find_spec(INSTALLED) is not None
    except ImportError:  # no jax_tpu_embedding, or no flax.nnx in it
        return False


pytestmark = [
    pytest.mark.skipif(
        not HEAD and not _installed_module(),
        reason="this jax-tpu-embedding has no checkpoint_utils (0.1.0) and "
        "JAX_TPU_EMBEDDING_CHECKPOINT_UTILS names no checkout",
    ),
    pytest.mark.oracle("jax-tpu-embedding"),
]

jax = pytest.importorskip("jax")
pytest.importorskip("jax_tpu_embedding")
ocp = pytest.importorskip("orbax.checkpoint")
optax = pytest.importorskip("optax")
nnx = pytest.importorskip("flax.nnx")

import jax_checkpoints  # noqa: E402
from jax_checkpoints import TABLES, table_values  # noqa: E402
from jax_tpu_embedding.sparsecore.lib.nn import (  # noqa: E402
    embedding,
    embedding_spec,
    table_stacking,
)
from jax_tpu_embedding.sparsecore.utils import utils as jte_utils  # noqa: E402

from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import reader as jax_orbax  # noqa: E402
from tf_tpu_embed_opt.checkpoints.jax_tpu_embedding import (  # noqa: E402
    writer as jax_orbax_writer,
)


@pytest.fixture
def head(monkeypatch):
    """jax-tpu-embedding's `checkpoint_utils`: the installed one (0.2.0),
    else the checkout's, loaded over the installed package (a constant it
    names, and 0.1.0 lacks, is given for its import; the functions used here
    do not read it)."""
    monkeypatch.setattr(jte_utils, "num_sparsecores_per_device", lambda d=None: 4)
    if not HEAD:
        return importlib.import_module(INSTALLED)
    if not hasattr(table_stacking, "DEFAULT_ACTIVATION_MEM_BYTES_LIMIT"):
        monkeypatch.setattr(
            table_stacking, "DEFAULT_ACTIVATION_MEM_BYTES_LIMIT", 0, raising=False
        )
    spec = importlib.util.spec_from_file_location("jte_checkpoint_utils", HEAD)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _model(seed):
    from jax_tpu_embedding.sparsecore.lib.flax.nnx import embed

    class Model(nnx.Module):
        def __init__(self, rngs):
            self.dense = nnx.Linear(4, 2, rngs=rngs)
            mesh = jax.sharding.Mesh(np.array(jax.devices()), ("x",))
            self.embedding_layer = embed.SparseCoreEmbed(
                jax_checkpoints.feature_specs(1, 4), "x", mesh, rngs
            )

    model = Model(nnx.Rngs(seed))
    return model, embed.PartitionedOptimizer(model, optax.adam(0.1))


def _saved(head, root, model, optimizer):
    """The job's step 1000, saved by jax-tpu-embedding's `save_checkpoint`."""
    manager = head.create_checkpoint_manager(
        cp_path=root, cp_options=ocp.CheckpointManagerOptions()
    )
    head.save_checkpoint(
        cp_manager=manager,
        step=1000,
        model=model,
        optimizer=optimizer,
        feature_specs=jax_checkpoints.feature_specs(1, 4),
        num_global_devices=1,
        num_sc_per_device=4,
    )
    manager.wait_until_finished()
    manager.close()
    return os.path.join(root, "1000")


def _write(root, values, spec, items_from, spill_bytes=None):
    """Step 1001 of `values`' Adam tables in `spec`'s layout, written by the
    package with the other items of `items_from`."""
    jax_orbax_writer.write_jax_checkpoint(
        root,
        1001,
        [
            (
                name,
                {
                    "parameters": values["table"][name],
                    "momenta": values["momentum"][name],
                    "velocities": values["velocity"][name],
                },
            )
            for name in TABLES
        ],
        spec,
        dict.fromkeys(TABLES, "Adam"),
        items_from=items_from,
        spill_bytes=spill_bytes,
    )


def _assert_restored(model, values, padding):
    """`model`'s stacks hold `values` bit for bit as jax-tpu-embedding's own
    stacking for 1 x 4 lays them out; `padding=False`: the rows no table
    holds aside (a restore from another topology fills them its own way)."""
    expected = jax_checkpoints.their_stacks(1, 4, values)[0]
    for stack, variables in model.embedding_layer.embedding_table.get_value().items():
        for part, value in (
            ("table", variables.table),
            ("momentum", variables.slot.momentum),
            ("velocity", variables.slot.velocity),
        ):
            got, want = np.asarray(value), expected[part][stack]
            rows = np.ones(want.shape, bool) if padding else ~np.isnan(want)
            np.testing.assert_array_equal(
                got[rows].view(np.uint32),
                want[rows].view(np.uint32),
                err_msg=f"{stack} {part}",
            )


@pytest.mark.parametrize("spill_bytes", [None, 0])
def test_jax_tpu_embeddings_own_save_and_restore(tmp_path, head, spill_bytes):
    values = table_values(seed=50)
    model, optimizer = _model(0)
    stacked = jax_checkpoints.their_stacks(1, 4, values)[0]
    model.embedding_layer.embedding_table.set_value(
        {
            stack: embedding.EmbeddingVariables(
                table=jax.numpy.asarray(stacked["table"][stack]),
                slot=embedding_spec.AdamSlotVariables(
                    momentum=jax.numpy.asarray(stacked["momentum"][stack]),
                    velocity=jax.numpy.asarray(stacked["velocity"][stack]),
                ),
            )
            for stack in stacked["table"]
        }
    )
    step = _saved(head, tmp_path / "job", model, optimizer)
    read = jax_orbax.read_jax_tables(step)
    for name in TABLES:
        np.testing.assert_array_equal(read[name].table, values["table"][name])
        for slot in jax_checkpoints.SLOTS:
            np.testing.assert_array_equal(read[name].slots[slot], values[slot][name])
    new = table_values(seed=51)
    _write(
        tmp_path / "out", new, jax_orbax.read_embedding_spec(step), step, spill_bytes
    )
    fresh, fresh_optimizer = _model(1)
    head.restore_checkpoint(
        input_checkpoint_path=tmp_path / "out",
        step=1001,
        model=fresh,
        optimizer=fresh_optimizer,
    )
    _assert_restored(fresh, new, padding=True)
    np.testing.assert_array_equal(
        np.asarray(fresh.dense.kernel.get_value()),
        np.asarray(model.dense.kernel.get_value()),
    )


def test_jax_tpu_embeddings_cross_topology_restore_reads_the_packages_step(
    tmp_path, head
):
    """A step the package writes for another topology (2 devices x 4
    SparseCores, the job's other items carried from its own step) is what
    jax-tpu-embedding's `restore_cross_topology_checkpoint` restores into
    the job of 1 x 4: tables and slots bit for bit as its own stacking of the
    values lays them out there."""
    if not hasattr(head, "restore_cross_topology_checkpoint"):
        pytest.skip("this checkpoint_utils has no restore_cross_topology_checkpoint")
    model, optimizer = _model(0)
    step = _saved(head, tmp_path / "job", model, optimizer)
    new = table_values(seed=52)
    spec = jax_orbax_writer.retarget_embedding_spec(
        jax_orbax.read_embedding_spec(step), num_devices=2, sparsecores_per_device=4
    )
    _write(tmp_path / "other", new, spec, step)
    fresh, fresh_optimizer = _model(1)
    head.restore_cross_topology_checkpoint(
        cross_topology_checkpoint_restore_path=tmp_path / "other",
        model=fresh,
        optimizer=fresh_optimizer,
        target_feature_specs=jax_checkpoints.feature_specs(1, 4),
        num_global_devices=1,
        num_sc_per_device=4,
        restore_step=1001,
    )
    _assert_restored(fresh, new, padding=False)
