"""What goes into an sbatch script's `#SBATCH` lines: checked as sbatch would read them, and spelled so it does.

sbatch refuses a script whose time limit it cannot read ("Invalid --time specification") or whose --signal time is
above 65535 s, and splits an unquoted value at its spaces ("Invalid directive found in batch script"); a line break
in a value would end the comment line and run the rest as a command. `accelkit launch --slurm` refuses these when it
writes the script, with nothing written, instead of leaving a script that fails (or does something else) later.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from accelkit.errors import AccelkitError

if TYPE_CHECKING:
    from accelkit.launch.targets.slurm import SlurmOptions

MAX_SIGNAL_BEFORE = 65535  # SLURM's --signal=...@SECONDS takes at most this (sbatch: "Invalid --signal specification")
# sbatch's time limit forms: MINUTES, MINUTES:SECONDS, HOURS:MINUTES:SECONDS, DAYS-HOURS[:MINUTES[:SECONDS]]
_TIME_LIMIT = re.compile(r"(?:(?P<days>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?"
                         r"|(?P<a>\d+)(?::(?P<b>\d+)(?::(?P<c>\d+))?)?)")


def time_limit_seconds(text: str) -> int | None:
    """A SLURM time limit (as `sbatch --time` reads it) in seconds; None for no limit (UNLIMITED, INFINITE, 0)."""
    if text.strip().upper() in ("UNLIMITED", "INFINITE"):
        return None
    match = _TIME_LIMIT.fullmatch(text.strip())
    if match is None:
        raise AccelkitError(f"--time {text} is not a SLURM time limit",
                            hint="write MINUTES, HOURS:MINUTES:SECONDS or DAYS-HOURS:MINUTES:SECONDS, e.g. 04:00:00")
    part = {key: int(value) for key, value in match.groupdict().items() if value is not None}
    if "days" in part:
        seconds = ((part["days"] * 24 + part["dh"]) * 60 + part.get("dm", 0)) * 60 + part.get("ds", 0)
    elif "c" in part:  # HOURS:MINUTES:SECONDS
        seconds = (part["a"] * 60 + part["b"]) * 60 + part["c"]
    else:  # MINUTES or MINUTES:SECONDS
        seconds = part["a"] * 60 + part.get("b", 0)
    return seconds or None  # SLURM: a time limit of 0 is no limit


def check_directive_value(option: str, value: str, *, spaces: bool, hint: str | None = None) -> None:
    """A value that goes into an `#SBATCH` line: one line, no double quote (values with spaces are quoted)."""
    if any(char == '"' or not char.isprintable() for char in value) or (not spaces and any(c.isspace() for c in value)):
        what = "spaces, quotes or control characters" if not spaces else "quotes or control characters"
        raise AccelkitError(f"{option} {value!r} cannot go into an #SBATCH line: it has {what}",
                            hint=hint or f"pass {option} without them")


def check_slurm_options(options: SlurmOptions) -> None:
    """Refuse what sbatch would refuse (or misread) in the script, before anything is written."""
    if options.partition is not None:
        check_directive_value("--partition", options.partition, spaces=False)
    check_directive_value("--job-name", options.job_name, spaces=True)
    if "/" in options.job_name:
        raise AccelkitError(f"--job-name {options.job_name} has a '/': it names the job's log (%x-%j.out)",
                            hint="pass a job name without '/'")
    for option, value in (("--account", options.account), ("--qos", options.qos),
                          ("--container-image", options.container_image)):
        if value is not None:
            check_directive_value(option, value, spaces=False)
    if options.chdir is not None:
        check_directive_value("the job's folder", str(options.chdir), spaces=True,
                               hint="run accelkit launch --slurm from a folder whose path has no quotes")
    limit = time_limit_seconds(options.time) if options.time is not None else None
    if not options.requeue:
        return
    if options.signal_before > MAX_SIGNAL_BEFORE:
        raise AccelkitError(f"--signal-before {options.signal_before} is more than SLURM allows "
                            f"({MAX_SIGNAL_BEFORE} seconds)", hint=f"pass --signal-before {MAX_SIGNAL_BEFORE} or less")
    if limit is not None and options.signal_before >= limit:
        raise AccelkitError(f"--requeue's warning {options.signal_before} s before the time limit (--signal-before) "
                            f"is not shorter than --time {options.time} ({limit} s): SLURM would ask the job to save "
                            "as soon as it starts",
                            hint="pass a shorter --signal-before (a few minutes: time to save a checkpoint), or a "
                                 "longer --time")


def sbatch_directive(option: str, value: object) -> str:
    """`#SBATCH --OPTION=VALUE`, the value in double quotes when it has spaces (sbatch reads them)."""
    text = str(value)
    return f'#SBATCH --{option}="{text}"' if any(char.isspace() for char in text) else f"#SBATCH --{option}={text}"
