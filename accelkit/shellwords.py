"""One way to write a command back as it can be pasted into a shell: the header of a written config, the commands a
report recommends, the hints that say what to run next."""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ShellVariable:
    """A value the shell fills in when the command runs, written `"$NAME"` (expanded, never split): machine 0's
    address in a command printed for every machine of a multi-machine job."""

    name: str

    def __str__(self) -> str:
        return f'"${self.name}"'


def command_line(*words: object, flags: Iterable[tuple[str, object]] = (), args: Sequence[object] = (),
                 script_args: Sequence[str] = ()) -> str:
    """`words` (the program, its command, leading arguments), then each (flag, value) spelled as click reads it
    back: True -> `--flag`, False -> `--no-flag`, a tuple or list -> `--flag item` once per item, None or () ->
    nothing, a ShellVariable -> `--flag "$NAME"`, anything else -> `--flag value`; then `args`, then `script_args`
    after `--`. Every word quoted (a ShellVariable so that the shell expands it)."""
    parts: list[object] = [str(word) for word in words]
    for flag, value in flags:
        if value is None or value == ():
            continue
        if isinstance(value, bool):
            parts.append(flag if value else "--no-" + flag.removeprefix("--"))
        elif isinstance(value, (tuple, list)):
            for item in value:
                parts += [flag, str(item)]
        else:
            parts += [flag, value if isinstance(value, ShellVariable) else str(value)]
    parts += [str(arg) for arg in args]
    if script_args:
        parts += ["--", *script_args]
    return " ".join(str(part) if isinstance(part, ShellVariable) else shlex.quote(str(part)) for part in parts)
