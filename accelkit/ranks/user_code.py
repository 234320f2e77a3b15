"""Telling the user's code from library code in a stack: messages point at the user's line, not at torch's."""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path
from types import FrameType

_PACKAGE = str(Path(__file__).resolve().parent.parent)  # accelkit itself
_LIBRARY_ROOTS = tuple(root.rstrip("/") + "/" for root in
                       {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"], _PACKAGE})


def is_library_file(file: str) -> bool:
    """True for the standard library, installed packages, accelkit and frozen/generated code."""
    file = file.replace("\\", "/")
    if file.startswith("<") or "/site-packages/" in file or "/dist-packages/" in file:
        return True
    return file.startswith(_LIBRARY_ROOTS)


def is_user_file(file: str) -> bool:
    """The user's code: not a library, or the script this process runs (even one installed in site-packages, like
    Accelerate's own test scripts)."""
    if not is_library_file(file):
        return True
    main = sys.argv[0] if sys.argv and sys.argv[0] else ""
    return bool(main) and os.path.abspath(file) == os.path.abspath(main)


def user_frame(frame: FrameType | None) -> FrameType | None:
    """The innermost frame from `frame` outwards that runs the user's code."""
    while frame is not None and not is_user_file(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def caller_location(depth: int = 2) -> str:
    """`file:line` of the user's code that (directly or through libraries) called the caller's caller."""
    frame = user_frame(sys._getframe(depth))
    return f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "an unknown line"
