"""Checks that run once, in the `accelkit` process, before any rank exists: a failure here is one message instead of
the same traceback from each of N ranks. No torch here."""

from __future__ import annotations

from pathlib import Path

from accelkit.errors import AccelkitError
from accelkit.launch.launch_plan import LaunchTarget


def module_script(name: str, cwd: Path) -> Path | None:
    """The file `python -m NAME` would run, when it lies under `cwd` (found without importing anything)."""
    base = cwd.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__main__.py"):
        if candidate.is_file():
            return candidate
    return None


def check_syntax(target: LaunchTarget, cwd: Path | None = None) -> None:
    """Compile the script once (not run it): a syntax error is reported the way Python would, in one line."""
    cwd = cwd or Path.cwd()
    path = module_script(target.script, cwd) if target.module else cwd / target.script
    if path is None or not path.is_file():
        return  # check_target reports missing scripts; installed modules are not ours to check
    try:
        source = path.read_bytes()
    except OSError:
        return
    shown = target.script if not target.module else str(path)
    try:
        compile(source, str(path), "exec", dont_inherit=True)
    except SyntaxError as exc:
        where = f"{shown}:{exc.lineno}:{exc.offset}" if exc.lineno else shown
        code = (exc.text or "").strip()
        raise AccelkitError(f"{where}: {type(exc).__name__}: {exc.msg}" + (f": {code}" if code else ""),
                            hint="fix the script; no process was started") from None
    except ValueError as exc:  # e.g. a null byte in the source
        raise AccelkitError(f"{shown} cannot be compiled: {exc}", hint="fix the script; no process was started") \
            from None
