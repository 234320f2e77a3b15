"""Ports of a job's rendezvous: a free one for single-machine jobs, and whether a given one can be listened on."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (the OS picks it). Another process could take it before torchrun binds
    it; that race is the same one `torchrun --standalone` accepts."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_free(port: int) -> bool:
    """True when this machine can listen on `port` (on every address, as torchrun's store does). SO_REUSEADDR, as
    the store sets it, so a port in TIME_WAIT after a previous job counts as free."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True
