"""accelkit's checks on an Accelerate config dict: each finding says what is wrong and how to fix it.

These are the mistakes Accelerate's loader lets through (or reports without a fix): values the launcher silently
ignores or overrides, combinations that fail only once the processes have started, and typos in key names.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from accelkit.configs.from_config import fsdp_section
from accelkit.configs.schema import (
    DEEPSPEED_JSON_CONFLICTS,
    IGNORED_BY_LAUNCHER,
    nearest,
    nested_keys,
    section,
    top_level_keys,
)

FSDP_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")


@dataclass(frozen=True)
class Finding:
    severity: str  # "error" (will fail or silently do something else) | "warning" (works, probably not as meant)
    message: str
    fix: str


def _int(value: object, default: int) -> int | None:
    try:
        return int(value) if value is not None else default  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def _true(value: object) -> bool:
    return str(value).strip().lower() in {"true", "1", "yes"}


def problems(config: dict, deepspeed_json: dict | None = None, relative_to: Path | None = None) -> list[Finding]:
    """All findings for `config`. `deepspeed_json` is the JSON content when it is not on disk yet (build time);
    otherwise deepspeed_config_file is read, relative paths from `relative_to` (default: the current directory)."""
    found: list[Finding] = []
    found += _unknown_keys(config)
    found += _processes(config)
    dtype = str(config.get("distributed_type", "")).upper()
    mixed = str(config.get("mixed_precision") or "no")
    if mixed not in ("no", "fp16", "bf16", "fp8"):
        found.append(Finding("error", f"mixed_precision `{mixed}` is not one Accelerate knows",
                             "use no, fp16 or bf16"))
    if mixed == "fp16" and (_true(config.get("use_cpu")) or dtype == "MULTI_CPU"):
        found.append(Finding("error", "fp16 mixed precision on CPU: CPUs do not run fp16 autocast",
                             "set `mixed_precision: bf16` (or no) for CPU runs"))
    multi_node = (_int(config.get("num_machines"), 1) or 1) > 1
    for key, default in IGNORED_BY_LAUNCHER.items():
        # rendezvous settings only matter across machines; CPU affinity matters anywhere
        if key in config and config[key] != default and (multi_node or key == "enable_cpu_affinity"):
            flag = "--" + key
            found.append(Finding("warning", f"`{key}: {config[key]}` has no effect: `accelerate launch` reads it only "
                                            f"from its {flag} flag", f"remove it and pass {flag} when launching"))
    if dtype == "FSDP":
        found += _fsdp(config)
    if dtype == "DEEPSPEED":
        found += _deepspeed(config, deepspeed_json, relative_to)
    return found


def _unknown_keys(config: dict) -> list[Finding]:
    found = []
    valid = top_level_keys()
    for key in sorted(set(config) - valid):
        guess = nearest(key, valid)
        fix = f"rename it to `{guess}`" if guess else "remove it (Accelerate's loader refuses unknown keys)"
        found.append(Finding("error", f"unknown key `{key}`: Accelerate refuses to load the file", fix))
    if "distributed_type" not in config:
        found.append(Finding("error", "`distributed_type` is missing (it is the one required key)",
                             "add e.g. `distributed_type: MULTI_GPU` (or regenerate with `accelkit config`)"))
    for name in ("fsdp_config", "deepspeed_config", "parallelism_config", "mpirun_config", "dynamo_config"):
        if config.get(name) is not None and not isinstance(config[name], dict):
            found.append(Finding("error", f"`{name}` must be a mapping of keys, not {config[name]!r}",
                                 f"write `{name}:` followed by indented `key: value` lines, or remove it"))
    for name in ("fsdp_config", "deepspeed_config"):
        valid_nested = nested_keys(name) or frozenset()
        for key in sorted(section(config, name), key=str):
            spelled = str(key) if name != "fsdp_config" or str(key).startswith("fsdp_") else f"fsdp_{key}"
            if spelled in valid_nested:
                continue
            guess = nearest(spelled, valid_nested)
            fix = f"rename it to `{guess}`" if guess else "remove it"
            found.append(Finding("error", f"unknown key `{name}.{key}`: `accelerate launch` silently ignores it", fix))
    return found


def _processes(config: dict) -> list[Finding]:
    found = []
    dtype = str(config.get("distributed_type", "")).upper()
    procs = _int(config.get("num_processes"), 1 if dtype == "NO" else -1)
    machines = _int(config.get("num_machines"), 1)
    rank = _int(config.get("machine_rank"), 0)
    if procs is None or machines is None or rank is None:
        return [Finding("error", "num_processes, num_machines and machine_rank must be integers",
                        "write whole numbers for them")]
    if procs == -1:
        return [Finding("error", "num_processes is not set: `accelerate launch` will refuse to start",
                        "add `num_processes: N` (the total across all machines)")]
    if procs < 1:
        found.append(Finding("error", f"num_processes is {procs}", "set num_processes to at least 1"))
    if machines < 1:
        found.append(Finding("error", f"num_machines is {machines}", "set num_machines to at least 1"))
        return found
    if procs >= 1 and procs % machines:
        found.append(Finding("error", f"num_processes {procs} is not divisible by num_machines {machines}",
                             "num_processes is the TOTAL across machines: set it to machines x processes per "
                             f"machine (e.g. {machines * -(-procs // machines)})"))
    if not 0 <= rank < machines:
        found.append(Finding("error", f"machine_rank {rank} is outside 0..{machines - 1}",
                             "the main machine is rank 0; each other machine gets its own rank below num_machines"))
    if procs == 1 and dtype in ("MULTI_GPU", "FSDP"):
        kind = "DDP" if dtype == "MULTI_GPU" else "FSDP"
        found.append(Finding("warning", f"{kind} with one process: nothing is distributed",
                             "set num_processes to the number of GPUs (or use distributed_type: NO for one device)"))
    if machines > 1 and not config.get("main_process_ip"):
        found.append(Finding("warning", f"{machines} machines but no main_process_ip: the others cannot find rank 0",
                             "add `main_process_ip: <address of machine 0>` (or pass --main_process_ip)"))
    if dtype == "MULTI_CPU" and procs > 1 and not section(config, "mpirun_config").get("mpirun_hostfile"):
        found.append(Finding("warning", f"MULTI_CPU with {procs} processes and no mpirun hostfile: `accelerate "
                                        "launch` starts ONE process", "for N real CPU ranks use `accelkit launch "
                                                                      "--cpu --backend ddp --num-processes N`"))
    return found


def _fsdp(config: dict) -> list[Finding]:
    found = []
    fsdp = fsdp_section(config)
    version = _int(fsdp.get("fsdp_version"), 1)
    if "fsdp_version" not in fsdp:
        found.append(Finding("warning", "fsdp_version is not set: `accelerate launch` then uses FSDP1",
                             "add `fsdp_version: 2` (or 1) to fsdp_config"))
    reshard = fsdp.get("fsdp_reshard_after_forward")
    reshard_is_strategy = str(reshard).upper() in FSDP_STRATEGIES
    if version == 1 and "fsdp_sharding_strategy" not in fsdp and reshard_is_strategy \
            and str(reshard).upper() != "FULL_SHARD":
        found.append(Finding("error", f"FSDP1 with fsdp_reshard_after_forward {reshard} but no fsdp_sharding_strategy:"
                                      " the launcher's default FULL_SHARD wins", f"add `fsdp_sharding_strategy: "
                                                                                 f"{str(reshard).upper()}`"))
    if version == 2 and reshard is not None and reshard_is_strategy:
        found.append(Finding("error", f"FSDP2 takes true/false for fsdp_reshard_after_forward, not {reshard}",
                             "use true (like FULL_SHARD) or false (like SHARD_GRAD_OP)"))
    if version == 2 and str(fsdp.get("fsdp_sharding_strategy", "")).upper() not in ("", "FULL_SHARD"):
        found.append(Finding("warning", "fsdp_sharding_strategy is ignored by FSDP2",
                             "express it with fsdp_reshard_after_forward (true = full, false = grad-op)"))
    policy = str(fsdp.get("fsdp_auto_wrap_policy", "")).upper()
    if policy == "TRANSFORMER_BASED_WRAP" and not fsdp.get("fsdp_transformer_layer_cls_to_wrap"):
        found.append(Finding("warning", "transformer wrap policy without a layer class: Accelerate then wraps the "
                                        "model's `_no_split_modules` (Transformers models); any other model becomes "
                                        "ONE FSDP unit, gathered whole in forward (no per-layer memory saving)",
                             "name the block class: --wrap-cls LlamaDecoderLayer (fsdp_transformer_layer_cls_to_wrap)"))
    if _true(fsdp.get("fsdp_cpu_ram_efficient_loading")) and "fsdp_sync_module_states" in fsdp \
            and not _true(fsdp["fsdp_sync_module_states"]):
        found.append(Finding("error", "fsdp_cpu_ram_efficient_loading needs fsdp_sync_module_states: the launcher "
                                      "refuses this combination", "set `fsdp_sync_module_states: true`"))
    return found


def _deepspeed(config: dict, content: dict | None, relative_to: Path | None) -> list[Finding]:
    found = []
    ds = section(config, "deepspeed_config")
    json_file = ds.get("deepspeed_config_file")
    if json_file:
        conflicts = [k for k in DEEPSPEED_JSON_CONFLICTS if k in ds]
        if config.get("mixed_precision") is not None:
            conflicts.append("mixed_precision")
        if conflicts:
            found.append(Finding("error", f"deepspeed_config_file is set, so Accelerate refuses {', '.join(conflicts)}"
                                          " in the YAML", "remove them from the YAML and set them in the DeepSpeed "
                                                          "JSON instead"))
        if content is None:
            found += _read_json(Path(str(json_file)), relative_to)
        elif "zero_optimization" not in content:
            found.append(Finding("error", "the DeepSpeed JSON has no zero_optimization section",
                                 'add "zero_optimization": {"stage": 2}'))
        return found
    stage = _int(ds.get("zero_stage"), 2)
    param_device = str(ds.get("offload_param_device", "none")).lower()
    if stage is not None and stage < 3 and param_device != "none":
        found.append(Finding("warning", f"offload_param_device {param_device} is ignored below ZeRO stage 3",
                             "set zero_stage: 3, or offload_param_device: none"))
    for kind in ("optimizer", "param"):
        if str(ds.get(f"offload_{kind}_device", "none")).lower() == "nvme" and not ds.get(f"offload_{kind}_nvme_path"):
            found.append(Finding("error", f"offload_{kind}_device is nvme but offload_{kind}_nvme_path is not set",
                                 f"add `offload_{kind}_nvme_path: /local/nvme/dir`"))
    return found


def _read_json(path: Path, relative_to: Path | None) -> list[Finding]:
    full = path if path.is_absolute() else (relative_to or Path.cwd()) / path
    if not full.is_file():
        return [Finding("error", f"deepspeed_config_file {path} does not exist (relative paths are resolved from the "
                                 "directory you launch from)", "write it with `accelkit config --backend deepspeed "
                                                               "--deepspeed-json PATH`, or fix the path")]
    try:
        content = json.loads(full.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return [Finding("error", f"deepspeed_config_file {path} is not valid JSON: {exc}", "fix the JSON syntax")]
    if not isinstance(content, dict) or "zero_optimization" not in content:
        return [Finding("error", f"{path} has no zero_optimization section (Accelerate requires it)",
                        'add "zero_optimization": {"stage": 2}')]
    return []
