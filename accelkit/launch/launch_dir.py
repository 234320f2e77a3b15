"""The one temporary folder a launch owns, removed on every way out (success, failure, Ctrl-C, SIGTERM, a stall).

`accelkit launch` creates `accelkit-launch-<PID>-<random>` in the temp directory and hands it to the launcher
process as its TMPDIR, so everything the launcher writes there (the generated Accelerate config, torchrun's
`torchelastic_*` log folders) lands inside; the ranks get the user's own TMPDIR back (accelerate_main restores it)
and keep only their per-rank watch files there ($ACCELKIT_WATCH_DIR). The supervisor removes the folder when the job
is over. If accelkit itself was killed with SIGKILL, the next launch removes folders whose PID is gone.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from pathlib import Path

import psutil

from accelkit.fsio import remove_path

PREFIX = "accelkit-launch-"
# The user's TMPDIR ("" when unset), for the launcher to give back to the ranks.
ORIGINAL_TMPDIR_ENV = "ACCELKIT_ORIGINAL_TMPDIR"
STALLED_MARKER = "stalled"  # written by the supervisor before it stops a stalled job: the launcher stays quiet
_OWNED = re.compile(re.escape(PREFIX) + r"(\d+)-")


def remove_stale_launch_dirs(root: Path | None = None) -> list[Path]:
    """Remove launch folders of accelkit processes that no longer exist (only this user's)."""
    root = Path(root or tempfile.gettempdir())
    removed = []
    with contextlib.suppress(OSError):
        for entry in root.iterdir():
            match = _OWNED.match(entry.name)
            if not match or int(match.group(1)) == os.getpid() or psutil.pid_exists(int(match.group(1))):
                continue
            with contextlib.suppress(OSError):
                if entry.is_dir() and not entry.is_symlink() and entry.stat().st_uid == os.getuid():
                    remove_path(entry)
                    removed.append(entry)
    return removed


def create_launch_dir() -> Path:
    remove_stale_launch_dirs()
    return Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-"))


def launcher_env(launch_dir: Path, env: dict[str, str]) -> dict[str, str]:
    """The launcher process's environment: TMPDIR inside the launch folder, the user's TMPDIR kept aside."""
    return {**env, "TMPDIR": str(launch_dir), ORIGINAL_TMPDIR_ENV: env.get("TMPDIR", "")}


def restore_user_tmpdir(environ: dict[str, str] | os._Environ) -> None:
    """In the launcher, before ranks start: give them the user's TMPDIR (the launcher keeps using the folder)."""
    if ORIGINAL_TMPDIR_ENV not in environ:
        return
    original = environ.pop(ORIGINAL_TMPDIR_ENV)
    if original:
        environ["TMPDIR"] = original
    else:
        environ.pop("TMPDIR", None)


def is_stalled(launch_dir: Path | None) -> bool:
    return launch_dir is not None and (launch_dir / STALLED_MARKER).exists()
