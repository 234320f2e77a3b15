"""The launch folder: stale folders of dead accelkit processes are removed, nothing else is, and the ranks get the
user's TMPDIR back."""

from __future__ import annotations

import os
import subprocess
import sys

from accelkit.launch.launch_dir import (
    ORIGINAL_TMPDIR_ENV,
    launcher_env,
    remove_stale_launch_dirs,
    restore_user_tmpdir,
)


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_only_folders_of_dead_accelkit_processes_are_removed(tmp_path):
    dead = tmp_path / f"accelkit-launch-{dead_pid()}-abc123"
    alive = tmp_path / f"accelkit-launch-{os.getppid()}-def456"
    old_style = tmp_path / "accelkit-launch-x1y2z3"  # an older --dry-run config folder (now accelkit-dry-run-*)
    other = tmp_path / "unrelated-12345-"
    for folder in (dead, alive, old_style, other):
        folder.mkdir()
        (folder / "accelerate_config.yaml").write_text("x")
    assert remove_stale_launch_dirs(tmp_path) == [dead]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in (alive, old_style, other))


def test_the_launcher_writes_into_the_folder_and_the_ranks_get_the_users_tmpdir(tmp_path):
    env = launcher_env(tmp_path / "launch", {"TMPDIR": "/scratch/me", "HOME": "/home/me"})
    assert env["TMPDIR"] == str(tmp_path / "launch") and env["HOME"] == "/home/me"
    restore_user_tmpdir(env)
    assert env["TMPDIR"] == "/scratch/me" and ORIGINAL_TMPDIR_ENV not in env

    env = launcher_env(tmp_path / "launch", {"HOME": "/home/me"})  # TMPDIR was not set: it is unset again
    restore_user_tmpdir(env)
    assert "TMPDIR" not in env and ORIGINAL_TMPDIR_ENV not in env


def test_restore_without_a_supervisor_changes_nothing():
    env = {"TMPDIR": "/tmp/x"}
    restore_user_tmpdir(env)
    assert env == {"TMPDIR": "/tmp/x"}
