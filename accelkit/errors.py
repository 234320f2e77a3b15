"""The one error type users see: a message naming the problem plus a hint naming the fix."""

from __future__ import annotations

import click


class AccelkitError(click.ClickException):
    """A user-facing failure: printed as `Error: <message>` plus `Hint: <hint>`, exit code 1, no traceback."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint

    def format_message(self) -> str:
        if self.hint:
            return f"{self.message}\n  Hint: {self.hint}"
        return self.message
