"""The one place where bench meets the config -> launch spine: options per run, the launch request, checking it
before anything starts, and one supervised launch with the probe installed (GPUs and CPU rehearsal alike).

Everything else in accelkit.bench works on the typed values of spec.py and on the ranks' result files, so when the
spine changes (typed ResolvedConfig / LaunchPlan) only this module follows.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from accelkit.bench import PROBE_MODULE
from accelkit.configs import Mesh
from accelkit.ranks.probes import MAX_STEPS_ENV, PROBE_DIR_ENV

if TYPE_CHECKING:
    from accelkit.launch import RunOutcome


@dataclass(frozen=True)
class LaunchSettings:
    """What every run of a sweep shares: the config options as given (num_processes and backend set per run), the
    base config file, CPU rehearsal, and the launcher's rendezvous flags."""

    options: Any  # accelkit.configs.ConfigOptions
    config_file: Path | None = None
    cpu: bool = False
    flags: Any = None  # accelkit.launch.LauncherFlags
    command_line: str = "accelkit bench"


def launch_settings(options: Any, config_file: Path | None, cpu: bool, *, rdzv_backend: str | None = None,
                    rdzv_conf: str | None = None, same_network: bool | None = None,
                    command_line: str = "accelkit bench") -> LaunchSettings:
    from accelkit.launch import LauncherFlags

    flags = LauncherFlags(rdzv_backend=rdzv_backend, rdzv_conf=rdzv_conf, same_network=same_network)
    return LaunchSettings(options=options, config_file=config_file, cpu=cpu, flags=flags, command_line=command_line)


def _resolved(settings: LaunchSettings, backend: str | None = None):
    """The job's ResolvedConfig for these settings (the --backend of one run when given)."""
    from accelkit.configs import load_accelerate_config, resolve_config

    options = settings.options if backend is None else replace(settings.options, backend=backend)
    if options.pp_size is None:  # --layouts: the pipeline's schedule and microbatches go to its pp layouts only
        options = replace(options, pp_schedule=None, microbatches=None)
    base = load_accelerate_config(settings.config_file) if settings.config_file is not None else None
    return resolve_config(replace(options, gradient_accumulation_steps=None), base=base,
                          base_label=str(settings.config_file) if base is not None else None, launch=True)


def num_machines(settings: LaunchSettings) -> int:
    """Machines of the job (--num-machines, else the config file's, else 1)."""
    if settings.options.num_machines:
        return int(settings.options.num_machines)
    if settings.config_file is not None and settings.config_file.is_file():
        return _resolved(settings).num_machines
    return 1


def asked_backend(settings: LaunchSettings) -> str | None:
    """The backend named by --backend (None: not given)."""
    return settings.options.backend


def backend_given(settings: LaunchSettings) -> bool:
    """Whether the user named a backend (by --backend, a preset or a config file)."""
    return bool(settings.options.backend or settings.options.preset or settings.config_file)


def available_devices(cpu: bool) -> int:
    """GPUs on this machine, or (with --cpu, or without GPUs) the CPU cores this process may use."""
    from accelkit.hardware import cpu_cores, gpu_count

    gpus = 0 if cpu else gpu_count()
    return gpus if gpus > 0 else cpu_cores()


def backend_of(settings: LaunchSettings, backend: str | None) -> str:
    """accelkit's name of the backend a run uses (from --backend, else the config file, else the default)."""
    return _resolved(settings, backend).backend.value


def launched_backend(backend: str, num_processes: int) -> str:
    """One process of a DDP sweep is the plain single-process run (DDP with one process distributes nothing)."""
    return "single" if backend in ("ddp", "cpu") and num_processes == 1 else backend


def request_for(settings: LaunchSettings, backend: str, num_processes: int, script: str, args: tuple[str, ...],
                *, module: bool, probes: tuple[str, ...], layout: Mesh | None = None):
    from accelkit.launch import LauncherFlags, LaunchRequest, LaunchTarget

    sizes: dict[str, int | None] = {}
    if layout is not None:  # --layouts: the N-D flags of `accelkit launch`
        sizes = {**layout.option_values(), **({} if layout.pp > 1 else {"pp_schedule": None, "microbatches": None})}
    options = replace(settings.options, backend=backend, num_processes=num_processes, **sizes)
    if options.model_config is None:  # as `accelkit launch`: the model the rule set checks tp and pp against
        from accelkit.configs import model_from_script_args

        options = replace(options, model_config=model_from_script_args(args, script=None if module else script))
    return LaunchRequest(target=LaunchTarget(script=script, args=tuple(args), module=module), options=options,
                         config_file=settings.config_file, cpu=settings.cpu,
                         flags=settings.flags or LauncherFlags(), command_line=settings.command_line, probes=probes)


def script_request(settings: LaunchSettings, backend: str, num_processes: int, script: str, args: tuple[str, ...],
                   module: bool, layout: Mesh | None = None):
    return request_for(settings, backend, num_processes, script, args, module=module, probes=(PROBE_MODULE,),
                       layout=layout)


def comm_request(settings: LaunchSettings, backend: str, num_processes: int, args: tuple[str, ...]):
    from accelkit.bench import COMM_MODULE

    return request_for(settings, backend, num_processes, COMM_MODULE, args, module=True, probes=())


def check_script_exists(script: str, module: bool) -> None:
    """The script (or module) exists: checked first, before the heavier config checks."""
    from accelkit.launch import LaunchTarget, check_target

    check_target(LaunchTarget(script=script, module=module))


def check_request(request) -> None:
    """Everything launch checks before a rank starts (config rules, script, GPUs, DeepSpeed), without starting."""
    from accelkit.launch import prepare_launch

    prepared = prepare_launch(request)
    if prepared.temp_dir is not None:
        shutil.rmtree(prepared.temp_dir, ignore_errors=True)


def run_bench_launch(request, *, probe_dir: Path, max_steps: int | None, env: dict[str, str], log_path: Path | None,
               timeout: float | None, stall_timeout: float | None = None) -> RunOutcome:
    """One supervised launch (accelkit.launch.run_supervised: no rank outlives it) with the probe's settings in the
    ranks' environment; the output goes to `log_path` unless it is None."""
    from accelkit.launch import Stream, SupervisedRun, run_supervised

    full_env = {**os.environ, **env, PROBE_DIR_ENV: str(probe_dir)}
    if max_steps is not None:
        full_env[MAX_STEPS_ENV] = str(max_steps)
    return run_supervised(SupervisedRun(
        request, env=full_env, stall_timeout=stall_timeout, deadline=timeout,
        stdout=Stream.INHERIT if log_path is None else log_path,
        stderr=Stream.INHERIT if log_path is None else Stream.STDOUT))
