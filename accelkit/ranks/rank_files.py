"""The files through which each rank tells the `accelkit launch` supervisor how it is doing.

The supervisor creates one folder per launch and passes it to the ranks as $ACCELKIT_WATCH_DIR. Each rank that
starts in the bootstrap with the watch probe (accelkit.ranks.watch) writes, under `ranks/`:

    <pid>.json    who it is (rank, local rank, main thread id, whether it runs on CPU): written last, so a rank
                  listed here is ready to dump its stack on STACK_SIGNAL
    <pid>.steps   an 8-byte counter of optimizer steps, memory-mapped (an increment is one memory write)
    <pid>.stack   Python stacks of every thread, appended by faulthandler each time the rank gets STACK_SIGNAL
    <pid>.crash   the stacks faulthandler writes if the rank dies of a fatal signal (SIGSEGV, SIGABRT, ...)
    <pid>.error   the one-line explanation of a known failure (accelkit.ranks.explain), for the launcher to
                  print once instead of every rank printing it
    <pid>.failed  when and how the rank's script failed (its exception, or its usage error and exit status): the
                  supervisor names the rank that failed FIRST with its own error, not a peer's consequence
                  ("Connection closed by peer") of it

Both sides import this module, so the layout lives in one place. No torch here.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import signal
import struct
from dataclasses import asdict, dataclass
from pathlib import Path

WATCH_DIR_ENV = "ACCELKIT_WATCH_DIR"
# A real-time signal nobody else uses: faulthandler dumps the stacks on it. (SIGUSR1/SIGUSR2 are taken by
# SLURM requeue handlers in Lightning and submitit.)
STACK_SIGNAL = signal.SIGRTMIN + 5 if hasattr(signal, "SIGRTMIN") else signal.SIGUSR2
_COUNTER = struct.Struct("<Q")


@dataclass(frozen=True)
class RankInfo:
    pid: int
    rank: int
    local_rank: int
    main_thread: int  # threading.main_thread().ident, to find the main thread in a faulthandler dump
    cpu_job: bool  # a CPU rehearsal or CPU job (vs. GPUs): decides the default stall timeout


@dataclass(frozen=True)
class RankFiles:
    folder: Path
    pid: int

    @classmethod
    def of(cls, watch_dir: Path, pid: int) -> RankFiles:
        return cls(Path(watch_dir) / "ranks", pid)

    def _named(self, suffix: str) -> Path:
        return self.folder / f"{self.pid}.{suffix}"

    info = property(lambda self: self._named("json"))
    steps = property(lambda self: self._named("steps"))
    stack = property(lambda self: self._named("stack"))
    crash = property(lambda self: self._named("crash"))
    error = property(lambda self: self._named("error"))
    failed = property(lambda self: self._named("failed"))


def write_info(files: RankFiles, info: RankInfo) -> None:
    temp = files.info.with_suffix(".json.tmp")
    temp.write_text(json.dumps(asdict(info)))
    os.replace(temp, files.info)


def write_rank_error(files: RankFiles, message: str, hint: str | None) -> None:
    files.folder.mkdir(parents=True, exist_ok=True)
    temp = files.error.with_suffix(".error.tmp")
    temp.write_text(json.dumps({"message": message, "hint": hint}))
    os.replace(temp, files.error)


def read_rank_error(files: RankFiles) -> tuple[str, str | None] | None:
    """(message, hint) a rank left before failing, or None."""
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        data = json.loads(files.error.read_text())
        return str(data["message"]), data.get("hint")
    return None


@dataclass(frozen=True)
class RankFailure:
    """How one rank's script failed: its own error line, when (wall clock, to order ranks), its exit status."""

    rank: int
    pid: int
    error: str
    exit_code: int
    time: float


def write_failure(files: RankFiles, failure: RankFailure) -> None:
    files.folder.mkdir(parents=True, exist_ok=True)
    temp = files.failed.with_suffix(".failed.tmp")
    temp.write_text(json.dumps(asdict(failure)))
    os.replace(temp, files.failed)


def read_failures(watch_dir: Path) -> list[RankFailure]:
    """Every failure a rank of this launch recorded, the earliest first."""
    found = []
    with contextlib.suppress(OSError):
        for path in (Path(watch_dir) / "ranks").glob("*.failed"):
            with contextlib.suppress(OSError, ValueError, TypeError):
                found.append(RankFailure(**json.loads(path.read_text())))
    return sorted(found, key=lambda failure: (failure.time, failure.rank))


def registered_ranks(watch_dir: Path) -> list[RankInfo]:
    """Every rank that registered in this launch (alive or not), by pid."""
    folder = Path(watch_dir) / "ranks"
    infos = []
    with contextlib.suppress(OSError):
        for path in folder.glob("*.json"):
            with contextlib.suppress(OSError, ValueError, TypeError):
                infos.append(RankInfo(**json.loads(path.read_text())))
    return sorted(infos, key=lambda info: (info.rank, info.pid))


class StepCounter:
    """A counter in a memory-mapped file: the rank increments it, the supervisor reads it."""

    def __init__(self, path: Path) -> None:
        with open(path, "a+b") as handle:
            if os.fstat(handle.fileno()).st_size < _COUNTER.size:
                handle.truncate(_COUNTER.size)
            self._map = mmap.mmap(handle.fileno(), _COUNTER.size)
        self.value = _COUNTER.unpack_from(self._map)[0]

    def increment(self) -> None:
        self.value += 1
        _COUNTER.pack_into(self._map, 0, self.value)


def read_steps(files: RankFiles) -> int:
    try:
        data = files.steps.read_bytes()
    except OSError:
        return 0
    return _COUNTER.unpack_from(data)[0] if len(data) >= _COUNTER.size else 0


def read_text(path: Path, start: int = 0) -> str:
    """The text of `path` from byte `start` ('' if it is missing)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(start)
            return handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
