"""The one error type users see, and the one way it is printed.

`AccelkitError(message, hint)` names the problem and the fix. It knows nothing of click: the library (merge,
convert, rehearsal ranks, the launch worker) raises it, and every process that can end with one calls `report()`,
so the CLI, the launcher process and each rank print the same two lines:

    Error: <message>
      Hint: <hint>
"""

from __future__ import annotations

import os
import sys
from typing import TextIO

DEBUG_ENV = "ACCELKIT_DEBUG"


class AccelkitError(Exception):
    """A user-facing failure: printed as `Error: <message>` plus `Hint: <hint>`, exit code 1, no traceback."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None, *, exit_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        if exit_code is not None:
            self.exit_code = exit_code

    def format_message(self) -> str:
        if self.hint:
            return f"{self.message}\n  Hint: {self.hint}"
        return self.message

    def __str__(self) -> str:
        return self.message


def debug_enabled() -> bool:
    """ACCELKIT_DEBUG=1: show full tracebacks instead of one-line errors."""
    return os.environ.get(DEBUG_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def report(error: AccelkitError, stream: TextIO | None = None) -> int:
    """Print `error` the way every accelkit process does and return its exit code."""
    stream = sys.stderr if stream is None else stream
    print(f"Error: {error.format_message()}", file=stream, flush=True)
    return error.exit_code


class Terminated(BaseException):
    """SIGTERM/SIGHUP turned into an exception, so every `finally` and context manager cleans up on the way out.

    A BaseException (like KeyboardInterrupt), so `except Exception` blocks do not swallow it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
        self.exit_code = 128 + signum


def raise_on_termination() -> None:
    """Make SIGTERM and SIGHUP raise Terminated in the main thread (Python's default kills without cleanup)."""
    import signal

    def _handler(signum: int, frame: object) -> None:
        raise Terminated(signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _handler)
