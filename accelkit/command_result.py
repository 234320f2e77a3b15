"""What a command prints and how it ends, as the library hands it back: the CLI prints the lines in order and exits
with the code (the library decides what to say; only accelkit/commands knows click). Free of click, like errors.py.

Lines a user must see while a long run goes on (progress) go through a callback instead; this is what is printed
once the work is done, in the order it was said, on the stream it was said on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

from accelkit.errors import AccelkitError


@dataclass(frozen=True)
class Line:
    text: str
    err: bool = False  # stderr (notes, summaries) rather than stdout (the result itself)
    nl: bool = True  # False: the text carries its own line ends (a YAML document, a diff)


@dataclass
class CommandResult:
    """The lines to print, the exit status, and an error to end with once they are printed (a report first, then
    the one-line refusal)."""

    exit_code: int = 0
    lines: list[Line] = field(default_factory=list)
    error: AccelkitError | None = None

    def out(self, text: str, nl: bool = True) -> CommandResult:
        self.lines.append(Line(text, nl=nl))
        return self

    def err(self, text: str) -> CommandResult:
        self.lines.append(Line(text, err=True))
        return self

    @contextlib.contextmanager
    def ends_on_error(self) -> Iterator[CommandResult]:
        """An AccelkitError raised in the block ends the result: printed after what was said before it."""
        try:
            yield self
        except AccelkitError as error:
            self.error = error
