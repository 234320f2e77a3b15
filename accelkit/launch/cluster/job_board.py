"""The job board: a small key-value store that the nodes of one cluster job share, hosted by the job's first node.

A cluster job's nodes each run their own supervised launcher, and they need a few facts from one another that
torchrun's own store cannot give them (it exists only once ranks rendezvous, and dies with them):
- which node failed first, with which rank, status and signal (the job's exit status is that rank's: srun's own
  is the largest code, 143 after it killed the other nodes);
- what every node is about to run (versions, the script's sha256, the config's hash, the world size), compared
  before any rank starts (accelkit.launch.cluster.node_preflight);
- that a node's watchdog found the job stalled, so every node prints its ranks' stacks before any is stopped.

Standard library only (multiprocessing.managers, authenticated with a per-job key), so the light processes that
host and read it never import torch. The first node's job process (accelkit.launch.cluster.slurm_job) hosts it and
publishes its address as ACCELKIT_JOB_BOARD=HOST:PORT and ACCELKIT_JOB_KEY to every node. Where no batch step runs
before the nodes (SkyPilot, Kubernetes), machine 0's node launcher hosts it on a port the job file names, with the
key the job file carries (accelkit.launch.cluster.node --job-board-port).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
import time
from multiprocessing.managers import BaseManager
from typing import Any

from accelkit.errors import AccelkitError

BOARD_ENV = "ACCELKIT_JOB_BOARD"
KEY_ENV = "ACCELKIT_JOB_KEY"
FIRST_FAILURE = "first_failure"
SAVE_REQUEST = "save_request"  # set by the batch step on SIGUSR1: every node asks its ranks to save and stop


class Board:
    """The shared state (in the hosting process); nodes call it through a manager proxy."""

    def __init__(self) -> None:
        self._values: dict[str, Any] = {}
        self._lock = threading.Lock()

    def put(self, key: str, value: Any) -> None:
        with self._lock:
            self._values[key] = value

    def put_first(self, key: str, value: Any) -> Any:
        """Store `value` unless `key` has one already; return the value that `key` holds now."""
        with self._lock:
            return self._values.setdefault(key, value)

    def get(self, key: str) -> Any:
        with self._lock:
            return self._values.get(key)

    def with_prefix(self, prefix: str) -> dict[str, Any]:
        with self._lock:
            return {key: value for key, value in self._values.items() if key.startswith(prefix)}


class _BoardManager(BaseManager):
    pass


_BoardManager.register("board")  # the client side: a proxy to whatever the host serves under that name


class HostedBoard:
    """The board served from this process on all addresses (`port` 0: one the OS picks), until `close()`."""

    def __init__(self, port: int = 0, key: str | None = None) -> None:
        self.key = key or secrets.token_hex(16)
        self.board = Board()

        class Manager(BaseManager):  # a class per board: register() is class-wide
            pass

        Manager.register("board", callable=lambda: self.board)
        self._server = Manager(address=("", port), authkey=self.key.encode()).get_server()
        self.port = int(self._server.address[1])
        self._thread = threading.Thread(target=self._serve, name="accelkit-job-board", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        with contextlib.suppress(SystemExit):  # serve_forever ends with sys.exit(0) when stopped
            self._server.serve_forever()

    def env(self, host: str) -> dict[str, str]:
        """What every node needs to reach the board."""
        return {BOARD_ENV: f"{host}:{self.port}", KEY_ENV: self.key}

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._server.stop_event.set()


def connect(env: dict[str, str] | os._Environ | None = None, timeout: float = 30.0) -> Any | None:
    """A proxy to the job's board, or None when this process is not part of a cluster job."""
    env = os.environ if env is None else env
    address, key = env.get(BOARD_ENV), env.get(KEY_ENV)
    if not address or not key:
        return None
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout
    while True:
        manager = _BoardManager(address=(host, int(port)), authkey=key.encode())
        try:
            manager.connect()
            return manager.board()
        except OSError:
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.5)


def wait_for_all(board, prefix: str, machines: int, timeout: float) -> dict[int, Any]:
    """Every machine's entry under `prefix` (machine -> value), once all `machines` have published one."""
    deadline = time.monotonic() + timeout
    while True:
        entries = board.with_prefix(prefix)
        if len(entries) >= machines:
            return {int(key[len(prefix):]): value for key, value in entries.items()}
        if time.monotonic() >= deadline:
            missing = sorted(set(range(machines)) - {int(key[len(prefix):]) for key in entries})
            raise AccelkitError(f"machine(s) {', '.join(map(str, missing))} of {machines} did not start within "
                                f"{timeout:g} s", hint="check that the job got all its nodes and that they run "
                                                      "accelkit from the same environment")
        time.sleep(0.2)
