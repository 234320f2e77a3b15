"""Never lose data: the output is built under a temporary name in its own folder and renamed into place at the end.

On any failure (a bad shard, a full disk, Ctrl-C) the temporary output is removed and nothing is left behind. An
existing output is only replaced with --force, and only after the new one is complete. The input is opened
read-only and may not contain, or be contained in, the output.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from accelkit.errors import AccelkitError


def _inside(child: Path, parent: Path) -> bool:
    return child == parent or parent in child.parents


def check_paths(input_path: Path, output: Path, force: bool) -> None:
    src, dst = input_path.resolve(), output.resolve()
    if _inside(dst, src) if input_path.is_dir() else dst == src:
        raise AccelkitError(f"output {output} is inside the input {input_path}",
                            hint="write the merged checkpoint somewhere outside the checkpoint folder")
    if _inside(src, dst):
        raise AccelkitError(f"the input {input_path} is inside the output {output}",
                            hint="choose an output path that does not contain the checkpoint")
    if output.exists() and not force:
        raise AccelkitError(f"output {output} already exists", hint="pass --force to replace it, or pick a new path")
    if output.exists() and output.is_dir() != (output.suffix != ".safetensors"):
        raise AccelkitError(f"output {output} exists and is a {'folder' if output.is_dir() else 'file'}",
                            hint="remove it or pick another output path")


def check_free_space(folder: Path, needed: int) -> None:
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise AccelkitError(f"not enough disk space in {folder}: the output needs {needed / 1e9:.2f} GB, "
                            f"{free / 1e9:.2f} GB are free", hint="free some space or write the output elsewhere")


