"""Write an sbatch script that runs one supervised accelkit launcher per node.

The script holds the job's LaunchRequest (JSON) and runs accelkit.launch.slurm_job on the allocation's first node,
which finds machine 0's address from SLURM, picks the rendezvous port, hosts the job board and starts the per-node
command (node_command.py) on every node with srun: each node resolves and supervises its own ranks exactly as
`accelkit launch --machine-rank R` would (stall watchdog included), and the job ends with the first failing
rank's exit status.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from accelkit.errors import AccelkitError
from accelkit.launch.request import LaunchRequest
from accelkit.launch.slurm_values import check_slurm_options, sbatch_directive
from accelkit.launch.targets.cluster_job import ClusterJob, ClusterTarget, JobOptions, write_cluster_job

SLURM = ClusterTarget(flag="--slurm", scheduler="SLURM", job_file="the sbatch script", rank_source="SLURM_NODEID")
REQUEST_DELIMITER = "ACCELKIT_REQUEST"


@dataclass(frozen=True, kw_only=True)
class SlurmOptions(JobOptions):
    """What only SLURM is asked for (the job's shape and the request are the ClusterJob's)."""

    partition: str | None = None
    time: str | None = None
    chdir: Path | None = None  # directory the job runs in (where relative script paths resolve)
    requeue: bool = False  # on SIGUSR1 the ranks save and stop, and the job requeues itself
    signal_before: int = 120  # with requeue: seconds before the time limit that SLURM sends SIGUSR1


def render_sbatch(job: ClusterJob, options: SlurmOptions) -> str:
    """The sbatch script text for `job`."""
    request = job.request
    header = [
        "#!/bin/bash",
        sbatch_directive("job-name", options.job_name),
        f"#SBATCH --nodes={job.nodes}",
        "#SBATCH --ntasks-per-node=1",
    ]
    if job.gpus_per_node > 0:
        header.append(f"#SBATCH --gpus-per-node={job.gpus_per_node}")
    if options.partition:
        header.append(sbatch_directive("partition", options.partition))
    if options.time:
        header.append(sbatch_directive("time", options.time))
    if options.chdir is not None:
        header.append(sbatch_directive("chdir", options.chdir))  # quoted when it has spaces (sbatch reads the quotes)
    if options.requeue:
        # SLURM warns the batch step (B:) this long before the time limit; a preemption's warning is SIGUSR1 too
        # where the cluster sets SlurmctldParameters=preempt_send_user_signal. Requeued, the job starts over.
        # --open-mode=append: the requeued run adds to the log instead of replacing it.
        header += ["#SBATCH --requeue", f"#SBATCH --signal=B:USR1@{options.signal_before}",
                   "#SBATCH --open-mode=append"]
    header.append("#SBATCH --output=%x-%j.out")

    job_args: list[str] = []
    if job.port is not None:
        job_args += ["--port", str(job.port)]
    if options.stall_timeout is not None:
        job_args += ["--stall-timeout", f"{options.stall_timeout:g}"]
    if options.requeue:
        job_args.append("--requeue")
    text = request.to_json()
    assert REQUEST_DELIMITER not in text  # JSON of the request never holds the bare delimiter line
    body = [
        "",
        f"# Written by: {request.command_line}",
        "# Submit with: sbatch <this file>. Activate the job's Python environment (with accelkit installed) below.",
        "set -euo pipefail",
        "",
        "# What every node runs (accelkit launch's request); each node adds its rank, machine 0's address and port.",
        f"export ACCELKIT_LAUNCH_REQUEST=\"$(cat <<'{REQUEST_DELIMITER}'",
        text,
        REQUEST_DELIMITER,
        ')"',
        "",
        "# On this (the first) node: find machine 0's address (NodeAddr; export MAIN_PROCESS_IP to override) and a",
        "# free port, start one supervised launcher per node with srun, exit with the first failing rank's status.",
        "exec python -m accelkit.launch.slurm_job" + (" " + shlex.join(job_args) if job_args else ""),
        "",
    ]
    return "\n".join(header + body)


def check_saves_on_signal(request: LaunchRequest, cwd: Path | None = None) -> None:
    """--requeue needs a script that saves a checkpoint on SIGUSR1 and resumes from it: without a handler, SIGUSR1
    would kill every rank and the requeued job would start over from scratch."""
    from accelkit.launch.preflight import module_file

    cwd = cwd or Path.cwd()
    target = request.target
    path = module_file(target.script, cwd) if target.module else cwd / target.script
    try:
        source = path.read_text(errors="replace") if path is not None else ""
    except OSError:
        source = ""
    if "SIGUSR1" not in source:
        raise AccelkitError(f"--requeue needs a script that saves a checkpoint on SIGUSR1; {target.describe()} does "
                            "not handle SIGUSR1", hint="use a script from `accelkit init` (its Preemption class), or "
                                                   "catch SIGUSR1, save at the next step and resume from the latest "
                                                   "checkpoint; or drop --requeue")
    resumes = any(arg == "--resume-from-checkpoint" or arg.startswith("--resume-from-checkpoint=")
                  for arg in target.args)
    if not resumes and "resume_from_checkpoint" in source:  # a script with accelkit's templates' resume option
        raise AccelkitError("--requeue restarts the job from the top: the script must resume by itself",
                                hint="add `--resume-from-checkpoint latest` to the script's arguments")


def write_slurm_job(request: LaunchRequest, slurm: SlurmOptions, sbatch_path: Path,
                    force: bool = False) -> ClusterJob:
    """Write the sbatch script for `request` and its config beside it; return the job (its summary for the user)."""
    check_slurm_options(slurm)
    if slurm.requeue:
        check_saves_on_signal(request)
    return write_cluster_job(request, SLURM, slurm, sbatch_path, force, lambda job: render_sbatch(job, slurm),
                             mode=0o755)
