"""One node of a cluster job: the same supervised launch `accelkit launch --machine-rank R` runs, plus the job board.

    python -m accelkit.launch.node --machine-rank R --main-process-ip A --main-process-port P [--node-name N]

reads the job's LaunchRequest (JSON, from $ACCELKIT_LAUNCH_REQUEST, which the job script sets), gives it this
node's rank, machine 0's address and the rendezvous port, and runs it under accelkit.launch.supervisor's
Supervisor: this node's ranks are supervised and watched for stalls exactly as in a single-machine launch. Through
the job board (accelkit.launch.job_board), when the job has one, the node
- checks before any rank starts that every node runs the same thing (accelkit.launch.cluster_preflight);
- reports its failure (rank, status, signal, node) so the job ends with the first failing rank's status;
- passes a save request (a preemption's warning) on to its ranks, which save a checkpoint and end;
- on a stall, waits a few seconds for the other nodes' watchdogs so every node prints its ranks' stacks.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from accelkit.errors import AccelkitError, debug_enabled, report
from accelkit.launch import job_board
from accelkit.launch.failures import signal_name
from accelkit.launch.request import LaunchRequest

REQUEST_ENV = "ACCELKIT_LAUNCH_REQUEST"
SAVE_REPEAT = 1.0  # seconds between save requests to the ranks, until they end
STALL_PREFIX = "stall/"
STALL_PEER_WAIT = 10.0  # seconds a stalled node waits for the other nodes' stacks before it stops its ranks


def node_request(request: LaunchRequest, machine_rank: int, main_process_ip: str, port: int) -> LaunchRequest:
    """The cluster request as this machine runs it: the per-machine values filled in, as `--machine-rank` does."""
    options = replace(request.options, machine_rank=machine_rank, main_process_ip=main_process_ip,
                      main_process_port=port)
    return replace(request, options=options, for_cluster=False)


def describe_failure(record: dict, stalls: dict[str, dict] | None = None) -> str:
    """One line for the job's log: which rank on which node ended the job, and how. `stalls`: what each node's
    watchdog found (the board's stall entries); the node whose ranks are not all waiting in a collective is the
    one that stopped progressing."""
    where = f"on node {record['node']} (machine {record['machine']})"
    if record.get("stalled"):
        found = sorted((stalls or {}).values(), key=lambda entry: (entry["all_waiting"], entry["machine"]))
        if found:
            first = found[0]
            return (f"the job stalled (exit {record['status']}): on node {first['node']} (machine "
                    f"{first['machine']}), {first['where']}")
        return f"the job stalled: the watchdog {where} stopped it (exit {record['status']})"
    rank = record.get("rank")
    who = f"rank {rank} {where}" if rank is not None else f"node {record['node']} (machine {record['machine']})"
    if record.get("signal"):
        return f"the job failed: {who} was killed by {record['signal']} (exit {record['status']})"
    return f"the job failed: {who} exited with status {record['status']}"


def _failure_record(status: int, failure_file: Path, node: str, machine: int, stalled: bool) -> dict:
    record: dict = {"node": node, "machine": machine, "status": status, "stalled": stalled, "rank": None,
                    "signal": None}
    try:
        first = json.loads(failure_file.read_text())
    except (OSError, ValueError):
        return record
    record["rank"] = first.get("rank")
    if int(first.get("exitcode", 0)) < 0:
        record["signal"] = signal_name(-int(first["exitcode"]))
    return record


def _wait_for_peer_stacks(supervisor, board, machine: int, machines: int, node: str) -> None:
    """Wrap the supervisor's stall handler: announce the stall, give the other nodes' watchdogs time to print
    their ranks' stacks too, then stop this node's ranks."""
    stop = supervisor._stop_stalled_job

    def stop_after_peers(infos, stall, stacks, timeout):
        from accelkit.launch.stacks import diagnosis

        where, _ = diagnosis(stacks)
        board.put(f"{STALL_PREFIX}{machine}", {"node": node, "machine": machine, "where": where,
                                               "all_waiting": all(stack.wait is not None for stack in stacks)})
        deadline = time.monotonic() + STALL_PEER_WAIT
        while len(board.with_prefix(STALL_PREFIX)) < machines and time.monotonic() < deadline:
            time.sleep(0.2)
        stop(infos, stall, stacks, timeout)

    supervisor._stop_stalled_job = stop_after_peers


def _forward_save_signal(supervisor, board) -> None:
    """A save request (SIGUSR1 to this launcher, or the job's "save" entry on the board, which the batch step sets
    when SLURM warns it of a preemption or the time limit) becomes SIGUSR1 to this node's ranks, which save a
    checkpoint at their next step and end (see the templates' Preemption). Only the ranks get the signal: to
    torchrun's agent, SIGUSR1 would be fatal."""
    import threading

    from accelkit.launch.rank_monitor import RankMonitor

    def to_ranks() -> None:
        if supervisor.watch is None:
            return
        for info in RankMonitor(supervisor.watch.watch_dir).alive_ranks():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(info.pid, signal.SIGUSR1)

    signal.signal(signal.SIGUSR1, lambda signum, frame: to_ranks())
    if board is None:
        return

    def watch_board() -> None:
        with contextlib.suppress(Exception):  # the board goes away with the job
            while board.get(job_board.SAVE_REQUEST) is None:
                time.sleep(0.5)
            # Repeated until the ranks end: a rank that got it before its script's handler existed ignored it.
            while True:
                to_ranks()
                time.sleep(SAVE_REPEAT)

    threading.Thread(target=watch_board, name="accelkit-save-request", daemon=True).start()


def run_node(request: LaunchRequest, *, machine_rank: int, main_process_ip: str, port: int, node: str,
             stall_timeout: float | None) -> int:
    from accelkit.launch.accelerate_main import FAILURE_FILE_ENV
    from accelkit.launch.preflight import check_syntax
    from accelkit.launch.supervisor import supervised

    request = node_request(request, machine_rank, main_process_ip, port)
    machines = request.options.num_machines or 1
    board = job_board.connect()
    check_syntax(request.target)
    if board is not None:
        from accelkit.launch.cluster_preflight import check_nodes

        check_nodes(board, request, machine=machine_rank, machines=machines, node=node)
    fd, failure_path = tempfile.mkstemp(prefix="accelkit-node-failure-")
    os.close(fd)
    failure_file = Path(failure_path)
    try:
        env = {**os.environ, FAILURE_FILE_ENV: str(failure_file)}
        env.pop(REQUEST_ENV, None)
        with supervised(request, env=env, stall_timeout=stall_timeout) as supervisor:
            _forward_save_signal(supervisor, board)
            if board is not None and machines > 1:
                _wait_for_peer_stacks(supervisor, board, machine_rank, machines, node)
            status = supervisor.run()
        # A node stopped from outside (srun ending the job after another node failed, scancel) is not the cause.
        if status != 0 and board is not None and not supervisor.signals:
            record = _failure_record(status, failure_file, node, machine_rank, supervisor.stalled)
            board.put_first(job_board.FIRST_FAILURE, record)
        return status
    finally:
        failure_file.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m accelkit.launch.node")
    parser.add_argument("--machine-rank", type=int, required=True)
    parser.add_argument("--main-process-ip", required=True)
    parser.add_argument("--main-process-port", type=int, required=True)
    parser.add_argument("--node-name", default=None)
    parser.add_argument("--stall-timeout", type=float, default=None)
    args = parser.parse_args(argv)
    text = os.environ.get(REQUEST_ENV)
    if not text:
        return report(AccelkitError(f"${REQUEST_ENV} is not set: this runs one node of a job that accelkit wrote",
                                    hint="submit the job file accelkit wrote (e.g. `sbatch job.sbatch`)"))
    node = args.node_name or socket.gethostname()
    try:
        return run_node(LaunchRequest.from_json(text), machine_rank=args.machine_rank,
                        main_process_ip=args.main_process_ip, port=args.main_process_port, node=node,
                        stall_timeout=args.stall_timeout)
    except AccelkitError as error:
        if debug_enabled():
            raise
        board = job_board.connect()
        if board is not None:
            board.put_first(job_board.FIRST_FAILURE, {"node": node, "machine": args.machine_rank,
                                                      "status": error.exit_code, "stalled": False, "rank": None,
                                                      "signal": None, "message": error.message})
        print(f"accelkit: node {node} (machine {args.machine_rank}):", file=sys.stderr, flush=True)
        return report(error)


if __name__ == "__main__":
    sys.exit(main())
