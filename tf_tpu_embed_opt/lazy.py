"""Package attributes that load their module on first use.

`engines` and `checkpoints` re-export names whose modules need TensorFlow (or
are heavy); importing the package must not load them. Python calls a module's
`__getattr__` for a name it lacks (PEP 562): the one made here imports the
name's home module, caches the value in the package and returns it.
"""

import importlib
from typing import Any, Callable, Dict, Mapping

__all__ = ["module_getattr"]


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
        value = getattr(importlib.import_module(f"{package}.{homes[name]}"), name)
        namespace[name] = value
        return value

    return __getattr__
