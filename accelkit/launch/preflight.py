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


def check_pipeline_code(target: LaunchTarget, said_pp: str, cwd: Path | None = None) -> None:
    """A pipeline layout reaches the ranks only as $ACCELKIT_PIPELINE (configs/pipeline_spec.py): a script that never
    reads it would train whole replicas under a banner that says pp. The script, or a module beside it (causal-lm's
    pipeline_parallel.py), must name the variable."""
    from accelkit.launch.inherited import PIPELINE_ENV as ENV_VAR

    cwd = cwd or Path.cwd()
    path = module_script(target.script, cwd) if target.module else cwd / target.script
    if path is None or not path.is_file():
        return  # an installed module: not ours to read
    for candidate in (path, *sorted(path.parent.glob("*.py"))):
        try:
            if ENV_VAR in candidate.read_text(encoding="utf-8", errors="replace"):
                return
        except OSError:
            continue
    shown = target.script if not target.module else str(path)
    raise AccelkitError(f"{said_pp}: {shown} has no pipeline code (neither it nor a module beside it reads "
                        f"${ENV_VAR}), so every rank would train the whole model as a data-parallel replica",
                        hint="run a script with a pipeline loop (`accelkit init --template causal-lm` has one; "
                             f"docs/guides/nd-parallelism.md says what it reads), or launch without {said_pp}")
