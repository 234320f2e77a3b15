"""Side effects of a process: files it writes (through `open`, `torch.save`, safetensors) and what it prints
(stdout lines, each tagged with the last DataLoader event; progress-bar redraws on stderr)."""

from __future__ import annotations

import builtins
import io
import os
import re
import sys
from collections.abc import Callable

from accelkit.convert.check.frames import innermost_user_function, user_frames
from accelkit.convert.check.record import Record
from accelkit.ranks import is_user_file

MAX_LINES = 20_000
LIBRARY_LOG = re.compile(r"^\[\d{4}-\d\d-\d\d [\d:,.]+\] \[(DEBUG|INFO|WARNING|ERROR|CRITICAL)\] ")
WRITE_MODES = set("wax+")
MAX_UNEDITED = 200


def _unedited() -> str:
    """Why the line being printed comes from code the conversion could not gate ("" when it could): the process
    has no Accelerator yet, so it cannot tell it is not the main one (an exec'd configurator at import), or the
    print is in a module beside the script, which the conversion does not edit."""
    state = sys.modules.get("accelerate.state")
    if state is None or not getattr(state.PartialState, "_shared_state", None):
        return "before its Accelerator existed"
    frame = next(user_frames(3), None)
    script = sys.argv[0] if sys.argv else ""
    if frame is not None and script and os.path.abspath(frame.f_code.co_filename) != os.path.abspath(script):
        return os.path.basename(frame.f_code.co_filename)
    return ""


class OutputTracker:
    def __init__(self, record: Record, ignore: list[str], tag: Callable[[], str], keep_lines: bool,
                 metric_positions: Callable[[str, object], list[int] | None] | None = None) -> None:
        self.record = record
        self.ignore = [os.path.abspath(p) for p in ignore]  # the probe's own files
        self.tag = tag
        self.keep_lines = keep_lines
        self.metric_positions = metric_positions  # lines after an evaluation: which numbers are its metrics
        self.real_open = builtins.open

    def install(self) -> None:
        real_open = self.real_open
        tracker = self

        def open_and_note(file, mode="r", *args, **kwargs):
            tracker._opened(file, kwargs.get("mode", mode))
            return real_open(file, mode, *args, **kwargs)

        builtins.open = open_and_note
        io.open = open_and_note
        sys.stdout = _LineTee(sys.stdout, self._line)
        sys.stderr = _ProgressCounter(sys.stderr, self._progress)

    def hook_torch(self) -> None:
        torch = sys.modules["torch"]
        self._wrap(torch, "save", 1)
        sys.modules["torch.serialization"].save = torch.save

    def hook_safetensors(self) -> None:
        module = sys.modules["safetensors.torch"]  # not yet an attribute of its package while the hook runs
        self._wrap(module, "save_file", 1)
        self._wrap(module, "save_model", 1)

    def _wrap(self, owner, name: str, path_arg: int) -> None:
        original = getattr(owner, name, None)
        if original is None or getattr(original, "_accelkit_check", False):
            return
        tracker = self

        def write_and_note(*args, **kwargs):
            target = args[path_arg] if len(args) > path_arg else kwargs.get("f", kwargs.get("filename"))
            tracker._opened(target, "wb")
            return original(*args, **kwargs)

        write_and_note._accelkit_check = True
        write_and_note.__wrapped__ = original
        setattr(owner, name, write_and_note)

    def _opened(self, file, mode) -> None:
        if not isinstance(file, (str, bytes, os.PathLike)) or not isinstance(mode, str) or not WRITE_MODES & set(mode):
            return
        path = os.path.abspath(os.fsdecode(file))
        if path.startswith(("/dev/", "/proc/")) or any(path == p or path.startswith(p + os.sep) for p in self.ignore):
            return
        shown = os.path.relpath(path) if path.startswith(os.getcwd() + os.sep) else path
        self.record.files[shown] = self.record.files.get(shown, 0) + 1

    def _line(self, text: str, from_script: bool) -> None:
        if LIBRARY_LOG.match(text):
            return  # `[2026-11-24 02:47:44,298] [WARNING] [real_accelerator.py:213:...]`: DeepSpeed's logger, which
            # `unwrap_model` imports mid-run; not the script's output on either side
        if self.keep_lines and len(self.record.lines) < MAX_LINES:
            tag = self.tag()
            line: list = [tag, innermost_user_function(), text]
            if tag.endswith(":end") and self.metric_positions is not None:
                line.append(self.metric_positions(text, next(user_frames(2), None)))
            self.record.lines.append(line)
            return
        if not from_script:
            return  # a library's log line (DeepSpeed's accelerator notice, warnings): not the script's output
        why = _unedited()
        if why:  # side_effects decides against the original's output whether the conversion added the line
            if len(self.record.unedited_lines) < MAX_UNEDITED:
                self.record.unedited_lines.append([why, text])
            return
        self.record.stdout_lines += 1
        if len(self.record.lines) < 3:  # evidence of output on the other ranks
            self.record.lines.append(["", innermost_user_function(), text])

    def _progress(self) -> None:
        self.record.progress_writes += 1


class _LineTee:
    """sys.stdout as the script sees it: writes pass through; complete lines are also handed to `on_line`."""

    def __init__(self, stream, on_line: Callable[[str, bool], None]) -> None:
        self._stream = stream
        self._on_line = on_line
        self._pending = ""
        self._from_script = False  # the pending line was started by the script's own print()

    def write(self, text: str) -> int:
        written = self._stream.write(text)
        if not self._pending:
            self._from_script = is_user_file(sys._getframe(1).f_code.co_filename)
        self._pending += text
        while "\n" in self._pending:
            line, self._pending = self._pending.split("\n", 1)
            self._on_line(line, self._from_script)
        return written

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


class _ProgressCounter:
    """sys.stderr as the script sees it: counts carriage-return redraws (tqdm and friends)."""

    def __init__(self, stream, on_progress: Callable[[], None]) -> None:
        self._stream = stream
        self._on_progress = on_progress

    def write(self, text: str) -> int:
        if "\r" in text:
            self._on_progress()
        return self._stream.write(text)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)
