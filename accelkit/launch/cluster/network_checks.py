"""The network and storage checks a job of several machines makes through its job board, before any rank starts.

Each one replaces a failure that would otherwise come minutes or hours later, far from its cause:
- machine 0's address is a loopback address while some node is another machine: every node would wait for a
  rendezvous on its own loopback until torchrun's timeout;
- a node cannot reach machine 0's rendezvous port (a firewall, a wrong address): the same wait;
- the working directory is not shared by every node while the job's checkpoints are sharded (FSDP, DeepSpeed):
  each node would save its shards to its own disk, and resume or `accelkit merge-ckpt` would find a checkpoint in
  pieces.
A node is "another machine" when its network differs: the kernel's boot id and the network namespace, which is
what a loopback address is private to. Each check ends with one line naming the node, the address or folder, and
the fix, on every node alike (each reads the same findings from the board).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import threading
from pathlib import Path
from typing import Any

from accelkit.errors import AccelkitError
from accelkit.launch.cluster.network import is_loopback, resolve

CHECK_PREFIX = "network/"
CLEANED_PREFIX = "network-cleaned/"
CLEANUP_WAIT = 10.0  # seconds a node waits for the others to remove their markers before it refuses the job
CONNECT_TIMEOUT = 10.0  # seconds a node tries machine 0's port (a dropped SYN shows as this wait)
MARKER_PREFIX = ".accelkit-shared-"


def network_identity() -> str:
    """Which machine's network this process is on: the kernel's boot id and the network namespace."""
    boot = ""
    with contextlib.suppress(OSError):
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    namespace = ""
    with contextlib.suppress(OSError):
        namespace = str(os.stat("/proc/self/ns/net").st_ino)
    return f"{boot or socket.gethostname()}/{namespace}"


class _PortListener:
    """Machine 0 listens on the rendezvous port while the other nodes try it; each connection is read until the
    node closes it (the node closes first, so the port is not left in TIME_WAIT on machine 0's side)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind(("", port))
        except OSError:
            self.sock.close()
            raise AccelkitError(f"port {port} is already in use on machine 0",
                                hint="leave the port out when writing the job (accelkit then picks a free one on "
                                     "machine 0), or free it") from None
        self.sock.listen(64)
        self.sock.settimeout(0.5)
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self._serve, name="accelkit-port-check", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            with conn:
                conn.settimeout(CONNECT_TIMEOUT)
                with contextlib.suppress(OSError):
                    while conn.recv(64):
                        pass

    def close(self) -> None:
        self.closed.set()
        self.thread.join(timeout=2)
        self.sock.close()


def _unreachable(address: str, port: int) -> str | None:
    """Why this node cannot connect to address:port, or None when it can."""
    try:
        with socket.create_connection((address, port), timeout=CONNECT_TIMEOUT):
            return None
    except TimeoutError:
        return f"no answer within {CONNECT_TIMEOUT:g} s"
    except OSError as exc:
        return exc.strerror or str(exc)


class NetworkChecks:
    def __init__(self, *, machine: int, machines: int, node: str, main_address: str | None, port: int | None,
                 shared_dir: Path | None) -> None:
        self.machine, self.machines, self.node = machine, machines, node
        self.active = machines > 1 and bool(main_address) and port is not None
        self.main_address = main_address or ""
        self.port = port or 0
        self.shared_dir = shared_dir if self.active else None
        self.token = secrets.token_hex(8)
        self.marker: Path | None = None
        self.listener: _PortListener | None = None

    def __enter__(self) -> NetworkChecks:
        if not self.active:
            return self
        if self.machine == 0:  # up before machine 0 publishes: a node that sees its entry can try the port
            self.listener = _PortListener(self.port)
        if self.shared_dir is not None:
            marker = self.shared_dir / f"{MARKER_PREFIX}{self.token}"
            try:
                marker.write_text(self.token)
            except OSError as exc:
                self.__exit__()
                raise AccelkitError(f"node {self.node} (machine {self.machine}) cannot write in the job's working "
                                    f"directory {self.shared_dir}: {exc.strerror or exc}",
                                    hint="run the job from a directory every node can write (its checkpoints "
                                         "go there); nothing was started") from None
            self.marker = marker
        return self

    def __exit__(self, *exc: object) -> None:
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        if self.marker is not None:
            self.marker.unlink(missing_ok=True)
            self.marker = None

    def published(self) -> dict[str, Any]:
        return {"network": network_identity(), "marker": self.marker.name if self.marker else None,
                "token": self.token}

    def check_addresses(self, published: dict[int, dict[str, Any]]) -> None:
        """A loopback address for machine 0 works only for nodes on machine 0's own network."""
        if not self.active or not is_loopback(resolve(self.main_address)):
            return
        zero = published[0]
        elsewhere = [(machine, entry) for machine, entry in sorted(published.items())
                     if entry.get("network") != zero.get("network")]
        if elsewhere:
            machine, entry = elsewhere[0]
            raise AccelkitError(f"machine 0's address {self.main_address} is a loopback address, but node "
                                f"{entry['node']} (machine {machine}) is another machine: it would look for machine "
                                "0 on its own loopback",
                                hint="give machine 0's address on the network the nodes share (SLURM: NodeAddr in "
                                     "slurm.conf, or export MAIN_PROCESS_IP in the job; elsewhere "
                                     "--main-process-ip); nothing was started")

    def run(self, board, published: dict[int, dict[str, Any]], timeout: float) -> None:
        """Try machine 0's port and the other nodes' markers, publish what was found, and raise on the first
        problem any node found."""
        from accelkit.launch.cluster.job_board import wait_for_all

        if not self.active:
            return
        unreachable = None if self.machine == 0 else _unreachable(self.main_address, self.port)
        unseen = []
        if self.shared_dir is not None:
            for machine, entry in sorted(published.items()):
                if machine == self.machine or not entry.get("marker"):
                    continue
                try:
                    seen = (self.shared_dir / entry["marker"]).read_text()
                except OSError:
                    seen = None
                if seen != entry.get("token"):
                    unseen.append(machine)
        board.put(f"{CHECK_PREFIX}{self.machine}", {"node": self.node, "unreachable": unreachable,
                                                    "unseen": unseen})
        findings = wait_for_all(board, CHECK_PREFIX, self.machines, timeout)
        if any(found["unreachable"] or found["unseen"] for found in findings.values()):
            self._clean_up_together(board)
        for machine, found in sorted(findings.items()):
            if found["unreachable"]:
                raise AccelkitError(
                    f"node {found['node']} (machine {machine}) cannot reach machine 0 at "
                    f"{self.main_address}:{self.port}: {found['unreachable']}",
                    hint=f"open TCP port {self.port} on machine 0 ({published[0]['node']}) to the other nodes "
                         "(firewall), or give machine 0's address on the network they share (MAIN_PROCESS_IP / "
                         "--main-process-ip); nothing was started")
        for machine, found in sorted(findings.items()):
            if found["unseen"]:
                other = found["unseen"][0]
                raise AccelkitError(
                    f"the working directory {self.shared_dir} is not shared: node {found['node']} (machine "
                    f"{machine}) does not see the file node {published[other]['node']} (machine {other}) wrote "
                    "there, and this job's checkpoints are sharded across nodes",
                    hint="run the job from a directory on a filesystem every node mounts (a shared home or "
                         "parallel filesystem), so each checkpoint is whole in one place; nothing was started")

    def _clean_up_together(self, board) -> None:
        """Before any node refuses the job: every node removes its marker and frees machine 0's port, and waits
        (briefly) until all have. The first node to exit with the refusal makes srun end the others, which must
        not find them halfway through their cleanup."""
        from accelkit.launch.cluster.job_board import wait_for_all

        self.__exit__()
        board.put(f"{CLEANED_PREFIX}{self.machine}", True)
        with contextlib.suppress(AccelkitError):  # a node that is gone already cleans up nothing more
            wait_for_all(board, CLEANED_PREFIX, self.machines, CLEANUP_WAIT)
