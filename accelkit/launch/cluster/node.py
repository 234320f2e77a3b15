"""One node of a cluster job: the same supervised launch `accelkit launch --machine-rank R` runs, plus the job board.

    python -m accelkit.launch.cluster.node --machine-rank R --main-process-ip A --main-process-port P [--node-name N]

reads the job's LaunchRequest (JSON, from $ACCELKIT_LAUNCH_REQUEST, which the job script sets), gives it this
node's rank, machine 0's address and the rendezvous port, and runs it under accelkit.launch.supervisor's
Supervisor: this node's ranks are supervised and watched for stalls exactly as in a single-machine launch. Through
the job board (accelkit.launch.cluster.job_board), when the job has one, the node
- checks before any rank starts that every node runs the same thing (accelkit.launch.cluster.node_preflight), reaches
  machine 0's address and port, and (a SLURM job with sharded checkpoints) shares the working directory
  (accelkit.launch.cluster.network_checks);
- reports its failure (rank, status, signal, node) so the job ends with the first failing rank's status;
- passes a save request (a preemption's warning) on to its ranks, which save a checkpoint and end;
- on a stall, waits a few seconds for the other nodes' watchdogs so every node prints its ranks' stacks.

Under SLURM the batch step hosts the board. Where the nodes start on their own (SkyPilot, Kubernetes),
`--job-board-port P` has machine 0 host it on port P (with $ACCELKIT_JOB_KEY: SkyPilot's secret, a Kubernetes
Secret, never in the job file) and, at the end, print the first failing rank of the whole job and exit with its
status; `--expect-machines` and `--expect-processes-per-node` take the scheduler's own counts (SKYPILOT_NUM_NODES,
PET_NPROC_PER_NODE, ...) and refuse a job whose shape is not the one the request was written for.
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
from accelkit.launch.accelerate_main import NODE_NAME_ENV
from accelkit.launch.cluster import job_board
from accelkit.launch.cluster.heartbeat import NodeBeats, describe_loss
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


BOARD_WAIT = 900.0  # seconds a node waits for machine 0's job board (torchrun's own rendezvous timeout)
FAILURE_WAIT = 5.0  # seconds machine 0 waits, after a failure, for the node that failed first to report
HOST_GRACE = 2.0  # seconds machine 0 keeps the board up after its own error, for the other nodes to read it


def check_scheduler_shape(request: LaunchRequest, machines: str | None, per_node: str | None) -> None:
    """The scheduler's node count (and processes per node, where it sets one) must be the request's: a task edited
    by hand, or a runtime that overrides it, would otherwise wait for ranks that never come."""
    want_machines = request.options.num_machines or 1
    want_per_node = (request.options.num_processes or want_machines) // want_machines
    for label, given, want, fix in (("nodes", machines, want_machines, "--num-machines"),
                                    ("processes per node", per_node, want_per_node, "--gpus-per-node")):
        if not given or not given.strip():
            continue
        try:
            value = int(given)
        except ValueError:
            raise AccelkitError(f"the scheduler's {label} is {given!r}, not a number",
                                hint="run the job file accelkit wrote as it is") from None
        if value and value != want:
            raise AccelkitError(f"the scheduler runs {value} {label} but the job was written for {want}",
                                hint=f"write the job again with {fix} {value} (accelkit launch ...), rather than "
                                     "editing its shape by hand")


def job_failure_line(record: dict, stalls: dict[str, dict] | None = None) -> str:
    """One line for the job's log: which rank on which node ended the job, and how. `stalls`: what each node's
    watchdog found (the board's stall entries); the node whose ranks are not all waiting in a collective is the
    one that stopped progressing."""
    if record.get("lost"):
        return f"the job failed: {describe_loss(record)}"
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
    from accelkit.launch.restarts import is_peer_loss, peer_detail

    errors = record.get("errors") or []
    if errors and is_peer_loss(errors[0]):  # no node named a cause in time: say what this one saw
        return (f"the job failed: {who} lost a peer ({peer_detail(errors[0])}); the node at that address failed "
                "or went away first, and its own log says why")
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
        from accelkit.launch.stacks import stall_diagnosis

        where, _ = stall_diagnosis(stacks)
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
        from accelkit.launch.preemption import catching_save_request

        for info in RankMonitor(supervisor.watch.watch_dir).alive_ranks():
            # Only a rank whose handler is in place: before the script installs it (watch.py ignores it then) or
            # once Python's teardown has put the default back, SIGUSR1 would kill the rank.
            if not catching_save_request(info.pid):
                continue
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


@contextlib.contextmanager
def _terminate_unwinds():
    """While the cross-node preflight runs: SIGTERM unwinds like an error. When one node refuses the job, srun
    ends the others with SIGTERM, and their preflight must still remove what it wrote (its marker file in the
    working directory) and free machine 0's port."""
    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _shared_dir_to_check(request: LaunchRequest) -> Path | None:
    """A SLURM job whose checkpoints are sharded (FSDP, DeepSpeed: each node saves its ranks' shards) writes them
    under its working directory, which every node must then share. (SkyPilot and Kubernetes jobs run in a copy of
    the project on each node: where their checkpoints go is the job file's storage.)"""
    from accelkit.configs import Backend
    from accelkit.launch.build_plan import resolve_request

    if not os.environ.get("SLURM_JOB_ID") or (request.options.num_machines or 1) < 2:
        return None
    # Only the backend is read here; the launcher resolves and checks the whole config again before any rank starts
    # (Accelerate's own check imports torch: ~10 s on a loaded node, before the preflight could even begin).
    backend = resolve_request(request, check_with_accelerate=False).backend
    return Path.cwd() if backend in (Backend.FSDP, Backend.DEEPSPEED) else None


def run_node(request: LaunchRequest, *, machine_rank: int, main_process_ip: str, port: int, node: str,
             stall_timeout: float | None, board_wait: float = 30.0) -> int:
    from accelkit.launch.accelerate_main import FAILURE_FILE_ENV
    from accelkit.launch.preflight import check_syntax
    from accelkit.launch.supervised import SupervisedRun, run_supervised

    request = node_request(request, machine_rank, main_process_ip, port)
    machines = request.options.num_machines or 1
    board = job_board.connect(timeout=board_wait)
    if board is None and os.environ.get(job_board.BOARD_ENV):
        raise AccelkitError(f"machine {machine_rank} could not reach the job board at "
                            f"{os.environ[job_board.BOARD_ENV]} within {board_wait:g} s",
                            hint="check that machine 0 started and that the nodes reach each other on that port")
    check_syntax(request.target)
    if board is not None:
        from accelkit.launch.cluster.node_preflight import check_nodes

        with _terminate_unwinds():
            check_nodes(board, request, machine=machine_rank, machines=machines, node=node,
                        main_address=main_process_ip, port=port, shared_dir=_shared_dir_to_check(request))
    fd, failure_path = tempfile.mkstemp(prefix="accelkit-node-failure-")
    os.close(fd)
    failure_file = Path(failure_path)
    try:
        env = {**os.environ, FAILURE_FILE_ENV: str(failure_file)}
        env.pop(REQUEST_ENV, None)
        env[NODE_NAME_ENV] = node
        watched: dict = {"beats": None}

        def on_start(supervisor) -> None:
            """Just before the node's ranks start: forward save signals to every node and, across machines, beat."""
            watched["supervisor"] = supervisor
            _forward_save_signal(supervisor, board)
            if board is not None and machines > 1:
                _wait_for_peer_stacks(supervisor, board, machine_rank, machines, node)
                watched["beats"] = NodeBeats(board, supervisor, machine=machine_rank, machines=machines, node=node,
                                             main_process_ip=main_process_ip, port=port, timeout=request.lost_timeout)

        try:
            # SIGTERM as a preemption on Kubernetes and SkyPilot nodes; a SLURM job's own is SIGUSR1 (--requeue
            # --signal-before), and srun's SIGTERM ends the steps of a failed or cancelled job at once.
            preemption = None if os.environ.get("SLURM_JOB_ID") else request.preemption_grace_seconds()
            status = run_supervised(SupervisedRun(request, env=env, stall_timeout=stall_timeout, report_stall=True,
                                                  on_start=on_start, preemption_grace=preemption)).exit_code
            supervisor, beats = watched["supervisor"], watched["beats"]
            # A node stopped from outside (srun ending the job after another node failed, scancel) is not the
            # cause; nor is one whose ranks only lost a peer, once the node that failed (or was lost) is named.
            if status != 0 and board is not None and not supervisor.signals:
                record = _failure_record(status, failure_file, node, machine_rank, supervisor.stalled)
                errors = [failure.error for failure in supervisor.failures]
                if beats is None or beats.should_record(record, errors):
                    with contextlib.suppress(Exception):  # machine 0, hosting the board, may have ended already
                        board.put_first(job_board.FIRST_FAILURE, {**record, "errors": errors[:1]})
        finally:
            if watched["beats"] is not None:
                watched["beats"].finish()
        return status
    finally:
        failure_file.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m accelkit.launch.cluster.node")
    parser.add_argument("--machine-rank", type=int, required=True)
    parser.add_argument("--main-process-ip", required=True)
    parser.add_argument("--main-process-port", type=int, required=True)
    parser.add_argument("--node-name", default=None)
    parser.add_argument("--stall-timeout", type=float, default=None)
    parser.add_argument("--job-board-port", type=int, default=None,
                        help="machine 0 hosts the job board on this port (no batch step hosts it)")
    parser.add_argument("--expect-machines", default=None, help="the scheduler's node count")
    parser.add_argument("--expect-processes-per-node", default=None, help="the scheduler's processes per node")
    args = parser.parse_args(argv)
    text = os.environ.get(REQUEST_ENV)
    if not text:
        return report(AccelkitError(f"${REQUEST_ENV} is not set: this runs one node of a job that accelkit wrote",
                                    hint="submit the job file accelkit wrote (e.g. `sbatch job.sbatch`, "
                                         "`sky launch task.yaml`, `kubectl apply -f trainjob.yaml`)"))
    node = args.node_name or socket.gethostname()
    hosted = None
    try:
        request = LaunchRequest.from_json(text)
        check_scheduler_shape(request, args.expect_machines, args.expect_processes_per_node)
        board_wait = 30.0
        if args.job_board_port is not None:
            hosted = _host_or_find_board(args.job_board_port, args.machine_rank, args.main_process_ip)
            board_wait = BOARD_WAIT
        status = run_node(request, machine_rank=args.machine_rank, main_process_ip=args.main_process_ip,
                          port=args.main_process_port, node=node, stall_timeout=args.stall_timeout,
                          board_wait=board_wait)
        return _job_status(hosted, status) if hosted is not None else status
    except (EOFError, ConnectionError) as lost:  # the board's host (machine 0) ended while this node used it
        if debug_enabled():
            raise
        print(f"accelkit: node {node} (machine {args.machine_rank}):", file=sys.stderr, flush=True)
        return report(AccelkitError(f"lost the job board on machine 0 ({type(lost).__name__}): machine 0 ended",
                                    hint="machine 0's log says why"))
    except AccelkitError as error:
        if debug_enabled():
            raise
        board = job_board.connect()
        if board is not None:
            board.put_first(job_board.FIRST_FAILURE, {"node": node, "machine": args.machine_rank,
                                                      "status": error.exit_code, "stalled": False, "rank": None,
                                                      "signal": None, "message": error.message})
        print(f"accelkit: node {node} (machine {args.machine_rank}):", file=sys.stderr, flush=True)
        if hosted is not None:
            time.sleep(HOST_GRACE)  # the other nodes read the same findings (e.g. the preflight's) before it closes
        return report(error)
    finally:
        if hosted is not None:
            hosted.close()


def _host_or_find_board(port: int, machine_rank: int, main_process_ip: str) -> job_board.HostedBoard | None:
    """Machine 0 hosts the job board on `port`; every node (machine 0 too) then finds it through the environment."""
    key = os.environ.get(job_board.KEY_ENV)
    if not key:
        raise AccelkitError(f"--job-board-port needs ${job_board.KEY_ENV} (the job board's key)",
                            hint=f"launch the job as accelkit printed it: SkyPilot with `--secret "
                                 f"{job_board.KEY_ENV}`, Kubernetes after `kubectl create secret generic "
                                 "JOB-NAME-job-key ...`")
    hosted = None
    if machine_rank == 0:
        try:
            hosted = job_board.HostedBoard(port=port, key=key)
        except OSError as exc:
            raise AccelkitError(f"machine 0 cannot host the job board on port {port}: {exc.strerror or exc}",
                                hint="free the port, or write the job again with another --main-process-port "
                                     "(the board uses the port after it)") from None
    os.environ[job_board.BOARD_ENV] = f"{'127.0.0.1' if hosted else main_process_ip}:{port}"
    return hosted


def _job_status(hosted: job_board.HostedBoard, status: int) -> int:
    """On machine 0 (the board's host): the job's status is its first failing rank's, on whichever node; one line
    names the rank, its node and its signal (this node's own ranks fail as a consequence)."""
    record = hosted.board.get(job_board.FIRST_FAILURE)
    deadline = time.monotonic() + FAILURE_WAIT
    while status != 0 and record is None and time.monotonic() < deadline:
        time.sleep(0.2)
        record = hosted.board.get(job_board.FIRST_FAILURE)
    if record is None:
        return status
    print(f"accelkit: {job_failure_line(record, hosted.board.with_prefix(STALL_PREFIX))}", file=sys.stderr,
          flush=True)
    return int(record["status"]) or 1


if __name__ == "__main__":
    sys.exit(main())
