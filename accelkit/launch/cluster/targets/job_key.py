"""The job board's key, for the targets where machine 0 hosts the board (SkyPilot, Kubernetes): the job file names
where the key comes from, never the key itself, so whoever reads the file (a shared repository, `kubectl get -o
yaml`, SkyPilot's dashboard) cannot post to the job's board. The key is made where the job is submitted, by the
command accelkit prints (NEW_KEY, a shell expression: Python is there, accelkit runs on it).
"""

from __future__ import annotations

import shlex

from accelkit.launch.cluster.job_board import KEY_ENV

NEW_KEY = '"$(python3 -c \'import secrets; print(secrets.token_hex(16))\')"'


def skypilot_launch_command(cluster: str, path: str) -> str:
    """`sky launch` with the task's one secret (its `secrets:` entry has no value) set from a fresh key. `path`:
    the task file, as the shell reads it (quoted)."""
    return f"{KEY_ENV}={NEW_KEY} sky launch -c {shlex.quote(cluster)} {path} --secret {KEY_ENV}"
