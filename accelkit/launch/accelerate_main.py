"""`python -m accelkit.launch.accelerate_main ARGS` = `accelerate launch ARGS`, with a useful exit status.

Accelerate's own launch command turns every rank failure into exit status 1 and a long torch.distributed
traceback. This entry point runs exactly the same parser and launch function, then exits with the status of the
rank that failed first (128 + N when it was killed by signal N), printing one line naming it instead: for a signal,
its name and (with the watch probe) the line the rank died at. A machine other than machine 0 says whom it waits
for, and a rendezvous that times out says what to check.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

from accelkit.errors import AccelkitError, report
from accelkit.launch import failures
from accelkit.launch.launch_dir import is_stalled, restore_user_tmpdir
from accelkit.launch.restarts import forget_inherited_attempt
from accelkit.ranks import WATCH_DIR_ENV


def exit_status(returncode: int) -> int:
    """A shell-style exit status: 128 + N for a process killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def _watch_dir() -> Path | None:
    value = os.environ.get(WATCH_DIR_ENV)
    return Path(value) if value else None


def _rdzv_timeout(rdzv_conf: str | None) -> int:
    for item in (rdzv_conf or "").split(","):
        key, _, value = item.partition("=")
        if key.strip() == "timeout" and value.strip().isdigit():
            return int(value)
    return failures.DEFAULT_RENDEZVOUS_TIMEOUT


def _num_machines(args) -> int:
    if getattr(args, "num_machines", None):
        return int(args.num_machines)
    if getattr(args, "config_file", None):
        import yaml

        try:
            config = yaml.safe_load(Path(args.config_file).read_text()) or {}
        except (OSError, yaml.YAMLError):
            return 1
        return int(config.get("num_machines", 1) or 1)
    return 1


class _Rendezvous:
    """Who this machine waits for while the job forms, so it can say so (and what to check when that fails)."""

    def __init__(self, args) -> None:
        self.machines = _num_machines(args)
        self.rank = int(args.machine_rank or 0)
        self.address = args.main_process_ip or "127.0.0.1"
        self.port = int(args.main_process_port or 29500)
        self.timeout = _rdzv_timeout(getattr(args, "rdzv_conf", None))

    def announce(self) -> None:
        if self.machines < 2:
            return
        from accelkit.launch.cluster.network import choose_socket_interface

        # Before torchrun starts: the ranks inherit the interface variables from this process's environment.
        print(choose_socket_interface(self.address), file=sys.stderr, flush=True)
        if self.rank > 0:
            line = failures.waiting_for_machine_zero(self.address, self.port, self.timeout)
        else:
            line = failures.waiting_for_other_machines(self.port, self.machines, self.timeout)
        print(line, file=sys.stderr, flush=True)

    def wait_for_machine_zero(self) -> None:
        """On machines 1..N-1: wait until machine 0's rendezvous port accepts connections, then let torchrun connect.
        torch's own client would wait as long, then print pages of C++ stack frames; this says what to check."""
        import socket
        import time

        if self.machines < 2 or self.rank == 0:
            return
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                with socket.create_connection((self.address, self.port), timeout=5):
                    return
            except socket.gaierror as exc:
                raise AccelkitError(f"cannot resolve machine 0's address {self.address!r}: {exc.strerror}",
                                    hint="pass --main-process-ip with machine 0's IP address or a resolvable "
                                         "host name") from None
            except OSError:
                if time.monotonic() >= deadline:
                    raise self.timed_out() from None
                time.sleep(1.0)

    def timed_out(self) -> AccelkitError:
        if self.rank > 0:
            return failures.machine_zero_unreachable(self.address, self.port, self.timeout, self.rank)
        return failures.other_machines_missing(self.port, self.machines, self.timeout)


FAILURE_FILE_ENV = "ACCELKIT_FAILURE_FILE"  # set by a cluster node's launcher (accelkit.launch.cluster.node)


def _record_first_failure(exc) -> None:
    """Where a cluster node's launcher learns which rank failed first: {"rank", "exitcode"} (< 0: a signal)."""
    import json

    path = os.environ.get(FAILURE_FILE_ENV)
    if not path:
        return
    rank, failure = exc.get_first_failure()
    with contextlib.suppress(OSError):
        Path(path).write_text(json.dumps({"rank": rank, "exitcode": failure.exitcode}))


def _is_rendezvous_timeout(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "timed out" in text or "timeout" in text


def _explained_failure(exc, watch_dir: Path | None) -> AccelkitError | None:
    """The explanation the lowest failed rank left (see accelkit.ranks.bootstrap), if any."""
    from accelkit.ranks import RankFiles, read_rank_error

    if watch_dir is None:
        return None
    # Ranks that exited on their own first: the others may have been stopped (SIGTERM) right after writing theirs.
    failures = sorted(exc.failures.items(), key=lambda item: (item[1].exitcode <= 0, item[0]))
    for _, failure in failures:
        found = read_rank_error(RankFiles.of(watch_dir, failure.pid))
        if found is not None:
            return AccelkitError(found[0], hint=found[1])
    return None


def _first_failure(exc, watch_dir: Path | None):
    """(rank, failure) of the rank that failed first. torchrun orders failures by a timestamp in seconds, so a rank
    that failed because a peer died (gloo's "Connection closed by peer") ties with it; the ranks' own failure
    records (accelkit.ranks.bootstrap) carry the exact time. In order:
    - a rank killed by a signal (the OOM killer's SIGKILL, a segfault), which records nothing: the others' errors
      are consequences (SIGTERM is the launcher's own way to stop the other ranks, never a cause);
    - the rank whose recorded failure is the earliest;
    - a rank that exited with an error by itself (before the ones the launcher stopped)."""
    from accelkit.ranks import read_failures

    recorded = read_failures(watch_dir) if watch_dir is not None else []
    mine = {failure.pid for failure in recorded}
    failures = sorted(exc.failures.items())
    killed = [(rank, failure) for rank, failure in failures
              if failure.exitcode < 0 and failure.exitcode != -signal.SIGTERM and failure.pid not in mine]
    if killed:
        return killed[0]
    by_pid = {failure.pid: (rank, failure) for rank, failure in failures}
    for failure in recorded:
        if failure.pid in by_pid:
            return by_pid[failure.pid]
    exited = [(rank, failure) for rank, failure in failures if failure.exitcode > 0]
    if exited:
        return min(exited, key=lambda item: (item[1].timestamp, item[0]))
    return exc.get_first_failure()


def _recorded_exit_code(pid: int, watch_dir: Path | None) -> int | None:
    """The exit code a rank recorded when it failed by itself. A rank that failed at the same moment as a peer can
    be stopped by the launcher's SIGTERM while it prints its traceback: it failed with its own error, not of the
    signal."""
    from accelkit.ranks import read_failures

    recorded = read_failures(watch_dir) if watch_dir is not None else []
    return next((failure.exit_code for failure in recorded if failure.pid == pid), None)


def _peer_loss(pid: int, watch_dir: Path | None) -> str | None:
    """What a rank that failed only because a peer vanished saw ('Connection closed by peer [ADDR]:PORT'), or None
    when it failed by itself."""
    from accelkit.launch.restarts import is_peer_loss, peer_detail
    from accelkit.ranks import read_failures

    recorded = read_failures(watch_dir) if watch_dir is not None else []
    error = next((failure.error for failure in recorded if failure.pid == pid), None)
    return peer_detail(error) if error and is_peer_loss(error) else None


def _single_process_error(watch_dir: Path | None) -> AccelkitError | None:
    """The explanation the one rank of a single-process launch left, if any."""
    from accelkit.ranks import RankFiles, read_rank_error

    for path in sorted((watch_dir / "ranks").glob("*.error")) if watch_dir is not None else []:
        found = read_rank_error(RankFiles.of(watch_dir, int(path.stem)))
        if found is not None:
            return AccelkitError(found[0], hint=found[1])
    return None


def _single_process_died(signum: int, watch_dir: Path | None) -> int:
    """Accelerate's one-process launcher reports only the status; the rank's pid comes from its watch files."""
    from accelkit.ranks import registered_ranks

    ranks = registered_ranks(watch_dir) if watch_dir is not None else []
    pid = ranks[0].pid if ranks else 0
    lines, error = failures.rank_died(0, pid, signum, watch_dir if ranks else None)
    for line in lines:
        print(line, file=sys.stderr)
    return report(error)


NODE_NAME_ENV = "ACCELKIT_NODE_NAME"  # set by a cluster node's launcher (accelkit.launch.cluster.node)
RUN_ID_ENV = "ACCELKIT_RUN_ID"  # the rendezvous run id every machine of one job shares (default: from the port)


def _say_restarts(args, rendezvous: _Rendezvous, watch_dir: Path | None) -> None:
    """Under --max-restarts: a line per restart (accelkit.launch.restarts), through a rendezvous that can form
    again (c10d) with a run id unique to the job."""
    restarts = int(getattr(args, "max_restarts", 0) or 0)
    if restarts <= 0:
        return
    # torchrun restarts a group only through a rendezvous that can form again: the static one, which Accelerate
    # uses, hands the restarted ranks the old ranks' addresses (gloo: "connectFullMesh failed"); c10d forms anew.
    if getattr(args, "rdzv_backend", None) in (None, "static"):
        args.rdzv_backend = "c10d"
        if rendezvous.machines < 2:
            args.rdzv_endpoint = f"127.0.0.1:{rendezvous.port}"
    board = None
    if rendezvous.machines > 1:
        from accelkit.launch.cluster import job_board

        args.rdzv_id = os.environ.get(RUN_ID_ENV) or os.environ.get("SLURM_JOB_ID") or \
            f"accelkit-{rendezvous.address}-{rendezvous.port}"
        # Machine 0 hosts the rendezvous store: torch guesses it from the host name, which on many clusters
        # resolves to a loopback address, never to the address the other machines use.
        # Each agent's own address, which the restarted ranks use to reach the store of the attempt: torch would
        # take it from the host name (a loopback address again) where the user has not given one.
        if not getattr(args, "local_addr", None):
            from accelkit.launch.cluster.heartbeat import own_address

            args.local_addr = own_address(rendezvous.address, rendezvous.port)
        conf = getattr(args, "rdzv_conf", None) or ""
        if "is_host=" not in conf:
            args.rdzv_conf = ",".join(filter(None, [conf, f"is_host={int(rendezvous.rank == 0)}"]))
        board = job_board.connect(timeout=5.0)
    from accelkit.launch.restarts import RestartReporter

    RestartReporter(watch_dir, restarts, machine=rendezvous.rank, machines=rendezvous.machines,
                    node=os.environ.get(NODE_NAME_ENV), board=board).install()


def main(argv: list[str] | None = None) -> int:
    from accelerate.commands.launch import launch_command, launch_command_parser
    from torch.distributed import DistNetworkError, DistStoreError
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousTimeoutError

    restore_user_tmpdir(os.environ)  # the ranks get the user's TMPDIR back (see accelkit.launch.launch_dir)
    forget_inherited_attempt(os.environ)
    # torchrun logs every failure and every rank it stops ("failed (exitcode: 1) local_rank: 0 ..."); this module
    # reports the failure itself, in one line.
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").setLevel(logging.CRITICAL)
    watch_dir = _watch_dir()
    args = launch_command_parser().parse_args(sys.argv[1:] if argv is None else argv)
    rendezvous = _Rendezvous(args)
    _say_restarts(args, rendezvous, watch_dir)
    try:
        rendezvous.announce()
        rendezvous.wait_for_machine_zero()
        launch_command(args)
    except ChildFailedError as exc:
        _record_first_failure(exc)
        if is_stalled(watch_dir):  # the supervisor stopped a stalled job and has said why
            return 1
        explained = _explained_failure(exc, watch_dir)
        if explained is not None:  # a known failure the rank described in one line (accelkit.ranks.explain)
            return report(explained)
        rank, failure = _first_failure(exc, watch_dir)
        exit_code = _recorded_exit_code(failure.pid, watch_dir) or failure.exitcode
        if exit_code < 0:
            lines, error = failures.rank_died(rank, failure.pid, -exit_code, watch_dir)
            for line in lines:
                print(line, file=sys.stderr)
            return report(error)
        lost_peer = _peer_loss(failure.pid, watch_dir)
        if lost_peer is not None:  # a consequence: never reported as the rank that failed first
            print(f"accelkit: rank {rank} (pid {failure.pid}) lost a peer ({lost_peer}), exit code {exit_code}: "
                  "the rank at that address failed or its machine went away first; the launcher stopped the other "
                  "ranks.", file=sys.stderr, flush=True)
            return exit_status(exit_code) or 1
        print(f"accelkit: rank {rank} (pid {failure.pid}) failed first, exit code {exit_code}; "
              "the launcher stopped the other ranks.", file=sys.stderr, flush=True)
        return exit_status(exit_code) or 1
    except SignalException as exc:
        if watch_dir is None:  # under `accelkit launch` the supervisor says it (once, after every process is gone)
            print(f"accelkit: launcher received signal {int(exc.sigval)}; ranks stopped.", file=sys.stderr,
                  flush=True)
        return 128 + int(exc.sigval)
    except (DistNetworkError, DistStoreError, RendezvousTimeoutError) as exc:
        if not _is_rendezvous_timeout(exc):
            raise
        return report(rendezvous.timed_out())
    except subprocess.CalledProcessError as exc:  # single-process and pdsh-style launchers
        explained = _single_process_error(watch_dir)
        if explained is not None:
            return report(explained)
        if exc.returncode < 0 and not is_stalled(watch_dir):
            return _single_process_died(-exc.returncode, watch_dir)
        return exit_status(exc.returncode) or 1
    except AccelkitError as error:
        return report(error)
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
