"""Restarts said out loud. Under `--max-restarts N` torchrun's agent restarts the whole group when a rank dies, and
under `--requeue` SLURM starts the job again; both resume from the latest checkpoint, and neither says so.

- Launcher side (the process that runs torchrun's agent, accelkit.launch.accelerate_main): `RestartReporter`, a
  logging handler on the agent's own records (a failed worker: exit code, local rank, pid; a group restart: the
  attempts left), prints one line per restart naming the rank, how it failed (its signal, or its status and its own
  error line) and the attempt, and appends it to `attempts.jsonl` in the watch folder. In a cluster job the rank's
  node publishes it on the job board, so a machine whose ranks only lost their peer names the real cause.
- Supervisor side: `ResumeAnnouncer` prints, once per attempt, the checkpoint the ranks resumed from (recorded by
  the watch probe, accelkit.ranks.resume_record); `summary_lines` lists the attempts when the run ends.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sys
import time
from pathlib import Path

from accelkit.launch.failures import signal_name
from accelkit.ranks import ATTEMPT_ENV, RENDEZVOUS_ROUND_ENV

ATTEMPTS_FILE = "attempts.jsonl"
RESTART_PREFIX = "restart/"  # job board: restart/<attempt> -> the failure that caused it, from the node that saw it
BOARD_CAUSE_WAIT = 3.0  # seconds a node whose ranks only lost a peer waits for the node that saw the cause
# What gloo (and the TCP store) say when the process at the other end of a connection vanished: a rank failing
# with one of these failed because of another rank, not by itself.
PEER_LOSS_MARKERS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Connection refused",
                     "recvBytes", "sendBytes")
_PEER_ADDRESS = re.compile(r"\[([0-9a-fA-F.:]+)\]:(\d+)")  # gloo's "[10.77.0.12]:45491" (not its "[pair.cc:553]")
_AGENT_LOGGER = "torch.distributed.elastic.agent.server.api"
_PROCESSES_LOGGER = "torch.distributed.elastic.multiprocessing.api"
_RENDEZVOUS_LOGGER = "torch.distributed.elastic.rendezvous.dynamic_rendezvous"
_JOINED_ROUND = re.compile(r"has joined round (\d+) of the rendezvous")
MEMBERSHIP_CAUSE = "another machine's ranks restarted"


def forget_inherited_attempt(environ: dict[str, str] | os._Environ) -> None:
    """Before a launch: ACCELKIT_ATTEMPT and ACCELKIT_RENDEZVOUS_ROUND are set by this launch's own reporter for the
    ranks it starts. Inherited ones (an enclosing run's ranks, a shell that exported them) would number its attempts
    and key its store wrongly."""
    for name in (ATTEMPT_ENV, RENDEZVOUS_ROUND_ENV):
        environ.pop(name, None)


def is_peer_loss(error: str | None) -> bool:
    return bool(error) and any(marker in error for marker in PEER_LOSS_MARKERS)


def peer_address(error: str) -> str | None:
    """The address in a gloo error ('10.77.0.12' from '[10.77.0.12]:45491'), if any."""
    found = _PEER_ADDRESS.search(error)
    return found.group(1) if found else None


def peer_detail(error: str) -> str:
    """The part of a gloo error worth quoting: 'Connection closed by peer [10.77.0.12]:45491'."""
    marker = next((marker for marker in PEER_LOSS_MARKERS if marker in error), None)
    if marker is None:
        return error[:120]
    address = _PEER_ADDRESS.search(error)
    return f"{marker} [{address.group(1)}]:{address.group(2)}" if address else marker


def rank_failure_text(watch_dir: Path | None, pid: int, local_rank: int, exitcode: int) -> tuple[str, bool]:
    """("rank 1 (pid 123) was killed by SIGKILL", peer_loss) for a rank torchrun saw fail."""
    from accelkit.ranks import read_failures, registered_ranks

    rank = next((info.rank for info in registered_ranks(watch_dir) if info.pid == pid), None) if watch_dir else None
    who = f"rank {rank} (pid {pid})" if rank is not None else f"local rank {local_rank} (pid {pid})"
    if exitcode < 0:
        return f"{who} was killed by {signal_name(-exitcode)}", False
    recorded = next((f for f in read_failures(watch_dir) if f.pid == pid), None) if watch_dir else None
    if recorded is not None and is_peer_loss(recorded.error):
        return f"{who} lost a peer ({peer_detail(recorded.error)})", True
    said = f": {recorded.error.splitlines()[0][:160]}" if recorded is not None and recorded.error else ""
    return f"{who} exited with status {exitcode}{said}", False


class RestartReporter(logging.Handler):
    """Listens to torchrun's agent in this process; see the module's docstring.

    Two numbers, two jobs. The store keys the restarted ranks meet under are the c10d rendezvous round's
    (accelkit.ranks.restart_store): every machine's agent joins the same round, whether its own rank failed (a
    restart torchrun counts) or another machine's did (a membership change, which torchrun does not count), so the
    keys agree across machines. The attempt said to people is 1 + the group restarts this agent made, either kind,
    so every machine says the same number. Both variables are this reporter's alone: the launcher drops any it
    inherited (`forget_inherited_attempt`), so a launch started from inside another run's environment counts from
    1."""

    def __init__(self, watch_dir: Path | None, max_restarts: int, *, machine: int = 0, machines: int = 1,
                 node: str | None = None, board=None, stream=None) -> None:
        super().__init__(level=logging.INFO)
        self.watch_dir = watch_dir
        self.max_restarts = max_restarts
        self.machine, self.machines, self.node = machine, machines, node
        self.board = board
        self.stream = stream
        self.failure: tuple[str, bool] | None = None  # the last failed worker torchrun logged
        self.round = 0  # the rendezvous round this agent's ranks run in
        self.restarts = 0  # group restarts this agent made: its own failures and other machines'

    def install(self) -> None:
        import importlib

        for name in (_AGENT_LOGGER, _PROCESSES_LOGGER, _RENDEZVOUS_LOGGER):
            importlib.import_module(name)  # torch sets its loggers' levels when it imports them: import first
            logger = logging.getLogger(name)
            logger.addHandler(self)
            if logger.getEffectiveLevel() > logging.INFO:
                logger.setLevel(logging.INFO)
            logger.propagate = False  # torchrun's own lines about it are replaced by the one below

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):  # reporting must never break the agent
            message, args = str(record.msg), record.args or ()
            if record.name == _RENDEZVOUS_LOGGER:
                self._rendezvous_record(record)
            elif message.startswith("failed (exitcode") and len(args) >= 3:
                self.failure = rank_failure_text(self.watch_dir, int(args[2]), int(args[1]), int(args[0]))
            elif "attempts left" in message and len(args) >= 4:
                self._restarting(remaining=int(args[2]), total=int(args[3]))
            elif "new nodes from group_rank" in message:
                self._restarting_with_the_others()

    def _rendezvous_record(self, record: logging.LogRecord) -> None:
        joined = _JOINED_ROUND.search(record.getMessage())
        if joined is not None:  # logged before the agent starts the round's ranks: they inherit the round
            self.round = int(joined.group(1))
            os.environ[RENDEZVOUS_ROUND_ENV] = str(self.round)
            os.environ[ATTEMPT_ENV] = str(self._attempt())
        elif record.levelno >= logging.WARNING:  # torchrun's own warnings still reach its handlers
            logging.getLogger(_RENDEZVOUS_LOGGER.rsplit(".", 1)[0]).handle(record)

    def _attempt(self) -> int:
        """The attempt running now (1 for the first), or about to start once a restart is counted."""
        return self.restarts + 1

    def _restarting(self, remaining: int, total: int) -> None:
        self.restarts += 1
        attempt = self._attempt()  # the attempt about to start
        os.environ[ATTEMPT_ENV] = str(attempt)
        what, peer_loss = self.failure or ("a rank failed", False)
        self.failure = None
        where = f" on node {self.node} (machine {self.machine})" if self.machines > 1 else ""
        cause = f"{what}{where}"
        if self.board is not None:
            record = {"cause": cause, "machine": self.machine, "node": self.node}
            if not peer_loss:
                with contextlib.suppress(Exception):
                    self.board.put_first(f"{RESTART_PREFIX}{attempt}", record)
            else:
                cause = self._cause_from_board(attempt) or cause
        # Whether the script resumes is the script's own doing: the supervisor says so when it sees the load.
        self._say(f"{cause}; restarting every rank: attempt {attempt} of {total + 1} (--max-restarts {total})")
        self._append({"attempt": attempt, "cause": cause, "time": time.time()})

    def _restarting_with_the_others(self) -> None:
        """Another machine's agent restarted its ranks and waits in the next round: this one follows."""
        self.restarts += 1
        attempt = self._attempt()
        os.environ[ATTEMPT_ENV] = str(attempt)
        cause = (self._cause_from_board(attempt) if self.board is not None else None) or MEMBERSHIP_CAUSE
        self._say(f"{cause}; restarting this machine's ranks with the others: attempt {attempt}")
        self._append({"attempt": attempt, "cause": cause, "time": time.time()})

    def _cause_from_board(self, attempt: int) -> str | None:
        deadline = time.monotonic() + BOARD_CAUSE_WAIT
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                found = self.board.get(f"{RESTART_PREFIX}{attempt}")
                if found is not None:
                    return str(found["cause"])
            time.sleep(0.2)
        return None

    def _say(self, text: str) -> None:
        print(f"accelkit: {text}", file=self.stream or sys.stderr, flush=True)

    def _append(self, entry: dict) -> None:
        if self.watch_dir is None:
            return
        with contextlib.suppress(OSError), open(Path(self.watch_dir) / ATTEMPTS_FILE, "a") as handle:
            handle.write(json.dumps(entry) + "\n")


def read_attempts(watch_dir: Path) -> list[dict]:
    entries = []
    with contextlib.suppress(OSError):
        for line in (Path(watch_dir) / ATTEMPTS_FILE).read_text().splitlines():
            with contextlib.suppress(ValueError):
                entries.append(json.loads(line))
    return entries


def _resumed_text(record: dict) -> str:
    step = f" (step {record['step']})" if record.get("step") is not None else ""
    return f"{record.get('path') or 'the automatic checkpoint folder'}{step}"


class ResumeAnnouncer:
    """Prints, once per attempt of a restarted or requeued run, the checkpoint its ranks resumed from."""

    def __init__(self, watch_dir: Path) -> None:
        self.watch_dir = Path(watch_dir)
        self.said: set[tuple[int, int]] = set()
        self.resumed: dict[tuple[int, int], dict] = {}

    def poll(self) -> list[str]:
        from accelkit.ranks import read_resumed

        lines = []
        for record in read_resumed(self.watch_dir).values():
            key = (int(record.get("requeue", 0)), int(record.get("attempt", 1)))
            self.resumed.setdefault(key, record)
            if key in self.said or key == (0, 1):
                continue
            self.said.add(key)
            requeue = f"requeue {key[0]} of the SLURM job, " if key[0] else ""
            lines.append(f"{requeue}attempt {key[1]}: the ranks resumed from {_resumed_text(record)}")
        return lines

    def summary_lines(self, status: int) -> list[str]:
        """The run's attempts, one line each, when there was more than one (or it was a requeued job)."""
        self.poll()
        attempts = read_attempts(self.watch_dir)
        requeue = max((key[0] for key in self.resumed), default=0)
        if not attempts and not requeue:
            return []
        ended = "finished" if status == 0 else f"ended with status {status}"
        head = f"this run (requeue {requeue} of the SLURM job)" if requeue else "this run"
        started = sorted({1} | {int(entry["attempt"]) for entry in attempts} |
                         {key[1] for key in self.resumed if key[0] == requeue})
        lines = [f"{head} took {len(started)} attempt(s):"]
        ends = {int(entry["attempt"]): entry["cause"] for entry in attempts}  # the cause that started the next
        for index, attempt in enumerate(started):
            resumed = self.resumed.get((requeue, attempt))
            if resumed:
                start = f"resumed from {_resumed_text(resumed)}"
            else:  # a later attempt (or a requeued run) that loaded nothing trained from where it started
                start = "started" if attempt == 1 and not requeue else "started without loading a checkpoint"
            following = started[index + 1] if index + 1 < len(started) else None
            end = f"ended: {ends[following]}" if following in ends else ended
            lines.append(f"  attempt {attempt}: {start}; {end}")
        return lines
