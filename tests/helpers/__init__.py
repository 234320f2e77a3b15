"""Helpers shared by the test modules (import them as `from helpers import ...`; pytest puts tests/ on sys.path).

Fixtures live in tests/conftest.py; plain functions and constants live here, so no test imports conftest.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
TESTS = REPO_ROOT / "tests"
DATA = TESTS / "data"
# DeepSpeed JIT-builds its shared-memory comm op on a CPU rank's first use (minutes of C++ compile on two cores).
# One cache for the whole suite, set for every subprocess by conftest.py, so it is built once per run; one per
# virtualenv, because the build file names the venv's Python (another venv would rebuild it for each other).
# (By the venv's whole path: checkouts side by side each have a `.venv`, and one cache for all would rebuild in turn.)
OP_CACHE = (Path.home() / ".cache" / "torch_extensions"
            / f"accelkit-tests-{Path(sys.prefix).name}-{hashlib.sha1(sys.prefix.encode()).hexdigest()[:8]}")


def run_accelkit(*args: str, cwd: Path | str | None = None, env: dict[str, str] | None = None,
                 timeout: float = 300, check: bool = False) -> subprocess.CompletedProcess[str]:
    """Run `python -m accelkit ARGS` in a real subprocess and capture its output."""
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    proc = subprocess.run([sys.executable, "-m", "accelkit", *args], cwd=cwd, env=full_env, text=True,
                          capture_output=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"accelkit {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def invoke_accelkit(*args: str, cwd: Path | str | None = None, env: dict[str, str] | None = None,
                    check: bool = False) -> subprocess.CompletedProcess[str]:
    """Run `accelkit ARGS` in this process, through the console entry point `accelkit.cli.main` (its one-line errors
    and exit codes), and capture its output as `run_accelkit` does: for tests about what one command prints, writes
    and exits with, without paying a Python and torch start-up per call. Tests of what only a real process shows
    (a traceback on the real stderr, signals, `python -m`) use `run_accelkit`."""
    import signal

    from click.testing import CliRunner

    import accelkit.cli
    from accelkit.cli import main

    def stopped(code: int) -> None:  # a stopped command ends its process at once: here, only this call
        raise SystemExit(code)

    # main() installs its own (and ignores further stops once a command was stopped by one)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    exit_stopped, accelkit.cli._exit_stopped = accelkit.cli._exit_stopped, stopped
    here = os.getcwd()
    code: int | str | None = 0
    try:
        with CliRunner().isolation(env=env) as (out, err, _):
            os.chdir(cwd or here)
            try:
                main(list(args))
            except SystemExit as stop:
                code = stop.code
            stdout, stderr = out.getvalue().decode(), err.getvalue().decode()
    finally:
        os.chdir(here)
        accelkit.cli._exit_stopped = exit_stopped
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    returncode = code if isinstance(code, int) else (0 if code is None else 1)
    proc = subprocess.CompletedProcess(["accelkit", *args], returncode, stdout, stderr)
    if check and returncode != 0:
        raise AssertionError(f"accelkit {' '.join(args)} exited {returncode}\n{stdout}\n{stderr}")
    return proc


def tree_hash(path: Path) -> dict[str, str]:
    """sha256 of every file under path (or of path itself), to prove an input was not modified."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p.relative_to(path.parent)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
