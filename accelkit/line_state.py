"""Whether the job's output stands at the start of a line, so accelkit's own lines (`accelkit: ...`, `Error: ...`)
always start one.

The ranks write straight to the file descriptors they inherit, which the launcher and the supervisor write their
own lines to as well. A progress bar (tqdm redraws `\r 45%|####` and ends with no newline until it closes) left by a
rank that then fails would glue the next `accelkit:` line onto it: `grep ^accelkit` on a SLURM log then misses it.
Under a supervisor ($ACCELKIT_WATCH_DIR), every rank's sys.stdout and sys.stderr record, after each write that
reaches the file, whether it ended with a newline: one byte in the launch folder's LINE_STATE_FILE, shared by the
node's ranks (the last writer's). start_line() writes a newline first when that byte says a line is open.
The byte is written just after the rank's text, so two processes writing at the same instant can leave the other's
state (a missing or an extra newline, never a lost line); text written by C code straight to the descriptors is not
seen.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from pathlib import Path
from typing import TextIO

from accelkit.ranks import WATCH_DIR_ENV

LINE_STATE_FILE = "line-state"
AT_LINE_START, MID_LINE = b"\n", b"-"


class _TrackedFile(io.FileIO):
    """A rank's stdout or stderr descriptor (not closed with it) that records how each write ended."""

    def __init__(self, fd: int, state_fd: int) -> None:
        super().__init__(fd, "w", closefd=False)
        self.state_fd = state_fd

    def write(self, data) -> int:  # type: ignore[override]
        written = super().write(data)
        if written:
            last = bytes(memoryview(data)[written - 1:written])
            with contextlib.suppress(OSError):
                os.pwrite(self.state_fd, AT_LINE_START if last == b"\n" else MID_LINE, 0)
        return written or 0


def track_line_state(watch_dir: str | None = None) -> None:
    """In a rank, before the user's script runs: sys.stdout and sys.stderr become line-buffered streams over the
    same descriptors that record how their last write ended (nothing without a supervisor's launch folder)."""
    watch_dir = watch_dir or os.environ.get(WATCH_DIR_ENV)
    if not watch_dir:
        return
    try:
        state_fd = os.open(Path(watch_dir) / LINE_STATE_FILE, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        try:
            fd = stream.fileno()
            stream.flush()
        except (AttributeError, ValueError, OSError, io.UnsupportedOperation):
            continue
        tracked = io.TextIOWrapper(io.BufferedWriter(_TrackedFile(fd, state_fd)), encoding=stream.encoding,
                                   errors=stream.errors, line_buffering=True)
        setattr(sys, name, tracked)


def start_line(stream: TextIO | None = None, watch_dir: str | Path | None = None) -> None:
    """Before accelkit writes its own line to `stream` (default sys.stderr): a newline when a rank left a line open
    there, and the state back at a line start (the line about to be written ends with its newline)."""
    folder = watch_dir or os.environ.get(WATCH_DIR_ENV)
    if not folder:
        return
    path = Path(folder) / LINE_STATE_FILE
    try:
        with open(path, "r+b", buffering=0) as state:
            if state.read(1) != MID_LINE:
                return
            out = stream or sys.stderr
            out.write("\n")
            out.flush()
            state.seek(0)
            state.write(AT_LINE_START)
    except OSError:
        return
