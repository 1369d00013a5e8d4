"""jax-tpu-embedding's own newest save and restore, on both sides of the package.

jax-tpu-embedding after 0.1.0 saves and restores its flax NNX jobs with
`lib/flax/nnx/checkpoint_utils.py` (`save_checkpoint`, `restore_checkpoint`).
That release is not offered for Python 3.11, so this test runs that module
from a checkout of jax-tpu-embedding's repository, over the installed
package, when `JAX_TPU_EMBEDDING_CHECKPOINT_UTILS` names the file (e.g.
`.../jax_tpu_embedding/sparsecore/lib/flax/nnx/checkpoint_utils.py`);
otherwise it is skipped. A model with jax-tpu-embedding's own
`SparseCoreEmbed` (Adam tables stacked by its code) is built on CPU as on a
TPU of 1 device x 4 SparseCores (only the probe of SparseCores per device is
answered); its `save_checkpoint` writes the step the package reads, and its
`restore_checkpoint` reads back the step the package writes over it (in
memory, and spilled to chunk files).
"""

# Runs without TensorFlow.

import importlib.util
import os

import numpy as np
import pytest

HEAD = os.environ.get("JAX_TPU_EMBEDDING_CHECKPOINT_UTILS")
pytestmark = [
    pytest.mark.skipif(
        not HEAD, reason="JAX_TPU_EMBEDDING_CHECKPOINT_UTILS names no checkout"
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

from tf_tpu_embed_opt.checkpoints import jax_orbax, jax_orbax_writer  # noqa: E402


@pytest.fixture
def head(monkeypatch):
    """jax-tpu-embedding's newest `checkpoint_utils`, loaded over the
    installed package (a constant it names, and 0.1.0 lacks, is given for
    its import; the functions used here do not read it)."""
    monkeypatch.setattr(jte_utils, "num_sparsecores_per_device", lambda d=None: 4)
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
    manager = head.create_checkpoint_manager(
        cp_path=tmp_path / "job", cp_options=ocp.CheckpointManagerOptions()
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
    step = os.path.join(tmp_path, "job", "1000")
    read = jax_orbax.read_jax_tables(step)
    for name in TABLES:
        np.testing.assert_array_equal(read[name].table, values["table"][name])
        for slot in jax_checkpoints.SLOTS:
            np.testing.assert_array_equal(read[name].slots[slot], values[slot][name])
    new = table_values(seed=51)
    jax_orbax_writer.write_jax_checkpoint(
        tmp_path / "out",
        1001,
        [
            (
                name,
                {
                    "parameters": new["table"][name],
                    "momenta": new["momentum"][name],
                    "velocities": new["velocity"][name],
                },
            )
            for name in TABLES
        ],
        jax_orbax.read_embedding_spec(step),
        dict.fromkeys(TABLES, "Adam"),
        items_from=step,
        spill_bytes=spill_bytes,
    )
    fresh, fresh_optimizer = _model(1)
    head.restore_checkpoint(
        input_checkpoint_path=tmp_path / "out",
        step=1001,
        model=fresh,
        optimizer=fresh_optimizer,
    )
    expected = jax_checkpoints.their_stacks(1, 4, new)[0]
    for stack, variables in fresh.embedding_layer.embedding_table.get_value().items():
        for part, value in (
            ("table", variables.table),
            ("momentum", variables.slot.momentum),
            ("velocity", variables.slot.velocity),
        ):
            np.testing.assert_array_equal(
                np.asarray(value).view(np.uint32),
                expected[part][stack].view(np.uint32),
                err_msg=f"{stack} {part}",
            )
    np.testing.assert_array_equal(
        np.asarray(fresh.dense.kernel.get_value()),
        np.asarray(model.dense.kernel.get_value()),
    )
