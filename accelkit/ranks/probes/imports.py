"""Run a callback right after a module has been imported, wherever the user's script first imports it.

A rank's entry point (the rehearsal bootstrap) must not import torch or Accelerate itself: that would add their
import time before the script's first line and change the order in which the script imports things. Patches (the
rehearsal shim) and probes that need those libraries register here instead and run the moment the script's own
import of the module completes.
"""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Callable

from accelkit.errors import AccelkitError


class _AfterImport(importlib.abc.MetaPathFinder):
    """A one-shot import hook: lets `module` execute normally, then calls every callback registered for it."""

    def __init__(self, module: str) -> None:
        self.module = module
        self.callbacks: list[Callable[[], None]] = []
        self.required = False  # a callback that must run (a patch, not a probe): refuse a loader we cannot hook

    def find_spec(self, fullname, path, target=None):
        if fullname != self.module:
            return None
        sys.meta_path.remove(self)  # one shot; also keeps the lookup below from finding this finder again
        spec = next((found for finder in sys.meta_path if hasattr(finder, "find_spec")
                     for found in [finder.find_spec(fullname, path, target)] if found is not None), None)
        if spec is None:
            return None  # the import fails as it would have anyway
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            if self.required:
                raise AccelkitError(f"accelkit cannot hook the import of {fullname} (unusual module loader).",
                                    hint=f"install {fullname.split('.')[0]} normally (pip install ...)")
            return spec  # loads as it would have anyway; nothing to hook
        exec_module, callbacks = spec.loader.exec_module, self.callbacks

        def exec_then_call(module) -> None:
            exec_module(module)
            for callback in callbacks:
                callback()

        spec.loader.exec_module = exec_then_call
        return spec


def after_import(module: str, callback: Callable[[], None], *, required: bool = False) -> None:
    """Call `callback` once `module` is imported (now, if it already is). `required`: the import fails with a
    clear error when its loader cannot be hooked (a patch that must not be skipped silently)."""
    if module in sys.modules:
        callback()
        return
    finder = next((f for f in sys.meta_path if isinstance(f, _AfterImport) and f.module == module), None)
    if finder is None:
        finder = _AfterImport(module)
        sys.meta_path.insert(0, finder)
    finder.callbacks.append(callback)
    finder.required = finder.required or required
