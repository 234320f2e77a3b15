"""Which checkpoint a rank resumed from: the watch probe wraps `Accelerator.load_state`, and after a successful
load writes `<pid>.resumed` in the watch folder ({"path", "step", "attempt", "requeue"}). The launcher side
(accelkit.launch.restarts) reads it to say, after a restart or a requeue, which checkpoint the run continues from,
and to give a lost machine's step. Step: the number in a `checkpoint-<N>` folder name (the templates' naming and
Accelerate's automatic `checkpoint_<N>`), else None."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
from pathlib import Path

from accelkit.ranks.rank_files import RankFiles

_STEP = re.compile(r"checkpoint[-_](\d+)$")
ATTEMPT_ENV = "ACCELKIT_ATTEMPT"  # the attempt of this run the rank belongs to, from 1 (accelkit.launch.restarts)
REQUEUE_COUNT_ENV = "SLURM_RESTART_COUNT"  # SLURM: how many times this job was requeued


def checkpoint_step(path: str) -> int | None:
    found = _STEP.search(Path(path).name) if path else None
    return int(found.group(1)) if found else None


def _count(name: str) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else 0


def write_resumed(files: RankFiles, path: str) -> None:
    record = {"path": path, "step": checkpoint_step(path), "attempt": max(1, _count(ATTEMPT_ENV)),
              "requeue": _count(REQUEUE_COUNT_ENV)}
    temp = files.folder / f"{files.pid}.resumed.tmp"
    temp.write_text(json.dumps(record))
    os.replace(temp, files.folder / f"{files.pid}.resumed")


def read_resumed(watch_dir: Path) -> dict[int, dict]:
    """pid -> what that rank resumed from, for every rank of this launch that resumed."""
    found = {}
    for path in (Path(watch_dir) / "ranks").glob("*.resumed"):
        try:
            found[int(path.name.split(".")[0])] = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
    return found


def hook_load_state(files: RankFiles) -> None:
    """Wrap Accelerator.load_state (called once accelerate.accelerator is imported)."""
    from accelerate.accelerator import Accelerator

    original = Accelerator.load_state
    if getattr(original, "_accelkit_resume_record", False):
        return

    @functools.wraps(original)
    def load_state(self, input_dir=None, *args, **kwargs):
        result = original(self, input_dir, *args, **kwargs)
        with contextlib.suppress(OSError, TypeError):  # observing must never break the script's resume
            write_resumed(files, os.fspath(input_dir) if input_dir is not None else "")
        return result

    load_state._accelkit_resume_record = True
    Accelerator.load_state = load_state
