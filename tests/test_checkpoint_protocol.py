"""Every checkpoint format implements one protocol, found in one registry.

`checkpoints.formats` registers each format once; its handler module
(`protocol.FormatHandler`: `detect`, `open_reader`, `describe`), its reader
class (a `protocol.TableReader`) and its writer module (`protocol.FormatWriter`)
are checked here against that record, and no module outside the registry
compares a format's name as a string (read from the source).
"""

# Runs without TensorFlow.

import ast
import importlib
import inspect
import pathlib
import typing

import pytest

from tf_tpu_embed_opt.checkpoints import formats, protocol

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "tf_tpu_embed_opt"
MISSING = ("tensorflow", "jax", "orbax", "keras")


def _imported(load):
    try:
        return load()
    except ModuleNotFoundError as error:
        if (error.name or "").split(".")[0] not in MISSING:
            raise
        pytest.skip(f"needs {error.name}, which is not installed")


def _parameters(function):
    return {
        name
        for name, p in inspect.signature(function).parameters.items()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    } - {"path"}


@pytest.mark.parametrize("format", formats.FORMATS, ids=str)
def test_every_format_has_a_handler_taking_its_arguments(format):
    handler = _imported(format.handling)
    assert isinstance(handler, protocol.FormatHandler), format.handler
    assert _parameters(handler.open_reader) == set(format.takes)
    # describe_checkpoint reads no tensor: it takes no algorithms and no cache.
    described = set(format.takes) - {"algorithms", "cache_bytes"}
    assert _parameters(handler.describe) == described


@pytest.mark.parametrize("format", formats.FORMATS, ids=str)
def test_every_format_reads_through_a_table_reader(format):
    handler = _imported(format.handling)
    reader = typing.get_type_hints(handler.open_reader)["return"]
    assert issubclass(reader, protocol.TableReader), reader
    # keras-rs's steps are read by jax-tpu-embedding's reader, as keras-rs.
    assert reader.format in (format.name, formats.JAX_TPU_EMBEDDING.name)
    for method in ("read", "read_tensor", "read_rows", "layout", "read_scalar"):
        assert callable(getattr(reader, method)), (reader, method)


@pytest.mark.parametrize("format", formats.WRITTEN, ids=str)
def test_every_written_format_has_a_writer(format):
    writer = _imported(format.writing)
    assert isinstance(writer, protocol.FormatWriter), format.writer
    assert set(format.write_needs) <= set(format.write_takes)


def test_the_registry_names_each_format_once():
    names = [f.name for f in formats.FORMATS]
    assert len(set(names)) == len(names)
    assert formats.READ == {f.name: f.words for f in formats.FORMATS}
    assert set(formats.WRITTEN) <= set(formats.FORMATS)
    for format in formats.FORMATS:
        assert formats.format_named(format.name, "f") is format
        assert formats.found(format.name) is format
        if format.layout:
            assert formats.with_layout(format.layout) is format
    with pytest.raises(ValueError, match=r"f: argument `format` must be one of"):
        formats.format_named("orbax", "f")


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


def test_the_count_catches_a_planted_format_comparison(tmp_path, monkeypatch):
    planted = tmp_path / "tf_tpu_embed_opt"
    planted.mkdir()
    (planted / "m.py").write_text(
        "def f(format, found):\n"
        "    return format == 'keras-rs' or found in ('sparsecore', 'keras')\n"
    )
    monkeypatch.setattr(
        importlib.import_module(__name__), "PACKAGE", planted, raising=True
    )
    hits = _compared(("format", "found"), set(formats.READ_NAMES))
    assert [hit[2] for hit in hits] == [["keras-rs"], ["sparsecore", "keras"]]
