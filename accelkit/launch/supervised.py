"""The one way accelkit runs a job under supervision: a request in, an outcome out.

    outcome = run_supervised(SupervisedRun(request, env=env, probes=("accelkit.bench.probe",), stall_timeout=60,
                                           deadline=600, stdout=log, stderr=Stream.STDOUT))
    outcome.status        "ok" | "failed" | "stalled" | "timed out" | "interrupted"
    outcome.failed_rank   the rank that failed first, outcome.error its own error line

The job is either a launch (a LaunchRequest: N ranks through Accelerate's launcher, as `accelkit launch` runs it)
or one plain Python process (a ScriptProcess: convert --check's run of the original script). Either way the
supervisor (accelkit.launch.supervisor.Supervisor) owns every process it starts: no process outlives it, whatever
happens (a failing rank, Ctrl-C, SIGTERM, a SIGKILLed launcher); every rank starts with the watch probe, so the one
stall watchdog (accelkit.launch.watchdog) sees it, and its stacks can be read when it stalls or runs past its deadline.

Parameters, never globals: the job's environment is a parameter (os.environ is read, never changed), output goes
to files (or this process's stderr) through the job's own file descriptors (this process's are never swapped), and
the time limit is the supervisor's (no timer thread, no signal sent to this process). Signals the user sends
(Ctrl-C, SIGTERM) stop the job and come back as `outcome.signal`; the caller decides what to do next (a sweep
stops).

Used by `accelkit launch` (through run_request), `accelkit bench`, `plan --measure` and `convert --check`.
"""

from __future__ import annotations

import contextlib
import enum
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from accelkit.launch.request import LaunchRequest
from accelkit.launch.supervisor import WATCH_PROBE, WORKER_MODULE, stall_error, supervised_job


class Stream(enum.Enum):
    """Where a job's stream goes when it is not a file."""

    INHERIT = "inherit"  # this process's own stream
    STDERR = "stderr"  # this process's stderr (stdout only: keeps this process's stdout for its own result)
    STDOUT = "stdout"  # the same place as the job's stdout (stderr only)


@dataclass(frozen=True)
class ScriptProcess:
    """One plain Python process (not a launch): `python SCRIPT ARGS` (or `-m MODULE` with module=True), started
    in the rank bootstrap (accelkit.ranks.bootstrap) with the probes, so it is watched like a rank 0."""

    script: str
    args: tuple[str, ...] = ()
    module: bool = False


@dataclass(frozen=True)
class SupervisedRun:
    """What to run and how to watch it.

    job            a LaunchRequest (N ranks) or a ScriptProcess (one process)
    env            the job's whole environment (None: this process's, as it is)
    cwd            the job's working folder (None: this process's)
    probes         modules whose install() runs in every rank before the script (bench's, plan's, convert's)
    stall_timeout  seconds without progress before the job counts as stalled and is stopped with its stacks;
                   None: launch's default for the job's kind (CPU 300 s, GPUs 1800 s); 0: no watchdog
    deadline       seconds after which the job is stopped (its stacks taken first); None: no limit
    stdout, stderr a file (created or truncated) or a Stream; the supervisor's own lines (the stacks of a stalled
                   job) go where the job's stderr goes
    grace          seconds a stopped job gets to end by itself before it is killed
    report_stall   also print the stall's one-line `Error:` (as `accelkit launch` does); otherwise the caller says it
    on_start       called with the Supervisor just before the job starts, to run work beside it (a cluster node's
                   heartbeats and save-signal forwarding); the caller stops that work after run_supervised returns
    preemption_grace  seconds the ranks get to save and stop after a SIGTERM (accelkit.launch.preemption); None:
                   SIGTERM stops the job like any other signal
    """

    job: LaunchRequest | ScriptProcess
    env: Mapping[str, str] | None = None
    cwd: Path | None = None
    probes: tuple[str, ...] = ()
    stall_timeout: float | None = None
    deadline: float | None = None
    stdout: Path | Stream = Stream.INHERIT
    stderr: Path | Stream = Stream.INHERIT
    grace: float = 15.0
    report_stall: bool = False
    on_start: Callable[[Any], None] | None = None
    preemption_grace: float | None = None

    def __post_init__(self) -> None:
        for name in ("stall_timeout", "deadline"):
            value = getattr(self, name)
            if value is not None and (not math.isfinite(value) or value < 0):
                raise ValueError(f"{name} must be a finite number of seconds >= 0, not {value!r}")


OK, FAILED, STALLED, TIMED_OUT, INTERRUPTED = "ok", "failed", "stalled", "timed out", "interrupted"


@dataclass(frozen=True)
class RunOutcome:
    """How a supervised job ended.

    status       OK, FAILED, STALLED, TIMED_OUT or INTERRUPTED (by a signal the user sent)
    exit_code    the job's exit status: the first failing rank's; 124 after a stall or the deadline; 128 + N after
                 signal N
    seconds      wall time from start to the last process gone
    signal       the signal the user sent (Ctrl-C, SIGTERM), if any
    stacks       the ranks' stacks (accelkit.launch.stacks.RankStack) when the job was stopped for a stall or its
                 deadline
    failed_rank  the rank that failed first, and `error` its own error line (an exception, a usage error, an
                 explanation); for a stall, `error` says where the ranks wait and `hint` what to do
    """

    status: str
    exit_code: int
    seconds: float
    signal: int | None = None
    timed_out: bool = False
    stalled: bool = False
    stacks: tuple = ()
    failed_rank: int | None = None
    error: str | None = None
    hint: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == OK


def run_request(request: LaunchRequest, *, grace: float = 15.0, stall_timeout: float | None = None) -> int:
    """`accelkit launch`'s run: `request` in a supervised launcher process (accelkit.launch.worker); the exit status
    (the failing rank's on failure, STALL_EXIT_STATUS after a stall, PREEMPTED_EXIT_STATUS after a SIGTERM the ranks
    saved on). `stall_timeout`: None = the default for the job's kind, 0 = no watchdog."""
    return run_supervised(SupervisedRun(request, stall_timeout=stall_timeout, grace=grace, report_stall=True,
                                        preemption_grace=request.preemption_grace_seconds())).exit_code


def run_supervised(run: SupervisedRun) -> RunOutcome:
    """Run `run.job` under a Supervisor until every process it started is gone; see the module docstring."""
    env = dict(os.environ if run.env is None else run.env)
    if isinstance(run.job, LaunchRequest):
        from accelkit.launch.preflight import check_syntax

        check_syntax(run.job.target)  # once here, not N tracebacks from N ranks
        request = replace(run.job, probes=(*run.job.probes, *run.probes, WATCH_PROBE))
        argv = [sys.executable, "-m", WORKER_MODULE, request.to_json()]
    else:
        from accelkit.launch.launch_plan import BOOTSTRAP_MODULE
        from accelkit.ranks import PROBES_ENV

        job = run.job
        argv = [sys.executable, "-m", BOOTSTRAP_MODULE, *(["-m"] if job.module else []), job.script, *job.args]
        env[PROBES_ENV] = ",".join(run.probes)  # the watch probe joins them in supervised_job
    with contextlib.ExitStack() as files:
        stdout, stderr, messages = _open_outputs(run, files)
        with supervised_job(argv, env, plain=not isinstance(run.job, LaunchRequest), grace=run.grace,
                            stall_timeout=run.stall_timeout, cwd=run.cwd, stdout=stdout, stderr=stderr,
                            deadline=run.deadline, messages=messages, report_stall=run.report_stall,
                            preemption_grace=run.preemption_grace) as supervisor:
            if run.on_start is not None:
                run.on_start(supervisor)
            started = time.monotonic()
            exit_code = supervisor.run()
            seconds = time.monotonic() - started
    return outcome_of(supervisor, exit_code, seconds)


def _open_outputs(run: SupervisedRun, files: contextlib.ExitStack):
    """(stdout, stderr, messages) for the Supervisor: open files (append mode, so the supervisor's own lines and
    every process of the job write one after the other) or descriptors, None for this process's own stream;
    `messages` is where the job's stderr goes, as a text stream for the supervisor's own lines."""
    sys.stdout.flush()
    sys.stderr.flush()
    opened: dict[Path, tuple] = {}

    def file(path: Path) -> tuple:
        if path not in opened:
            path.write_bytes(b"")  # created or truncated
            raw = files.enter_context(open(path, "ab", buffering=0))  # noqa: SIM115
            text = files.enter_context(open(path, "a", encoding="utf-8", buffering=1))  # noqa: SIM115
            opened[path] = (raw, text)
        return opened[path]

    if isinstance(run.stdout, Path):
        stdout, stdout_text = file(run.stdout)
    elif run.stdout is Stream.STDERR:
        stdout, stdout_text = sys.stderr.fileno(), sys.stderr
    else:
        stdout, stdout_text = None, sys.stdout
    if isinstance(run.stderr, Path):
        stderr, messages = file(run.stderr)
    elif run.stderr is Stream.STDOUT:
        stderr, messages = (stdout if stdout is not None else sys.stdout.fileno()), stdout_text
    else:
        stderr, messages = None, None
    return stdout, stderr, messages


def outcome_of(supervisor, exit_code: int, seconds: float) -> RunOutcome:
    """The typed outcome of a finished Supervisor."""
    user_signal = supervisor.signals[0] if supervisor.signals else None
    if supervisor.stalled:
        stall = supervisor.stall
        hint = stall_error(stall).hint if stall is not None else None
        error = f"no rank progressed for {stall.seconds:.0f} s; {stall.where}" if stall is not None else None
        return RunOutcome(STALLED, exit_code, seconds, stalled=True, stacks=tuple(supervisor.stacks), error=error,
                          hint=hint)
    if user_signal is not None:
        return RunOutcome(INTERRUPTED, exit_code, seconds, signal=user_signal)
    if supervisor.timed_out:
        return RunOutcome(TIMED_OUT, exit_code, seconds, timed_out=True, stacks=tuple(supervisor.stacks),
                          error=f"ran past its time limit ({supervisor.deadline:g} s) and was stopped")
    if exit_code == 0:
        return RunOutcome(OK, 0, seconds)
    if exit_code > 128:  # a rank killed by a signal records nothing; the others' errors are consequences
        return RunOutcome(FAILED, exit_code, seconds, error=f"a rank died of {_signal_name(exit_code - 128)}")
    first = supervisor.failures[0] if supervisor.failures else None
    if first is not None:
        return RunOutcome(FAILED, exit_code, seconds, failed_rank=first.rank, error=first.error)
    return RunOutcome(FAILED, exit_code, seconds, error=f"exit code {exit_code}")


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
