"""Where a line of the converted copy the check ran comes from, for reports (a hang's stack, say).

The converted run executes a copy named like the original (`train.py`) whose lines are the conversion's, not the
user's: a stack line `train.py:57` would point at the wrong line of the user's file. A conversion made by the check
is mapped back to the original's lines (a line diff: unchanged lines map exactly, changed ones to the line they
replace, added ones are named as the conversion's); a conversion the user gave (`--converted FILE`) is named by that
file, whose lines are the ones that ran.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field


@dataclass
class ConvertedLines:
    copy_name: str  # the file name the converted copy ran under (the original's)
    shown_name: str  # the name to show: the original's, or the user's converted file
    origin: dict[int, tuple[int, str]] = field(default_factory=dict)  # copy line -> (original line, "same"|...)

    @classmethod
    def mapped(cls, name: str, original: str, converted: str) -> ConvertedLines:
        """Map each line of `converted` to `original` (a conversion made by the check)."""
        ours, theirs = converted.splitlines(), original.splitlines()
        origin: dict[int, tuple[int, str]] = {}
        matcher = difflib.SequenceMatcher(None, theirs, ours, autojunk=False)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            for j in range(j1, j2):
                if tag == "equal":
                    origin[j + 1] = (i1 + (j - j1) + 1, "same")
                elif tag == "replace":
                    origin[j + 1] = (min(i1 + (j - j1), i2 - 1) + 1, "changed")
                elif tag == "insert":
                    origin[j + 1] = (i1, "added")  # added after the original's line i1 (0: at the top)
        return cls(name, name, origin)

    @classmethod
    def named(cls, copy_name: str, converted_file: str) -> ConvertedLines:
        """The user's own conversion: its lines are the ones that ran, under its own name."""
        return cls(copy_name, converted_file)

    def where(self, file_name: str, line: int, function: str) -> str:
        """`train.py:12 in main`, for a frame of `file_name` at `line` in the converted run."""
        if file_name != self.copy_name:
            return f"{file_name}:{line} in {function}"
        if line not in self.origin:
            return f"{self.shown_name}:{line} in {function}"
        original, how = self.origin[line]
        if how == "same":
            return f"{self.shown_name}:{original} in {function}"
        if how == "changed":
            return f"{self.shown_name}:{original} in {function} (as converted: line {line} of the conversion)"
        return (f"line {line} of the converted {self.shown_name}, added by the conversion after line {original}, "
                f"in {function}")
