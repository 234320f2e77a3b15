"""Which network interface a machine's ranks talk on: the one this machine's route to machine 0 goes through.

torch's gloo (and NCCL's and TensorPipe's socket transports) advertise the address of the host name unless told an
interface. Where the host name resolves to a loopback address (Debian's `127.0.1.1 HOST` line, many images'
`127.0.0.1 HOST`), every rank advertises a loopback address and a job across machines fails after a long wait with
`Gloo connectFullMesh failed ... remote=[127.0.0.1]`. So each machine of a multi-machine job asks the kernel which
interface carries its traffic to machine 0's address (a UDP socket's connect() picks the route and source address
without sending anything; psutil names the interface holding that address) and sets GLOO_SOCKET_IFNAME,
NCCL_SOCKET_IFNAME and TP_SOCKET_IFNAME to it, unless the user set them. On machine 0 the route to its own
address goes through `lo`; the interface that holds the address is the one the others reach it on.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
from collections.abc import MutableMapping
from dataclasses import dataclass

from accelkit.errors import AccelkitError

SOCKET_IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME")


@dataclass(frozen=True)
class Route:
    interface: str  # the interface this machine's traffic to machine 0 leaves on
    source: str  # this machine's address on it
    target: str  # machine 0's address (resolved)

    @property
    def is_machine_zero(self) -> bool:
        return self.source == self.target

    def why(self) -> str:
        if self.is_machine_zero:
            return f"it holds machine 0's address {self.target}"
        return f"this machine's route to machine 0 at {self.target} goes through it (from {self.source})"


def resolve(address: str) -> str:
    """Machine 0's IPv4 address (`address` may be a host name)."""
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(address, None, socket.AF_INET, socket.SOCK_STREAM)
    except OSError as exc:
        raise AccelkitError(f"cannot resolve machine 0's address {address!r}: {exc.strerror or exc}",
                            hint="pass machine 0's IP address (--main-process-ip, or MAIN_PROCESS_IP in a SLURM "
                                 "job)") from None
    return str(infos[0][4][0])


def is_loopback(address: str) -> bool:
    with contextlib.suppress(ValueError):
        return ipaddress.ip_address(address).is_loopback
    return False


def _interface_holding(address: str) -> str | None:
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(addr.family == socket.AF_INET and addr.address == address for addr in addrs):
            return name
    return None


def route_to(address: str) -> Route:
    """The interface and source address the kernel uses from here to `address` (nothing is sent)."""
    target = resolve(address)
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect((target, 9))  # UDP: connect() only chooses the route and the source address
        source = probe.getsockname()[0]
    except OSError as exc:
        raise AccelkitError(f"this machine has no route to machine 0's address {target}: {exc.strerror or exc}",
                            hint="check machine 0's address (MAIN_PROCESS_IP / --main-process-ip) and this "
                                 "machine's network (`ip route get ADDRESS`)") from None
    finally:
        probe.close()
    interface = _interface_holding(source)
    if interface is None:
        raise AccelkitError(f"no interface of this machine holds {source}, its address on the route to machine 0 "
                            f"at {target}", hint="set GLOO_SOCKET_IFNAME (and NCCL_SOCKET_IFNAME) to the interface "
                                                 "that reaches machine 0")
    return Route(interface=interface, source=source, target=target)


def choose_socket_interface(address: str, environ: MutableMapping[str, str] | None = None) -> str:
    """Set the socket-interface variables the user left unset to the interface on the route to machine 0, in
    `environ` (os.environ: the ranks inherit it); the line that says what was chosen and why."""
    environ = os.environ if environ is None else environ
    given = {name: environ[name] for name in SOCKET_IFNAME_VARS if environ.get(name)}
    if len(given) == len(SOCKET_IFNAME_VARS):
        return "accelkit: ranks talk on the interfaces you set: " + " ".join(f"{k}={v}" for k, v in given.items())
    route = route_to(address)
    chosen = [name for name in SOCKET_IFNAME_VARS if name not in given]
    for name in chosen:
        environ[name] = route.interface
    line = f"accelkit: ranks talk on {route.interface} ({', '.join(chosen)}): {route.why()}"
    if given:
        line += "; kept yours: " + " ".join(f"{k}={v}" for k, v in given.items())
    return line
