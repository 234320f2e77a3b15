"""Test hosts on one machine: N Linux network namespaces on one bridge, each with its own loopback and an `eth0`.

    with NetworkNamespaces(2) as hosts:
        hosts.addresses            # ['10.Y.Z.11', '10.Y.Z.12']: eth0 of each namespace
        hosts.bridge_address       # '10.Y.Z.1': the root namespace's side (a daemon here serves every host)
        subprocess.run(hosts.enter(0, "ip", "-br", "addr"))   # nsenter --net=/var/run/netns/NAME ip -br addr

Each namespace gets a veth pair whose root side is on a bridge and whose other side is renamed `eth0` inside, so
every host has the same interface name (as on a cluster) and `lo` up. No default route: every host and the bridge
share one /24, and with a default route each reverse DNS lookup (c10d makes one per connection) would wait 10 s for a
resolver this machine does not forward to, where a cluster's DNS answers at once. The host name
still resolves to 127.0.0.1 (nothing edits /etc/hosts): a program that advertises "its host name's address" gets a
loopback address, as on Debian's clusters. Commands run inside with `nsenter --net=...`, which changes the network
only: `ip netns exec` also mounts a fresh /sys, without the cgroup mounts slurmd needs. The filesystem stays shared,
like a cluster's home.

Names and the subnet are unique per instance (names carry this process's PID and a counter; the /24 is one no
interface or route of this machine uses, chosen under a lock file), so test runs on one machine do not collide.
`stop()` kills every process left inside the namespaces (by PID, from `ip netns pids`), then removes the namespaces
(their veths go with them) and the bridge, even after a failure halfway through `start()`.
Needs root and iproute2 (`ip`) and util-linux (`nsenter`).
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import itertools
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

NETNS_DIR = Path("/var/run/netns")
LOCK_FILE = Path("/tmp/accelkit-test-netns.lock")  # serialises subnet choice between concurrent test runs
_counter = itertools.count()


def missing_tools() -> list[str]:
    return [tool for tool in ("ip", "nsenter") if shutil.which(tool) is None]


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed: {proc.stderr.strip()}")
    return proc


def _used_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network this machine's root namespace has an address or a route in (and the other test runs'
    bridges, which are in the root namespace too)."""
    used = []
    for line in _ip("-o", "-4", "addr", "show").stdout.splitlines():
        fields = line.split()
        if "inet" in fields:
            used.append(ipaddress.ip_network(fields[fields.index("inet") + 1], strict=False))
    for line in _ip("-4", "route", "show", "table", "all").stdout.splitlines():
        first = line.split()[0] if line.split() else ""
        with contextlib.suppress(ValueError):
            if first not in ("default", "broadcast", "local", "unreachable", "blackhole", "prohibit"):
                used.append(ipaddress.ip_network(first, strict=False))
    return used


def _free_subnet() -> ipaddress.IPv4Network:
    used = _used_networks()
    start = os.getpid() % 200
    for offset in range(200 * 250):
        second, third = 20 + (start + offset // 250) % 200, (offset % 250) + 1
        candidate = ipaddress.ip_network(f"10.{second}.{third}.0/24")
        if not any(candidate.overlaps(net) for net in used):
            return candidate
    raise RuntimeError("no free 10.x.y.0/24 subnet for the test namespaces")


@dataclass
class NetworkNamespaces:
    count: int = 2
    prefix: str = field(default_factory=lambda: f"ak{os.getpid() % 10_000_000}-{next(_counter)}")
    names: list[str] = field(default_factory=list)
    addresses: list[str] = field(default_factory=list)
    bridge_address: str = ""
    subnet: ipaddress.IPv4Network | None = None
    _bridge_made: bool = False

    @property
    def bridge(self) -> str:
        return f"{self.prefix}br"  # interface names: at most 15 characters

    def path(self, index: int) -> Path:
        return NETNS_DIR / self.names[index]

    def enter(self, index: int, *argv: str) -> list[str]:
        """`argv` as run inside namespace `index` (network only; mounts and /sys stay the machine's)."""
        return ["nsenter", f"--net={self.path(index)}", *argv]

    def start(self) -> NetworkNamespaces:
        missing = missing_tools()
        if missing:
            raise RuntimeError(f"the test namespaces need {', '.join(missing)} (iproute2, util-linux) and root")
        try:
            with open(LOCK_FILE, "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                self.subnet = _free_subnet()
                hosts = list(self.subnet.hosts())
                self.bridge_address = str(hosts[0])
                _ip("link", "add", self.bridge, "type", "bridge")
                self._bridge_made = True
                _ip("addr", "add", f"{self.bridge_address}/24", "dev", self.bridge)
                _ip("link", "set", self.bridge, "up")
            for index in range(self.count):
                self._add_host(index, str(hosts[10 + index]))
        except BaseException:
            self.stop()
            raise
        return self

    def _add_host(self, index: int, address: str) -> None:
        name, outside, inside = f"{self.prefix}n{index + 1}", f"{self.prefix}v{index + 1}", f"{self.prefix}p{index + 1}"
        _ip("netns", "add", name)
        self.names.append(name)
        _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        _ip("link", "set", outside, "master", self.bridge)
        _ip("link", "set", outside, "up")
        _ip("link", "set", inside, "netns", name)
        for args in (("link", "set", inside, "name", "eth0"), ("addr", "add", f"{address}/24", "dev", "eth0"),
                     ("link", "set", "eth0", "up"), ("link", "set", "lo", "up")):
            _ip("-n", name, *args)
        self.addresses.append(address)

    def pids(self, index: int) -> list[int]:
        out = _ip("netns", "pids", self.names[index], check=False).stdout
        return [int(pid) for pid in out.split() if pid.isdigit()]

    def kill_all(self, index: int, timeout: float = 10.0) -> None:
        """SIGKILL every process inside namespace `index` (a node's crash), and wait until they are gone."""
        deadline = time.monotonic() + timeout
        while (pids := self.pids(index)) and time.monotonic() < deadline:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)

    def stop(self) -> None:
        for index in range(len(self.names)):
            self.kill_all(index)
        for name in self.names:
            _ip("netns", "del", name, check=False)  # its veth pair goes with it
        self.names.clear()
        self.addresses.clear()
        if self._bridge_made:
            _ip("link", "del", self.bridge, check=False)
            self._bridge_made = False

    def __enter__(self) -> NetworkNamespaces:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
