"""SIGTERM as a preemption: what `accelkit launch` does with the first SIGTERM when the ranks can save.

Kubernetes (a TrainJob's pods, KubeRay, spot node pools), SkyPilot's spot instances and most schedulers send SIGTERM
to a job's first process, then SIGKILL after a grace period. The templates already stop early with a checkpoint on
SIGUSR1 (their Preemption block: the ranks agree on the step, save, end). The supervisor turns the first SIGTERM
into that request for the ranks that catch SIGUSR1 (read from the kernel's record of each rank's handlers: a script
without the handler would be killed by SIGUSR1), waits `--preemption-grace` seconds for them to save and end, and
exits with PREEMPTED_EXIT_STATUS, the status of a process ended by SIGTERM, which every target reads as "stopped"
(a TrainJob's pod failure policy, a requeue). A second SIGTERM, or the grace running out, stops the job at once.
"""

from __future__ import annotations

import signal
from pathlib import Path

PREEMPTED_EXIT_STATUS = 128 + signal.SIGTERM  # 143
DEFAULT_PREEMPTION_GRACE = 120.0  # seconds to save after SIGTERM; a TrainJob's pods get this plus a margin


def catching_save_request(pid: int, proc: Path = Path("/proc")) -> bool:
    """Does process `pid` catch SIGUSR1 (a handler installed, not the default action that would kill it)?"""
    try:
        text = (proc / str(pid) / "status").read_text()
    except OSError:
        return False
    for line in text.splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signal.SIGUSR1 - 1) & 1)
    return False


def preemption_line(catching: int, grace: float) -> str:
    if not catching:
        return ("SIGTERM: no rank handles the save request (SIGUSR1, which the templates' Preemption block catches); "
                "stopping the job without a checkpoint")
    return (f"SIGTERM: a preemption; asked {catching} rank(s) to save a checkpoint and stop (SIGUSR1), waiting up "
            f"to {grace:g} s (--preemption-grace); a second SIGTERM stops the job at once")


def preempted_summary(status: int, grace: float | None, *, killed: bool) -> str:
    if killed or status != 0:
        return (f"preempted: the ranks did not finish their save within {grace:g} s (launcher status {status}); "
                f"the job is stopped (exit {PREEMPTED_EXIT_STATUS}); resume from the last complete checkpoint")
    return (f"preempted: the ranks saved a checkpoint and stopped (exit {PREEMPTED_EXIT_STATUS}); run the same "
            "command with --resume-from-checkpoint latest to continue")
