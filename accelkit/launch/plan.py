"""Resolve the exact launcher command line and environment for a job: a pure function of its inputs.

Nothing here touches the file system, the network or the environment, so the command a launch runs, the command
`--dry-run` prints and the command the SLURM script runs on every node all come from the same code.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

# The entry point every launch runs: Accelerate's launch parser and launch function, exiting with the failing
# rank's status (see accelerate_main.py).
LAUNCHER_MODULE = "accelkit.launch.accelerate_main"
# The module each rank runs instead of the user's script during a CPU rehearsal (owned by accelkit.rehearsal).
BOOTSTRAP_MODULE = "accelkit.rehearsal.bootstrap"

# Top-level config keys `accelerate launch` reads only from its command line: a value in the YAML is ignored,
# so a launch passes them as flags.
FLAG_ONLY_CONFIG_KEYS = ("rdzv_backend", "same_network", "enable_cpu_affinity")

BACKEND_NAMES = {"NO": "single", "MULTI_CPU": "cpu", "MULTI_GPU": "ddp", "FSDP": "fsdp", "DEEPSPEED": "deepspeed"}
GPU_DISTRIBUTED_TYPES = ("MULTI_GPU", "FSDP", "DEEPSPEED")


@dataclass(frozen=True)
class LaunchTarget:
    """What every rank runs: a script path (or a module name with `module=True`) and its arguments, verbatim."""

    script: str
    args: tuple[str, ...] = ()
    module: bool = False


@dataclass(frozen=True)
class LauncherFlags:
    """Settings handed to the launcher as flags rather than through the config file: per-machine values (the
    same YAML serves every machine) and the rendezvous settings Accelerate ignores in YAML. None = not set."""

    machine_rank: int | None = None
    main_process_ip: str | None = None
    main_process_port: int | None = None
    max_restarts: int | None = None
    monitor_interval: float | None = None
    rdzv_backend: str | None = None
    rdzv_conf: str | None = None
    same_network: bool | None = None
    enable_cpu_affinity: bool | None = None
    deepspeed_multinode_launcher: str | None = None


@dataclass(frozen=True)
class LaunchPlan:
    """The resolved launch: run `argv` with `env` added to the inherited environment."""

    argv: list[str]
    env: dict[str, str]
    config: dict[str, Any]  # the config written to config_path (on CPU: the rehearsal's launch config)
    config_path: Path
    rehearsal: str | None = None  # the backend rehearsed on CPU processes; None for a plain (GPU) launch
    notes: list[str] = field(default_factory=list)  # decisions worth telling the user (see summary)

    def shell_command(self) -> str:
        """The command as one copy-pasteable shell line: `VAR=value ... python -m ... script args`."""
        prefix = [f"{name}={shlex.quote(value)}" for name, value in sorted(self.env.items())]
        return " ".join([*prefix, shlex.join(self.argv)])


def backend_name(config: dict[str, Any]) -> str:
    """accelkit's name for a config's backend (`ddp`, `fsdp`, ...)."""
    distributed_type = str(config.get("distributed_type", "NO"))
    if distributed_type == "NO" and config.get("use_cpu"):
        return "cpu"
    return BACKEND_NAMES.get(distributed_type, distributed_type.lower())


def needs_gpus(config: dict[str, Any]) -> bool:
    """True when Accelerate would start this config on GPUs (DDP, FSDP, DeepSpeed without use_cpu)."""
    return str(config.get("distributed_type", "NO")) in GPU_DISTRIBUTED_TYPES and not config.get("use_cpu", False)


def launcher_flags_argv(config: dict[str, Any], flags: LauncherFlags) -> list[str]:
    """The launcher flags for `flags`, plus the flag-only settings found in the config (an explicit flag wins)."""
    merged: dict[str, Any] = {key: config[key] for key in FLAG_ONLY_CONFIG_KEYS if key in config}
    merged.update({key: value for key, value in vars(flags).items() if value is not None})

    num_machines = int(config.get("num_machines", 1) or 1)
    if (
        str(config.get("distributed_type")) == "DEEPSPEED"
        and num_machines > 1
        and "deepspeed_multinode_launcher" not in merged
        and "deepspeed_multinode_launcher" not in (config.get("deepspeed_config") or {})
    ):
        # Accelerate's default multi-node DeepSpeed launcher is pdsh (ssh from one node into all others); accelkit
        # starts one launcher per machine instead (like torchrun or srun), which is the `standard` launcher.
        merged["deepspeed_multinode_launcher"] = "standard"

    argv: list[str] = []
    for key in (f.name for f in fields(LauncherFlags)):  # argv follows the field order
        if key not in merged:
            continue
        value = merged[key]
        if isinstance(value, bool):  # store_true flags: present or absent
            if value:
                argv.append(f"--{key}")
        else:
            argv += [f"--{key}", str(value)]
    return argv


def target_argv(target: LaunchTarget, *, bootstrap: bool) -> list[str]:
    """The launcher's positional part: the script (or `--module NAME`) and its arguments."""
    if bootstrap:
        inner = ["-m", target.script] if target.module else [target.script]
        return ["--module", BOOTSTRAP_MODULE, *inner, *target.args]
    if target.module:
        return ["--module", target.script, *target.args]
    return [target.script, *target.args]


def plan_launch(
    config: dict[str, Any],
    config_path: Path,
    target: LaunchTarget,
    flags: LauncherFlags,
    *,
    python: str,
    env: dict[str, str] | None = None,
    rehearsal: str | None = None,
    bootstrap: bool | None = None,
    notes: list[str] | None = None,
) -> LaunchPlan:
    """The launch of `target` with the config stored at `config_path`.

    `env` holds the variables the ranks need on top of the inherited environment (a CPU rehearsal's, see
    accelkit.rehearsal.prepare_rehearsal); `rehearsal` names the rehearsed backend. With `bootstrap` (default:
    whenever rehearsing) every rank starts in the rehearsal bootstrap, which installs the CPU shim and then runs
    the script unmodified.
    """
    if bootstrap is None:
        bootstrap = rehearsal is not None
    argv = [python, "-m", LAUNCHER_MODULE, "--config_file", str(config_path)]
    argv += launcher_flags_argv(config, flags)
    argv += target_argv(target, bootstrap=bootstrap)
    return LaunchPlan(argv=argv, env=dict(env or {}), config=config, config_path=config_path, rehearsal=rehearsal,
                      notes=list(notes or []))


def accelerate_cli_argv(plan: LaunchPlan) -> list[str]:
    """The same launch spelled with Accelerate's own CLI (`accelerate launch ...`)."""
    index = plan.argv.index(LAUNCHER_MODULE)
    return ["accelerate", "launch", *plan.argv[index + 1:]]
