"""Run a function right after a module finishes importing, wherever the script first imports it.

The rank entry point (bootstrap) must not import torch or Accelerate itself: that would add their import time before
the script's first line and change the order in which the script imports things. Patches and probes that need those
libraries register here instead and run the moment the script's own import of the module completes.
"""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Callable

from accelkit.errors import AccelkitError


class _RunAfterImport(importlib.abc.MetaPathFinder):
    """A one-shot finder: finds `module` with the other finders, then runs `callbacks` after it executes."""

    def __init__(self, module: str) -> None:
        self.module = module
        self.callbacks: list[Callable[[], None]] = []

    def find_spec(self, fullname, path, target=None):
        if fullname != self.module:
            return None
        sys.meta_path.remove(self)  # one shot; also keeps the lookup below from finding this finder again
        spec = next((found for finder in sys.meta_path if hasattr(finder, "find_spec")
                     for found in [finder.find_spec(fullname, path, target)] if found is not None), None)
        if spec is None:
            return None  # the import fails as it would have anyway
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            raise AccelkitError(f"accelkit cannot hook the import of {fullname} (unusual module loader).",
                                hint=f"install {fullname.split('.')[0]} normally (pip install ...)")
        exec_module, callbacks = spec.loader.exec_module, self.callbacks

        def exec_then_run(module) -> None:
            exec_module(module)
            for callback in callbacks:
                callback()

        spec.loader.exec_module = exec_then_run
        return spec


def after_import(module: str, callback: Callable[[], None]) -> None:
    """Call `callback()` once `module` is imported: now if it already is, else right after the script imports it."""
    if module in sys.modules:
        callback()
        return
    for finder in sys.meta_path:
        if isinstance(finder, _RunAfterImport) and finder.module == module:
            finder.callbacks.append(callback)
            return
    finder = _RunAfterImport(module)
    finder.callbacks.append(callback)
    sys.meta_path.insert(0, finder)
