"""Run the original (one process) and the converted script (N CPU ranks) with the check probe, each in a sandbox
of its own, and collect what every process recorded.

Each run starts in a real copy of the user's working directory (sandbox.py): whatever it writes lands in the copy,
never in the user's files. The scratch folder holds the sandboxes and the probe results; it is removed afterwards,
on every path out.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from accelkit.convert.check.record import (
    BOOTSTRAP_MODULE,
    LAUNCHER_MODULE,
    PROBE_MODULE,
    REPLAY_ENV,
    ROLE_ENV,
    STALL_ENV,
    WORLD_ENV,
    Record,
    read_records,
)
from accelkit.convert.check.sandbox import Sandbox
from accelkit.probes import MAX_STEPS_ENV, PROBE_DIR_ENV

SCRATCH_PREFIX = "accelkit-check-"
STOP_GRACE = 15.0  # seconds a stopped run gets to end by itself before it is killed


@dataclass
class RunResult:
    role: str
    status: int | None  # exit status (None: stopped by the check)
    stdout: str
    stderr: str
    records: list[Record]
    seconds: float
    stalled: bool = False  # a process made no progress for the stall time
    timed_out: bool = False
    stacks: dict[int, str] = field(default_factory=dict)  # rank -> faulthandler dump


@dataclass(frozen=True)
class RunSpec:
    role: str
    argv: list[str]
    cwd: Path
    probe_dir: Path
    env: dict[str, str]
    stall: float
    timeout: float


class Scratch:
    """A temporary folder for one check: the runs' sandboxes and probe results; removed on exit."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir.resolve()
        self.root = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX))

    def __enter__(self) -> Scratch:
        return self

    def __exit__(self, *exc: object) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def folder(self, name: str) -> Path:
        path = self.root / name
        path.mkdir()
        return path


# no bytecode written beside the script's copies or into the user's own importable folders
SANDBOX_ENV = {"PYTHONDONTWRITEBYTECODE": "1"}


def original_spec(scratch: Scratch, box: Sandbox, script: Path, args: list[str], steps: int, world: int,
                  replay: Path, stall: float, timeout: float) -> RunSpec:
    shutil.copyfile(script, box.script)  # at the script's place in the sandbox: `__file__` paths stay inside it
    probe_dir = scratch.folder("probe-original")
    env = {ROLE_ENV: "original", REPLAY_ENV: str(replay), WORLD_ENV: str(world), MAX_STEPS_ENV: str(steps),
           **SANDBOX_ENV}
    return RunSpec("original", [sys.executable, "-m", BOOTSTRAP_MODULE, str(box.script), *args],
                   box.cwd, probe_dir, env, stall, timeout)


def converted_spec(scratch: Scratch, box: Sandbox, code: str, args: list[str], steps: int, world: int,
                   stall: float, timeout: float) -> RunSpec:
    box.script.write_text(code, encoding="utf-8")
    probe_dir = scratch.folder("probe-converted")
    env = {ROLE_ENV: "converted", MAX_STEPS_ENV: str(steps), **SANDBOX_ENV}
    spec = json.dumps({"script": str(box.script), "args": list(args), "processes": world})
    return RunSpec("converted", [sys.executable, "-m", LAUNCHER_MODULE, spec], box.cwd, probe_dir, env, stall,
                   timeout)


def run(spec: RunSpec, script_dir: Path) -> RunResult:
    env = {**os.environ, **spec.env, PROBE_DIR_ENV: str(spec.probe_dir), STALL_ENV: str(spec.stall),
           "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1"}
    if spec.role == "original":
        env["ACCELKIT_PROBES"] = PROBE_MODULE
    # the script's own folder stays importable (its sibling modules), wherever the converted copy lives
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), str(script_dir)) if p)
    started = time.monotonic()
    proc = subprocess.Popen(spec.argv, cwd=spec.cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, errors="replace", start_new_session=True)
    out: list[str] = []
    err: list[str] = []
    readers = [threading.Thread(target=_drain, args=(proc.stdout, out), daemon=True),
               threading.Thread(target=_drain, args=(proc.stderr, err), daemon=True)]
    for reader in readers:
        reader.start()
    try:
        stalled, timed_out = watch(proc, spec.probe_dir, spec.timeout)
    finally:
        if proc.poll() is None:  # interrupted (Ctrl-C, SIGTERM): stop the run before the scratch folder goes
            stop(proc)
    for reader in readers:
        reader.join(timeout=10)
    stacks = {}
    for path in spec.probe_dir.glob("stall.rank*.txt"):
        text = path.read_text(errors="replace")
        if text.strip():
            stacks[int(path.stem.rsplit("rank", 1)[1])] = text
    status = None if (stalled or timed_out) else proc.returncode
    return RunResult(spec.role, status, "".join(out), "".join(err), read_records(spec.probe_dir),
                     time.monotonic() - started, stalled, timed_out, stacks)


def watch(proc: subprocess.Popen, probe_dir: Path, timeout: float) -> tuple[bool, bool]:
    """Wait for `proc`; stop it when a process dumped its stack (no progress for the stall time: the probe's
    faulthandler watchdog) or after `timeout` seconds. Returns (stalled, timed_out). The other processes are asked
    for their stacks too (SIGUSR1) before the run is stopped, so the report can say where each one was.

    Why not only `accelkit launch`'s watchdog: the original runs as one plain process, outside any launch, and a
    check wants a verdict within `--stall-timeout` (60 s) of the last step, not the launch default of 300 s of
    silence; the launch watchdog still runs behind the converted run as a backstop."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        stalled = any(p.stat().st_size > 0 for p in probe_dir.glob("stall.rank*.txt"))
        timed_out = time.monotonic() > deadline
        if stalled or timed_out:
            _ask_for_stacks(proc)
            time.sleep(1.0)
            stop(proc)
            return stalled, timed_out and not stalled
        time.sleep(0.2)
    return False, False


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM the run (a launch supervisor forwards it to every rank), then SIGKILL whatever is left."""
    family = _family(proc)
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=STOP_GRACE)
    import psutil

    for member in family:
        with contextlib.suppress(psutil.Error):
            member.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def _family(proc: subprocess.Popen) -> list:
    import psutil

    try:
        parent = psutil.Process(proc.pid)
        return [parent, *parent.children(recursive=True)]
    except psutil.Error:
        return []


def _ask_for_stacks(proc: subprocess.Popen) -> None:
    import psutil

    for member in _family(proc):
        with contextlib.suppress(psutil.Error):
            if BOOTSTRAP_MODULE in " ".join(member.cmdline()):
                member.send_signal(signal.SIGUSR1)


def _drain(stream, into: list[str]) -> None:
    for chunk in iter(lambda: stream.read(4096), ""):
        into.append(chunk)
