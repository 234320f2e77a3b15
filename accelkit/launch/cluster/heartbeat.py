"""A lost machine, named. Every node of a cluster job beats on the job board (accelkit.launch.cluster.job_board) once a
second: its machine, node name, address and the step its ranks reached. Machine 0 watches the beats; when a machine
that was beating falls silent for the lost timeout (its processes gone: a node crash; or unreachable: a partition,
a frozen host), machine 0 records it as the job's first failure, says so in a few lines, and stops its own ranks,
which would otherwise wait in a collective for as long as the process group's timeout (gloo: 30 minutes; NCCL: 10).

The beat is read by machine 0 against its own clock (a beat counter that stopped moving), so the nodes' clocks
never matter. A node whose ranks failed only because a peer vanished (gloo: "Connection closed by peer") is a
consequence: it waits for the board to name the cause (`wait_for_cause`) before it names itself.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from accelkit.launch.cluster import job_board

HEARTBEAT_PREFIX = "heartbeat/"
BEAT_INTERVAL = 1.0  # seconds between a node's beats
DEFAULT_LOST_TIMEOUT = 20.0  # seconds of silence after which machine 0 declares a machine lost
SUSPECT_TIMEOUT = 3.0  # the same for a machine whose address machine 0's ranks just lost a connection to
LOST_EXIT_STATUS = 1  # the job's status when a machine was lost (its ranks' own status never came back)


def own_address(main_process_ip: str, port: int) -> str:
    """This node's address on its route to machine 0 (a UDP socket's source address: nothing is sent)."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((main_process_ip, port or 9))
        return str(probe.getsockname()[0])
    return socket.gethostname()


def ranks_step(watch_dir: Path | None) -> int | None:
    """The step this node's ranks reached: the checkpoint step they resumed from plus the optimizer steps they took
    since (the watch probe counts them), the most advanced rank's; None before any rank registered."""
    if watch_dir is None:
        return None
    from accelkit.ranks import RankFiles, read_resumed, read_steps, registered_ranks

    resumed = read_resumed(watch_dir)
    steps = [(resumed.get(info.pid, {}).get("step") or 0) + read_steps(RankFiles.of(watch_dir, info.pid))
             for info in registered_ranks(watch_dir)]
    return max(steps) if steps else None


class Heartbeat:
    """This node's beat, from a daemon thread, until `stop()` (or the board goes away)."""

    def __init__(self, board, *, machine: int, node: str, address: str,
                 watch_dir: Callable[[], Path | None]) -> None:
        self.board, self.machine, self.node, self.address = board, machine, node, address
        self.watch_dir = watch_dir
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="accelkit-heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _beat(self) -> None:
        beat = 0
        while not self._stop.is_set():
            beat += 1
            with contextlib.suppress(Exception):  # unreachable board: machine 0 sees the silence, not this node
                self.board.put(f"{HEARTBEAT_PREFIX}{self.machine}",
                               {"beat": beat, "machine": self.machine, "node": self.node, "address": self.address,
                                "step": ranks_step(self.watch_dir())})
            self._stop.wait(BEAT_INTERVAL)


@dataclass
class _Seen:
    beat: int
    since: float  # monotonic time (machine 0's clock) when this beat was first seen
    entry: dict


class LossWatcher:
    """On machine 0: declares a machine lost after `timeout` seconds without a new beat, once per job, and calls
    `on_lost(record)` (the job's first-failure record, see `describe_loss`)."""

    def __init__(self, board, *, machines: int, timeout: float, on_lost: Callable[[dict], None],
                 own_machine: int = 0) -> None:
        self.board, self.machines, self.timeout = board, machines, timeout
        self.on_lost, self.own_machine = on_lost, own_machine
        self.seen: dict[int, _Seen] = {}
        self.lost: dict | None = None
        self.finished: set[int] = set()
        # Addresses this machine's ranks lost their connection to (gloo named them): the machine there is judged
        # after SUSPECT_TIMEOUT seconds of silence, not the whole timeout, since its silence has a witness.
        self.suspects: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="accelkit-loss-watcher", daemon=True)

    def start(self) -> LossWatcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def check(self, now: float) -> dict | None:
        """One look at the beats; the lost machine's record, the first time one is found."""
        if self.lost is not None:
            return None
        for entry in self.board.with_prefix(HEARTBEAT_PREFIX).values():
            machine = int(entry["machine"])
            if entry.get("done"):  # ended (done or failed by itself): silent from now on, not lost
                self.seen.pop(machine, None)
                self.finished.add(machine)
                continue
            seen = self.seen.get(machine)
            if seen is None or seen.beat != entry["beat"]:
                self.seen[machine] = _Seen(beat=int(entry["beat"]), since=now, entry=dict(entry))
        for machine, seen in sorted(self.seen.items()):
            timeout = min(self.timeout, SUSPECT_TIMEOUT) if seen.entry.get("address") in self.suspects else \
                self.timeout
            if machine == self.own_machine or machine in self.finished or now - seen.since < timeout:
                continue
            self.lost = {**seen.entry, "lost": True, "silent": round(now - seen.since), "status": LOST_EXIT_STATUS,
                         "rank": None, "signal": None, "stalled": False}
            return self.lost
        return None

    def _watch(self) -> None:
        while not self._stop.wait(BEAT_INTERVAL / 2):
            try:
                found = self.check(time.monotonic())
            except Exception:  # the board is gone: the job is over
                return
            if found is not None:
                recorded = self.board.put_first(job_board.FIRST_FAILURE, found)
                if recorded.get("lost") and recorded.get("machine") == found["machine"]:
                    self.on_lost(found)
                return


def describe_loss(record: dict) -> str:
    step = f"; its ranks were last at step {record['step']}" if record.get("step") is not None else \
        "; its ranks had not started"
    return (f"machine {record['machine']} (node {record['node']}, address {record['address']}) was lost: no "
            f"heartbeat for {record['silent']} s (its processes are gone or it is unreachable){step}")


def wait_for_cause(board, timeout: float) -> dict | None:
    """A node whose ranks only lost a peer: the job's first failure once some node (or machine 0's loss watcher)
    has named it, within `timeout` seconds; None if none did."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            found = board.get(job_board.FIRST_FAILURE)
            if found is not None:
                return found
        time.sleep(0.2)
    return None


def say(text: str) -> None:
    print(f"accelkit: {text}", file=sys.stderr, flush=True)


class NodeBeats:
    """What one node of a multi-machine job runs around its supervised ranks (accelkit.launch.cluster.node): its
    beat, and on machine 0 the loss watcher, which stops this node's ranks when another machine is lost."""

    def __init__(self, board, supervisor, *, machine: int, machines: int, node: str, main_process_ip: str,
                 port: int, timeout: float | None) -> None:
        self.board = board
        self.timeout = DEFAULT_LOST_TIMEOUT if timeout is None else timeout
        watch = supervisor.watch
        self.beat = Heartbeat(board, machine=machine, node=node, address=own_address(main_process_ip, port),
                              watch_dir=lambda: watch.watch_dir if watch is not None else None).start()
        self.watcher = None
        if machine == 0 and machines > 1 and self.timeout > 0:
            def on_lost(record: dict) -> None:
                say(describe_loss(record))
                say("stopping this machine's ranks: they would wait for it in their next collective")
                supervisor.stop()

            self.watcher = LossWatcher(board, machines=machines, timeout=self.timeout, on_lost=on_lost).start()

    def should_record(self, failure: dict, rank_errors: list[str]) -> bool:
        """After this node's ranks failed: False when they failed only because a peer vanished and another node
        (or the loss watcher) named the cause in time; the node then does not name itself."""
        from accelkit.launch.restarts import is_peer_loss, peer_address

        if failure.get("signal") or not rank_errors or not all(is_peer_loss(error) for error in rank_errors):
            return True
        if self.watcher is not None:
            self.watcher.suspects.update(peer_address(error) for error in rank_errors)
        return wait_for_cause(self.board, self.timeout + 3 * BEAT_INTERVAL) is None

    def finish(self) -> None:
        """This node is done (whatever its status): its silence from now on is not a loss."""
        self.beat.stop()
        if self.watcher is not None:
            self.watcher.stop()
        with contextlib.suppress(Exception):
            entry = self.board.get(f"{HEARTBEAT_PREFIX}{self.beat.machine}") or {}
            self.board.put(f"{HEARTBEAT_PREFIX}{self.beat.machine}", {**entry, "machine": self.beat.machine,
                                                                      "beat": -1, "done": True})
