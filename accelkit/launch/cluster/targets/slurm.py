"""Write an sbatch script that runs one supervised accelkit launcher per node.

The script holds the job's LaunchRequest (JSON) and runs accelkit.launch.cluster.slurm_job on the allocation's first
node,
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
from accelkit.launch.cluster.slurm_values import (
    MAX_SIGNAL_BEFORE,
    check_directive_value,
    sbatch_directive,
    time_limit_seconds,
)
from accelkit.launch.cluster.targets.cluster_job import ClusterJob, ClusterTarget, JobOptions, write_cluster_job
from accelkit.launch.cluster.targets.node_resources import mebibytes
from accelkit.launch.request import LaunchRequest

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
    exclusive: bool = False  # whole nodes: all their CPUs (and, with no memory given, all their memory)
    account: str | None = None
    qos: str | None = None
    sbatch_args: tuple[str, ...] = ()  # more `#SBATCH` lines, e.g. --constraint=a100
    container_image: str | None = None  # pyxis/enroot: every node's launcher and ranks run in this image


def resource_lines(job: ClusterJob, options: SlurmOptions) -> list[str]:
    """The `#SBATCH` lines for the CPUs and memory of each node. The job runs one task per node (accelkit's node
    launcher), which starts all of the node's ranks: its --cpus-per-task is the CPUs of the whole node's ranks, and
    the batch step hands the same count to its srun step (SLURM 22.05's srun does not inherit it)."""
    cpus, memory = options.resources.cpus, options.resources.memory
    lines = ["# CPUs and memory per node, for the one launcher task that starts the node's ranks (and their loaders)."]
    exclusive = options.exclusive or (cpus is None and memory is None and job.gpus_per_node > 0)
    if cpus is not None:
        lines.append(f"#SBATCH --cpus-per-task={cpus}")
    elif not exclusive:  # a CPU job asking nothing: a core per process
        lines.append(f"#SBATCH --cpus-per-task={job.processes_per_node}")
    if exclusive:
        # Whole nodes: every CPU (and, with no --mem-per-node, all memory: SLURM 22.05's --exclusive alone gives
        # only the default memory per CPU).
        lines.append("#SBATCH --exclusive")
    if memory is not None:
        lines.append(f"#SBATCH --mem={mebibytes(memory)}M")
    elif exclusive:
        lines.append("#SBATCH --mem=0")
    return lines


# What accelkit writes itself: an --sbatch-arg that sets one of these would contradict the job (the option to use).
OWN_SBATCH_OPTIONS = {
    "nodes": "--num-machines", "N": "--num-machines", "ntasks": "--num-machines", "n": "--num-machines",
    "ntasks-per-node": "--num-machines", "gpus-per-node": "--gpus-per-node", "gpus": "--gpus-per-node",
    "G": "--gpus-per-node", "gres": "--gpus-per-node", "cpus-per-task": "--cpus-per-node",
    "c": "--cpus-per-node", "cpus-per-gpu": "--cpus-per-node", "mem": "--mem-per-node",
    "mem-per-cpu": "--mem-per-node", "mem-per-gpu": "--mem-per-node", "exclusive": "--exclusive",
    "job-name": "--job-name", "J": "--job-name", "partition": "--partition", "p": "--partition",
    "time": "--time", "t": "--time", "account": "--account", "A": "--account", "qos": "--qos", "q": "--qos",
    "requeue": "--requeue", "signal": "--requeue --signal-before", "output": "(the log is %x-%j.out)",
    "o": "(the log is %x-%j.out)", "chdir": "(the folder accelkit launch ran in)", "D": "(the folder accelkit "
    "launch ran in)", "open-mode": "--requeue",
}


def sbatch_arg_line(arg: str) -> str:
    """One `--sbatch-arg` as its `#SBATCH` line: a long option (`--constraint=a100`, `--mail-type=END`)."""
    name, sep, value = arg.partition("=")
    if not name.startswith("--") or len(name) < 3 or any(char.isspace() for char in name):
        raise AccelkitError(f"--sbatch-arg {arg!r} is not a long sbatch option",
                            hint="write it as sbatch's long option with '=', e.g. --sbatch-arg=--constraint=a100")
    check_directive_value("--sbatch-arg", arg, spaces=True)
    own = OWN_SBATCH_OPTIONS.get(name[2:])
    if own is not None:
        use = f"use {own}" if own.startswith("--") else f"accelkit sets it {own}"
        raise AccelkitError(f"--sbatch-arg {arg} sets what accelkit writes itself", hint=f"drop it; {use}")
    return sbatch_directive(name[2:], value) if sep else f"#SBATCH {name}"


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
    if options.account:
        header.append(sbatch_directive("account", options.account))
    if options.qos:
        header.append(sbatch_directive("qos", options.qos))
    header += resource_lines(job, options)
    header += [sbatch_arg_line(arg) for arg in options.sbatch_args]
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
        *environment_lines(options),
        "# What every node runs (accelkit launch's request); each node adds its rank, machine 0's address and port.",
        f"export ACCELKIT_LAUNCH_REQUEST=\"$(cat <<'{REQUEST_DELIMITER}'",
        text,
        REQUEST_DELIMITER,
        ')"',
        "",
        "# On this (the first) node: find machine 0's address (NodeAddr; export MAIN_PROCESS_IP to override) and a",
        "# free port, start one supervised launcher per node with srun, exit with the first failing rank's status.",
        "exec python -m accelkit.launch.cluster.slurm_job" + (" " + shlex.join(job_args) if job_args else ""),
        "",
    ]
    return "\n".join(header + body)


def environment_lines(options: SlurmOptions) -> list[str]:
    """The job's set-up (--setup: run here, before the launch, and on every node before its launcher) and its
    container (--container-image: srun runs every node's launcher in it, through pyxis)."""
    lines: list[str] = []
    if options.setup:
        lines += ["# The job's environment (--setup), run here; srun carries it to every node, where it runs again.",
                  *options.setup,
                  f"export ACCELKIT_NODE_SETUP={shlex.quote(chr(10).join(options.setup))}" if not
                  options.container_image else "# (not run again inside the container: the image holds the rest)",
                  ""]
    if options.container_image:
        folder = str(options.chdir or ".")
        srun = [f"--container-image={options.container_image}", f"--container-mounts={folder}:{folder}",
                f"--container-workdir={folder}"]
        lines += ["# Every node's launcher and ranks run in this image (pyxis/enroot), with the job's folder mounted;",
                  "# this batch step runs on the node itself and needs accelkit there too.",
                  f"export ACCELKIT_SRUN_ARGS={shlex.quote(shlex.join(srun))}",
                  "export ACCELKIT_PYTHON=python3", ""]
    return lines


def check_saves_on_signal(request: LaunchRequest, cwd: Path | None = None) -> None:
    """--requeue needs a script that saves a checkpoint on SIGUSR1 and resumes from it: without a handler, SIGUSR1
    would kill every rank and the requeued job would start over from scratch."""
    from accelkit.launch.preflight import module_script

    cwd = cwd or Path.cwd()
    target = request.target
    path = module_script(target.script, cwd) if target.module else cwd / target.script
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


def check_slurm_options(options: SlurmOptions) -> None:
    """Refuse what sbatch would refuse (or misread) in the script, before anything is written."""
    if options.partition is not None:
        check_directive_value("--partition", options.partition, spaces=False)
    check_directive_value("--job-name", options.job_name, spaces=True)
    if "/" in options.job_name:
        raise AccelkitError(f"--job-name {options.job_name} has a '/': it names the job's log (%x-%j.out)",
                            hint="pass a job name without '/'")
    for option, value in (("--account", options.account), ("--qos", options.qos),
                          ("--container-image", options.container_image)):
        if value is not None:
            check_directive_value(option, value, spaces=False)
    if options.chdir is not None:
        check_directive_value("the job's folder", str(options.chdir), spaces=True,
                               hint="run accelkit launch --slurm from a folder whose path has no quotes")
    limit = time_limit_seconds(options.time) if options.time is not None else None
    if not options.requeue:
        return
    if options.signal_before > MAX_SIGNAL_BEFORE:
        raise AccelkitError(f"--signal-before {options.signal_before} is more than SLURM allows "
                            f"({MAX_SIGNAL_BEFORE} seconds)", hint=f"pass --signal-before {MAX_SIGNAL_BEFORE} or less")
    if limit is not None and options.signal_before >= limit:
        raise AccelkitError(f"--requeue's warning {options.signal_before} s before the time limit (--signal-before) "
                            f"is not shorter than --time {options.time} ({limit} s): SLURM would ask the job to save "
                            "as soon as it starts",
                            hint="pass a shorter --signal-before (a few minutes: time to save a checkpoint), or a "
                                 "longer --time")
