"""Every checkpoint format implements one protocol, found in one registry.

`checkpoints.formats` registers each format once; its handler module
(`protocol.FormatHandler`: `detect`, `open_reader`, `describe`), its reader
class (a `protocol.TableReader`) and its writer module (`protocol.FormatWriter`)
are checked here against that record (`test_registries.py` checks that no
module outside the registry compares a format's name).
"""

# Runs without TensorFlow.

import inspect
import typing

import pytest

from tf_tpu_embed_opt.checkpoints import formats, protocol

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


def test_formats_are_described_as_one_list_in_words():
    keras, sparsecore, tpu = formats.KERAS, formats.SPARSECORE, formats.TPU_EMBEDDING
    assert formats.described([]) == ""
    assert formats.described([tpu]) == tpu.words
    assert formats.described(["keras", tpu]) == f"{keras.words} or {tpu.words}"
    assert formats.described([keras, sparsecore, tpu]) == (
        f"{keras.words}, {sparsecore.words} or {tpu.words}"
    )
