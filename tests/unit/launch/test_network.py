"""The interface a machine's ranks talk on, and the preflight's network and shared-storage checks (in one process:
the real ones across network namespaces are in tests/integration/test_slurm_network.py)."""

from __future__ import annotations

import socket
from pathlib import Path

import psutil
import pytest

from accelkit.errors import AccelkitError
from accelkit.launch.cluster.job_board import Board
from accelkit.launch.cluster.network import SOCKET_IFNAME_VARS, choose_socket_interface, is_loopback, route_to
from accelkit.launch.cluster.network_checks import CHECK_PREFIX, MARKER_PREFIX, NetworkChecks, network_identity
from accelkit.launch.ports import free_port


def loopback_interface() -> str:
    return next(name for name, addrs in psutil.net_if_addrs().items()
                if any(addr.family == socket.AF_INET and addr.address == "127.0.0.1" for addr in addrs))


def test_the_route_to_a_loopback_address_is_the_loopback_interface() -> None:
    route = route_to("127.0.0.1")
    assert (route.interface, route.source, route.target) == (loopback_interface(), "127.0.0.1", "127.0.0.1")
    assert route.is_machine_zero and "holds machine 0's address 127.0.0.1" in route.why()
    assert route_to("localhost").target == "127.0.0.1"  # a host name is resolved first


def test_unset_interface_variables_are_set_and_the_line_says_why() -> None:
    environ: dict[str, str] = {}
    line = choose_socket_interface("127.0.0.1", environ)
    lo = loopback_interface()
    assert environ == dict.fromkeys(SOCKET_IFNAME_VARS, lo)
    assert line == (f"accelkit: ranks talk on {lo} (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME, TP_SOCKET_IFNAME): it "
                    "holds machine 0's address 127.0.0.1")


def test_the_users_interface_variables_are_kept() -> None:
    environ = {"GLOO_SOCKET_IFNAME": "ib0"}
    line = choose_socket_interface("127.0.0.1", environ)
    assert environ["GLOO_SOCKET_IFNAME"] == "ib0" and environ["NCCL_SOCKET_IFNAME"] == loopback_interface()
    assert line.endswith("; kept yours: GLOO_SOCKET_IFNAME=ib0")
    every = dict.fromkeys(SOCKET_IFNAME_VARS, "eth9")
    assert choose_socket_interface("127.0.0.1", every).startswith("accelkit: ranks talk on the interfaces you set")
    assert every == dict.fromkeys(SOCKET_IFNAME_VARS, "eth9")


def test_loopback_addresses() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("127.0.1.1") and is_loopback("::1")
    assert not is_loopback("10.77.0.11") and not is_loopback("node-1")


def published(node: str, network: str) -> dict:
    return {"node": node, "network": network, "marker": None, "token": "t"}


def test_a_loopback_machine_zero_is_refused_when_a_node_is_another_machine() -> None:
    checks = NetworkChecks(machine=1, machines=2, node="n2", main_address="127.0.0.1", port=1, shared_dir=None)
    same = {0: published("n1", network_identity()), 1: published("n2", network_identity())}
    checks.check_addresses(same)  # every node on machine 0's own network: a loopback address works
    other = {0: published("n1", network_identity()), 1: published("n2", "another-boot/1")}
    with pytest.raises(AccelkitError) as refused:
        checks.check_addresses(other)
    assert refused.value.message == ("machine 0's address 127.0.0.1 is a loopback address, but node n2 (machine 1) "
                                     "is another machine: it would look for machine 0 on its own loopback")
    assert "MAIN_PROCESS_IP" in refused.value.hint and "nothing was started" in refused.value.hint
    routable = NetworkChecks(machine=1, machines=2, node="n2", main_address="10.77.0.11", port=1, shared_dir=None)
    routable.check_addresses(other)


def test_machine_zero_listens_on_its_port_for_the_check_and_frees_it(tmp_path: Path) -> None:
    port = free_port("")
    board = Board()
    zero = NetworkChecks(machine=0, machines=2, node="n1", main_address="127.0.0.1", port=port, shared_dir=tmp_path)
    one = NetworkChecks(machine=1, machines=2, node="n2", main_address="127.0.0.1", port=port, shared_dir=tmp_path)
    with zero, one:
        assert len(list(tmp_path.glob(f"{MARKER_PREFIX}*"))) == 2
        entries = {0: {"node": "n1", **zero.published()}, 1: {"node": "n2", **one.published()}}
        board.put(f"{CHECK_PREFIX}0", {"node": "n1", "unreachable": None, "unseen": []})
        one.run(board, entries, timeout=5)  # reaches machine 0's port and sees its marker
        assert board.get(f"{CHECK_PREFIX}1") == {"node": "n2", "unreachable": None, "unseen": []}
    assert not list(tmp_path.iterdir())  # the markers are gone
    with socket.socket() as again:  # and machine 0's port is free for torchrun's store
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("", port))


def test_an_unreachable_port_and_an_unshared_folder_are_named(tmp_path: Path) -> None:
    port = free_port("")  # nothing listens: machine 0's check listener is not started here
    here, there = tmp_path / "n1", tmp_path / "n2"
    here.mkdir()
    there.mkdir()
    one = NetworkChecks(machine=1, machines=2, node="n2", main_address="127.0.0.1", port=port, shared_dir=there)
    board = Board()
    board.put(f"{CHECK_PREFIX}0", {"node": "n1", "unreachable": None, "unseen": []})
    entries = {0: {"node": "n1", "network": "x", "marker": f"{MARKER_PREFIX}abc", "token": "abc"},
               1: {"node": "n2", **one.published()}}
    with one, pytest.raises(AccelkitError) as refused:
        one.run(board, entries, timeout=5)
    assert refused.value.message == f"node n2 (machine 1) cannot reach machine 0 at 127.0.0.1:{port}: " \
                                    "Connection refused"
    assert f"open TCP port {port} on machine 0 (n1)" in refused.value.hint

    board = Board()
    board.put(f"{CHECK_PREFIX}0", {"node": "n1", "unreachable": None, "unseen": [1]})
    zero = NetworkChecks(machine=0, machines=2, node="n1", main_address="127.0.0.1", port=free_port(""),
                         shared_dir=here)
    with zero:
        board.put(f"{CHECK_PREFIX}1", {"node": "n2", "unreachable": None, "unseen": [0]})
        with pytest.raises(AccelkitError) as refused:
            zero.run(board, {0: {"node": "n1", **zero.published()},
                             1: {"node": "n2", "network": "x", "marker": f"{MARKER_PREFIX}def", "token": "def"}},
                     timeout=5)
    assert refused.value.message == (f"the working directory {here} is not shared: node n1 (machine 0) does not see "
                                     "the file node n2 (machine 1) wrote there, and this job's checkpoints are "
                                     "sharded across nodes")
    assert not list(here.iterdir()) and not list(there.iterdir())
