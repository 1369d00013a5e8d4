"""Engines and formats are objects found in a registry, never names compared.

`checkpoints.formats` registers the checkpoint formats and
`definitions.engine_faces` the engines (`spec.ENGINES`); every other module
asks the object (`format.orbax`, `engine.tensorflow`, ...). Read from the
source: a comparison of a format's or an engine's name, written as a string,
with an expression about a format or an engine is refused outside its
registry.
"""

# Runs without TensorFlow.

import ast
import importlib
import pathlib

import pytest

from tf_tpu_embed_opt import engines
from tf_tpu_embed_opt.checkpoints import formats
from tf_tpu_embed_opt.definitions import arguments, registry, spec

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "tf_tpu_embed_opt"
ENGINE_NAMES = {engine.name for engine in spec.ENGINES}


def _constants(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [value for element in node.elts for value in _constants(element)]
    return []


def _compared(words, names):
    """`(module, line, constant)` of each comparison of a name in `names`
    with an expression whose source mentions one of `words`."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            constants = [c for side in sides for c in _constants(side) if c in names]
            if not constants:
                continue
            others = " ".join(
                ast.get_source_segment(source, side) or ""
                for side in sides
                if not _constants(side)
            )
            if any(word in others for word in words):
                found.append((str(path.relative_to(PACKAGE)), node.lineno, constants))
    return found


def test_no_module_compares_a_format_name_as_a_string():
    names = set(formats.READ_NAMES)
    found = _compared(("format", "layout", "found", "naming"), names)
    found = [hit for hit in found if hit[0] != "checkpoints/formats.py"]
    assert found == []


def test_no_module_compares_an_engine_name_as_a_string():
    found = _compared(("engine",), ENGINE_NAMES)
    found = [hit for hit in found if hit[0] != "definitions/engine_faces.py"]
    assert found == []


def test_an_engine_is_its_name_and_says_what_it_is():
    for engine in spec.ENGINES:
        assert spec.engine_named(engine.name, "f") is engine
        assert engine == engine.name and hash(engine) == hash(engine.name)
        assert repr(engine) == repr(engine.name) and f"{engine}" == engine.name
    assert [e.name for e in spec.ENGINES if e.whole_proto] == ["TPUEmbedding"]
    assert [e.name for e in spec.ENGINES if e.sparsecore_op] == ["TPUEmbeddingV2"]
    assert [e.name for e in spec.ENGINES if not e.tensorflow] == [spec.JAX_ENGINE]


def test_the_count_catches_a_planted_comparison(tmp_path, monkeypatch):
    planted = tmp_path / "tf_tpu_embed_opt"
    planted.mkdir()
    (planted / "m.py").write_text(
        "def f(format, found, engine):\n"
        "    return format == 'keras-rs' or found in ('sparsecore', 'keras')\n"
        "def g(engine):\n"
        "    return 'TPUEmbeddingV2' != engine\n"
    )
    monkeypatch.setattr(
        importlib.import_module(__name__), "PACKAGE", planted, raising=True
    )
    hits = _compared(("format", "found"), set(formats.READ_NAMES))
    assert [hit[2] for hit in hits] == [["keras-rs"], ["sparsecore", "keras"]]
    hits = _compared(("engine",), ENGINE_NAMES)
    assert [hit[2] for hit in hits] == [["TPUEmbeddingV2"]]


def _behaviours():
    """Each engine's behaviour, where it loads here (`TPUEmbeddingV2`'s reads
    TensorFlow's classes): `(engine, behaviour)`."""
    loaded = []
    for engine in spec.ENGINES:
        try:
            loaded.append((engine, engines.behaviour_of(engine)))
        except ModuleNotFoundError as error:
            assert error.name.split(".")[0] == "tensorflow" and engine.tensorflow
    return loaded


def test_every_engine_carries_its_behaviour():
    """One object per engine in one registry; what it does is its module's
    (`Engine.module`), which satisfies the one protocol, found by the engine
    or by its name."""
    loaded = _behaviours()
    assert [e.name for e, _ in loaded][-1] == spec.JAX_ENGINE
    for engine, behaviour in loaded:
        assert isinstance(behaviour, engines.EngineBehaviour), engine
        assert behaviour.__name__ == f"tf_tpu_embed_opt.engines.{engine.module}"
        assert engines.behaviour_of(engine.name) is behaviour
    with pytest.raises(ValueError, match=r"behaviour_of: argument `engine` must "):
        engines.behaviour_of("TPUEmbeddingV3")


def test_each_engine_says_what_it_runs():
    """What runs where, asked of the engines: each algorithm's own records
    (TensorFlow's, SparseCore's, jax-tpu-embedding's spec) and its refusal."""
    for engine, behaviour in _behaviours():
        algorithms = behaviour.algorithms()
        assert list(algorithms) == [
            d.name for d in registry.ALL if d.name in algorithms
        ]
        for d in registry.ALL:
            runs = d.name in algorithms
            if engine.whole_proto:
                assert runs == (d.tensorflow is not None and not d.engine_refusal)
            elif engine.sparsecore_op:
                assert runs == (d.sparsecore is not None), d.name
            else:
                assert runs == (d.jax is not None or d.engine_refusal is None)
            cell = behaviour.runs_as(d)
            if engine.tensorflow:
                assert cell == ("yes" if runs else "no")
            elif runs:
                assert cell.startswith("`") and "Spec`" in cell, cell
            else:
                assert cell.startswith("no: "), cell


def _optimizer(definition, **kwargs):
    """An embedding optimizer of `definition`: the class where TensorFlow
    loads, else its checked arguments (what the engines read)."""
    try:
        from tf_tpu_embed_opt.embedding import parameters
    except ModuleNotFoundError:
        return arguments.Checked(definition, **kwargs)
    return parameters.class_for(definition)(**kwargs)


def test_what_a_twin_reproduces_is_asked_of_the_engine():
    """`to_keras` asks the engine what it computes for an optimizer: the
    optimizer itself, or what is left of it (with the settings dropped), or
    a refusal in the engine's words."""
    for engine, behaviour in _behaviours():
        for d in registry.DEFINITIONS:
            opt = _optimizer(d, learning_rate=0.5, clipvalue=1.0)
            if d.name not in behaviour.algorithms():
                with pytest.raises(ValueError, match=f"^{engine} cannot run "):
                    behaviour.for_twin(opt)
                continue
            computed, dropped = behaviour.for_twin(opt)
            if engine.sparsecore_op:
                assert [s.name for s in dropped] == ["clipvalue"]
                assert computed.clip_gradient_max is None
                assert computed.learning_rate == 0.5
            else:
                assert (computed, dropped) == (opt, ())
        if not engine.whole_proto:
            opt = _optimizer(registry.BY_NAME["Adagrad"], weight_decay_factor=0.1)
            refused = "weight_decay" if engine.sparsecore_op else None
            if refused is None:
                opt = _optimizer(
                    registry.BY_NAME["Adagrad"], use_gradient_accumulation=False
                )
                refused = "use_gradient_accumulation"
            with pytest.raises(ValueError, match=refused):
                behaviour.for_twin(opt)


# Issue #55: ClippyAdagrad is a definition like the others; the package names
# it only in its definition module. Its registry entry and the old module
# path served for one release (`optimizers.clippy_adagrad`) name the module.
CLIPPY_HOME = "definitions/algorithms/clippy_adagrad.py"
CLIPPY_MODULE_PATHS = {
    ("definitions/registry.py", "    clippy_adagrad,"),
    ("definitions/registry.py", "    clippy_adagrad.DEFINITION,"),
    ("__init__.py", '    "clippy_adagrad": "tf_tpu_embed_opt.optimizers",'),
    (
        "optimizers/__init__.py",
        'lazy.serve_moved_modules({f"{__name__}.clippy_adagrad": __name__})',
    ),
}


def _naming(package, word):
    """`(module, line)` of each line of `package`'s source that names `word`
    (any case: the class, its module, its words in docstrings)."""
    found = set()
    for path in sorted(package.rglob("*.py")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if word in line.lower():
                found.add((str(path.relative_to(package)), line))
    return found


def test_only_its_definition_names_clippy_adagrad():
    named = {hit for hit in _naming(PACKAGE, "clippy") if hit[0] != CLIPPY_HOME}
    assert named == CLIPPY_MODULE_PATHS


def test_the_naming_count_catches_a_planted_special_case(tmp_path):
    planted = tmp_path / "layers" / "table.py"
    planted.parent.mkdir()
    planted.write_text("if type(opt).__name__ == 'ClippyAdagrad':\n    pass\n")
    assert _naming(tmp_path, "clippy") == {
        ("layers/table.py", "if type(opt).__name__ == 'ClippyAdagrad':")
    }
