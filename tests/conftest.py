"""Shared test set-up: every subprocess runs offline, single-threaded per rank, with the CLI of this checkout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

# Ranks share two cores in CI: one intra-op thread each keeps distributed tests from oversubscribing.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ.pop("ACCELKIT_DEBUG", None)


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


@pytest.fixture
def accelkit_cli():
    """The `run_accelkit` helper as a fixture."""
    return run_accelkit
