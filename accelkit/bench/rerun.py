"""The exact command that measures a noisy benchmark again over a longer window: the user's own command line,
its `--min-time` replaced, and `--force` so it can replace the results it would otherwise refuse to overwrite."""

from __future__ import annotations

import math
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


# The script flags that cap a run's steps, as the templates and transformers' examples spell them.
STEP_FLAGS = ("--max-steps", "--max_steps", "--max-train-steps", "--max_train_steps", "--num-steps", "--num_steps")
MARGIN = 1.5  # steps beyond the projection: step times vary, and a run cut short measures nothing better


def _with_enough_steps(script: Sequence[str], needed: int) -> list[str]:
    """`script` with its step cap (`--max-steps 1000`) raised to `needed` if it is lower; unchanged without one."""
    words = list(script)
    for i, word in enumerate(words):
        name, eq, value = word.partition("=")
        if name not in STEP_FLAGS:
            continue
        at, value = (i, value) if eq else (i + 1, words[i + 1] if i + 1 < len(words) else "")
        if value.isdigit() and int(value) < needed:
            words[at] = f"{name}={needed}" if eq else str(needed)
    return words


def longer_command(options: Sequence[str], script: Sequence[str], min_time: float, *,
                   step_seconds: float | None = None, warmup: int = 0) -> str:
    """`options`: the words before SCRIPT (`accelkit bench --cpu ...`), `script`: SCRIPT and its arguments.
    `step_seconds`: the fastest run's mean step: a step cap in the script's arguments is raised so the longer window
    fits in it (else the re-run would end before its window, as the first did)."""
    kept = _without(_without(options, "--min-time", True), "--force", False)
    window = longer_window(min_time)
    if step_seconds is not None and step_seconds > 0:
        script = _with_enough_steps(script, warmup + math.ceil(window * MARGIN / step_seconds))
    return command_line(*kept, "--min-time", f"{window:g}", "--force", *script)


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
