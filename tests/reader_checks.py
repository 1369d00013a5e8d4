"""Checks every checkpoint reader passes, whatever its format (imported by
the tests that open one of each)."""

# Runs without TensorFlow.

import pytest

# Each call of the front door (`Checkpoint`) and of a format's own reader
# (`protocol.TableReader`) that takes a table, and an array where it does.
_BY_NAME = {
    "read": (),
    "algorithms": (),
    "algorithms_of": (),
    "algorithm": (),
    "layout": (),
    "streams": (),
}
_BY_KEY = {
    "read_tensor": (),
    "read_rows": ((0, 1),),
    "stream": (),
    "verify": (),
    "verify_tensor": (),
    "jax_slot_name": (),
}


def assert_unknown_names_refused(source, name):
    """Every call of `source` refuses a table it does not hold, in the same
    words for every format and as a `KeyError` that is also a `ValueError`
    (SparseCore's reader raised a `ValueError`, the others a `KeyError`), and
    an array the table does not have, naming both; before this, a format's
    own `layout`, `read_rows` or `stream` raised a bare `KeyError('nope')`.
    A name that is no str is a `TypeError` (it was "unhashable type")."""
    calls = {**_BY_NAME, **_BY_KEY}
    present = [m for m in calls if callable(getattr(source, m, None))]
    assert {"read", "read_tensor", "read_rows", "stream", "layout"} <= set(present)
    for method in present:
        keys = ("parameters",) if method in _BY_KEY else ()
        with pytest.raises(KeyError, match="has no table 'nope'; its tables: ") as e:
            getattr(source, method)("nope", *keys, *calls[method])
        assert isinstance(e.value, ValueError), method
        assert str(e.value).startswith(f"Checkpoint {source.path!r} has no"), method
        with pytest.raises(TypeError, match=r"named by a str; received \['nope'\]"):
            getattr(source, method)(["nope"], *keys, *calls[method])
        if method in _BY_KEY:
            with pytest.raises(KeyError, match=f"Table '{name}' of .* has no 'nope'"):
                getattr(source, method)(name, "nope", *calls[method])
