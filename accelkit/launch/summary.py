"""Say which values a launch uses and where each came from (a command-line option, the --config file, a preset,
or a default), so nobody has to guess which of three places won."""

from __future__ import annotations

import shlex
from typing import Any

from accelkit.launch.plan import BOOTSTRAP_MODULE, LaunchPlan, accelerate_cli_argv, backend_name

# (label, option field, path of the key in an Accelerate config)
_COMMON = [
    ("processes", "num_processes", ("num_processes",)),
    ("machines", "num_machines", ("num_machines",)),
    ("mixed_precision", "mixed_precision", ("mixed_precision",)),
]
_MULTI_MACHINE = [
    ("machine_rank", "machine_rank", ("machine_rank",)),
    ("main_process_ip", "main_process_ip", ("main_process_ip",)),
]
_FSDP = [
    ("fsdp_version", "fsdp_version", ("fsdp_config", "fsdp_version")),
    ("reshard_after_forward", "sharding", ("fsdp_config", "fsdp_reshard_after_forward")),
    ("sharding_strategy", "sharding", ("fsdp_config", "fsdp_sharding_strategy")),
    ("state_dict", "state_dict", ("fsdp_config", "fsdp_state_dict_type")),
    ("offload_params", "offload", ("fsdp_config", "fsdp_offload_params")),
]
_DEEPSPEED = [
    ("zero_stage", "zero_stage", ("deepspeed_config", "zero_stage")),
    ("offload_optimizer", "offload_optimizer", ("deepspeed_config", "offload_optimizer_device")),
    ("offload_params", "offload_params", ("deepspeed_config", "offload_param_device")),
    ("gradient_accumulation_steps", "gradient_accumulation_steps", ("deepspeed_config", "gradient_accumulation_steps")),
    ("deepspeed_config_file", "deepspeed_json", ("deepspeed_config", "deepspeed_config_file")),
]


def _lookup(config: dict[str, Any] | None, path: tuple[str, ...]) -> Any:
    node: Any = config or {}
    for key in path:
        if not isinstance(node, dict):
            return None
        # Accelerate accepts fsdp_config keys with or without their `fsdp_` prefix.
        node = node.get(key, node.get(key.removeprefix("fsdp_")) if key.startswith("fsdp_") else None)
    return node


def _source(field: str, path: tuple[str, ...], request: Any, base: dict[str, Any] | None) -> str:
    options = request.options
    if field in request.source_labels:
        return request.source_labels[field]
    if getattr(options, field, None) not in (None, ()):
        return "--" + field.replace("_", "-")
    if field in ("offload_optimizer", "offload_params") and getattr(options, "offload", None) is not None:
        return "--offload"
    if base is not None and _lookup(base, path) is not None:
        return str(request.config_file)
    if getattr(options, "preset", None):
        return f"preset {options.preset}"
    return "default"


def describe(request: Any, config: dict[str, Any], base: dict[str, Any] | None, plan: LaunchPlan, *,
             port_source: str) -> list[str]:
    """Summary lines (stderr) for a launch: target, each value with its origin, and what rehearsal does."""
    name = backend_name(config)
    backend_source = _source("backend", ("distributed_type",), request, base)
    items = [f"backend={name} ({backend_source})"]
    rows = list(_COMMON)
    if int(config.get("num_machines", 1) or 1) > 1 and not request.for_cluster:
        rows += _MULTI_MACHINE
    if name == "fsdp":
        rows += _FSDP
    elif name == "deepspeed":
        rows += _DEEPSPEED
    for label, field, path in rows:
        value = _lookup(config, path)
        if value is None:
            continue
        items.append(f"{label}={value} ({_source(field, path, request, base)})")
    steps = plan.env.get("ACCELERATE_GRADIENT_ACCUMULATION_STEPS")
    if steps is not None:
        items.append(f"gradient_accumulation_steps={steps} (--gradient-accumulation-steps)")
    port = plan_port(plan)
    if port is not None:
        items.append(f"main_process_port={port} ({port_source})")
    for flag in ("max_restarts", "rdzv_backend", "rdzv_conf", "same_network"):
        value = getattr(request.flags, flag, None)
        if value not in (None, False):
            items.append(f"{flag}={value} (--{flag.replace('_', '-')})")

    target = f"-m {request.target.script}" if request.target.module else request.target.script
    verb = "SLURM job for" if request.for_cluster else "launching"
    lines = [f"accelkit: {verb} {target}: " + ", ".join(items)]
    if plan.rehearsal is not None:
        processes = int(plan.config.get("num_processes", 1) or 1) // max(int(plan.config.get("num_machines", 1)
                                                                               or 1), 1)
        how = "with the accelkit CPU shim" if BOOTSTRAP_MODULE in plan.argv else "unpatched"
        what = "CPU job (DDP)" if name == "cpu" else f"CPU rehearsal of {plan.rehearsal}"
        lines.append(f"accelkit: {what}: {processes} gloo rank(s) on this machine, {how}")
    if plan.env:
        lines.append("accelkit: environment for the ranks: "
                     + " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(plan.env.items())))
    lines += [f"accelkit: {note}" for note in plan.notes]
    return lines


def plan_port(plan: LaunchPlan) -> str | None:
    if "--main_process_port" in plan.argv:
        return plan.argv[plan.argv.index("--main_process_port") + 1]
    return None


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
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(plan.env.items()))
    lines.append("#   " + (prefix + " " if prefix else "") + shlex.join(accelerate_cli_argv(plan)))
    lines.append(plan.shell_command())
    return "\n".join(lines)
