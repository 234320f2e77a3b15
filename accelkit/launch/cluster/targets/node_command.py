"""The one per-node command of every cluster target: `python -m accelkit.launch.cluster.node ...`, with the scheduler's
variables for this node's rank, machine 0's address and the port.

accelkit.launch.cluster.node reads the job's request ($ACCELKIT_LAUNCH_REQUEST), fills in those per-node values
exactly as
`accelkit launch --machine-rank R --main-process-ip A --main-process-port P` does on a bare machine, and runs this
node's ranks under the supervisor (stall watchdog, one-line failures, the first failing rank's exit status), after
the cross-node preflight. Targets differ only in where the values come from (SLURM_NODEID, SKYPILOT_NODE_RANK,
PET_NODE_RANK, ...): they pass shell expressions, never values of their own.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

NODE_MODULE = "accelkit.launch.cluster.node"


@dataclass(frozen=True)
class NodeCommand:
    """Shell expressions (already quoted as the shell needs them) for each of the node launcher's arguments."""

    machine_rank: str
    node_name: str
    main_process_ip: str | None = None  # None: given later (the SLURM batch step appends it, see extra)
    main_process_port: str | None = None
    python: str = "python"
    job_board_port: str | None = None  # machine 0 hosts the job board there (targets without a batch step)
    expect_machines: str | None = None  # the scheduler's own count, checked against the request's
    expect_processes_per_node: str | None = None
    stall_timeout: float | None = None
    extra: str = ""  # appended verbatim, e.g. '"$@"'

    def render(self) -> str:
        parts = [self.python, "-m", NODE_MODULE, "--machine-rank", self.machine_rank]
        optional = [("--main-process-ip", self.main_process_ip), ("--main-process-port", self.main_process_port),
                    ("--job-board-port", self.job_board_port), ("--expect-machines", self.expect_machines),
                    ("--expect-processes-per-node", self.expect_processes_per_node)]
        for flag, value in optional:
            if value is not None:
                parts += [flag, value]
        if self.stall_timeout is not None:
            parts += ["--stall-timeout", shlex.quote(f"{self.stall_timeout:g}")]
        parts += ["--node-name", self.node_name]
        if self.extra:
            parts.append(self.extra)
        return "exec " + " ".join(parts)
