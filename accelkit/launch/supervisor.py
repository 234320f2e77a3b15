"""Run a launch in a launcher process (accelkit.launch.worker) and supervise it until every process is gone.

torchrun (under `accelerate launch`) already stops all ranks when one fails and when it receives SIGINT/SIGTERM.
What it cannot do is clean up after itself when it is killed hard, notice a job that hangs, or say where. Its ranks
run in sessions of their own, so they never see a terminal's Ctrl-C directly. The supervisor therefore:
- starts the launcher in its own process group, asks the kernel to SIGTERM it if accelkit dies, and makes
  accelkit a "child subreaper" so ranks orphaned by a dead launcher are re-parented to accelkit, not init;
- forwards SIGINT/SIGTERM/SIGHUP to the launcher, which stops its ranks; a second signal, or a launcher still
  alive `grace` seconds later, gets SIGKILL for the whole tree; the exit status is then 128 + the first signal;
- with a preemption grace, turns the first SIGTERM (what Kubernetes, spot instances and `kill` send before they
  stop a job) into the save request the templates honour: SIGUSR1 to the ranks that catch it, which agree on a
  step, save a checkpoint there and end; the job then has `preemption_grace` seconds before it is killed, and
  exits with PREEMPTED_EXIT_STATUS (see accelkit.launch.preemption);
- watches the ranks for stalls (accelkit.launch.watchdog): when nothing moved for the stall timeout it prints every
  rank's Python stack and where they wait, stops the job and exits with STALL_EXIT_STATUS;
- stops a job that runs past its deadline (when given) like a SIGTERM would, with the ranks' stacks first, and
  exits with STALL_EXIT_STATUS too (what `timeout` returns);
- after the launcher exits, kills and reaps any descendant still running, removes the launch folder, and returns
  the launcher's status (128 + N when it was killed by signal N).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TextIO

import psutil

from accelkit.errors import AccelkitError, report
from accelkit.fsio import remove_path
from accelkit.launch.accelerate_main import exit_status
from accelkit.launch.launch_dir import STALLED_MARKER, create_launch_dir, launcher_env
from accelkit.launch.restarts import ResumeAnnouncer
from accelkit.ranks import WATCH_DIR_ENV

WORKER_MODULE = "accelkit.launch.worker"
WATCH_PROBE = "accelkit.ranks.watch"  # the per-rank side of the watchdog (see accelkit.ranks.watch)
STALL_EXIT_STATUS = 124  # what `timeout` returns for a command it stopped
# Default stall timeouts: a CPU rehearsal of a small model steps or prints within seconds; a GPU job's own
# collective timeout (NCCL: 10 minutes) comes first there, so the watchdog only catches what NCCL cannot see.
DEFAULT_STALL_TIMEOUT_CPU = 300.0
DEFAULT_STALL_TIMEOUT_GPU = 1800.0
SAMPLE_INTERVAL = 1.0

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _prctl(option: int, value: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _launcher_preexec() -> None:  # runs in the child between fork and exec
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass(frozen=True)
class WatchSettings:
    """The stall watchdog of one launch: `timeout` None = the default for the job's kind (CPU or GPU), 0 = off."""

    watch_dir: Path
    timeout: float | None = None


@dataclass(frozen=True)
class StallReport:
    """What the watchdog found when it stopped a job: how long nothing moved, the ranks' stacks, where they wait."""

    seconds: float
    timeout: float
    stacks: tuple  # RankStack, one per rank that answered
    where: str
    advice: str


class Supervisor:
    """Owns one launcher process and everything it starts.

    `cwd`, `stdout`, `stderr`: the launcher's working folder and output (open files; None = this process's).
    `deadline`: seconds after which the job is stopped. `messages`: where the supervisor's own lines go (default
    sys.stderr). `report_stall=False` leaves the one-line stall error to the caller (the stacks are still printed).
    """

    def __init__(self, argv: list[str], env: dict[str, str], *, grace: float = 15.0, poll: float = 0.1,
                 watch: WatchSettings | None = None, cwd: Path | None = None, stdout: IO | None = None,
                 stderr: IO | None = None, deadline: float | None = None, messages: TextIO | None = None,
                 report_stall: bool = True, preemption_grace: float | None = None) -> None:
        self.argv = argv
        self.env = env
        self.grace = grace
        self.poll = poll
        self.watch = watch
        self.cwd = cwd
        self.stdout = stdout
        self.stderr = stderr
        self.deadline = deadline
        self.messages = messages
        self.report_stall = report_stall
        self.preemption_grace = preemption_grace  # None: SIGTERM stops the job as any other signal
        self.preempted: list[int] = []  # the ranks asked to save and stop (by pid)
        self.proc: subprocess.Popen[bytes] | None = None
        self.known: dict[int, psutil.Process] = {}  # every descendant seen so far (pid -> process)
        self.signals: list[int] = []
        self.kill_deadline: float | None = None
        self.stalled = False
        self.stall: StallReport | None = None
        self.timed_out = False
        self.stacks: tuple = ()  # the ranks' stacks when the job was stopped for a stall or its deadline
        self.failures: list = []  # RankFailure, the earliest first, read when the job is over

    def _say(self, text: str) -> None:
        print(f"accelkit: {text}", file=self.messages or sys.stderr, flush=True)

    # -- signals ---------------------------------------------------------------------------------------------
    def _on_signal(self, signum: int, frame: object) -> None:
        self.signals.append(signum)
        if self.proc is None or self.proc.poll() is not None:
            return
        if len(self.signals) == 1:
            if signum == signal.SIGTERM and self._request_save():
                return
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signum)
            self.kill_deadline = time.monotonic() + self.grace
        else:  # asked twice: stop waiting for a clean shutdown
            self.kill_deadline = time.monotonic()

    def _request_save(self) -> bool:
        """A preemption: ask the ranks that honour the save request to save and stop (True), or say why not and
        leave the SIGTERM to stop the job (False)."""
        from accelkit.launch.preemption import catching_save_request, preemption_line

        if self.preemption_grace is None or self.watch is None:
            return False
        from accelkit.launch.rank_monitor import RankMonitor

        ranks = RankMonitor(self.watch.watch_dir).alive_ranks()
        catching = [info for info in ranks if catching_save_request(info.pid)]
        if not catching:
            if ranks:
                self._say(preemption_line(0, self.preemption_grace))
            return False
        for info in catching:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(info.pid, signal.SIGUSR1)
        self.preempted = [info.pid for info in catching]
        self.kill_deadline = time.monotonic() + self.preemption_grace
        self._say(preemption_line(len(catching), self.preemption_grace))
        return True

    def stop(self, grace: float = 5.0) -> None:
        """Stop the job from another thread (a lost machine): SIGTERM to the launcher's group, SIGKILL for the
        whole tree `grace` seconds later. The status stays the launcher's, not 128 + SIGTERM: nobody signalled us."""
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        self.kill_deadline = time.monotonic() + grace

    # -- process tree ----------------------------------------------------------------------------------------
    def _track(self) -> None:
        """Remember every current descendant, so it can be stopped even after its parent is gone."""
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process().children(recursive=True):
                self.known.setdefault(child.pid, child)

    def _alive_descendants(self) -> list[psutil.Process]:
        self._track()
        alive = []
        for proc in self.known.values():
            with contextlib.suppress(psutil.Error):
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    alive.append(proc)
        return alive

    def kill_tree(self, sig: int = signal.SIGKILL) -> None:
        for proc in self._alive_descendants():
            with contextlib.suppress(psutil.Error):
                proc.send_signal(sig)

    def _reap_leftovers(self, timeout: float = 5.0) -> None:
        """Stop whatever outlived the launcher (SIGTERM, then SIGKILL) and reap children re-parented to us."""
        leftovers = self._alive_descendants()
        if leftovers:
            for proc in leftovers:
                with contextlib.suppress(psutil.Error):
                    proc.terminate()
            _, still = psutil.wait_procs(leftovers, timeout=timeout)
            for proc in still:
                with contextlib.suppress(psutil.Error):
                    proc.kill()
            psutil.wait_procs(still, timeout=timeout)
        # Orphans re-parented to this (subreaper) process are our children now: collect their exit statuses.
        for child in psutil.Process().children():
            with contextlib.suppress(psutil.Error, ChildProcessError):
                child.wait(timeout=0)

    # -- stall watchdog --------------------------------------------------------------------------------------
    def _watchdog(self):
        """A generator the main loop advances once per poll: samples the ranks every SAMPLE_INTERVAL seconds."""
        from accelkit.launch.rank_monitor import RankMonitor
        from accelkit.launch.watchdog import StallDetector

        assert self.watch is not None
        monitor = RankMonitor(self.watch.watch_dir)
        detector: StallDetector | None = None
        next_sample = 0.0
        while True:
            now = yield
            if now < next_sample or self.signals or self.stalled or self.timed_out:
                continue
            next_sample = now + SAMPLE_INTERVAL
            infos = monitor.alive_ranks()
            if not infos:
                continue
            if detector is None:
                timeout = self.watch.timeout
                if timeout is None:
                    timeout = DEFAULT_STALL_TIMEOUT_CPU if infos[0].cpu_job else DEFAULT_STALL_TIMEOUT_GPU
                if timeout <= 0:
                    return
                detector = StallDetector(timeout)
            stall = detector.observe(now, monitor.sample(infos))
            if stall is None:
                continue
            stacks = monitor.dump_stacks(infos)
            if self._confirmed(stall, stacks):
                self._stop_stalled_job(infos, stall, stacks, detector.timeout)
            else:
                detector.restart()

    @staticmethod
    def _confirmed(stall, stacks) -> bool:
        """Nothing moved and some rank sat idle. With every rank idle that is a stall. With some ranks computing
        (without output), it is one only if an idle rank waits in a collective, i.e. for them: an idle rank that
        waits elsewhere (a file lock while rank 0 compiles an extension) is not."""
        if not stall.busy_ranks:
            return True
        idle = set(stall.idle_ranks)
        return any(stack.wait is not None for stack in stacks if stack.rank in idle)

    def _stop_stalled_job(self, infos, stall, stacks, timeout: float) -> None:
        from accelkit.launch.stacks import stall_diagnosis

        assert self.watch is not None and self.proc is not None
        self.stalled = True
        with contextlib.suppress(OSError):
            (self.watch.watch_dir / STALLED_MARKER).write_text("")
        self._say(f"the job stalled: for {stall.seconds:.0f} s no rank wrote, read or stepped an optimizer, and "
                  f"rank(s) {', '.join(map(str, stall.idle_ranks))} used no CPU. Stacks of the {len(infos)} rank(s):")
        self._print_stacks(infos, stacks)
        where, advice = stall_diagnosis(stacks)
        self.stacks = tuple(stacks)
        self.stall = StallReport(seconds=stall.seconds, timeout=timeout, stacks=tuple(stacks), where=where,
                                 advice=advice)
        if self.report_stall:
            report(stall_error(self.stall), self.messages)
        # A hung job has nothing left to flush: kill it at once, ranks and launcher, before they add noise.
        self.kill_tree(signal.SIGKILL)

    def _print_stacks(self, infos, stacks) -> None:
        from accelkit.launch.stacks import format_stack

        for stack in stacks:
            for line in format_stack(stack):
                print(line, file=self.messages or sys.stderr)
        missing = sorted({info.rank for info in infos} - {stack.rank for stack in stacks})
        if missing:
            self._say(f"no stack from rank(s) {', '.join(map(str, missing))} (it did not answer the dump signal)")

    # -- deadline --------------------------------------------------------------------------------------------
    def _stop_at_deadline(self, now: float) -> None:
        """The job ran past its deadline: take the ranks' stacks (where it was), then stop it as SIGTERM would."""
        assert self.proc is not None
        self.timed_out = True
        if self.watch is not None:
            from accelkit.launch.rank_monitor import RankMonitor

            monitor = RankMonitor(self.watch.watch_dir)
            infos = monitor.alive_ranks()
            if infos:
                self.stacks = tuple(monitor.dump_stacks(infos))
                self._say(f"the job ran past its time limit ({self.deadline:g} s) and is stopped. Stacks of the "
                          f"{len(infos)} rank(s):")
                self._print_stacks(infos, self.stacks)
            with contextlib.suppress(OSError):  # the launcher stays quiet: the caller says why the job ended
                (self.watch.watch_dir / STALLED_MARKER).write_text("")
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        self.kill_deadline = time.monotonic() + self.grace

    # -- main loop -------------------------------------------------------------------------------------------
    def run(self) -> int:
        _prctl(_PR_SET_CHILD_SUBREAPER, 1)
        previous = {sig: signal.signal(sig, self._on_signal) for sig in _FORWARDED_SIGNALS}
        try:  # our handler stays until the end is said: a second Ctrl-C meanwhile must not interrupt the saying
            return self._supervise()
        finally:
            for sig, handler in previous.items():
                # Once stopped by a signal, the command is on its way out: a further Ctrl-C must not interrupt its
                # cleanup (a half-removed launch folder) or its exit (-2 instead of 128 + N). Seen in CI.
                signal.signal(sig, _absorb_signal if self.signals else handler)

    def _supervise(self) -> int:
        watchdog = None
        resumes = None
        started = time.monotonic()
        try:
            self.proc = subprocess.Popen(self.argv, env=self.env, start_new_session=True, cwd=self.cwd,
                                         stdout=self.stdout, stderr=self.stderr, preexec_fn=_launcher_preexec)
            if self.watch is not None:
                watchdog = self._watchdog()
                next(watchdog)
            last_track = 0.0
            resumes = ResumeAnnouncer(self.watch.watch_dir) if self.watch is not None else None
            while self.proc.poll() is None:
                now = time.monotonic()
                if now - last_track > 0.5:
                    self._track()
                    last_track = now
                    for line in resumes.poll() if resumes is not None else ():
                        self._say(line)
                if watchdog is not None:
                    try:
                        watchdog.send(now)
                    except StopIteration:
                        watchdog = None
                if (self.deadline is not None and not (self.timed_out or self.stalled or self.signals)
                        and now - started >= self.deadline):
                    self._stop_at_deadline(now)
                if self.kill_deadline is not None and now >= self.kill_deadline:
                    self.kill_tree(signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=self.poll)
            status = exit_status(self.proc.returncode)
        finally:
            if self.proc is not None and self.proc.poll() is None:
                self.kill_tree(signal.SIGKILL)
                self.proc.wait()
            self._reap_leftovers()
            if self.watch is not None:
                from accelkit.ranks import read_failures

                self.failures = read_failures(self.watch.watch_dir)
                if resumes is not None:  # a restarted or requeued run: its attempts, one line each
                    for line in resumes.summary_lines(exit_status(self.proc.returncode)):
                        self._say(line)
        if self.stalled:
            return STALL_EXIT_STATUS
        if self.preempted and len(self.signals) == 1:
            from accelkit.launch.preemption import PREEMPTED_EXIT_STATUS, preempted_summary

            self._say(preempted_summary(status, self.preemption_grace, killed=self.proc.returncode < 0))
            return PREEMPTED_EXIT_STATUS
        if self.signals:  # however the launcher ended (even SIGKILLed after a second Ctrl-C): 128 + first signal
            name = signal.Signals(self.signals[0]).name
            self._say(f"stopped by {name}{' (Ctrl-C)' if self.signals[0] == signal.SIGINT else ''}; "
                      "every process of the job has exited.")
            return 128 + self.signals[0]
        if self.timed_out:
            return STALL_EXIT_STATUS
        return status


def _absorb_signal(signum: int, frame: object) -> None:
    """A stop signal after the job was already stopped by one: nothing more to do than what is under way."""


def stall_error(stall: StallReport) -> AccelkitError:
    """The one-line error of a stalled job, with what to do about it."""
    return AccelkitError(
        f"the job stalled for {stall.seconds:.0f} s and was stopped: {stall.where}",
        hint=f"{stall.advice}; if the job is only slow and silent, raise --stall-timeout (now {stall.timeout:g} s; 0 "
             "turns the watchdog off)")


@contextlib.contextmanager
def supervised_job(argv: list[str], env: dict[str, str], *, plain: bool = False, **settings):
    """A Supervisor for `argv` (a launcher, or with `plain` one process started in the rank bootstrap with
    $ACCELKIT_PROBES set), watched through the launch folder it owns, which is removed when the block ends. The
    watch probe must be among the job's probes (see `supervised`); `settings` go to the Supervisor."""
    launch_dir = create_launch_dir()
    try:
        if plain:  # one process keeps the user's TMPDIR; it registers as rank 0 through the watch probe
            from accelkit.ranks import PROBES_ENV

            probes = [name for name in env.get(PROBES_ENV, "").split(",") if name]
            full_env = {**env, PROBES_ENV: ",".join([*probes, WATCH_PROBE])}
        else:
            full_env = launcher_env(launch_dir, env)
        full_env[WATCH_DIR_ENV] = str(launch_dir)
        watch = WatchSettings(watch_dir=launch_dir, timeout=settings.pop("stall_timeout", None))
        yield Supervisor(argv, full_env, watch=watch, **settings)
    finally:
        remove_path(launch_dir)
