"""The typed cluster job every target renders: the launch request for all nodes, with the job's shape checked once.

`accelkit launch --slurm/--skypilot/--kubernetes` all come here: the shape (nodes, processes per node, the GPUs the
scheduler is asked for, a fixed port) is derived from the command line in one place, the config is resolved once
(a bad option fails now, not on the cluster), and each target's renderer only spells the result in its own format.
Every node later resolves the same request again for its own rank (accelkit.launch.cluster.node), exactly as
`accelkit launch --machine-rank R` does on a bare machine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from accelkit.errors import AccelkitError
from accelkit.launch.cluster.targets.node_resources import NodeResources, check_resources, check_shape_ceilings
from accelkit.launch.request import LaunchRequest


@dataclass(frozen=True)
class ClusterTarget:
    """How a target is named to the user, in refusals and hints."""

    flag: str  # "--slurm"
    scheduler: str  # "SLURM"
    job_file: str  # "the sbatch script"
    rank_source: str  # where each node's rank comes from, e.g. "SLURM_NODEID"


@dataclass(frozen=True, kw_only=True)
class JobOptions:
    """What every target is asked for the job's shape; each target's options add what only its scheduler takes."""

    nodes: int
    gpus_per_node: int  # 0: not given (--num-processes then gives the total)
    job_name: str = "accelkit"
    stall_timeout: float | None = None  # the watchdog's, on every node (None: launch's default)
    resources: NodeResources = NodeResources()  # CPUs and memory per node (None: each target's default)
    setup: tuple[str, ...] = ()  # shell lines run on every node before its launcher (modules, a venv)


@dataclass(frozen=True)
class ClusterJob:
    """The job as every target renders it."""

    request: LaunchRequest  # what every node runs: options for all nodes (no rank, address or port)
    nodes: int
    processes_per_node: int
    gpus_per_node: int  # what the scheduler is asked for: 0 for a CPU job (--cpu)
    port: int | None  # the rendezvous port when the user fixed one (--main-process-port)
    config_path: Path  # the resolved config, written beside the job file for people to read
    summary: tuple[str, ...]  # what the launch resolved, as `accelkit launch` prints it
    backend: str = "ddp"  # the resolved backend (the rehearsed one for --cpu)
    sharded_checkpoints: bool = False  # every rank writes its own part of a checkpoint (FSDP sharded, DeepSpeed)

    @property
    def cpu(self) -> bool:
        return self.request.cpu


def config_path_for(job_path: Path) -> Path:
    """Where the job's Accelerate config goes: beside the job file (job.sbatch -> job.accelerate.yaml)."""
    return job_path.with_name(f"{job_path.stem}.accelerate.yaml")


def relative_to_workdir(path: Path, workdir: Path, what: str, target: ClusterTarget) -> Path:
    """`path` as the nodes see it: relative to the working directory the scheduler ships to every node."""
    absolute = (workdir / path).resolve()
    try:
        return absolute.relative_to(workdir.resolve())
    except ValueError:
        raise AccelkitError(f"{what} {path} is outside {workdir}, the folder every {target.scheduler} node gets",
                            hint=f"move it into {workdir} (or run accelkit launch from a folder that holds it)") \
            from None


def cluster_request(request: LaunchRequest, target: ClusterTarget, nodes: int, gpus_per_node: int | None,
                    workdir: Path | None = None) -> tuple[LaunchRequest, int]:
    """The request for all nodes and the processes per node, or a one-line refusal of a shape that does not add
    up. `gpus_per_node` (with --cpu: processes per node) may be left out when --num-processes gives the total.
    `workdir`: the folder the scheduler copies to every node (its files are named relative to it there); None: the
    nodes share this file system (SLURM), so paths are made absolute."""
    options = request.options
    if nodes < 1:
        raise AccelkitError(f"--num-machines must be at least 1 (got {nodes})",
                            hint="use 1 for one machine (--num-machines 1)")
    if options.num_machines is not None and options.num_machines != nodes:
        raise AccelkitError(f"--nodes {nodes} and --num-machines {options.num_machines} disagree",
                            hint="--nodes is another spelling of --num-machines: give one of them")
    if options.machine_rank is not None or options.main_process_ip is not None:
        raise AccelkitError(f"--machine-rank and --main-process-ip come from {target.scheduler} in "
                            f"{target.job_file}", hint=f"drop them; each node takes its rank from {target.rank_source}")
    per_node = gpus_per_node or 0
    if options.num_processes is not None:
        if per_node and options.num_processes != per_node * nodes:
            raise AccelkitError(f"--num-processes {options.num_processes} is not --num-machines x --gpus-per-node "
                                f"({nodes} x {per_node})", hint="drop --num-processes; it is the total")
        if options.num_processes % nodes:
            raise AccelkitError(f"--num-processes {options.num_processes} does not split over {nodes} nodes",
                                hint="pass --gpus-per-node G instead")
        per_node = options.num_processes // nodes
    if not per_node:
        raise AccelkitError(f"{target.flag} needs the number of GPUs per node", hint="pass --gpus-per-node G, e.g. 8")
    check_shape_ceilings(nodes, per_node, request.cpu)
    labels = {"num_machines": "--num-machines"}
    if options.num_processes is None:
        labels["num_processes"] = "--num-machines x --gpus-per-node"
    config_file, script = request.config_file, request.target
    if workdir is None:
        config_file = config_file.resolve() if config_file is not None else None
    else:
        if config_file is not None:
            config_file = relative_to_workdir(config_file, workdir, "the config", target)
        if not script.module:
            script = replace(script, script=str(relative_to_workdir(Path(script.script), workdir, "the script",
                                                                    target)))
    all_nodes = replace(options, num_machines=nodes, num_processes=per_node * nodes)
    return replace(request, target=script, options=all_nodes, config_file=config_file, for_cluster=True,
                   source_labels=labels), per_node


def plan_cluster_job(request: LaunchRequest, target: ClusterTarget, *, nodes: int, gpus_per_node: int | None,
                     config_path: Path, workdir: Path | None = None) -> ClusterJob:
    """Check the shape, resolve the config once (written to `config_path`) and return the job."""
    from accelkit.launch.build_plan import prepare_launch

    for_all, per_node = cluster_request(request, target, nodes, gpus_per_node, workdir)
    # Resolved here once, so a bad option fails now rather than on the cluster; the config beside the job file
    # shows what every node will use (each node resolves the same request again, for its own rank).
    prepared = prepare_launch(for_all, config_path=config_path, check_hardware=False)
    plan = prepared.plan
    return ClusterJob(request=for_all, nodes=nodes, processes_per_node=per_node,
                      gpus_per_node=0 if request.cpu else per_node, port=request.options.main_process_port,
                      config_path=config_path, summary=tuple(prepared.summary),
                      backend=str(plan.rehearsal or plan.config.backend),
                      sharded_checkpoints=writes_sharded_checkpoints(plan.config))


def writes_sharded_checkpoints(config: object) -> bool:
    """Whether every rank writes its own part of a checkpoint: DeepSpeed always (ZeRO's per-rank optimizer and
    parameter files), FSDP unless its state dict is gathered whole (fsdp_state_dict_type FULL_STATE_DICT)."""
    from accelkit.configs import Backend

    backend = getattr(config, "backend", None)
    if backend is Backend.DEEPSPEED:
        return True
    fsdp = getattr(config, "fsdp", None)
    return backend is Backend.FSDP and (fsdp is None or getattr(fsdp.state_dict, "value", None) != "full")


def check_setup_lines(lines: tuple[str, ...]) -> None:
    """`--setup` lines go into the job file as shell lines: one line each, not empty."""
    for line in lines:
        if not line.strip() or any(not char.isprintable() for char in line):
            raise AccelkitError(f"--setup {line!r} is not one line of shell",
                                hint="give each set-up line its own --setup, e.g. --setup 'module load cuda/12.4' "
                                     "--setup 'source ~/venv/bin/activate'")


def write_cluster_job(request: LaunchRequest, target: ClusterTarget, options: JobOptions, path: Path, force: bool,
                      render: Callable[[ClusterJob], str], *, workdir: Path | None = None,
                      mode: int = 0o644, check: Callable[[ClusterJob], None] | None = None) -> ClusterJob:
    """Refuse what cannot be written (the job file and its config beside it, both before either is written), plan
    the job once, refuse what the planned job cannot run (`check`, with the config put back as it was), then write
    `render(job)` to `path`; return the job (its summary for the user)."""
    check_setup_lines(options.setup)
    config_path = config_path_for(path)
    check_outputs([path, config_path], force)
    previous = config_path.read_bytes() if config_path.is_file() else None
    job = plan_cluster_job(request, target, nodes=options.nodes, gpus_per_node=options.gpus_per_node or None,
                           config_path=config_path, workdir=workdir)
    try:
        check_resources(options.resources, job.processes_per_node, job.cpu)
        if check is not None:
            check(job)
        text = render(job)
    except BaseException:
        if previous is None:
            config_path.unlink(missing_ok=True)
        else:
            config_path.write_bytes(previous)
        raise
    write_job_file(path, text, mode=mode)
    return job


def check_outputs(paths: list[Path], force: bool) -> None:
    """Refuse, before anything is resolved or written, an output that exists (without --force), cannot be replaced,
    or whose folder cannot take it (missing, read-only, not ours)."""
    import errno
    import os

    from accelkit.fsio import refuse_overwrite, writable_target, write_error

    for path in paths:
        writable_target(path)  # what is not a regular file is refused as such, --force or not
        refuse_overwrite(path, force)
        folder = path.absolute().parent
        if not folder.exists():
            raise AccelkitError(f"cannot write {path}: the folder {path.parent} does not exist",
                                hint="create it first, or choose another output path")
        if not folder.is_dir():
            raise write_error(OSError(errno.ENOTDIR, "not a folder"), path)
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            raise write_error(OSError(errno.EROFS, "read-only"), path)
        if not os.access(folder, os.W_OK):
            raise write_error(OSError(errno.EACCES, "permission denied"), path)


def write_job_file(path: Path, text: str, mode: int = 0o644) -> None:
    """The job file, atomically (a failed write leaves nothing behind)."""
    from accelkit.fsio import atomic_write

    atomic_write(path, text, mode=mode)


def yaml_document(comments: list[str], data: dict) -> str:
    """`data` as YAML after `comments` (lines starting with '#'); multi-line strings (shell) as literal blocks."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)

    Dumper.add_representer(str, text)
    return "\n".join(comments) + "\n" + yaml.dump(data, Dumper=Dumper, sort_keys=False, width=120)
