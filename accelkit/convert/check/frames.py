"""Which stack frames belong to the user's code (not Python's, a library's, or accelkit's own)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import accelkit

LIBRARY_MARKERS = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep, "<frozen", "<string>")
ACCELKIT_DIR = str(Path(accelkit.__file__).resolve().parent) + os.sep
STDLIB_DIR = os.path.dirname(os.__file__) + os.sep


def is_user_code(filename: str) -> bool:
    return not (any(marker in filename for marker in LIBRARY_MARKERS) or filename.startswith(ACCELKIT_DIR)
                or filename.startswith(STDLIB_DIR))


def user_frames(skip: int = 1):
    """The user's frames on the current stack, innermost first."""
    frame = sys._getframe(skip)
    while frame is not None:
        if is_user_code(frame.f_code.co_filename):
            yield frame
        frame = frame.f_back


def qualname(frame) -> str:
    return getattr(frame.f_code, "co_qualname", frame.f_code.co_name)


def innermost_user_function() -> str:
    """`Trainer.run` for the innermost user frame on the stack ("" if none)."""
    frame = next(user_frames(2), None)
    return "" if frame is None else f"{Path(frame.f_code.co_filename).name}:{qualname(frame)}"
