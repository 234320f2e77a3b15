"""When is a distributed job stalled? A pure decision over samples of its ranks (the supervisor takes the samples).

A rank waiting in a collective, sleeping, or blocked on a dead data source uses no CPU and does no I/O; a rank
that trains does. Per rank, the supervisor samples (about once a second) the CPU time and the bytes read and written
by the rank and the processes it started (console output, files, and the collectives' own socket traffic), and the
optimizer steps the rank's watch probe counted. Over the last `timeout` seconds the job made progress if

- any rank read or wrote anything, or stepped an optimizer, or
- every rank kept using CPU (at least IDLE_CPU_SHARE of a core on average: all ranks computing).

Otherwise it may be stalled: nothing moved, and at least one rank sat idle the whole time. With every rank idle it
is. With other ranks busy without any output, the supervisor decides from the stacks: an idle rank that waits in a
collective waits for the busy ones (e.g. an infinite loop on one rank), while one that waits elsewhere (a file lock
while rank 0 compiles a C++ extension) does not, and the window starts over. A job that is slow but progresses
(prints, steps or exchanges gradients now and then) is never stalled, however slow.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

IDLE_CPU_SHARE = 0.05  # a waiting rank's housekeeping threads use ~0.3% of a core (measured); computing uses ~100%


@dataclass(frozen=True)
class RankSample:
    rank: int
    pid: int
    cpu_seconds: float  # CPU time of the rank and its child processes
    io_bytes: int  # bytes read + written by the rank and its child processes
    steps: int  # optimizer steps counted in the rank


@dataclass(frozen=True)
class Stall:
    seconds: float  # how long nothing moved
    idle_ranks: tuple[int, ...]  # ranks that used no CPU over that time
    busy_ranks: tuple[int, ...]  # ranks that computed, without any output or step


class StallDetector:
    """Feed it samples with `observe(now, samples)`; it returns a Stall once the job has not progressed for
    `timeout` seconds. A change in the set of ranks (a restart, a rank that exited) starts the window over."""

    def __init__(self, timeout: float) -> None:
        if timeout <= 0:
            raise ValueError("timeout must be positive")
        self.timeout = timeout
        self._pids: tuple[int, ...] = ()
        self._history: deque[tuple[float, dict[int, RankSample]]] = deque()

    def restart(self) -> None:
        """Start a new window (after a suspected stall turned out not to be one)."""
        self._history.clear()

    def observe(self, now: float, samples: list[RankSample]) -> Stall | None:
        pids = tuple(sorted(sample.pid for sample in samples))
        if pids != self._pids:
            self._pids = pids
            self._history.clear()
        if not samples:
            return None
        self._history.append((now, {sample.pid: sample for sample in samples}))
        # Keep the newest sample that is at least `timeout` old as the start of the window.
        while len(self._history) > 1 and self._history[1][0] <= now - self.timeout:
            self._history.popleft()
        start, first = self._history[0]
        window = now - start
        if window < self.timeout:
            return None
        last = self._history[-1][1]
        for pid, sample in last.items():
            before = first[pid]
            if sample.io_bytes != before.io_bytes or sample.steps != before.steps:
                return None
        cpu_used = {pid: last[pid].cpu_seconds - first[pid].cpu_seconds for pid in last}
        idle = sorted(last[pid].rank for pid, used in cpu_used.items() if used < IDLE_CPU_SHARE * window)
        if not idle:
            return None
        busy = sorted(last[pid].rank for pid, used in cpu_used.items() if used >= IDLE_CPU_SHARE * window)
        return Stall(seconds=window, idle_ranks=tuple(idle), busy_ranks=tuple(busy))
