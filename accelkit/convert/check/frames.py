"""The user's frames on a rank's own stack, by the one rule accelkit has for "the user's code"
(accelkit.ranks.is_user_file: not Python's, a library's or accelkit's own, or the script the process runs), so a
`convert --check` report and a stall report blame the same line of one stack."""

from __future__ import annotations

import sys
from pathlib import Path

from accelkit.ranks import is_user_file


def user_frames(skip: int = 1):
    """The user's frames on the current stack, innermost first."""
    frame = sys._getframe(skip)
    while frame is not None:
        if is_user_file(frame.f_code.co_filename):
            yield frame
        frame = frame.f_back


def qualname(frame) -> str:
    return getattr(frame.f_code, "co_qualname", frame.f_code.co_name)


def innermost_user_function() -> str:
    """`Trainer.run` for the innermost user frame on the stack ("" if none)."""
    frame = next(user_frames(2), None)
    return "" if frame is None else f"{Path(frame.f_code.co_filename).name}:{qualname(frame)}"
