"""Run the original (one process) and the converted script (N CPU ranks) with the check probe, each in a sandbox
of its own, and collect what every process recorded. Both runs go through accelkit.launch's supervised-run API: the
original as one plain process, the conversion as a DDP or FSDP rehearsal on N CPU ranks (what
`accelkit launch --cpu --backend ddp|fsdp --num-processes N` runs); the launch's one stall watchdog watches both, and
the supervisor stops every process of a run, whatever happens.

Each run starts in a real copy of the user's working directory (sandbox.py): whatever it writes lands in the copy,
never in the user's files. The scratch folder holds the probe results and the runs' output; it is removed
afterwards, on every path out.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accelkit.convert.check.record import (
    BACKEND_ENV,
    EQUIVALENCE_ROLE,
    ORDER_ENV,
    PROBE_MODULE,
    REPLAY_ENV,
    ROLE_ENV,
    WEIGHTS_ENV,
    WORLD_ENV,
    Record,
    read_records,
)
from accelkit.convert.check.sandbox import Sandbox
from accelkit.ranks.probes import MAX_STEPS_ENV, PROBE_DIR_ENV

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
    stacks: tuple = ()  # accelkit.launch.stacks.RankStack of each process, when the run was stopped


@dataclass(frozen=True)
class CheckRun:
    role: str
    job: Any  # accelkit.launch.ScriptProcess (the original) or LaunchRequest (the conversion)
    cwd: Path
    probe_dir: Path
    env: dict[str, str]
    stall: float
    timeout: float


class Scratch:
    """A temporary folder for one check: the probe results and the runs' output; removed on exit."""

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
                  replay: Path, stall: float, timeout: float, launcher_env: dict[str, str] | None = None,
                  cuda_env: dict[str, str] | None = None) -> CheckRun:
    """The original as one plain process; `launcher_env` (torchrun_env.one_process_env) for a torchrun-style
    script, which cannot start without it; `cuda_env` (cuda_on_cpu.rehearsal_env) for its second run, with its
    CUDA calls rehearsed on the CPU."""
    from accelkit.launch import ScriptProcess

    shutil.copyfile(script, box.script)  # at the script's place in the sandbox: `__file__` paths stay inside it
    probe_dir = scratch.folder("probe-original-cuda" if cuda_env else "probe-original")
    env = {**(launcher_env or {}), **(cuda_env or {}), ROLE_ENV: "original", REPLAY_ENV: str(replay),
           WORLD_ENV: str(world), MAX_STEPS_ENV: str(steps), **SANDBOX_ENV}
    return CheckRun("original", ScriptProcess(str(box.script), tuple(args)), box.cwd, probe_dir, env, stall, timeout)


def equivalence_spec(scratch: Scratch, box: Sandbox, script: Path, args: list[str], steps: int, world: int,
                     order: dict[str, list[list[int]]], stall: float, timeout: float,
                     launcher_env: dict[str, str] | None = None,
                     cuda_env: dict[str, str] | None = None) -> CheckRun:
    """The original as one plain process at the conversion's global batch (its DataLoaders' batch times `world`,
    probe_batch.py; the ranks' samples of each step together, `order`) for as many steps as the conversion,
    keeping its weights after each step."""
    import json

    from accelkit.launch import ScriptProcess

    shutil.copyfile(script, box.script)
    probe_dir = scratch.folder("probe-equivalence")
    order_file = scratch.root / "equivalence-order.json"
    order_file.write_text(json.dumps(order), encoding="utf-8")
    env = {**(launcher_env or {}), **(cuda_env or {}), ROLE_ENV: EQUIVALENCE_ROLE, WORLD_ENV: str(world),
           WEIGHTS_ENV: "1", MAX_STEPS_ENV: str(steps), ORDER_ENV: str(order_file), **SANDBOX_ENV}
    return CheckRun(EQUIVALENCE_ROLE, ScriptProcess(str(box.script), tuple(args)), box.cwd, probe_dir, env, stall,
                    timeout)


def converted_spec(scratch: Scratch, box: Sandbox, code: str, args: list[str], steps: int, world: int,
                   stall: float, timeout: float, backend: str = "ddp") -> CheckRun:
    box.script.write_text(code, encoding="utf-8")
    probe_dir = scratch.folder("probe-converted")
    env = {ROLE_ENV: "converted", BACKEND_ENV: backend, MAX_STEPS_ENV: str(steps), WEIGHTS_ENV: "1", **SANDBOX_ENV}
    return CheckRun("converted", converted_request(box.script, args, world, backend), box.cwd, probe_dir, env, stall,
                   timeout)


def converted_request(script: Path, args: list[str], world: int, backend: str = "ddp"):
    """The conversion on `world` CPU ranks: a DDP or FSDP (fully_shard, FSDP2) rehearsal, as
    `accelkit launch --cpu --backend ddp|fsdp` runs it."""
    from accelkit.configs import ConfigOptions
    from accelkit.launch import LaunchRequest, LaunchTarget

    return LaunchRequest(target=LaunchTarget(str(script), tuple(args)), cpu=True,
                         options=ConfigOptions(backend=backend, num_processes=world,
                                               fsdp_version=2 if backend == "fsdp" else None),
                         command_line="accelkit convert --check")


def run(spec: CheckRun, script_dir: Path) -> RunResult:
    """Run one side under supervision (accelkit.launch.run_supervised), its output captured beside its probe
    folder; a stall or the time limit stops it with every process's stack. Ctrl-C / SIGTERM stop it and end the
    check (Terminated), after every process of the run is gone."""
    from accelkit.errors import Terminated
    from accelkit.launch import SupervisedRun, run_supervised

    env = {**os.environ, **spec.env, PROBE_DIR_ENV: str(spec.probe_dir), "CUDA_VISIBLE_DEVICES": "",
           "PYTHONUNBUFFERED": "1"}
    # the script's own folder stays importable (its sibling modules), wherever the converted copy lives
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), str(script_dir)) if p)
    stdout, stderr = spec.probe_dir.parent / f"{spec.role}.stdout", spec.probe_dir.parent / f"{spec.role}.stderr"
    outcome = run_supervised(SupervisedRun(spec.job, env=env, cwd=spec.cwd, probes=(PROBE_MODULE,),
                                           stall_timeout=spec.stall, deadline=spec.timeout, stdout=stdout,
                                           stderr=stderr, grace=STOP_GRACE))
    if outcome.signal is not None:  # every process of the run is gone: end the check as the signal asked
        raise KeyboardInterrupt if outcome.signal == signal.SIGINT else Terminated(outcome.signal)
    stopped = outcome.stalled or outcome.timed_out
    return RunResult(spec.role, None if stopped else outcome.exit_code, _read(stdout), _read(stderr),
                     read_records(spec.probe_dir), outcome.seconds, outcome.stalled, outcome.timed_out,
                     outcome.stacks)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
