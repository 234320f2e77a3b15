"""The supervisor's view of the ranks on this machine: who they are, how much they compute and write, and their
Python stacks on demand. The ranks describe themselves through accelkit.ranks.rank_files (written by the watch
probe); everything else is read from the operating system (psutil), so a rank frozen in native code is still seen.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import psutil

from accelkit.launch.stacks import RankStack, main_thread_stack
from accelkit.launch.watchdog import RankSample
from accelkit.ranks import STACK_SIGNAL, RankFiles, RankInfo, read_steps, read_text, registered_ranks


class RankMonitor:
    def __init__(self, watch_dir: Path) -> None:
        self.watch_dir = Path(watch_dir)

    def files(self, info: RankInfo) -> RankFiles:
        return RankFiles.of(self.watch_dir, info.pid)

    def alive_ranks(self) -> list[RankInfo]:
        """Registered ranks whose process still runs."""
        alive = []
        for info in registered_ranks(self.watch_dir):
            with contextlib.suppress(psutil.Error):
                if psutil.Process(info.pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(info)
        return alive

    def sample(self, infos: list[RankInfo]) -> list[RankSample]:
        """CPU seconds and I/O bytes of each rank and its child processes (DataLoader workers, compilers), plus the
        optimizer steps it counted. One scan of the process table per call."""
        children: dict[int, list[int]] = {}
        for proc in psutil.process_iter(["pid", "ppid"]):
            children.setdefault(proc.info["ppid"], []).append(proc.info["pid"])
        samples = []
        for info in infos:
            cpu, io = 0.0, 0
            pending = [info.pid]
            while pending:
                pid = pending.pop()
                pending += children.get(pid, [])
                with contextlib.suppress(psutil.Error, OSError):
                    proc = psutil.Process(pid)
                    with proc.oneshot():
                        times = proc.cpu_times()
                        # children_* hold the CPU time of children that already exited and were reaped.
                        cpu += times.user + times.system + times.children_user + times.children_system
                        counters = proc.io_counters()
                        io += getattr(counters, "read_chars", counters.read_bytes) + getattr(
                            counters, "write_chars", counters.write_bytes)
            samples.append(RankSample(rank=info.rank, pid=info.pid, cpu_seconds=cpu, io_bytes=io,
                                      steps=read_steps(self.files(info))))
        return samples

    def dump_stacks(self, infos: list[RankInfo], timeout: float = 5.0) -> list[RankStack]:
        """Ask every rank for its stacks (faulthandler, on STACK_SIGNAL) and read them back. A rank whose dump does
        not arrive within `timeout` seconds is left out."""
        start = {info.pid: _size(self.files(info).stack) for info in infos}
        for info in infos:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(info.pid, STACK_SIGNAL)
        deadline = time.monotonic() + timeout
        sizes: dict[int, int] = {}
        while time.monotonic() < deadline:
            time.sleep(0.2)
            now = {info.pid: _size(self.files(info).stack) for info in infos}
            # Done once every file grew and no file changed since the last look (faulthandler writes in one go).
            if all(now[pid] > start[pid] for pid in now) and now == sizes:
                break
            sizes = now
        stacks = []
        for info in infos:
            text = read_text(self.files(info).stack, start[info.pid])
            stack = main_thread_stack(info.rank, info.pid, info.main_thread, text) if text else None
            if stack is not None:
                stacks.append(stack)
        return stacks


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
