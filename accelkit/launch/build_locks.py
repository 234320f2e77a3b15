"""Build locks that interrupted builds of DeepSpeed's C++ ops left behind: found, and removed, before a launch.

DeepSpeed compiles its C++ ops on first use with torch.utils.cpp_extension (on CPU its shared-memory comm op, CPU
Adam, FusedAdam; on GPUs its JIT ops), which guards each op's build folder, `<root>/<op>/`, with a file named
`lock`: the building process creates it, keeps it open while the compiler runs and deletes it when done. Every later
load of the op, even of one built long ago, first waits for that file to go away. A build killed by SIGTERM or
SIGKILL (torchrun stopping its ranks after Ctrl-C, a scheduler's time limit, the OOM killer) never deletes it, and
from then on every DeepSpeed run of that user on that machine waits forever without a word.

A lock is stale when no process on this machine has it open and it lies on a local filesystem. On a shared one
(NFS, Lustre, ...) a process on another machine may hold it, so there it counts as stale only after
SHARED_STALE_AFTER seconds, far longer than any build. The check holds an flock on the root folder, so two launches
starting together never both judge the same lock. A lock judged stale is looked at again CONFIRM_AFTER seconds later
and removed only if it is the same file and still unheld: a no-op load takes and drops the lock in well under a
second, so a lock that was being released, or one released and taken again by another rank, is never removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

from accelkit.errors import AccelkitError

SHARED_STALE_AFTER = 3600.0
CONFIRM_AFTER = 0.5
LOCK_NAME = "lock"  # torch.utils.cpp_extension's FileBaton in each op's build folder
# Filesystems whose files only this machine's processes can hold open; any other kind counts as shared.
LOCAL_FILESYSTEMS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "overlay", "zfs", "f2fs", "bcachefs",
                               "reiserfs", "jfs", "ramfs", "vfat", "exfat", "ntfs3", "hfsplus", "apfs"})


@dataclass(frozen=True)
class BuildLock:
    path: Path
    identity: tuple[int, int, int]  # device, inode and change time: a lock released and taken again differs
    age: float  # seconds since the lock was created
    holders: tuple[int, ...]  # processes on this machine that have it open
    filesystem: str

    @property
    def op(self) -> str:
        return self.path.parent.name

    @property
    def shared(self) -> bool:
        return self.filesystem not in LOCAL_FILESYSTEMS

    @property
    def stale(self) -> bool:
        return not self.holders and (not self.shared or self.age > SHARED_STALE_AFTER)


def extensions_root(env: Mapping[str, str]) -> Path:
    """Where torch builds extensions for this environment: TORCH_EXTENSIONS_DIR, or torch's default under the user's
    cache folder (torch._appdirs.user_cache_dir, which per-version folders such as py311_cpu lie under)."""
    if env.get("TORCH_EXTENSIONS_DIR"):
        return Path(env["TORCH_EXTENSIONS_DIR"]).expanduser()
    cache = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".cache")
    return Path(cache).expanduser() / "torch_extensions"


def clear_stale_build_locks(env: Mapping[str, str]) -> list[str]:
    """Remove the stale build locks under the extensions root of `env`; the lines to tell the user (what was
    removed, and builds that are running, which the ranks will wait for). AccelkitError for a stale lock that
    cannot be removed: the launch would wait for it forever."""
    root = extensions_root(env)
    if not root.is_dir():
        return []
    lines: list[str] = []
    stale: list[BuildLock] = []
    with _exclusive(root):
        for lock in find_build_locks(root):
            if lock.holders:
                pids = ", ".join(f"{pid} ({_command(pid)})" for pid in lock.holders)
                lines.append(f"accelkit: process {pids} holds the build lock of the torch extension {lock.op!r} "
                             f"(it builds or loads it); the ranks wait until it lets go ({lock.path})")
            elif not lock.stale:
                lines.append(f"accelkit: {lock.path} (a build lock of the torch extension {lock.op!r}, "
                             f"{_duration(lock.age)} old) lies on a shared filesystem ({lock.filesystem}), where a "
                             "build on another machine may hold it; the ranks wait for it (delete the file if no "
                             "build is running)")
            else:
                stale.append(lock)
        if stale:
            time.sleep(CONFIRM_AFTER)
            confirmed = {lock.identity for lock in find_build_locks(root) if lock.stale}
            lines += [_remove(lock) for lock in stale if lock.identity in confirmed]
    return lines


def find_build_locks(root: Path) -> list[BuildLock]:
    """Every build lock under root: in each op's folder, directly (TORCH_EXTENSIONS_DIR) or one level down (torch's
    default root holds a folder per Python version and accelerator, e.g. py311_cpu/)."""
    paths = sorted({*root.glob(f"*/{LOCK_NAME}"), *root.glob(f"*/*/{LOCK_NAME}")})
    holders = _holders(paths) if paths else {}
    mounts = mount_table() if paths else []
    found = []
    now = time.time()
    for path in paths:
        try:
            info = path.lstat()
        except OSError:
            continue  # released meanwhile
        pids = tuple(sorted(proc.pid for proc in holders[os.path.realpath(path)]))
        found.append(BuildLock(path=path, identity=(info.st_dev, info.st_ino, info.st_ctime_ns),
                               age=max(0.0, now - info.st_mtime), holders=pids,
                               filesystem=filesystem_type(path, mounts)))
    return found


def filesystem_type(path: Path, mounts: list[tuple[str, str]] | None = None) -> str:
    """The type of the filesystem `path` lies on: that of the deepest mount point above it, from `mounts`
    ((mount point, type) pairs; by default this machine's mount table, as psutil reads it); "unknown" where none."""
    if mounts is None:
        mounts = mount_table()
    target = os.path.realpath(path)
    best, kind = "", "unknown"
    for mount, fstype in mounts:
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best):
            best, kind = mount, fstype
    return kind


def mount_table() -> list[tuple[str, str]]:
    """(mount point, filesystem type) of every mount of this machine; empty where the table cannot be read."""
    try:
        return [(part.mountpoint, part.fstype) for part in psutil.disk_partitions(all=True)]
    except (OSError, RuntimeError, psutil.Error):
        return []


def _remove(lock: BuildLock) -> str:
    try:
        lock.path.unlink()
    except FileNotFoundError:
        pass  # released meanwhile: nothing left to wait for
    except OSError as exc:
        raise AccelkitError(
            f"{lock.path} is a build lock that an interrupted build of the torch extension {lock.op!r} left behind "
            f"(no process has it open), and it cannot be removed ({exc.strerror}): DeepSpeed would wait for it "
            "forever", hint="delete that file, or set TORCH_EXTENSIONS_DIR to a folder of your own") from None
    return (f"accelkit: removed {lock.path}: a build lock of the torch extension {lock.op!r}, created "
            f"{_duration(lock.age)} ago, that no process has open (an interrupted build left it); DeepSpeed would "
            "have waited for it forever")


@contextlib.contextmanager
def _exclusive(root: Path) -> Iterator[None]:
    """An flock on the root folder itself (no file of ours in the user's cache), held while locks are judged."""
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        yield  # unreadable: judge without it (at worst two launches remove the same stale file)
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _holders(paths: list[Path]) -> dict[str, list[psutil.Process]]:
    """The processes on this machine (those this user may look at) that have each of `paths` open."""
    wanted = {os.path.realpath(path): [] for path in paths}
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        with contextlib.suppress(psutil.Error):  # gone, or another user's
            for file in proc.open_files():
                if file.path in wanted:
                    wanted[file.path].append(proc)
    return wanted


def _command(pid: int) -> str:
    try:
        return psutil.Process(pid).name() or "?"
    except psutil.Error:
        return "?"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
