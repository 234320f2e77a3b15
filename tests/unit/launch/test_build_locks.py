"""Stale build locks of torch extensions (DeepSpeed's JIT ops): a lock whose builder was killed is removed, one a
live process holds is kept, and locks on shared filesystems wait for an hour. The locks are made by torch's own
FileBaton, as torch.utils.cpp_extension makes them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from accelkit.errors import AccelkitError
from accelkit.launch import build_locks
from accelkit.launch.build_locks import clear_stale_build_locks, extensions_root, filesystem_type, find_build_locks

# A builder as torch.utils.cpp_extension runs one: take the baton (and keep its file open), then "compile".
BUILDER = """
import sys, time
from torch.utils.file_baton import FileBaton
baton = FileBaton(sys.argv[1])
assert baton.try_acquire()
print("building", flush=True)
time.sleep(600)
"""


def start_builder(lock: Path) -> subprocess.Popen:
    lock.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", BUILDER, str(lock)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "building"
    return proc


def env_for(root: Path) -> dict[str, str]:
    return {"TORCH_EXTENSIONS_DIR": str(root)}


def test_a_lock_left_by_a_killed_build_is_removed_and_said(tmp_path):
    lock = tmp_path / "ext" / "deepspeed_shm_comm" / "lock"
    builder = start_builder(lock)
    builder.send_signal(signal.SIGKILL)  # as a scheduler's time limit or the OOM killer ends a build
    builder.wait()
    assert lock.exists()  # torch never removes it: every later load of the op would wait for it forever
    built = lock.parent / "deepspeed_shm_comm.so"
    built.write_bytes(b"not touched")

    lines = clear_stale_build_locks(env_for(tmp_path / "ext"))

    assert not lock.exists() and built.read_bytes() == b"not touched"
    assert len(lines) == 1 and lines[0].startswith(f"accelkit: removed {lock}: a build lock of the torch extension "
                                                   "'deepspeed_shm_comm', created ")
    assert "no process has open (an interrupted build left it)" in lines[0]
    assert clear_stale_build_locks(env_for(tmp_path / "ext")) == []  # nothing left to say


def test_a_lock_a_running_build_holds_is_kept(tmp_path):
    lock = tmp_path / "ext" / "cpu_adam" / "lock"
    builder = start_builder(lock)
    try:
        lines = clear_stale_build_locks(env_for(tmp_path / "ext"))
        assert lock.exists()
        assert len(lines) == 1
        assert lines[0].startswith(f"accelkit: process {builder.pid} (python")
        assert lines[0].endswith(f"holds the build lock of the torch extension 'cpu_adam' (it builds or loads it); "
                                 f"the ranks wait until it lets go ({lock})")
    finally:
        builder.kill()
        builder.wait()


def test_torch_default_root_holds_a_folder_per_python_and_accelerator(tmp_path):
    """Without TORCH_EXTENSIONS_DIR torch builds under <cache>/torch_extensions/py311_cpu/<op>/ (cu128 on GPUs)."""
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    root = extensions_root(env)
    assert root == tmp_path / "cache" / "torch_extensions"
    assert extensions_root({"HOME": str(tmp_path)}) == tmp_path / ".cache" / "torch_extensions"
    stale = [root / "py311_cpu" / "deepspeed_shm_comm" / "lock", root / "py311_cu128" / "fused_adam" / "lock"]
    for lock in stale:
        lock.parent.mkdir(parents=True)
        lock.touch()
    assert [lock.op for lock in find_build_locks(root)] == ["deepspeed_shm_comm", "fused_adam"]
    lines = clear_stale_build_locks(env)
    assert len(lines) == 2 and not any(lock.exists() for lock in stale)


def test_on_a_shared_filesystem_a_lock_counts_as_stale_only_after_an_hour(tmp_path, monkeypatch):
    """A process on another machine may hold a lock on NFS or Lustre; this machine cannot see it."""
    monkeypatch.setattr(build_locks, "mount_table", lambda: [("/", "nfs4")])
    young, old = tmp_path / "ext" / "a" / "lock", tmp_path / "ext" / "b" / "lock"
    for lock in (young, old):
        lock.parent.mkdir(parents=True)
        lock.touch()
    hours_ago = time.time() - 2 * 3600
    os.utime(old, (hours_ago, hours_ago))

    lines = clear_stale_build_locks(env_for(tmp_path / "ext"))

    assert young.exists() and not old.exists()
    assert any(line.startswith(f"accelkit: {young} (a build lock of the torch extension 'a'") and
               "lies on a shared filesystem (nfs4)" in line and "delete the file if no build is running" in line
               for line in lines)
    assert any(line.startswith(f"accelkit: removed {old}") and "created 2.0 h ago" in line for line in lines)


def test_a_stale_lock_that_cannot_be_removed_stops_the_launch_in_one_line(tmp_path, monkeypatch):
    lock = tmp_path / "ext" / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()

    def refuse(self, missing_ok=False):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "unlink", refuse)
    with pytest.raises(AccelkitError) as error:
        clear_stale_build_locks(env_for(tmp_path / "ext"))
    assert str(error.value).startswith(f"{lock} is a build lock that an interrupted build of the torch extension "
                                       "'deepspeed_shm_comm' left behind")
    assert "(Permission denied): DeepSpeed would wait for it forever" in str(error.value)
    assert "TORCH_EXTENSIONS_DIR" in error.value.hint


def test_no_root_no_work(tmp_path):
    assert clear_stale_build_locks(env_for(tmp_path / "missing")) == []
    assert not (tmp_path / "missing").exists()


MOUNTS = [("/proc", "proc"), ("/", "ext4"), ("/home", "nfs4"), ("/home/me/local disk", "xfs")]


def test_the_deepest_mount_point_decides_the_filesystem(tmp_path):
    assert filesystem_type(Path("/home/me/.cache/torch_extensions"), MOUNTS) == "nfs4"
    assert filesystem_type(Path("/home/me/local disk/ext"), MOUNTS) == "xfs"
    assert filesystem_type(Path("/homeless/x"), MOUNTS) == "ext4"  # a prefix of the name is not a mount
    assert filesystem_type(Path("/tmp/x"), []) == "unknown"
    real = filesystem_type(tmp_path)
    assert real != "unknown" and real in build_locks.LOCAL_FILESYSTEMS  # the tests' temp folder is local


def test_a_lock_released_and_taken_again_while_it_is_judged_is_kept(tmp_path, monkeypatch):
    """Ranks loading an op that is already built take and drop the lock in turn: an unheld lock is looked at again
    before it is removed, and a different file at the same path (another rank's, held) is left alone."""
    lock = tmp_path / "ext" / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()  # the first rank's lock, between its close and its remove
    builders = []

    def meanwhile(seconds):
        lock.unlink()  # the first rank lets go; the next one takes the lock
        builders.append(start_builder(lock))

    monkeypatch.setattr(build_locks.time, "sleep", meanwhile)
    try:
        lines = clear_stale_build_locks(env_for(tmp_path / "ext"))
        assert lines == [] and lock.exists()  # the second rank's lock is still there
    finally:
        for builder in builders:
            builder.kill()
            builder.wait()


def test_a_lock_released_while_it_is_judged_is_no_error(tmp_path, monkeypatch):
    lock = tmp_path / "ext" / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    monkeypatch.setattr(build_locks.time, "sleep", lambda seconds: lock.unlink())
    assert clear_stale_build_locks(env_for(tmp_path / "ext")) == []
