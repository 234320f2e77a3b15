"""The function every Ray Train worker runs (`train_loop_per_worker`): start this worker's rank, wait for it.

The rank is a child process (see job.py for why) in the user's working folder. Ray Train has already told the
worker its rank, world size, local rank and node rank (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK)
and rank 0's address (MASTER_ADDR); the child inherits them. Its process group needs a port of its own on rank 0's
node (the workers' own group, set up by TorchTrainer, holds MASTER_PORT): rank 0 picks a free one and Ray's
collective hands it to every worker. The child's stdout and stderr are the worker's, which Ray streams to the
driver's terminal. It dies with its worker (PR_SET_PDEATHSIG), so a worker Ray stops or loses leaves no rank behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time

_PR_SET_PDEATHSIG = 1


class RankFailed(RuntimeError):
    """A rank process ended with a non-zero status (the driver turns the first one into the job's exit status)."""

    def __init__(self, rank: int, node: str, exit_code: int, when: float) -> None:
        super().__init__(f"rank {rank} on node {node} exited with status {exit_code}")
        self.rank, self.node, self.exit_code, self.when = rank, node, exit_code, when

    def __reduce__(self):  # crosses from the worker to the driver
        return (RankFailed, (self.rank, self.node, self.exit_code, self.when))


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def exit_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def run_rank(job_fields: dict) -> None:
    """Ray Train's train_loop_per_worker: `job_fields` is the RayJob's rank part (argv, cwd, env)."""
    import ray.train
    from ray.train.collective import broadcast_from_rank_zero

    context = ray.train.get_context()
    rank = context.get_world_rank()
    port = broadcast_from_rank_zero(_free_port() if rank == 0 else None)
    env = {**os.environ, **job_fields["env"], "MASTER_PORT": str(port)}
    env.setdefault("MASTER_ADDR", "127.0.0.1")
    node = ray.util.get_node_ip_address()
    argv = [sys.executable, *job_fields["rank_argv"]]
    proc = subprocess.Popen(argv, cwd=job_fields["cwd"], env=env, preexec_fn=_die_with_parent)
    try:
        code = exit_status(proc.wait())
    finally:
        if proc.poll() is None:  # the worker is being stopped (Ray ended the group): take the rank with it
            proc.kill()
            proc.wait()
    if code != 0:
        raise RankFailed(rank, node, code, time.time())
