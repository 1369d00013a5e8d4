"""`.keras` files with the package's layers load in a fresh process.

Each child process saves or loads on one Keras backend (both where both are
installed: TensorFlow's legs have JAX beside it in CI's first leg). The
loading process does nothing but `import tf_tpu_embed_opt` before
`keras.saving.load_model`: every Keras class of the package must be
registered by then, each under its own name. The oracle is the saving
process itself: the loaded model's weights (table, slots, the table
optimizer's step, the model and its optimizer's state) equal the saved ones
bit for bit, and after one more `fit` step on the same batch so do the
tables' (their row step is exact by construction: no reduction but the sum
of a duplicate id's rows, in order, and RowWiseAdagrad's sum of a row's
squares, in a fixed order of its own). The row-sparse model has two tables:
one with Adagrad, one with RowWiseAdagrad (state of one value per row). The
dense layer's step is not compared: XLA's and TensorFlow's CPU kernels may
split its batch reduction differently in two processes on a busy machine
(seen: one ulp in Adam's moments).
"""

# Runs without TensorFlow.

import importlib.util
import json
import subprocess
import sys
import zipfile

import numpy as np
import pytest
from child_env import child_env
from conftest import same_in_the_jax_leg, version_independent


def _backends(*tensorflow_marks):
    """Keras's backends as parameters, each skipped where it is missing;
    the TensorFlow one with `tensorflow_marks` too, the JAX one marked
    `same_in_the_jax_leg`: its children run on JAX, which the JAX legs run at
    both ends of the `[jax]` extra (the TensorFlow 2.21 leg, which has JAX
    in between, leaves it to them)."""
    return [
        pytest.param(
            name,
            marks=[
                pytest.mark.skipif(
                    importlib.util.find_spec(name) is None, reason=f"{name} missing"
                ),
                *(tensorflow_marks if name == "tensorflow" else (same_in_the_jax_leg,)),
            ],
        )
        for name in ("tensorflow", "jax")
    ]


_CHILD = r"""
import sys
import warnings
mode, backend_name, layer_kind, path, out = sys.argv[1:]
import tf_tpu_embed_opt as teo
import keras
import numpy as np


def state():
    arrays = {f"w{i}": np.asarray(w) for i, w in enumerate(model.weights)}
    arrays.update(
        {f"o{i}": np.asarray(v) for i, v in enumerate(model.optimizer.variables)}
    )
    return arrays


assert keras.backend.backend() == backend_name, keras.backend.backend()
ids = np.array([[1, 2, 2], [3, 1, 0], [7, 7, 7], [4, 5, 6]], "int32")
labels = np.array([[1.0], [0.0], [1.0], [0.5]], "float32")
if mode == "save":
    inputs = keras.Input((3,), dtype="int32")
    if layer_kind == "row_sparse":
        items = teo.layers.Embedding(
            10, 4, optimizer=teo.optimizers.Adagrad(0.1), name="items"
        )
        # A second table whose state is one value per row ([rows, 1]).
        per_row = teo.layers.Embedding(
            10, 4, optimizer=teo.optimizers.RowWiseAdagrad(0.1), name="per_row"
        )
        table = lambda ids: items(ids) + per_row(ids)
    elif layer_kind.startswith("keras_rs"):
        import keras_rs

        config = keras_rs.layers.TableConfig(
            name="items",
            vocabulary_size=10,
            embedding_dim=4,
            optimizer=teo.optimizers.Adam(0.05, lazy=True),
            placement="default_device",
        )
        feature = keras_rs.layers.FeatureConfig(
            name="f", table=config, input_shape=(4, 3), output_shape=(4, 4)
        )
        inner = keras_rs.layers.DistributedEmbedding({"f": feature}, name="items")
        stacked = layer_kind == "keras_rs_stacked"
        embedding = teo.layers.row_sparse_tables(inner, stack=stacked)
        inputs = keras.Input((3,), batch_size=4, dtype="int32")
        # The mean of each sample's rows, as one row per sample.
        table = lambda ids: keras.ops.expand_dims(embedding({"f": ids})["f"], 1)
    else:
        table = teo.sharded.Embedding(10, 4, name="items")
    outputs = keras.layers.Dense(1)(keras.ops.sum(table(inputs), axis=1))
    model = keras.Model(inputs, outputs)
    model.compile(keras.optimizers.Adam(0.01), "mse")
    model.fit(ids, labels, batch_size=4, epochs=2, verbose=0)
    model.save(path)
else:
    model = keras.saving.load_model(path)
    if mode != "load":
        # "load:True" or "load:False": what the guide says to set after a
        # load on the other backend.
        model.jit_compile = mode.partition(":")[2] == "True"
table = model.get_layer("items")
tables = [layer for layer in model.layers if layer.name in ("items", "per_row")]
saved_or_loaded = state()
saved_or_loaded.update(
    {
        f"{layer.name}_{i}": np.asarray(w)
        for layer in tables
        for i, w in enumerate(layer.weights)
    }
)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    # Labels 100 away from what the model outputs: each looked-up row's
    # gradient is about 50 times the dense kernel, so its slots' float32
    # bits move (on the training labels a row whose sample is nearly fitted
    # adds a g**2 below half an ulp of its accumulator, which keeps its bits).
    model.fit(ids, labels + 100.0, batch_size=4, epochs=1, verbose=0)
# Whether the step ran under XLA on TensorFlow, where ids are not refused.
unchecked = any("under XLA" in str(warning.message) for warning in caught)
print("jit_compile", model.jit_compile, "unchecked", unchecked)
print(type(table).__module__, type(table).__name__)
stepped = {
    f"next_{layer.name}_{i}": np.asarray(w)
    for layer in tables
    for i, w in enumerate(layer.weights)
}
np.savez(out, **saved_or_loaded, **stepped)
"""


def _child_env(backend):
    return child_env(KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")


def _child(tmp_path, backend, script, *arguments):
    """The words `script` prints, run in a fresh process on `backend`."""
    result = subprocess.run(
        [sys.executable, "-c", script, *map(str, arguments)],
        capture_output=True,
        text=True,
        env=_child_env(backend),
        cwd=str(tmp_path),
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.split()


def _run(tmp_path, mode, backend, layer_kind, model_path, out):
    arguments = (mode, backend, layer_kind, model_path, out)
    return _child(tmp_path, backend, _CHILD, *arguments)[-2:]


def _assert_same_bits(saved, loaded, across_backends=False):
    """The saved and loaded arrays equal bit for bit; `across_backends`:
    those before the next step alone, and Keras's own step counter by value
    (int32 on JAX, int64 on TensorFlow)."""
    with np.load(saved) as want, np.load(loaded) as got:
        assert sorted(want.files) == sorted(got.files)
        for key in want.files:
            if across_backends and key.startswith("next_"):
                continue
            if across_backends and want[key].dtype != got[key].dtype:
                assert {want[key].dtype, got[key].dtype} == {
                    np.dtype("int32"),
                    np.dtype("int64"),
                }, key
                assert int(want[key]) == int(got[key]), key
                continue
            assert want[key].dtype == got[key].dtype, key
            assert want[key].tobytes() == got[key].tobytes(), key


def _registered_names(model_path):
    with zipfile.ZipFile(model_path) as archive:
        config = json.loads(archive.read("config.json"))
    names = []

    def walk(node):
        if isinstance(node, dict):
            if node.get("registered_name"):
                names.append(node["registered_name"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(config)
    return names


# Saving and reloading the layer on TensorFlow does not depend on its
# version (Keras's `.keras` format; the layer's math is pinned per version
# elsewhere): CI runs it once there.
@pytest.mark.parametrize("backend", _backends(version_independent))
def test_row_sparse_layer_reloads_after_a_plain_import(tmp_path, backend):
    model_path = tmp_path / "model.keras"
    saved, loaded = tmp_path / "saved.npz", tmp_path / "loaded.npz"
    kind = _run(tmp_path, "save", backend, "row_sparse", model_path, saved)
    assert kind == ["tf_tpu_embed_opt.layers", "Embedding"]
    names = _registered_names(model_path)
    assert "tf_tpu_embed_opt>Embedding" in names
    assert "tf_tpu_embed_opt>Adagrad" in names
    assert "tf_tpu_embed_opt>RowWiseAdagrad" in names
    kind = _run(tmp_path, "load", backend, "row_sparse", model_path, loaded)
    assert kind == ["tf_tpu_embed_opt.layers", "Embedding"]
    _assert_same_bits(saved, loaded)


_BOTH = pytest.mark.skipif(
    not all(importlib.util.find_spec(name) for name in ("tensorflow", "jax")),
    reason="needs TensorFlow and JAX",
)


def _read(path):
    with np.load(path) as arrays:
        return {key: arrays[key] for key in arrays.files}


_KINDS = {
    "row_sparse": ["tf_tpu_embed_opt.layers", "Embedding"],
    "keras_rs_stacked": [
        "tf_tpu_embed_opt.layers.keras_rs_tables",
        "RowSparseDistributedEmbedding",
    ],
}


@version_independent
@_BOTH
@pytest.mark.parametrize(
    "layer_kind",
    [
        "row_sparse",
        pytest.param(
            "keras_rs_stacked",
            marks=pytest.mark.skipif(
                importlib.util.find_spec("keras_rs") is None,
                reason="keras-rs missing",
            ),
        ),
    ],
)
@pytest.mark.parametrize(
    "saved_on, loaded_on", [("jax", "tensorflow"), ("tensorflow", "jax")]
)
def test_a_model_saved_on_one_backend_trains_on_on_the_other(
    tmp_path, saved_on, loaded_on, layer_kind
):
    """A `.keras` file written on one backend loads on the other with its
    state bit for bit (Keras's own step counter by value: int32 on JAX,
    int64 on TensorFlow), and the next step steps the tables as a step does:
    the looked-up rows move, the others keep their bits, table and slots,
    and each table's step counter goes one on. That step is not compared
    with the saving backend's: the dense layer's output, from which the
    rows' gradient comes, is XLA's dot product on one backend and
    TensorFlow's on the other (seen: 7.5e-9 in one row, TensorFlow to JAX).
    The file keeps the `jit_compile` the model was compiled with: on
    TensorFlow a model compiled on JAX (whose "auto" is True) steps under
    XLA, which the layer says (ids outside a table are not refused there);
    on JAX one compiled on TensorFlow on a CPU (False) steps uncompiled
    (the value the saving process compiled with is the expectation: beside
    a GPU, TensorFlow's "auto" is True too).
    Setting `model.jit_compile` after the load, as the guide says, gives the
    backend's own. Row-sparse layers (Adagrad, and RowWiseAdagrad's state of
    one value per row) and keras-rs tables stacked (lazy Adam)."""
    model_path = tmp_path / "model.keras"
    saved, loaded = tmp_path / "saved.npz", tmp_path / "loaded.npz"
    words = _child(
        tmp_path, saved_on, _CHILD, "save", saved_on, layer_kind, model_path, saved
    )
    # What "auto" became where the model was compiled: True on JAX; on
    # TensorFlow False on a CPU alone (True beside a GPU).
    compiled = words[-5]
    if saved_on == "jax":
        assert compiled == "True"
    words = _child(
        tmp_path, loaded_on, _CHILD, "load", loaded_on, layer_kind, model_path, loaded
    )
    assert words[-2:] == _KINDS[layer_kind]
    jit_compile, unchecked = words[-5], words[-3]
    assert jit_compile == compiled
    assert unchecked == str(loaded_on == "tensorflow" and compiled == "True")
    # The guide's way: set jit_compile for the backend it now runs on.
    wanted = str(loaded_on == "jax")
    words = _child(
        tmp_path,
        loaded_on,
        _CHILD,
        f"load:{wanted}",
        loaded_on,
        layer_kind,
        model_path,
        tmp_path / "set.npz",
    )
    assert words[-6:-2] == ["jit_compile", wanted, "unchecked", "False"]
    _assert_same_bits(saved, loaded, across_backends=True)
    got = _read(loaded)
    # ids 0-7 are looked up (tests' batch); 8 and 9 are not.
    for table in (name for name in ("items", "per_row") if f"{name}_0" in got):
        before = [got[key] for key in sorted(got) if key.startswith(f"{table}_")]
        after = [got[f"next_{table}_{i}"] for i in range(len(before))]
        rows = [i for i, value in enumerate(before) if value.shape[:1] == (10,)]
        assert len(rows) >= 2, table  # the table and its slots
        for i in rows:
            assert before[i][8:].tobytes() == after[i][8:].tobytes(), (table, i)
            moved = np.any(before[i][:8] != after[i][:8], axis=-1)
            assert moved.all(), (table, i, moved)
        (step,) = [i for i, value in enumerate(before) if value.shape == (2,)]
        # The pair [low, high] of a small count: low goes one on.
        assert (after[step] - before[step]).tolist() == [1.0, 0.0], table


@pytest.mark.skipif(
    importlib.util.find_spec("keras_rs") is None, reason="keras-rs missing"
)
@pytest.mark.parametrize("layer_kind", ["keras_rs", "keras_rs_stacked"])
@pytest.mark.parametrize("backend", _backends(version_independent))
def test_keras_rs_row_sparse_tables_reload_after_a_plain_import(
    tmp_path, backend, layer_kind
):
    """A keras-rs `DistributedEmbedding` changed by `row_sparse_tables` is
    saved under its own name with the arguments, so that the file rebuilds
    it row-sparse (keras-rs's own config would rebuild one variable per
    table and refuse the file's table, slots and step counter)."""
    model_path = tmp_path / "model.keras"
    saved, loaded = tmp_path / "saved.npz", tmp_path / "loaded.npz"
    kind = _run(tmp_path, "save", backend, layer_kind, model_path, saved)
    assert kind == [
        "tf_tpu_embed_opt.layers.keras_rs_tables",
        "RowSparseDistributedEmbedding",
    ]
    assert "tf_tpu_embed_opt>RowSparseDistributedEmbedding" in _registered_names(
        model_path
    )
    assert _run(tmp_path, "load", backend, layer_kind, model_path, loaded) == kind
    _assert_same_bits(saved, loaded)


def _rename_in_file(model_path, old, new):
    """Rewrites a `.keras` file's config as an older version wrote it."""
    with zipfile.ZipFile(model_path) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    config = members["config.json"].decode()
    assert old in config
    members["config.json"] = config.replace(old, new).encode()
    with zipfile.ZipFile(model_path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)


@version_independent
def test_sharded_layer_reloads_under_its_own_name(tmp_path):
    """`sharded.Embedding` has its own registered name; a file written when it
    shared `"tf_tpu_embed_opt>Embedding"` with the row-sparse layer (config
    without `optimizer`) still loads as the sharded layer."""
    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("the sharded layer needs TensorFlow")
    model_path = tmp_path / "model.keras"
    saved = tmp_path / "saved.npz"
    kind = _run(tmp_path, "save", "tensorflow", "sharded", model_path, saved)
    assert kind == ["tf_tpu_embed_opt.layers.sharded", "Embedding"]
    assert "tf_tpu_embed_opt>ShardedEmbedding" in _registered_names(model_path)
    older_path = tmp_path / "older.keras"
    older_path.write_bytes(model_path.read_bytes())
    _rename_in_file(
        older_path,
        '"tf_tpu_embed_opt>ShardedEmbedding"',
        '"tf_tpu_embed_opt>Embedding"',
    )
    assert "tf_tpu_embed_opt>ShardedEmbedding" not in _registered_names(older_path)
    for path in (model_path, older_path):
        loaded = tmp_path / f"{path.stem}.npz"
        kind = _run(tmp_path, "load", "tensorflow", "sharded", path, loaded)
        assert kind == ["tf_tpu_embed_opt.layers.sharded", "Embedding"], path
        _assert_same_bits(saved, loaded)
    if importlib.util.find_spec("jax") is None:
        return
    # Off TensorFlow the older file's layer is Keras's own Embedding, as the
    # sharded layer is there.
    loaded = tmp_path / "older_on_jax.npz"
    kind = _run(tmp_path, "load", "jax", "sharded", older_path, loaded)
    assert kind == ["keras.src.layers.core.embedding", "Embedding"]
    _assert_same_bits(saved, loaded, across_backends=True)


def test_each_registered_class_has_its_own_name():
    """No two of the package's Keras classes share a registered name (the
    import order would decide which one a file gets)."""
    keras = pytest.importorskip("keras")
    from keras.src.saving import object_registration

    import tf_tpu_embed_opt  # noqa: F401 - registers once Keras is loaded

    ours = {
        cls: name
        for cls, name in object_registration.GLOBAL_CUSTOM_NAMES.items()
        if name.startswith("tf_tpu_embed_opt>")
    }
    assert "tf_tpu_embed_opt>Embedding" in ours.values()
    assert len(set(ours.values())) == len(ours), sorted(ours.values())
    for cls, name in ours.items():
        assert keras.saving.get_registered_object(name) is cls, name


_FIRST_IMPORT = """
import sys
exec(sys.argv[1])
import keras

names = ("tf_tpu_embed_opt>Adagrad", "tf_tpu_embed_opt>Embedding")
print(*(keras.saving.get_registered_object(n).__module__ for n in names))
"""


# Which module registers the Keras classes does not depend on TensorFlow's
# version: on TensorFlow, CI runs these once (`version_independent`); the
# JAX leg runs them on JAX.
_ONCE_ON_TENSORFLOW = (
    [version_independent] if importlib.util.find_spec("tensorflow") else []
)


@pytest.mark.parametrize(
    "first",
    [
        pytest.param(first, marks=_ONCE_ON_TENSORFLOW)
        for first in (
            "import tf_tpu_embed_opt",
            "import keras, tf_tpu_embed_opt",
            "import tf_tpu_embed_opt.optimizers",
            "import tf_tpu_embed_opt.layers",
            "import tf_tpu_embed_opt.conversions.faces",
        )
    ],
)
def test_registered_whichever_module_imports_keras_first(tmp_path, first):
    """The registration waits for the package's module that imported Keras
    (the layers import the Keras face whole), then registers everything."""
    keras = pytest.importorskip("keras")
    words = _child(tmp_path, keras.backend.backend(), _FIRST_IMPORT, first)
    assert words == [
        "tf_tpu_embed_opt.optimizers",
        "tf_tpu_embed_opt.layers",
    ]
