"""The exact launcher command and environment of a job, as a structured LaunchPlan: a pure function of its inputs.

Nothing here touches the file system, the network or the environment, so the command a launch runs, the command
`--dry-run` prints and the command the SLURM script runs on every node all come from the same fields; `argv` is
derived from them and nothing parses it back.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from accelkit.configs import Backend, ResolvedConfig

# The entry point every launch runs: Accelerate's launch parser and launch function, exiting with the failing
# rank's status (see accelerate_main.py).
LAUNCHER_MODULE = "accelkit.launch.accelerate_main"
# The module each rank starts in when something must be installed before the user's script: the CPU rehearsal
# shim, or per-rank probes (owned by accelkit.rehearsal).
BOOTSTRAP_MODULE = "accelkit.ranks.bootstrap"

# Top-level config keys `accelerate launch` reads only from its command line: a value in the YAML is ignored,
# so a launch passes them as flags.
FLAG_ONLY_CONFIG_KEYS = ("rdzv_backend", "same_network", "enable_cpu_affinity")


@dataclass(frozen=True)
class LaunchTarget:
    """What every rank runs: a script path (or a module name with `module=True`) and its arguments, verbatim."""

    script: str
    args: tuple[str, ...] = ()
    module: bool = False

    def argv(self, *, bootstrap: bool) -> list[str]:
        """The launcher's positional part: the script (or `--module NAME`) and its arguments."""
        if bootstrap:
            inner = ["-m", self.script] if self.module else [self.script]
            return ["--module", BOOTSTRAP_MODULE, *inner, *self.args]
        if self.module:
            return ["--module", self.script, *self.args]
        return [self.script, *self.args]

    def describe(self) -> str:
        return f"-m {self.script}" if self.module else self.script


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

    def argv(self) -> list[str]:
        out: list[str] = []
        for f in fields(self):  # argv follows the field order
            value = getattr(self, f.name)
            if value is None:
                continue
            if isinstance(value, bool):  # store_true flags: present or absent
                if value:
                    out.append(f"--{f.name}")
            else:
                out += [f"--{f.name}", str(value)]
        return out

    def without_machine(self) -> LauncherFlags:
        """The flags every machine of a cluster shares: no rank, main address or port (each node adds its own)."""
        return replace(self, machine_rank=None, main_process_ip=None, main_process_port=None)


@dataclass(frozen=True)
class LaunchPlan:
    """The resolved launch: `python -m <launcher_module> --config_file <config_path> <flags> <target>`, run with
    `env` added to the inherited environment."""

    python: str
    config: ResolvedConfig  # what config_path holds (on CPU: the rehearsal's launch config)
    config_path: Path
    target: LaunchTarget
    flags: LauncherFlags = field(default_factory=LauncherFlags)
    bootstrap: bool = False  # every rank starts in BOOTSTRAP_MODULE, which then runs the target unmodified
    env: Mapping[str, str] = field(default_factory=dict)
    rehearsal: Backend | None = None  # the backend rehearsed on CPU processes; None for a plain (GPU) launch
    notes: tuple[str, ...] = ()  # decisions worth telling the user (see summary)
    launcher_module: str = LAUNCHER_MODULE

    @property
    def port(self) -> int | None:
        return self.flags.main_process_port

    def launcher_args(self) -> list[str]:
        """Everything after the launcher module: what `accelerate launch` itself takes."""
        return ["--config_file", str(self.config_path), *self.flags.argv(), *self.target.argv(bootstrap=self.bootstrap)]

    @property
    def argv(self) -> list[str]:
        return [self.python, "-m", self.launcher_module, *self.launcher_args()]

    def accelerate_cli_argv(self) -> list[str]:
        """The same launch spelled with Accelerate's own CLI (`accelerate launch ...`)."""
        return ["accelerate", "launch", *self.launcher_args()]

    def env_prefix(self) -> str:
        return " ".join(f"{name}={shlex.quote(value)}" for name, value in sorted(self.env.items()))

    def shell_command(self) -> str:
        """The command as one copy-pasteable shell line: `VAR=value ... python -m ... script args`."""
        prefix = self.env_prefix()
        return (prefix + " " if prefix else "") + shlex.join(self.argv)


def lift_flag_only_keys(config: ResolvedConfig, flags: LauncherFlags) -> LauncherFlags:
    """`flags` plus the launcher-only settings found in the config (an explicit flag wins)."""
    lifted = {key: config.extra[key] for key in FLAG_ONLY_CONFIG_KEYS if key in config.extra}
    lifted.update({key: value for key, value in asdict(flags).items() if value is not None})
    ds_extra = config.deepspeed.extra if config.deepspeed is not None else {}
    if config.backend is Backend.DEEPSPEED and config.num_machines > 1 and "deepspeed_multinode_launcher" not in \
            lifted and "deepspeed_multinode_launcher" not in ds_extra:
        # Accelerate's default multi-node DeepSpeed launcher is pdsh (ssh from one node into all others); accelkit
        # starts one launcher per machine instead (like torchrun or srun), which is the `standard` launcher.
        lifted["deepspeed_multinode_launcher"] = "standard"
    return LauncherFlags(**lifted)


def plan_launch(config: ResolvedConfig, config_path: Path, target: LaunchTarget, flags: LauncherFlags, *,
                python: str, env: Mapping[str, str] | None = None, rehearsal: Backend | None = None,
                bootstrap: bool | None = None, notes: tuple[str, ...] | list[str] = ()) -> LaunchPlan:
    """The launch of `target` with `config` stored at `config_path`.

    `env` holds the variables the ranks need on top of the inherited environment (a CPU rehearsal's, see
    accelkit.rehearsal.rehearse); `rehearsal` names the rehearsed backend. With `bootstrap` (default: whenever
    rehearsing) every rank starts in the rehearsal bootstrap, which installs the CPU shim (and any probes) and then
    runs the script unmodified.
    """
    return LaunchPlan(python=python, config=config, config_path=Path(config_path), target=target,
                      flags=lift_flag_only_keys(config, flags),
                      bootstrap=rehearsal is not None if bootstrap is None else bootstrap, env=dict(env or {}),
                      rehearsal=rehearsal, notes=tuple(notes))
