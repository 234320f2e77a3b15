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


def tree_hash(path: Path) -> dict[str, str]:
    """sha256 of every file under path (or of path itself), to prove an input was not modified."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p.relative_to(path.parent)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
