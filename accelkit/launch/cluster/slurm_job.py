"""The batch step of an accelkit SLURM job: `python -m accelkit.launch.cluster.slurm_job`, run by the sbatch script.

SLURM runs the batch script on the allocation's first node, which is machine 0 (SLURM_NODEID 0 of the step). This
process, there:
- finds machine 0's address from SLURM itself (`scontrol show node` NodeAddr), never from a node name that may not
  resolve elsewhere; $MAIN_PROCESS_IP overrides it;
- picks the rendezvous port free on this node (two jobs sharing a node do not collide), unless the job fixed one;
- hosts the job board (accelkit.launch.cluster.job_board) for the nodes' preflight, failures and stalls;
- starts one supervised launcher per node with srun (accelkit.launch.cluster.node), forwarding the signals it gets;
- turns SIGUSR1 (`#SBATCH --signal=B:USR1@S`, with --requeue) into a save request on the board: every node's
  ranks save a checkpoint and stop, and the job requeues itself;
- with --requeue, requeues the job when a machine was lost (accelkit.launch.cluster.heartbeat), so that it resumes once
  the node is back;
- ends with the first failing rank's exit status (srun's own is the largest, 143 after it stopped the other
  nodes), after one line naming the rank, its node and its signal.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import os
import shlex
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping

from accelkit.errors import AccelkitError, debug_enabled, report
from accelkit.launch import ports
from accelkit.launch.cluster import job_board
from accelkit.launch.cluster.targets.node_command import NodeCommand

_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
# Each srun task expands its own rank and node name; the arguments after the program come from this process.
NODE_PROGRAM = NodeCommand(python='"$ACCELKIT_PYTHON"', machine_rank='"$SLURM_NODEID"',
                           node_name='"${SLURMD_NODENAME:-$(hostname)}"', extra='"$@"').render()


def _say(text: str) -> None:
    print(f"accelkit: {text}", file=sys.stderr, flush=True)


def _scontrol(*args: str) -> str:
    try:
        proc = subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise AccelkitError(f"`scontrol {' '.join(args)}` failed: {exc}",
                            hint="run the job with sbatch on a SLURM cluster") from None
    if proc.returncode != 0:
        raise AccelkitError(f"`scontrol {' '.join(args)}` failed: {proc.stderr.strip() or proc.returncode}",
                            hint="run the job with sbatch on a SLURM cluster")
    return proc.stdout


def first_node(nodelist: str) -> str:
    names = _scontrol("show", "hostnames", nodelist).split()
    if not names:
        raise AccelkitError(f"no node in SLURM_JOB_NODELIST ({nodelist!r})", hint="submit the job with sbatch")
    return names[0]


def node_addr(name: str) -> str:
    """The node's NodeAddr as SLURM knows it (what slurmctld itself uses to reach the node)."""
    for field in _scontrol("show", "node", "-o", name).split():
        key, _, value = field.partition("=")
        if key == "NodeAddr" and value:
            return value
    return name


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def main_address(name: str, addr: str) -> str:
    """An address of machine 0 that the other nodes can use: NodeAddr when it is an IP address; otherwise NodeAddr
    (or the node name) resolved here, on machine 0, unless that gives only a loopback address."""
    if _is_ip(addr):
        return addr
    for candidate in dict.fromkeys([addr, name, socket.gethostname()]):
        with contextlib.suppress(OSError):
            for info in socket.getaddrinfo(candidate, None, socket.AF_INET, socket.SOCK_STREAM):
                ip = str(info[4][0])
                if not ipaddress.ip_address(ip).is_loopback:
                    return ip
    raise AccelkitError(f"cannot find an address of machine 0 (node {name}, NodeAddr {addr}) that other nodes can "
                        "reach: it does not resolve to a non-loopback address",
                        hint="export MAIN_PROCESS_IP=<machine 0's IP address> in the sbatch script")


def _addresses(first: str) -> tuple[str, str]:
    """Machine 0's address for the rendezvous ($MAIN_PROCESS_IP, else from NodeAddr) and for the job board (from
    NodeAddr where it gives one: the nodes' preflight must reach the board to check a rendezvous address)."""
    given = os.environ.get("MAIN_PROCESS_IP")
    try:
        found = main_address(first, node_addr(first))
    except AccelkitError:
        if not given:
            raise
        found = given
    return given or found, found


def step_options(env: Mapping[str, str] = os.environ) -> list[str]:
    """srun's options for the nodes' step beyond its shape: the CPUs of the job's one task per node (SLURM 22.05's
    srun does not take --cpus-per-task from the job, and its task would be bound to one CPU: every rank of the node
    on it), then the sbatch script's own (ACCELKIT_SRUN_ARGS: a container, from --container-image)."""
    cpus = env.get("SLURM_CPUS_PER_TASK") or env.get("SLURM_CPUS_ON_NODE")  # the latter: --exclusive
    options = [f"--cpus-per-task={cpus}"] if cpus and cpus.isdigit() else []
    return options + shlex.split(env.get("ACCELKIT_SRUN_ARGS", ""))


def srun_argv(nodes: int, node_args: list[str]) -> list[str]:
    # ACCELKIT_NODE_SETUP: the job's --setup lines, run again on every node before its launcher.
    program = 'set -eo pipefail\neval "${ACCELKIT_NODE_SETUP:-}"\n' + NODE_PROGRAM
    return ["srun", f"--nodes={nodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1", *step_options(),
            "bash", "-c", program, "accelkit-node", *node_args]


def requeue(reason: str) -> int:
    """Put this job back in the queue: SLURM restarts the batch script from the top, and the script resumes from its
    latest checkpoint (`--resume-from-checkpoint latest`)."""
    job_id = os.environ.get("SLURM_JOB_ID", "")
    _say(f"{reason}; requeueing job {job_id} (it resumes from the latest checkpoint)")
    _scontrol("requeue", job_id)
    return 0


SRUN_GRACE = 10.0  # seconds srun gets to end its step after a lost machine, before it is killed


def _wait_for_srun(proc: subprocess.Popen, board) -> dict | None:
    """Wait for srun; when machine 0 declares a machine lost (accelkit.launch.cluster.heartbeat), say it at once and end
    srun, which would otherwise wait for the lost node until SLURM declares it down. The lost machine's record, or
    None when none was lost."""
    import time

    from accelkit.launch.cluster.node import job_failure_line

    stop_at = None
    lost = None
    while proc.poll() is None:
        if lost is None:
            record = board.get(job_board.FIRST_FAILURE)
            if record is not None and record.get("lost"):
                lost = record
                _say(job_failure_line(record))
                with contextlib.suppress(ProcessLookupError):
                    proc.terminate()
                stop_at = time.monotonic() + SRUN_GRACE
        elif stop_at is not None and time.monotonic() > stop_at:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            stop_at = None
        time.sleep(0.5)
    return lost


def run_job(*, port: int | None, stall_timeout: float | None, requeue_on_signal: bool = False) -> int:
    nodes = int(os.environ.get("SLURM_JOB_NUM_NODES") or os.environ.get("SLURM_NNODES") or 0)
    nodelist = os.environ.get("SLURM_JOB_NODELIST")
    if not nodes or not nodelist:
        raise AccelkitError("not inside a SLURM job (SLURM_JOB_NODELIST is not set)",
                            hint="submit the script with sbatch")
    first = first_node(nodelist)
    address, board_address = _addresses(first)
    if port is None:
        port = ports.free_port("")
    elif not ports.port_free(port):
        raise AccelkitError(f"port {port} is already in use on machine 0 (node {first})",
                            hint="leave the port out when writing the job: accelkit then picks a free one on "
                                 "machine 0")
    board = job_board.HostedBoard()
    node_args = ["--main-process-ip", address, "--main-process-port", str(port)]
    if stall_timeout is not None:
        node_args += ["--stall-timeout", f"{stall_timeout:g}"]
    env = {**os.environ, **board.env(board_address),
           "ACCELKIT_PYTHON": os.environ.get("ACCELKIT_PYTHON", sys.executable)}
    _say(f"{nodes} node(s); machine 0 is {first} at {address}:{port}")
    argv = srun_argv(nodes, node_args)
    if debug_enabled():
        _say("running " + shlex.join(argv))
    proc = subprocess.Popen(argv, env=env)
    received: list[int] = []

    def forward(signum: int, frame: object) -> None:
        received.append(signum)
        if signum == signal.SIGUSR1:  # through the board: srun would signal every process of the nodes
            board.board.put(job_board.SAVE_REQUEST, True)
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in _FORWARDED}
    try:
        lost = _wait_for_srun(proc, board.board)
        if lost is not None and requeue_on_signal:  # SLURM runs it again once the node is back (or another)
            board.close()
            return requeue(f"machine {lost['machine']} (node {lost['node']}) was lost")
        returncode = proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    status = 128 - returncode if returncode < 0 else returncode
    record = board.board.get(job_board.FIRST_FAILURE)
    if record is not None:
        from accelkit.launch.cluster.node import STALL_PREFIX, job_failure_line

        if lost is None:  # a lost machine was said as soon as machine 0 found it
            _say(job_failure_line(record, board.board.with_prefix(STALL_PREFIX)))
        return int(record["status"]) or 1
    board.close()
    if requeue_on_signal and signal.SIGUSR1 in received and status == 0:
        return requeue("the ranks saved a checkpoint on SIGUSR1 and stopped")
    if received:
        _say(f"stopped by {signal.Signals(received[0]).name}")
        return 128 + received[0] if status == 0 else status
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m accelkit.launch.cluster.slurm_job")
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument("--stall-timeout", type=float, default=None)
    parser.add_argument("--requeue", action="store_true", help="after SIGUSR1 and a clean stop: scontrol requeue")
    args = parser.parse_args(argv)
    try:
        return run_job(port=args.port, stall_timeout=args.stall_timeout, requeue_on_signal=args.requeue)
    except AccelkitError as error:
        if debug_enabled():
            raise
        return report(error)


if __name__ == "__main__":
    sys.exit(main())
