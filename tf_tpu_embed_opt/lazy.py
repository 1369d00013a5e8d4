"""Package attributes that load their module on first use.

`engines` and `checkpoints` re-export names whose modules need TensorFlow (or
are heavy); importing the package must not load them. Python calls a module's
`__getattr__` for a name it lacks (PEP 562): the one made here imports the
name's home module, caches the value in the package and returns it.
"""

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional

from tf_tpu_embed_opt.errors import tensorflow_needed_by

__all__ = ["deprecated", "module_dir", "module_getattr", "serve_moved_modules"]


def module_getattr(
    package: str, homes: Mapping[str, str], namespace: Dict[str, Any]
) -> Callable[[str], Any]:
    """A `__getattr__` for `package` whose names live in its submodules.

    Args:
      package: The package's `__name__`.
      homes: For each lazy name, the submodule (relative to `package`) that
        defines it.
      namespace: The package's `globals()`, where each value is cached so
        that later lookups skip `__getattr__`.
    """

    def __getattr__(name: str) -> Any:
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        with tensorflow_needed_by(f"{package}.{name}"):
            value = getattr(importlib.import_module(f"{package}.{homes[name]}"), name)
        namespace[name] = value
        return value

    return __getattr__


def module_dir(
    names: Iterable[str], need_tensorflow: Iterable[str]
) -> Callable[[], List[str]]:
    """A `__dir__` for a package whose public `names` load on first use:
    without TensorFlow, those of `need_tensorflow` are left out, so that what
    lists and reads every name (`help()`, pydoc, completion) gets only names
    that load; asked for, they still raise `TensorFlowNotInstalled`."""
    names, need_tensorflow = sorted(names), frozenset(need_tensorflow)

    def __dir__() -> List[str]:
        if importlib.util.find_spec("tensorflow") is None:
            return [name for name in names if name not in need_tensorflow]
        return list(names)

    return __dir__


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports a module's old path as its new module, with a warning.

    Found on `sys.meta_path`, it answers only the old paths it was given:
    `import old` and `from package import old` give the new module itself
    (the same object, so its classes and state are shared), after a
    `DeprecationWarning` naming the new path, attributed to the importing
    line.
    """

    def __init__(self, moved: Mapping[str, str]) -> None:
        self.moved = dict(moved)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in self.moved:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: Any) -> Any:
        warnings.warn(
            f"{spec.name} moved to {self.moved[spec.name]}; import it from there "
            "(the old path will be removed).",
            DeprecationWarning,
            # The import machinery's frames are skipped: the importing line.
            stacklevel=2,
        )
        return importlib.import_module(self.moved[spec.name])

    def exec_module(self, module: Any) -> None:
        """The new module has run already."""


def serve_moved_modules(moved: Mapping[str, str]) -> Optional[_MovedModules]:
    """Serves each old module path in `moved` (old -> new, both full dotted
    names) as its new module, with a `DeprecationWarning` (once per process:
    a second call for the same paths adds nothing).

    Returns:
      The finder installed, or `None` when these paths are served already.
    """
    for finder in sys.meta_path:
        if isinstance(finder, _MovedModules) and finder.moved == dict(moved):
            return None
    finder = _MovedModules(moved)
    sys.meta_path.append(finder)
    return finder


def deprecated(
    function: Callable[..., Any], name: str, instead: str
) -> Callable[..., Any]:
    """`function` under its public name `name` (a full dotted path), which
    leaves the surface: each call warns (`DeprecationWarning`, attributed to
    the caller) that `instead` replaces it, then runs `function`."""
    import functools

    @functools.wraps(function)
    def warned(*args: Any, **kwargs: Any) -> Any:
        warnings.warn(
            f"{name} is deprecated and will be removed in the next release; "
            f"use {instead}.",
            DeprecationWarning,
            stacklevel=2,
        )
        return function(*args, **kwargs)

    warned.__name__ = warned.__qualname__ = name.rsplit(".", 1)[-1]
    warned.__doc__ = f"Deprecated: use {instead}.\n\n{function.__doc__ or ''}"
    return warned
