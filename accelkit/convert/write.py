"""Reading the script to convert and writing its conversion: beside it, to a path, or in place with a backup.

Light on purpose (no libcst): the command reads the script here before the codemod is imported.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from accelkit.errors import AccelkitError
from accelkit.fsio import atomic_write, refuse_overwrite

BACKUP_SUFFIX = ".bak"


@dataclass(frozen=True)
class Written:
    path: Path  # the converted script
    backup: Path | None = None  # the original, kept beside it (--in-place)


def read_script(script: Path) -> str:
    try:
        return script.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise AccelkitError(f"{script} is not UTF-8 text", hint="convert a Python source file") from None


def default_output(script: Path) -> Path:
    return script.with_name(f"{script.stem}_accelerate.py")


def write_conversion(script: Path, source: str, code: str, *, output: Path | None = None, in_place: bool = False,
                     force: bool = False) -> Written:
    """Write `code` (the conversion of `source`, read from `script`) to `output` (default: <name>_accelerate.py
    beside the script), or over the script itself with the original kept as <script>.bak (`in_place`). Every check
    comes before the first byte is written; each file is replaced whole or not at all."""
    if in_place:
        backup = script.with_name(script.name + BACKUP_SUFFIX)
        refuse_overwrite(backup, force)
        refuse_overwrite(script, True)  # a link is written through; anything but a regular file is refused
        atomic_write(backup, source)
        atomic_write(script, code)
        return Written(script, backup)
    target = output if output is not None else default_output(script)
    if target.resolve() == script.resolve():
        raise AccelkitError("the output would overwrite the input script", hint="use --in-place (keeps a backup)")
    refuse_overwrite(target, force)
    atomic_write(target, code)
    return Written(target)
