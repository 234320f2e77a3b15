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
    """Make SIGTERM and SIGHUP raise Terminated in the main thread (Python's default kills without cleanup).

    Not inside an import: an exception raised while a module runs its top level leaves it half-initialised in
    sys.modules (numpy then fails on the way out with a RecursionError, and an extension that called back into Python
    aborts the process). A signal that lands in an import is sent again shortly, until no import is running; one still
    pending when the command ends is raised by `raise_pending_termination`."""
    import signal

    _pending.clear()
    _raised.clear()

    def _handler(signum: int, frame: object) -> None:
        if _raised:
            return  # already unwinding to exit 128+N (this may be the resend of a signal deferred out of an import)
        if _inside_import(frame):
            _pending[:] = [signum]
            _resend_soon(signum)
            return
        _raise(signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _handler)


def raise_pending_termination() -> None:
    """Raise the Terminated a signal deferred out of an import still owes (the command ended before it was resent)."""
    if _pending and not _raised:
        _raise(_pending[0])


def _raise(signum: int) -> None:
    _pending.clear()
    _raised.append(signum)
    raise Terminated(signum)


IMPORT_RETRY_SECONDS = 0.02
_pending: list[int] = []  # the signal deferred out of an import, until it is raised
_raised: list[int] = []  # the signal already raised as Terminated: the process is on its way out


def _inside_import(frame: object) -> bool:
    """Whether the interrupted code runs inside an import (a frame of importlib's bootstrap on the stack)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):  # type: ignore[attr-defined]
            return True
        frame = frame.f_back  # type: ignore[attr-defined]
    return False


def _resend_soon(signum: int) -> None:
    import threading

    timer = threading.Timer(IMPORT_RETRY_SECONDS, os.kill, (os.getpid(), signum))
    timer.daemon = True
    timer.start()


def clip(text: str, limit: int = 300) -> str:
    """`text` on one line, at most about `limit` characters, never cut inside a sentence or a word: an upstream
    error quoted in an `Error:` line ends where its sentence ends, or says that it goes on ("..."), rather than
    stopping mid-word."""
    flat = " ".join(str(text).split())
    if len(flat) <= limit:
        return flat
    head = flat[:limit]
    for end in (". ", "; ", ": ", ", "):
        cut = head.rfind(end)
        if cut >= limit // 2:
            return head[:cut + 1].rstrip(",;:") + " ..."
    cut = head.rfind(" ")
    return (head[:cut] if cut > 0 else head) + " ..."
