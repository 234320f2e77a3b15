"""The one way a package names its public entry points and loads them on first use (PEP 562).

    __all__, __getattr__ = lazy_exports(__name__, {"resolve_config": "resolve", ...})

Importing such a package costs nothing: `from accelkit.configs import resolve_config` imports accelkit.configs.resolve
then, and only then. What a CLI's `--help` or every rank of a launch imports stays small.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from types import ModuleType
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str], *, also: Iterable[str] = (),
                 load: Callable[[str], ModuleType] = importlib.import_module) -> tuple[list[str], Callable[[str], Any]]:
    """(`__all__`, the module `__getattr__`) for `package`: each name of `exports` comes from the module named beside
    it (relative to the package), loaded with `load`; `also`: names the package defines itself (constants)."""
    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(load(f"{package}.{module}"), name)

    return sorted([*exports, *also]), __getattr__
