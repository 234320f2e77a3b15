"""Say which values a launch uses and where each came from (a command-line option, the --config file, a preset,
or a default), so nobody has to guess which of three places won. Everything is read from the ResolvedConfig (its
values and their sources) and the LaunchPlan (its fields); nothing is parsed back from the command."""

from __future__ import annotations

import shlex
from typing import Any

from accelkit.configs import Backend, ResolvedConfig
from accelkit.launch.launch_plan import LaunchPlan

# (label, option name) of the values worth a word, by backend
_COMMON = (("processes", "num_processes"), ("machines", "num_machines"), ("mixed_precision", "mixed_precision"))
_MULTI_MACHINE = (("machine_rank", "machine_rank"), ("main_process_ip", "main_process_ip"))
_BY_BACKEND = {
    Backend.FSDP: (("fsdp_version", "fsdp_version"), ("sharding", "sharding"), ("state_dict", "state_dict"),
                   ("offload_params", "offload")),
    Backend.DEEPSPEED: (("zero_stage", "zero_stage"), ("offload_optimizer", "offload_optimizer"),
                        ("offload_params", "offload_params"),
                        ("gradient_accumulation_steps", "gradient_accumulation_steps"),
                        ("deepspeed_config_file", "deepspeed_json")),
}
_FLAGS = ("max_restarts", "rdzv_backend", "rdzv_conf", "same_network")


def summary_lines(request: Any, config: ResolvedConfig, plan: LaunchPlan, *, port_source: str) -> list[str]:
    """Summary lines (stderr) for a launch: target, each value with its origin, what rehearsal does, warnings."""
    items = [f"backend={config.backend} ({config.source('backend')})"]
    rows = list(_COMMON)
    if config.num_machines > 1 and config.per_machine:
        rows += _MULTI_MACHINE
    rows += _BY_BACKEND.get(config.backend, ())
    for label, name in rows:
        value = config.value(name)
        if value is not None:
            items.append(f"{label}={value} ({config.source(name)})")
    if config.parallelism is not None:  # the N-D layout, as Accelerate names its mesh dimensions
        items.append(f"layout={config.parallelism.describe()}")
    if config.backend is not Backend.DEEPSPEED and config.gradient_accumulation_steps is not None:
        items.append(f"gradient_accumulation_steps={config.gradient_accumulation_steps} "
                     f"({config.source('gradient_accumulation_steps')})")
    if plan.port is not None:
        items.append(f"main_process_port={plan.port} ({port_source})")
    for flag in _FLAGS:
        value = getattr(request.flags, flag, None)
        if value not in (None, False):
            items.append(f"{flag}={value} (--{flag.replace('_', '-')})")

    verb = "cluster job for" if request.for_cluster else "launching"
    lines = [f"accelkit: {verb} {plan.target.describe()}: " + ", ".join(items)]
    if plan.rehearsal is not None:
        how = "with the accelkit CPU shim" if plan.bootstrap else "unpatched"
        what = "CPU job (DDP)" if config.backend is Backend.CPU else f"CPU rehearsal of {plan.rehearsal}"
        lines.append(f"accelkit: {what}: {plan.config.processes_per_machine} gloo rank(s) on this machine, {how}")
    if plan.env:
        lines.append(f"accelkit: environment for the ranks: {plan.env_prefix()}")
    lines += [f"accelkit: {note}" for note in plan.notes]
    for finding in config.findings:
        if not finding.accelerate_only:
            lines += finding.lines().splitlines()
    return lines


def dry_run_text(prepared: Any) -> str:
    """What --dry-run prints: comments (summary, config, the `accelerate launch` spelling) and, last, the command.
    The whole text can be pasted into a shell."""
    plan = prepared.plan
    lines = ["# accelkit launch --dry-run: nothing was started. The command below runs the job."]
    lines += [f"# {line.removeprefix('accelkit: ')}" for line in prepared.summary]
    lines.append(f"# Accelerate config, written to {plan.config_path} (shown without its comments):")
    lines += [f"#   {text}" for text in plan.config_path.read_text().splitlines()
              if text.strip() and not text.lstrip().startswith("#")]
    lines.append("# The same launch with Accelerate's CLI (which exits 1 instead of the failing rank's status):")
    prefix = plan.env_prefix()
    lines.append("#   " + (prefix + " " if prefix else "") + shlex.join(plan.accelerate_cli_argv()))
    lines.append(plan.shell_command())
    return "\n".join(lines)
