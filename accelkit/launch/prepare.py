"""From a LaunchRequest to a LaunchPlan: build the config, decide CPU rehearsal, check what can be checked before
anything starts (script, GPUs, DeepSpeed), write the config file, then call the pure plan function."""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from accelkit.errors import AccelkitError
from accelkit.launch.plan import LauncherFlags, LaunchPlan, LaunchTarget, backend_name, needs_gpus, plan_launch
from accelkit.launch.ports import free_port
from accelkit.launch.request import LaunchRequest
from accelkit.launch.summary import describe

DEEPSPEED_INSTALL_HINT = "pip install 'accelkit[deepspeed]' (or: pip install deepspeed)"


@dataclass
class PreparedLaunch:
    plan: LaunchPlan
    summary: list[str]  # what was used and where each value came from, one line each
    temp_dir: Path | None  # created for the config file; the caller removes it when the job is over


def check_target(target: LaunchTarget, cwd: Path | None = None) -> None:
    """The script (or module) must exist before any process starts."""
    cwd = cwd or Path.cwd()
    if target.module:
        top = target.script.split(".")[0]
        found = (cwd / top).is_dir() or (cwd / f"{top}.py").is_file() or importlib.util.find_spec(top) is not None
        if not found:
            raise AccelkitError(f"module `{target.script}` not found (nothing named `{top}` is importable here)",
                                hint="run from the directory that contains the package, or install it")
        return
    path = cwd / target.script
    if not path.exists():
        raise AccelkitError(f"script not found: {target.script}",
                            hint="check the path (relative to the current directory); use -m NAME to run a module")
    if not path.is_file():
        raise AccelkitError(f"not a file: {target.script}", hint="pass the training script itself, e.g. train.py")


def resolve_config(request: LaunchRequest) -> tuple[dict[str, Any], dict[str, Any] | None, dict[str, str]]:
    """(config, base, env): the job's config built from the options on top of --config FILE (if any), that base,
    and environment variables for settings a config file cannot hold."""
    from accelkit.configs import build_config, load_config

    base = None
    if request.config_file is not None:
        if not request.config_file.is_file():
            raise AccelkitError(f"config file not found: {request.config_file}",
                                hint="write one with `accelkit config ... -o FILE`, or use --backend")
        base = load_config(request.config_file)
    options = request.options
    steps = options.gradient_accumulation_steps
    if steps is None:
        return build_config(options, base=base), base, {}
    if steps < 1:
        raise AccelkitError(f"--gradient-accumulation-steps must be at least 1 (got {steps})",
                            hint="pass --gradient-accumulation-steps 1 for none")
    # Only DeepSpeed configs store accumulation; for the other backends Accelerator() reads it from this variable.
    config = build_config(replace(options, gradient_accumulation_steps=None), base=base)
    if backend_name(config) == "deepspeed":
        return build_config(options, base=base), base, {}
    return config, base, {"ACCELERATE_GRADIENT_ACCUMULATION_STEPS": str(steps)}


def check_gpus(config: dict[str, Any], config_file: Path | None = None) -> None:
    """A GPU backend on a machine without (enough) GPUs would start ranks that never connect: refuse instead.
    `config_file`: the --config FILE the backend came from (None when --backend chose it)."""
    import torch

    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    name = backend_name(config)
    machines = int(config.get("num_machines", 1) or 1)
    per_machine = int(config.get("num_processes", 1) or 1) // max(machines, 1)
    if available == 0 and config_file is not None:  # say what the user gave: the file (issue #14 item 9)
        raise AccelkitError(f"{config_file} is a {name} config, which needs GPUs, and this machine has none",
                            hint=f"add --cpu to rehearse it on {per_machine} CPU processes "
                                 f"(`accelkit launch --cpu --config {config_file} ...`)")
    if available == 0:
        raise AccelkitError(f"--backend {name} runs on GPUs, and this machine has none",
                            hint=f"add --cpu to rehearse {name} on {per_machine} CPU processes "
                                 f"(`accelkit launch --cpu --backend {name} ...`)")
    if available < per_machine:
        raise AccelkitError(f"{per_machine} processes per machine need {per_machine} GPUs; this machine has "
                            f"{available}", hint=f"pass --num-processes {available * machines}")


def check_deepspeed() -> None:
    if importlib.util.find_spec("deepspeed") is None:
        raise AccelkitError("the config uses DeepSpeed, which is not installed", hint=DEEPSPEED_INSTALL_HINT)


def launcher_flags(request: LaunchRequest, config: dict[str, Any], base: dict[str, Any] | None) -> tuple[
        LauncherFlags, str]:
    """Per-machine flags (rank, address, port) and where the port came from."""
    flags = request.flags
    machines = int(config.get("num_machines", 1) or 1)
    port = config.get("main_process_port")
    if request.for_cluster:  # the SLURM script fills rank, address and port on each node
        return replace(flags, machine_rank=None, main_process_ip=None, main_process_port=None), "sbatch script"
    if machines > 1:
        ip = config.get("main_process_ip")
        if not ip:
            raise AccelkitError(f"--num-machines {machines} needs the address of machine 0",
                                hint="pass --main-process-ip ADDRESS (the same on every machine)")
        if request.options.main_process_port is not None:
            source = "--main-process-port"
        else:
            source = str(request.config_file) if base is not None and base.get("main_process_port") else "default"
        return replace(flags, machine_rank=int(config.get("machine_rank", 0) or 0), main_process_ip=str(ip),
                       main_process_port=int(port or 29500)), source
    if request.options.main_process_port is not None:
        return replace(flags, main_process_port=int(request.options.main_process_port)), "--main-process-port"
    if base is not None and base.get("main_process_port"):
        return replace(flags, main_process_port=int(base["main_process_port"])), str(request.config_file)
    # One machine and no port asked for: pick a free one, so two jobs on one machine do not collide on 29500.
    return replace(flags, main_process_port=free_port()), "free port"


def prepare_launch(request: LaunchRequest, *, config_path: Path | None = None,
                   check_hardware: bool = True) -> PreparedLaunch:
    """Resolve everything about a launch. The config goes to `config_path`, or to a new temporary directory
    (returned as `temp_dir`). `check_hardware=False` (dry-run, SLURM) plans for another machine: no GPU or
    DeepSpeed checks here."""
    check_target(request.target)
    config, base, config_env = resolve_config(request)
    name = backend_name(config)
    cpu = request.cpu or name == "cpu" or bool(config.get("use_cpu"))
    flags, port_source = launcher_flags(request, config, base)

    from accelkit.configs import write_config, write_deepspeed_json

    # A DeepSpeed JSON asked for with --deepspeed-json must exist before the rehearsal reads it or a launcher runs.
    write_deepspeed_json(config)

    env: dict[str, str] = {}
    rehearsal = None
    bootstrap = False
    notes: list[str] = []
    launch_config: dict[str, Any] = config
    if cpu:
        from accelkit.rehearsal import prepare_rehearsal

        rehearsal_plan = prepare_rehearsal(config)
        launch_config, env, rehearsal = rehearsal_plan.launch_config, dict(rehearsal_plan.env), rehearsal_plan.backend
        # Ranks start in the rehearsal bootstrap (which installs the shim) unless the rehearsal needs no patch.
        bootstrap = rehearsal_plan.bootstrap
        notes = list(rehearsal_plan.notes)
    elif check_hardware:
        if needs_gpus(config):
            check_gpus(config, None if request.options.backend else request.config_file)
        if config.get("distributed_type") == "DEEPSPEED":
            check_deepspeed()
    if not cpu:  # NCCL flight recorder for GPU launches (accelkit.launch.collective_debug, issue #15)
        from accelkit.launch.collective_debug import gpu_debug_env

        env.update(gpu_debug_env())

    env = {**config_env, **env}
    if request.probes:  # per-rank instruments (bench, plan --measure): ranks start in the bootstrap, GPUs too
        from accelkit.rehearsal.bootstrap import PROBES_ENV

        env[PROBES_ENV] = ",".join(request.probes)
        bootstrap = True
    temp_dir = None
    if config_path is None:
        temp_dir = Path(tempfile.mkdtemp(prefix="accelkit-launch-"))
        config_path = temp_dir / "accelerate_config.yaml"
    write_config(dict(launch_config), config_path, request.command_line)

    plan = plan_launch(launch_config, config_path, request.target, flags, python=sys.executable, env=env,
                       rehearsal=rehearsal, bootstrap=bootstrap, notes=notes)
    summary = describe(request, config, base, plan, port_source=port_source)
    return PreparedLaunch(plan=plan, summary=summary, temp_dir=temp_dir)
