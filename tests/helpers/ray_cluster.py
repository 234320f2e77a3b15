"""A real two-node Ray cluster on this machine for the `accelkit launch --ray` tests: a head node and a worker node,
each a `ray start` with its own CPUs and its own temporary folder (two nodes sharing one would each stream every
worker's log: every line twice), on loopback. `ray stop --force` ends it: it stops every Ray process of the user,
which on a test machine are this cluster's."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from accelkit.launch.ports import free_port

RAY = Path(sys.executable).parent / "ray"


def _ray(*args: str, timeout: float = 120) -> None:
    proc = subprocess.run([str(RAY), *args], capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"ray {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")


@contextlib.contextmanager
def two_node_cluster(cpus_per_node: int = 2) -> Iterator[str]:
    """Start the cluster; yield the head's address (127.0.0.1:PORT)."""
    folders = [Path(tempfile.mkdtemp(prefix="akray-")) for _ in range(2)]
    port = free_port()
    common = ["--node-ip-address", "127.0.0.1", "--num-cpus", str(cpus_per_node), "--num-gpus", "0",
              "--object-store-memory", "100000000", "--disable-usage-stats"]
    try:
        _ray("start", "--head", "--port", str(port), "--include-dashboard", "false", "--temp-dir", str(folders[0]),
             *common)
        _ray("start", "--address", f"127.0.0.1:{port}", "--temp-dir", str(folders[1]), *common)
        yield f"127.0.0.1:{port}"
    finally:
        with contextlib.suppress(Exception):
            _ray("stop", "--force")
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)
