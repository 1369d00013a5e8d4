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

from tf_tpu_embed_opt.checkpoints import formats
from tf_tpu_embed_opt.definitions import spec

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
            others = " ".join(
                ast.get_source_segment(source, side) or ""
                for side in sides
                if not _constants(side)
            )
            if constants and any(word in others for word in words):
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
