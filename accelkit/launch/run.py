"""Run a launch in a launcher process (accelkit.launch.worker) and supervise it until every process is gone.

torchrun (under `accelerate launch`) already stops all ranks when one fails and when it receives SIGINT/SIGTERM.
What it cannot do is clean up after itself when it is killed hard, and its ranks run in sessions of their own,
so they never see a terminal's Ctrl-C directly. The supervisor therefore:
- starts the launcher in its own process group, asks the kernel to SIGTERM it if accelkit dies, and makes
  accelkit a "child subreaper" so ranks orphaned by a dead launcher are re-parented to accelkit, not init;
- forwards SIGINT/SIGTERM/SIGHUP to the launcher, which stops its ranks; a second signal, or a launcher still
  alive `grace` seconds later, gets SIGKILL for the whole tree;
- after the launcher exits, kills and reaps any descendant still running, and returns the launcher's status
  (128 + N when it was killed by signal N).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time

import psutil

from accelkit.launch.accelerate_main import exit_status
from accelkit.launch.request import LaunchRequest

WORKER_MODULE = "accelkit.launch.worker"

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


class Supervisor:
    """Owns one launcher process and everything it starts."""

    def __init__(self, argv: list[str], env: dict[str, str], *, grace: float = 15.0, poll: float = 0.1) -> None:
        self.argv = argv
        self.env = env
        self.grace = grace
        self.poll = poll
        self.proc: subprocess.Popen[bytes] | None = None
        self.known: dict[int, psutil.Process] = {}  # every descendant seen so far (pid -> process)
        self.signals: list[int] = []
        self.kill_deadline: float | None = None

    # -- signals ---------------------------------------------------------------------------------------------
    def _on_signal(self, signum: int, frame: object) -> None:
        self.signals.append(signum)
        if self.proc is None or self.proc.poll() is not None:
            return
        if len(self.signals) == 1:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signum)
            self.kill_deadline = time.monotonic() + self.grace
        else:  # asked twice: stop waiting for a clean shutdown
            self.kill_deadline = time.monotonic()

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

    # -- main loop -------------------------------------------------------------------------------------------
    def run(self) -> int:
        _prctl(_PR_SET_CHILD_SUBREAPER, 1)
        previous = {sig: signal.signal(sig, self._on_signal) for sig in _FORWARDED_SIGNALS}
        try:
            self.proc = subprocess.Popen(self.argv, env=self.env, start_new_session=True,
                                         preexec_fn=_launcher_preexec)
            last_track = 0.0
            while self.proc.poll() is None:
                now = time.monotonic()
                if now - last_track > 0.5:
                    self._track()
                    last_track = now
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
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if self.signals and status == 0:
            status = 128 + self.signals[0]
        return status


def run_request(request: LaunchRequest, *, grace: float = 15.0) -> int:
    """Resolve and run `request` in a supervised launcher process (accelkit.launch.worker); return the exit status
    (the failing rank's on failure)."""
    argv = [sys.executable, "-m", WORKER_MODULE, request.to_json()]
    return Supervisor(argv, dict(os.environ), grace=grace).run()
