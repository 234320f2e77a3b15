"""Never lose data: the output is built under a temporary name in its own folder and renamed into place at the end.

On any failure (a bad shard, a full disk, Ctrl-C) the temporary output is removed and nothing is left behind. An
existing output is only replaced with --force, and only after the new one is complete. The input is opened
read-only and may not contain, or be contained in, the output.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from accelkit.errors import AccelkitError

DISK_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


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


def disk_full_error(exc: OSError, where: Path) -> AccelkitError:
    return AccelkitError(f"disk full while writing {where} ({os.strerror(exc.errno or 0)}); nothing was written",
                         hint="free some space (or raise the file-size limit) or write the output elsewhere")


class StagedOutput:
    """Context manager: yields a temporary path (file or folder) next to `final`; `commit()` renames it into place.

    Leaving the block without commit (an exception, KeyboardInterrupt) removes the temporary path and any
    folders created for it.
    """

    def __init__(self, final: Path, is_dir: bool) -> None:
        self.final = final
        self.is_dir = is_dir
        self.temp = final.parent / f".{final.name}.accelkit-tmp-{os.getpid()}"
        self._created: list[Path] = []
        self._committed = False

    def __enter__(self) -> Path:
        missing = []
        folder = self.final.parent
        while not folder.exists():
            missing.append(folder)
            folder = folder.parent
        for folder in reversed(missing):
            folder.mkdir()
            self._created.append(folder)
        _remove(self.temp)
        if self.is_dir:
            self.temp.mkdir()
        return self.temp

    def commit(self) -> None:
        old = None
        if self.final.exists() or self.final.is_symlink():
            old = self.final.parent / f".{self.final.name}.accelkit-old-{os.getpid()}"
            os.replace(self.final, old)
        os.replace(self.temp, self.final)
        self._committed = True
        if old is not None:
            _remove(old)

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self._committed:
            _remove(self.temp)
            for folder in reversed(self._created):
                try:
                    folder.rmdir()
                except OSError:
                    break


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink()
