"""Run a callback right after a module has been imported, wherever the user's script first imports it."""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Callable


class _AfterImport(importlib.abc.MetaPathFinder):
    """A one-shot import hook: lets `module` execute normally, then calls every callback registered for it."""

    def __init__(self, module: str) -> None:
        self.module = module
        self.callbacks: list[Callable[[], None]] = []

    def find_spec(self, fullname, path, target=None):
        if fullname != self.module:
            return None
        sys.meta_path.remove(self)  # one shot; also keeps the lookup below from finding this finder again
        spec = next((found for finder in sys.meta_path if hasattr(finder, "find_spec")
                     for found in [finder.find_spec(fullname, path, target)] if found is not None), None)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec  # the import fails (or loads oddly) as it would have anyway; nothing to hook
        exec_module, callbacks = spec.loader.exec_module, self.callbacks

        def exec_then_call(module) -> None:
            exec_module(module)
            for callback in callbacks:
                callback()

        spec.loader.exec_module = exec_then_call
        return spec


def after_import(module: str, callback: Callable[[], None]) -> None:
    """Call `callback` once `module` is imported (now, if it already is)."""
    if module in sys.modules:
        callback()
        return
    for finder in sys.meta_path:
        if isinstance(finder, _AfterImport) and finder.module == module:
            finder.callbacks.append(callback)
            return
    finder = _AfterImport(module)
    finder.callbacks.append(callback)
    sys.meta_path.insert(0, finder)
