"""The package's layers: every import points down, no circle, small modules.

The layers, bottom up (docs/architecture.md): `errors`, `lazy`, `definitions` <
`embedding`, `optimizers` (siblings: neither imports the other) < `engines` <
`conversions` (`faces`, `keras_reading`, `learning_rates`, the preflights) <
`layers` < `checkpoints` < `optimizer_spec` < `cli`; the package's
`__init__` (public names, loaded on first use) and `__main__` on top. The
graph is read from the source (every `import` statement, those inside
functions included), so it needs neither TensorFlow nor Keras.
"""

# Runs without TensorFlow.

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "tf_tpu_embed_opt"

LAYERS = {
    "errors": 0,
    "lazy": 0,
    "definitions": 0,
    "embedding": 1,
    "optimizers": 1,
    "engines": 2,
    "conversions": 3,
    "layers": 4,
    "checkpoints": 5,
    "optimizer_spec": 6,
    "cli": 7,
}
TOP = 8  # tf_tpu_embed_opt/__init__.py and __main__.py

MAX_LINES = 700
# DESIGN.md: no function over about 80 lines. Counted from its first
# statement after the docstring to its last, so that Google-style docstrings
# are not held against it.
MAX_FUNCTION_LINES = 80


def _modules():
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


MODULES = _modules()


def _imports(path):
    """The package modules `path` imports (a name imported from a package
    counts as its submodule when there is one)."""
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{path}: relative import")
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "tf_tpu_embed_opt"
        ):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                targets.add(full if full in MODULES else node.module)
        elif isinstance(node, ast.Import):
            targets.update(
                a.name for a in node.names if a.name.startswith("tf_tpu_embed_opt")
            )
    return targets


GRAPH = {name: _imports(path) - {name} for name, path in MODULES.items()}


def _layer(module):
    parts = module.split(".")
    if len(parts) == 1 or parts[1] == "__main__":
        return TOP
    return LAYERS[parts[1]]


def test_every_module_has_a_layer():
    for module in MODULES:
        assert _layer(module) is not None, module


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down(module):
    for target in sorted(GRAPH[module]):
        if target == "tf_tpu_embed_opt":
            # The CLI takes `__version__` and the message for a missing
            # TensorFlow; the public names' lazy loader is never used from
            # inside the package.
            assert module.startswith("tf_tpu_embed_opt.cli"), target
            continue
        assert _layer(target) <= _layer(module), f"{module} imports up: {target}"
        if _layer(target) == _layer(module) == LAYERS["embedding"]:
            assert target.split(".")[1] == module.split(".")[1], (
                f"{module} imports its sibling face {target}"
            )


@pytest.mark.parametrize(
    "module", sorted(m for m in MODULES if m.startswith("tf_tpu_embed_opt.engines"))
)
def test_no_engine_imports_a_face(module):
    """An engine judges embedding-face objects and runs definitions; the two
    faces meet only above it (`convert`), so it never imports the Keras face
    (jax-tpu-embedding's custom spec runs a twin's `ConfiguredRule`)."""
    for target in GRAPH[module]:
        assert not target.startswith("tf_tpu_embed_opt.optimizers"), target


def test_no_import_circle():
    state = {}

    def visit(module, path):
        state[module] = "open"
        for target in sorted(GRAPH.get(module, ())):
            if state.get(target) == "open":
                raise AssertionError(" -> ".join([*path, module, target]))
            if target not in state:
                visit(target, [*path, module])
        state[module] = "done"

    for module in sorted(MODULES):
        if module not in state:
            visit(module, [])


@pytest.mark.parametrize("module", sorted(MODULES))
def test_module_size(module):
    lines = MODULES[module].read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_LINES, f"{module}: {lines} lines"


BENCHMARKS = PACKAGE.parent / "benchmarks"


@pytest.mark.parametrize(
    "path",
    sorted(BENCHMARKS.rglob("*.py")) if BENCHMARKS.is_dir() else [],
    ids=lambda path: str(path.relative_to(BENCHMARKS)),
)
def test_benchmark_module_size(path):
    """The harnesses keep the package's size rule: a room per concern."""
    lines = path.read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_LINES, f"benchmarks/{path.name}: {lines} lines"


def _long_functions(source, name):
    """`name:function (lines)` of each function in `source` whose code is
    longer than `MAX_FUNCTION_LINES`."""
    long = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        body = node.body
        if isinstance(body[0], ast.Expr) and isinstance(
            getattr(body[0], "value", None), ast.Constant
        ):
            body = body[1:]
        if not body:
            continue
        lines = body[-1].end_lineno - body[0].lineno + 1
        if lines > MAX_FUNCTION_LINES:
            long.append(f"{name}:{node.name} ({lines} lines)")
    return long


def test_function_size():
    """No function of the package or of the harnesses is over
    `MAX_FUNCTION_LINES` lines of code."""
    paths = sorted(PACKAGE.rglob("*.py"))
    if BENCHMARKS.is_dir():
        paths += sorted(BENCHMARKS.rglob("*.py"))
    long = [
        function
        for path in paths
        for function in _long_functions(
            path.read_text(encoding="utf-8"),
            str(path.relative_to(PACKAGE.parent)),
        )
    ]
    assert not long, long


def test_a_planted_long_function_is_caught():
    """The size rule counts code, not the docstring: a function one line over
    is caught, one that long only with its docstring is not."""
    code = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    docstring = '    """Doc.\n\n' + "    More.\n" * 30 + '    """\n'
    assert _long_functions("def f():\n" + docstring + code, "m") == []
    assert _long_functions(
        "def f():\n" + docstring + code + "    return x0\n", "m"
    ) == [f"m:f ({MAX_FUNCTION_LINES + 1} lines)"]


def test_definitions_import_neither_tensorflow_nor_keras():
    for module, path in MODULES.items():
        if not module.startswith("tf_tpu_embed_opt.definitions"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            for name in names:
                assert name.split(".")[0] not in ("tensorflow", "keras"), (
                    f"{module} imports {name}"
                )


def test_a_planted_upward_import_is_caught(tmp_path):
    """The graph reader sees imports inside functions too."""
    planted = tmp_path / "planted.py"
    planted.write_text(
        "def f():\n    from tf_tpu_embed_opt.checkpoints.keras import state\n"
    )
    assert _imports(planted) == {"tf_tpu_embed_opt.checkpoints.keras.state"}


MOVED = {
    "spec": "tf_tpu_embed_opt.definitions.spec",
    "registry": "tf_tpu_embed_opt.definitions.registry",
    "rules": "tf_tpu_embed_opt.definitions.rules",
    "tables": "tf_tpu_embed_opt.definitions.tables",
    "algorithms": "tf_tpu_embed_opt.definitions.algorithms",
    "proto": "tf_tpu_embed_opt.embedding.proto",
    "configuration": "tf_tpu_embed_opt.embedding.configuration",
    "clippy_adagrad": "tf_tpu_embed_opt.optimizers",
    "sparse": "tf_tpu_embed_opt.optimizers.sparse",
    "checkpoint_keys": "tf_tpu_embed_opt.checkpoints.shared.keys",
    "optimizer_spec_descriptor": "tf_tpu_embed_opt.optimizer_spec.descriptor",
    "convert": "tf_tpu_embed_opt.conversions.faces",
    "keras_differences": "tf_tpu_embed_opt.conversions.keras_reading",
    "learning_rates": "tf_tpu_embed_opt.conversions.learning_rates",
    "preflight": "tf_tpu_embed_opt.conversions.preflight",
    "preflight_jax": "tf_tpu_embed_opt.conversions.preflight_jax",
}


@pytest.mark.parametrize("old", sorted(MOVED))
def test_a_moved_module_is_served_with_a_warning_naming_its_new_path(old):
    import importlib

    import tf_tpu_embed_opt as teo

    with pytest.warns(DeprecationWarning, match=MOVED[old].replace(".", r"\.")):
        try:
            module = getattr(teo, old)
        except ModuleNotFoundError as error:
            if error.name != "tensorflow":
                raise
            pytest.skip(f"{MOVED[old]} needs TensorFlow, which is not installed")
    assert module is importlib.import_module(MOVED[old])
    assert old not in teo.__all__


# Issue #55: checkpoints/ from flat modules to a folder per format.
CHECKPOINTS_MOVED = {
    "keys": "shared.keys",
    "sparsecore_stacks": "shared.stacks",
    "tpu_layout": "tpu_embedding.reader",
    "tpu_writer": "tpu_embedding.writer",
    "sparsecore_reader": "sparsecore.reader",
    "jax_orbax": "jax_tpu_embedding.reader",
    "jax_orbax_writer": "jax_tpu_embedding.writer",
    "keras_rs_orbax": "jax_tpu_embedding.keras_rs",
    "keras_orbax": "keras.orbax_reader",
    "keras_state": "keras.state",
    # A conversion, no checkpoint: it left checkpoints/ (a full path).
    "multi_optimizer": "tf_tpu_embed_opt.conversions.multi_optimizer",
}


# Every flat module of checkpoints/ before issue #55.
_CHECKPOINTS_ALL_MOVED = (
    "keys",
    "paths",
    "table_info",
    "sparsecore_stacks",
    "orbax_arrays",
    "orbax_items",
    "tpu_layout",
    "tpu_writer",
    "sparsecore_reader",
    "sparsecore_writer",
    "jax_orbax",
    "jax_orbax_writer",
    "jax_orbax_processes",
    "jax_spec_proto",
    "jax_layouts",
    "jax_specs",
    "stack_assembly",
    "keras_rs_orbax",
    "keras_orbax",
    "keras_tables",
    "keras_state",
    "multi_optimizer",
)


@pytest.mark.parametrize("old", sorted(CHECKPOINTS_MOVED))
def test_a_moved_checkpoint_module_imports_by_its_old_path(old):
    """`import` and `from ... import` of an old path give the new module (the
    same object), with a DeprecationWarning naming the new path and the line
    that imported it."""
    import importlib
    import sys

    new = CHECKPOINTS_MOVED[old]
    if not new.startswith("tf_tpu_embed_opt."):
        new = f"tf_tpu_embed_opt.checkpoints.{new}"
    assert not (PACKAGE / "checkpoints" / f"{old}.py").exists()
    try:
        module = importlib.import_module(new)
    except ModuleNotFoundError as error:
        if error.name not in ("tensorflow", "jax", "orbax"):
            raise
        pytest.skip(f"{new} needs {error.name}, which is not installed")
    package = importlib.import_module("tf_tpu_embed_opt.checkpoints")

    def forget():
        # An earlier import of the old path left it in sys.modules and on
        # the package: import it afresh.
        sys.modules.pop(f"tf_tpu_embed_opt.checkpoints.{old}", None)
        package.__dict__.pop(old, None)

    forget()
    with pytest.warns(DeprecationWarning, match=new.replace(".", r"\.")) as caught:
        source = f"from tf_tpu_embed_opt.checkpoints import {old} as found"
        exec(compile(source, __file__, "exec"), globals())
    assert found is module  # noqa: F821 - bound by the exec above
    assert caught[0].filename == __file__
    forget()
    with pytest.warns(DeprecationWarning, match=new.replace(".", r"\.")):
        imported = importlib.import_module(f"tf_tpu_embed_opt.checkpoints.{old}")
    assert imported is module


def test_the_multi_optimizer_imports_by_its_path_in_checkpoints_keras():
    """`checkpoints.keras.multi_optimizer`, its home before it joined the
    conversions, gives the same module with a DeprecationWarning."""
    import importlib
    import sys

    from tf_tpu_embed_opt.checkpoints import keras as keras_side
    from tf_tpu_embed_opt.conversions import multi_optimizer

    old = "tf_tpu_embed_opt.checkpoints.keras.multi_optimizer"
    assert not (PACKAGE / "checkpoints" / "keras" / "multi_optimizer.py").exists()
    sys.modules.pop(old, None)
    keras_side.__dict__.pop("multi_optimizer", None)
    with pytest.warns(DeprecationWarning, match=r"conversions\.multi_optimizer"):
        imported = importlib.import_module(old)
    assert imported is multi_optimizer


def test_the_documentation_imports_no_moved_module():
    """The docs' examples use the new paths (an old one still imports, with a
    DeprecationWarning a user should not meet in them)."""
    import re

    from doc_pages import name, python_blocks

    old_paths = (
        [f"tf_tpu_embed_opt.{old}" for old in MOVED]
        + [f"tf_tpu_embed_opt.checkpoints.{old}" for old in _CHECKPOINTS_ALL_MOVED]
        + ["tf_tpu_embed_opt.checkpoints.keras.multi_optimizer"]
    )
    for page, block in python_blocks():
        for path in old_paths:
            package, _, module = path.rpartition(".")
            assert not re.search(rf"{re.escape(path)}\b(?![./])", block), (
                name(page),
                path,
            )
            assert not re.search(
                rf"from {re.escape(package)} import [^\n]*\b{module}\b", block
            ), (name(page), path)


def test_the_engines_judge_embedding_face_objects_only():
    keras = pytest.importorskip("keras")
    pytest.importorskip("tensorflow")
    import tf_tpu_embed_opt as teo

    with pytest.raises(TypeError, match=r"tf_tpu_embed_opt\.check_engine"):
        teo.engines.check_configuration(keras.optimizers.Adagrad(0.1))
    report = teo.check_engine(keras.optimizers.Adagrad(0.1), "TPUEmbedding")
    assert report.tables[0].algorithm == "Adagrad"


def test_one_check_engine():
    """`tf_tpu_embed_opt.check_engine` is the one function of that name; the
    engines' old one is served for a release, with a DeprecationWarning."""
    import tf_tpu_embed_opt as teo

    names = {}
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef) and node.name == "check_engine":
                names.setdefault(node.name, []).append(module)
    assert names == {"check_engine": ["tf_tpu_embed_opt.conversions.preflight"]}
    pytest.importorskip("tensorflow")
    with pytest.warns(DeprecationWarning, match="tf_tpu_embed_opt.check_engine"):
        old = teo.engines.__getattr__("check_engine")
    assert old is teo.engines.check_configuration


def _map_entries():
    """The module paths of docs/architecture.md's map, "The map"."""
    page = (PACKAGE.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = page[page.index("## The map") :]
    block = section[section.index("```text\n") + 8 :]
    block = block[: block.index("```")]
    return [line.split()[0] for line in block.splitlines() if line.strip()]


def test_the_architecture_map_names_every_module_once():
    entries = _map_entries()
    assert len(entries) == len(set(entries)), entries
    algorithms = PACKAGE / "definitions" / "algorithms"
    modules = set()
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE).as_posix()
        if path.parent == algorithms and path.stem not in ("__init__", "shared"):
            relative = "definitions/algorithms/<name>.py"
        modules.add(relative)
    assert sorted(modules - set(entries)) == [], "missing from the map"
    assert sorted(set(entries) - modules) == [], "in the map, not in the package"
