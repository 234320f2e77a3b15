"""Each rank's output reaches the terminal in whole lines, optionally prefixed with `[rank N] `.

torchrun starts ranks with `python -u`: print() then writes its text and its newline in two calls, and two ranks
writing at once glue their lines (`PROBE {...}PROBE {...}`, then two newlines). Line buffering hands each line to
the operating system in one write, which a pipe or a terminal delivers whole (up to PIPE_BUF, 4 KiB, on a pipe).
`accelkit launch --rank-prefix` names this module among the ranks' probes ($ACCELKIT_PROBES): its install() makes
every line a rank prints through Python's sys.stdout and sys.stderr start with `[rank N] ` (the global rank).
Output written by C code straight to the file descriptors (faulthandler, a native library's own logging) is as
whole as the library writes it, and never prefixed.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys

_LINE_ENDS = ("\n", "\r")  # tqdm redraws its bar after a carriage return: a line of its own


class PrefixedLines(io.TextIOBase):
    """A text stream that writes whole lines to `stream`, each starting with `prefix`. A partial line waits for its
    end, or for flush() (a prompt, a progress bar drawn with end="")."""

    def __init__(self, stream, prefix: str) -> None:
        super().__init__()
        self.stream, self.prefix = stream, prefix
        self.pending, self.at_line_start = "", True

    def write(self, text: str) -> int:
        self.pending += text
        cut = max(self.pending.rfind(end) for end in _LINE_ENDS) + 1
        if cut:
            complete, self.pending = self.pending[:cut], self.pending[cut:]
            self._emit(complete)
        return len(text)

    def _emit(self, text: str) -> None:
        out = []
        start = 0
        for index, char in enumerate(text):
            if char in _LINE_ENDS:
                out.append(self._prefixed(text[start:index + 1]))
                start = index + 1
        if start < len(text):  # a flushed partial line: its prefix now, the rest of it follows without one
            out.append(self._prefixed(text[start:]))
            self.at_line_start = False
        self.stream.write("".join(out))
        self.stream.flush()

    def _prefixed(self, piece: str) -> str:
        prefix = self.prefix if self.at_line_start else ""
        self.at_line_start = piece[-1] in _LINE_ENDS
        return prefix + piece

    def flush(self) -> None:
        if self.pending:
            pending, self.pending = self.pending, ""
            self._emit(pending)
        else:
            self.stream.flush()

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.stream.fileno()

    def isatty(self) -> bool:
        return self.stream.isatty()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self.stream.encoding

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        return self.stream.errors


def whole_lines() -> None:
    """In a rank, before the user's script runs: line-buffered sys.stdout and sys.stderr (whole lines)."""
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            with contextlib.suppress(AttributeError, ValueError, io.UnsupportedOperation):
                stream.reconfigure(line_buffering=True, write_through=False)


def install() -> None:
    """The probe `--rank-prefix` adds: every line through sys.stdout and sys.stderr starts with `[rank N] `."""
    prefix = f"[rank {os.environ.get('RANK', '0')}] "
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None:
            setattr(sys, name, PrefixedLines(stream, prefix))
