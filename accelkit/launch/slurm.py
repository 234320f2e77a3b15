"""Write an sbatch script that runs one supervised accelkit launcher per node.

The script holds the job's LaunchRequest (JSON) and runs accelkit.launch.slurm_job on the allocation's first node,
which finds machine 0's address from SLURM, picks the rendezvous port, hosts the job board and starts
accelkit.launch.node on every node with srun: each node resolves and supervises its own ranks exactly as
`accelkit launch --machine-rank R` would (stall watchdog included), and the job ends with the first failing
rank's exit status.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, replace
from pathlib import Path

from accelkit.errors import AccelkitError
from accelkit.launch.request import LaunchRequest
from accelkit.launch.slurm_values import check_slurm_options, sbatch_directive

REQUEST_DELIMITER = "ACCELKIT_REQUEST"


@dataclass(frozen=True)
class SlurmOptions:
    nodes: int
    gpus_per_node: int
    partition: str | None = None
    time: str | None = None
    job_name: str = "accelkit"
    port: int | None = None  # None: a free port on machine 0, chosen when the job starts
    chdir: Path | None = None  # directory the job runs in (where relative script paths resolve)
    stall_timeout: float | None = None  # the watchdog's, on every node (None: launch's default)
    requeue: bool = False  # on SIGUSR1 the ranks save and stop, and the job requeues itself
    signal_before: int = 120  # with requeue: seconds before the time limit that SLURM sends SIGUSR1


def render_sbatch(request: LaunchRequest, options: SlurmOptions) -> str:
    """The sbatch script text for the cluster `request` (its options describe all nodes)."""
    header = [
        "#!/bin/bash",
        sbatch_directive("job-name", options.job_name),
        f"#SBATCH --nodes={options.nodes}",
        "#SBATCH --ntasks-per-node=1",
    ]
    if options.gpus_per_node > 0:
        header.append(f"#SBATCH --gpus-per-node={options.gpus_per_node}")
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
    if options.port is not None:
        job_args += ["--port", str(options.port)]
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


def write_sbatch(path: Path, text: str) -> None:
    """Write the script atomically and make it executable."""
    from accelkit.fsio import atomic_write

    atomic_write(path, text, mode=0o755)


def slurm_config_path(sbatch_path: Path) -> Path:
    """Where the job's Accelerate config goes: beside the sbatch script (job.sbatch -> job.accelerate.yaml)."""
    return sbatch_path.with_name(f"{sbatch_path.stem}.accelerate.yaml")


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


def write_slurm_job(request: LaunchRequest, slurm: SlurmOptions, sbatch_path: Path) -> tuple[Path, list[str]]:
    """Write the sbatch script for `request` and its config; return the config path and the summary lines."""
    from accelkit.launch.build_plan import prepare_launch

    options = request.options
    check_slurm_options(slurm)
    if slurm.requeue:
        check_saves_on_signal(request)
    if slurm.nodes < 1:
        raise AccelkitError(f"--num-machines must be at least 1 (got {slurm.nodes})",
                            hint="use 1 for one machine (--num-machines 1)")
    if options.num_machines is not None and options.num_machines != slurm.nodes:
        raise AccelkitError(f"--nodes {slurm.nodes} and --num-machines {options.num_machines} disagree",
                            hint="--nodes is another spelling of --num-machines: give one of them")
    if options.machine_rank is not None or options.main_process_ip is not None:
        raise AccelkitError("--machine-rank and --main-process-ip come from SLURM in the sbatch script",
                            hint="drop them; each node takes its rank from SLURM_NODEID")
    per_node = slurm.gpus_per_node
    if options.num_processes is not None:
        if per_node and options.num_processes != per_node * slurm.nodes:
            raise AccelkitError(f"--num-processes {options.num_processes} is not --num-machines x --gpus-per-node "
                                f"({slurm.nodes} x {per_node})", hint="drop --num-processes; it is the total")
        if options.num_processes % slurm.nodes:
            raise AccelkitError(f"--num-processes {options.num_processes} does not split over {slurm.nodes} nodes",
                                hint="pass --gpus-per-node G instead")
        per_node = options.num_processes // slurm.nodes
    if not per_node:
        raise AccelkitError("--slurm needs the number of GPUs per node", hint="pass --gpus-per-node G, e.g. 8")
    cluster_options = replace(options, num_machines=slurm.nodes, num_processes=per_node * slurm.nodes)
    labels = {"num_machines": "--num-machines"}
    if options.num_processes is None:
        labels["num_processes"] = "--num-machines x --gpus-per-node"
    config_file = request.config_file.resolve() if request.config_file is not None else None
    cluster_request = replace(request, options=cluster_options, config_file=config_file, for_cluster=True,
                              source_labels=labels)
    slurm = replace(slurm, gpus_per_node=0 if request.cpu else per_node,
                    port=options.main_process_port or slurm.port)

    config_path = slurm_config_path(sbatch_path)
    from accelkit.fsio import writable_target

    for path in (sbatch_path, config_path):  # both refusable before either is written
        writable_target(path)
    # Resolved here once, so a bad option fails now rather than on the cluster; the config beside the script shows
    # what every node will use (each node resolves the same request again, for its own rank).
    prepared = prepare_launch(cluster_request, config_path=config_path, check_hardware=False)
    write_sbatch(sbatch_path, render_sbatch(cluster_request, slurm))
    return config_path, prepared.summary
