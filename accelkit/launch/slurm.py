"""Write an sbatch script that starts one launcher per node with srun.

SLURM allocates the nodes and starts one task on each; every task runs the same launcher command (the one
`accelkit launch` would run on that machine) with its machine rank taken from SLURM_NODEID and the main address
from the first host of the allocation. torchrun, under the launcher, starts the ranks of its node.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, replace
from pathlib import Path

from accelkit.errors import AccelkitError
from accelkit.launch.plan import LaunchPlan
from accelkit.launch.request import LaunchRequest


@dataclass(frozen=True)
class SlurmOptions:
    nodes: int
    gpus_per_node: int
    partition: str | None = None
    time: str | None = None
    job_name: str = "accelkit"
    port: int = 29500
    chdir: Path | None = None  # directory the job runs in (where relative script paths resolve)


def render_sbatch(plan: LaunchPlan, options: SlurmOptions, command_line: str) -> str:
    """The sbatch script text for `plan`, a plan without per-machine values (its config describes all nodes)."""
    # On the cluster the job uses whichever `python` its environment provides, not this machine's.
    head = ["python", "-m", plan.launcher_module]
    rest = plan.launcher_args()

    header = [
        "#!/bin/bash",
        f"#SBATCH --job-name={options.job_name}",
        f"#SBATCH --nodes={options.nodes}",
        "#SBATCH --ntasks-per-node=1",
    ]
    if options.gpus_per_node > 0:
        header.append(f"#SBATCH --gpus-per-node={options.gpus_per_node}")
    if options.partition:
        header.append(f"#SBATCH --partition={options.partition}")
    if options.time:
        header.append(f"#SBATCH --time={options.time}")
    if options.chdir is not None:
        header.append(f"#SBATCH --chdir={options.chdir}")
    header.append("#SBATCH --output=%x-%j.out")

    env_lines = [f"export {name}={shlex.quote(value)}" for name, value in sorted(plan.env.items())]
    # Each srun task evaluates its own SLURM_NODEID: the single-quoted program below is expanded on the node,
    # while the launcher arguments after it are fixed here and passed to it as "$@".
    node_program = (
        'exec ' + shlex.join(head) + ' --machine_rank "$SLURM_NODEID" '
        '--main_process_ip "$MAIN_PROCESS_IP" --main_process_port "$MAIN_PROCESS_PORT" "$@"'
    )
    body = [
        "",
        f"# Written by: {command_line}",
        "# Submit with: sbatch <this file>. Activate the job's Python environment (with accelkit installed) below.",
        "set -euo pipefail",
        "",
        "# The first node of the allocation hosts the rendezvous; every node learns its rank from SLURM_NODEID.",
        "# (`|| true`: head closes the pipe after one line, and pipefail must not count scontrol's SIGPIPE)",
        'MAIN_PROCESS_IP="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1 || true)"',
        'if [ -z "$MAIN_PROCESS_IP" ]; then',
        '  echo "accelkit: no host in SLURM_JOB_NODELIST (${SLURM_JOB_NODELIST:-unset}); submit with sbatch" >&2',
        "  exit 1",
        "fi",
        f'MAIN_PROCESS_PORT="${{MAIN_PROCESS_PORT:-{options.port}}}"',
        "export MAIN_PROCESS_IP MAIN_PROCESS_PORT",
        *env_lines,
        "",
        "# One launcher per node; it starts that node's ranks. --kill-on-bad-exit ends the job when one fails.",
        "srun --nodes=\"$SLURM_JOB_NUM_NODES\" --ntasks-per-node=1 --kill-on-bad-exit=1 \\",
        f"  bash -c {shlex.quote(node_program)} accelkit-node \\",
        "  " + shlex.join(rest),
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


def write_slurm_job(request: LaunchRequest, slurm: SlurmOptions, sbatch_path: Path) -> tuple[Path, list[str]]:
    """Write the sbatch script for `request` and its config; return the config path and the summary lines."""
    from accelkit.launch.prepare import prepare_launch

    options = request.options
    if options.num_machines is not None and options.num_machines != slurm.nodes:
        raise AccelkitError(f"--nodes {slurm.nodes} and --num-machines {options.num_machines} disagree",
                            hint="with --slurm, --nodes is the number of machines: drop --num-machines")
    if options.machine_rank is not None or options.main_process_ip is not None:
        raise AccelkitError("--machine-rank and --main-process-ip come from SLURM in the sbatch script",
                            hint="drop them; each node takes its rank from SLURM_NODEID")
    per_node = slurm.gpus_per_node
    if options.num_processes is not None:
        if per_node and options.num_processes != per_node * slurm.nodes:
            raise AccelkitError(f"--num-processes {options.num_processes} is not --nodes x --gpus-per-node "
                                f"({slurm.nodes} x {per_node})", hint="drop --num-processes; it is the total")
        if options.num_processes % slurm.nodes:
            raise AccelkitError(f"--num-processes {options.num_processes} does not split over {slurm.nodes} nodes",
                                hint="pass --gpus-per-node G instead")
        per_node = options.num_processes // slurm.nodes
    if not per_node:
        raise AccelkitError("--slurm needs the number of GPUs per node", hint="pass --gpus-per-node G, e.g. 8")
    cluster_options = replace(options, num_machines=slurm.nodes, num_processes=per_node * slurm.nodes)
    labels = {"num_machines": "--nodes"}
    if options.num_processes is None:
        labels["num_processes"] = "--nodes x --gpus-per-node"
    cluster_request = replace(request, options=cluster_options, for_cluster=True, source_labels=labels)
    slurm = replace(slurm, gpus_per_node=0 if request.cpu else per_node, port=options.main_process_port or slurm.port)

    config_path = slurm_config_path(sbatch_path)
    from accelkit.fsio import writable_target

    for path in (sbatch_path, config_path):  # both refusable before either is written
        writable_target(path)
    prepared = prepare_launch(cluster_request, config_path=config_path, check_hardware=False)
    write_sbatch(sbatch_path, render_sbatch(prepared.plan, slurm, request.command_line))
    return config_path, prepared.summary
