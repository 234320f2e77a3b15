"""Writing outputs without ever leaving half of one: the one home of "write under a temporary name, then rename".

Every command that writes (config, init, convert, merge-ckpt, launch --slurm) goes through here:
- `StagedOutput(final)` yields a temporary path `.NAME.accelkit-tmp-PID` beside `final` (a file or a folder);
  `commit()` renames it into place; leaving without commit removes it and any folder created for it. Because
  the CLI turns SIGTERM/SIGHUP into an exception (accelkit.errors.raise_on_termination), that covers signals too;
  after SIGKILL, `remove_stale_temps` clears what a dead process left the next time the same output is written.
- `atomic_write(path, data)` is the one-call version for a small text or bytes file.
- `write_error(exc, path)` turns the OSError of a failed write into one message naming the real cause
  (read-only file system, permission denied, disk full, file-size limit) and the path.
- `writable_target(path, is_dir)` is what an output may replace, checked on entry and again just before the
  rename: a regular file (a folder for folder outputs); a symbolic link is written through to the regular file
  (or folder) it points to, and stays a link; a device, FIFO, socket, a folder where a file goes (or the other way
  round) and a link to nothing are refused. Run as root, a rename over /dev/null would otherwise replace the device.
- `refuse_overwrite(path, force)` is the one "already exists, pass --force" check.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import stat
from pathlib import Path

from accelkit.errors import AccelkitError, raise_pending_termination

TEMP_MARK = ".accelkit-tmp-"
DISK_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


@contextlib.contextmanager
def signals_deferred():
    """Hold SIGINT/SIGTERM/SIGHUP until the block is done (they are delivered right after it). Main thread only:
    that is where Python runs signal handlers."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    held = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def temp_path(final: Path, pid: int | None = None) -> Path:
    """The temporary name of `final` while process `pid` (default: this one) writes it."""
    return final.parent / f".{final.name}{TEMP_MARK}{os.getpid() if pid is None else pid}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def remove_stale_temps(final: Path) -> list[Path]:
    """Remove temporary outputs of `final` left by accelkit processes that no longer exist (killed with SIGKILL,
    power loss). Returns what was removed, so the caller can say so."""
    pattern = re.compile(re.escape(f".{final.name}{TEMP_MARK}") + r"(\d+)$")
    removed: list[Path] = []
    with contextlib.suppress(OSError):
        for entry in final.parent.iterdir():
            match = pattern.match(entry.name)
            if match and int(match.group(1)) != os.getpid() and not _pid_alive(int(match.group(1))):
                remove_path(entry)
                removed.append(entry)
    return removed


def remove_path(path: Path) -> None:
    """Remove a file, link or folder tree; missing is fine."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


_SPECIAL_KINDS = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
                  (stat.S_ISSOCK, "a socket"))


def _kind(mode: int) -> str:
    for test, name in _SPECIAL_KINDS:
        if test(mode):
            return name
    return "a folder" if stat.S_ISDIR(mode) else "a file" if stat.S_ISREG(mode) else "a special file"


def writable_target(path: Path | str, is_dir: bool = False) -> Path:
    """The path an output for `path` really replaces: `path` itself, or the file/folder a symbolic link at `path`
    points to (written through, the link stays). Refuses anything that is not a regular file (a folder for folder
    outputs): devices, FIFOs, sockets, the wrong kind, links to nothing. Missing is fine."""
    path = Path(path)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return path
    except OSError as exc:
        raise write_error(exc, path) from None
    target = path
    if stat.S_ISLNK(mode):
        target = path.resolve()
        try:
            mode = os.stat(target).st_mode
        except FileNotFoundError:
            raise AccelkitError(f"cannot write {path}: it is a symbolic link to {os.readlink(path)}, which does not "
                                "exist", hint="remove the link or point it at an existing file, or choose another "
                                "output path") from None
        except OSError as exc:
            raise write_error(exc, path) from None
    wanted = stat.S_ISDIR(mode) if is_dir else stat.S_ISREG(mode)
    if not wanted:
        via = f" (through the link to {target})" if target != path else ""
        what = "folder" if is_dir else "regular file"
        raise AccelkitError(f"cannot write {path}: it is {_kind(mode)}{via}, and accelkit replaces only a {what}",
                            hint="choose another output path; nothing was written")
    return target


def refuse_overwrite(path: Path | str, force: bool, is_dir: bool = False) -> None:
    """The one 'already exists' check: refuse an existing output without --force, and with --force anything
    `writable_target` would refuse."""
    path = Path(path)
    if not (path.exists() or path.is_symlink()):
        return
    if not force:
        raise AccelkitError(f"{path} already exists", hint="pass --force to replace it, or choose another path")
    writable_target(path, is_dir)


def write_error(exc: OSError, path: Path | str) -> AccelkitError:
    """One message for a failed write, naming the cause and the path the user gave (never a temporary name)."""
    code = exc.errno
    if code == errno.EROFS:
        return AccelkitError(f"cannot write {path}: the file system is read-only",
                             hint="write to a writable location (choose another output path)")
    if code in (errno.EACCES, errno.EPERM):
        return AccelkitError(f"cannot write {path}: permission denied",
                             hint="choose a folder you can write to, or fix its permissions")
    if code == errno.EFBIG:
        return AccelkitError(f"cannot write {path}: the file exceeds the file-size limit; nothing was written",
                             hint="raise the limit (ulimit -f) or write smaller files (e.g. --max-shard-size)")
    if code in DISK_FULL_ERRNOS:
        return AccelkitError(f"disk full while writing {path} ({os.strerror(code or 0)}); nothing was written",
                             hint="free some space or write the output elsewhere")
    if code == errno.ENOTDIR:
        return AccelkitError(f"cannot write {path}: a part of the path is a file, not a folder",
                             hint="choose an output path whose parent folders are folders")
    if code == errno.ENAMETOOLONG:
        return AccelkitError(f"cannot write {path}: the name is too long", hint="choose a shorter output path")
    reason = exc.strerror or type(exc).__name__
    return AccelkitError(f"cannot write {path}: {reason}", hint="check the output path and its folder")


class StagedOutput:
    """Context manager: yields a temporary path (file or folder) next to `final`; `commit()` renames it into place.

    Leaving the block without commit (an exception, KeyboardInterrupt, Terminated) removes the temporary path
    and any folders created for it. OSErrors while setting up become `write_error` messages naming `final`.
    """

    def __init__(self, final: Path, is_dir: bool = False) -> None:
        self.given = Path(final)  # what messages name
        self.is_dir = is_dir
        self.final = writable_target(self.given, is_dir)  # a link's target: the link itself stays
        self.temp = temp_path(self.final)
        self.stale_removed: list[Path] = []
        self._created: list[Path] = []
        self._committed = False

    def __enter__(self) -> Path:
        try:
            missing = []
            folder = self.final.parent
            while not folder.exists():
                missing.append(folder)
                folder = folder.parent
            for folder in reversed(missing):
                folder.mkdir()
                self._created.append(folder)
            self.stale_removed = remove_stale_temps(self.final)
            remove_path(self.temp)
            if self.is_dir:
                self.temp.mkdir()
        except OSError as exc:
            self._discard()
            raise write_error(exc, self.given) from None
        return self.temp

    def commit(self) -> None:
        raise_pending_termination()  # a signal that landed in an import while the output was made: not committed
        with signals_deferred():  # a signal between the two renames would leave neither the old nor the new output
            if writable_target(self.final, self.is_dir) != self.final:  # it changed under us: a link appeared
                raise AccelkitError(f"{self.given} was replaced by a link while it was being written",
                                    hint="run the command again")
            old = None
            if self.final.exists() or self.final.is_symlink():
                old = temp_path(self.final).with_name(f".{self.final.name}.accelkit-old-{os.getpid()}")
                os.replace(self.final, old)
            os.replace(self.temp, self.final)
            self._committed = True
            if old is not None:
                remove_path(old)

    def _discard(self) -> None:
        with signals_deferred():  # a second Ctrl-C while cleaning up must not leave half of the temporary output
            remove_path(self.temp)
            for folder in reversed(self._created):
                try:
                    folder.rmdir()
                except OSError:
                    break

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self._committed:
            self._discard()


def atomic_write(path: Path | str, data: str | bytes, mode: int = 0o644) -> None:
    """Write a small file completely or not at all; failures become one `write_error` message."""
    atomic_write_many([(Path(path), data)], mode)


def atomic_write_many(files: list[tuple[Path, str | bytes]], mode: int = 0o644) -> None:
    """Write several small files that belong together (a YAML and the JSON it names): every one is staged first,
    then all are renamed; a failure before the renames leaves none of them."""
    with contextlib.ExitStack() as stack:
        staged: list[StagedOutput] = []
        for path, data in files:
            output = StagedOutput(Path(path))
            temp = stack.enter_context(output)
            try:
                if isinstance(data, str):
                    temp.write_text(data, encoding="utf-8")
                else:
                    temp.write_bytes(data)
                temp.chmod(mode)
            except OSError as exc:
                raise write_error(exc, path) from None
            staged.append(output)
        raise_pending_termination()  # before the first rename: all of the files or none
        for output in staged:
            try:
                output.commit()
            except OSError as exc:
                raise write_error(exc, output.given) from None
