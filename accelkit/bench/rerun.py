"""The exact command that measures a noisy benchmark again over a longer window: the user's own command line,
its `--min-time` replaced, and `--force` so it can replace the results it would otherwise refuse to overwrite."""

from __future__ import annotations

from collections.abc import Sequence

from accelkit.shellwords import command_line

LONGER = 5.0  # the next window: five times the last one
AT_LEAST = 10.0  # seconds


def longer_window(min_time: float) -> float:
    return max(AT_LEAST, min_time * LONGER)


def _without(words: Sequence[str], flag: str, takes_value: bool) -> list[str]:
    out: list[str] = []
    skip = False
    for word in words:
        if skip:
            skip = False
        elif word == flag:
            skip = takes_value
        elif not (takes_value and word.startswith(flag + "=")):
            out.append(word)
    return out


def longer_command(options: Sequence[str], script: Sequence[str], min_time: float) -> str:
    """`options`: the words before SCRIPT (`accelkit bench --cpu ...`), `script`: SCRIPT and its arguments."""
    kept = _without(_without(options, "--min-time", True), "--force", False)
    return command_line(*kept, "--min-time", f"{longer_window(min_time):g}", "--force", *script)


def split_command_line(argv: Sequence[str], script: str | None,
                       script_args: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """`accelkit bench`'s words (`argv`: after the program name) split into ("accelkit", "bench", OPTIONS...) and
    (SCRIPT, its arguments) as typed, `--` separators included. `script_args` arrive without the `--` that may
    follow SCRIPT."""
    words = tuple(argv)
    if script is None:
        return ("accelkit", *words), ()
    end = len(words) - len(script_args)
    start = end - 1
    if start >= 1 and words[start] == "--" and words[start - 1] == script:  # `SCRIPT -- ARGS`
        start -= 1
    if start >= 1 and words[start - 1] == "--":  # `[OPTIONS] -- SCRIPT`
        start -= 1
    return ("accelkit", *words[:start]), words[start:]
