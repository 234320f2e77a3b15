"""A training script's own command-line flags, read and set as argparse reads them (`--flag V` or `--flag=V`, the
last one wins): bench sets the batch flag of each run, launch points `--resume-from-checkpoint` at a ZeRO
checkpoint's universal copy."""

from __future__ import annotations


def flag_value(args: tuple[str, ...], flag: str) -> str | None:
    """The value of `flag` in a script's arguments (`--flag V` or `--flag=V`; the last one wins, like argparse)."""
    value = None
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(flag + "="):
            value = arg[len(flag) + 1:]
    return value


def set_flag(args: tuple[str, ...], flag: str, value: str) -> tuple[str, ...]:
    """The script's arguments with every occurrence of `flag` set to `value` (appended when absent)."""
    out: list[str] = []
    found = False
    skip = False
    for i, arg in enumerate(args):
        if skip:
            skip = False
            continue
        if arg == flag and i + 1 < len(args):
            out += [flag, value]
            found, skip = True, True
        elif arg.startswith(flag + "="):
            out.append(f"{flag}={value}")
            found = True
        else:
            out.append(arg)
    return tuple(out) if found else (*out, flag, value)
