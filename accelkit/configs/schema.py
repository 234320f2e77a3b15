"""What Accelerate accepts in a config file, read from Accelerate itself rather than written down here.

Top-level keys are ClusterConfig's dataclass fields (unknown ones are a hard error at load). Keys inside
fsdp_config / deepspeed_config are copied by `accelerate launch` onto its argparse namespace, so the valid ones are
that parser's options; anything else is silently ignored, which is why accelkit reports it.
"""

from __future__ import annotations

import difflib
from functools import cache

# Keys `accelerate launch` reads only from its own flags: in a YAML they have no effect.
IGNORED_BY_LAUNCHER = {"rdzv_backend": "static", "same_network": False, "enable_cpu_affinity": False}

# With deepspeed_config_file set, Accelerate refuses these (they belong in the DeepSpeed JSON).
DEEPSPEED_JSON_CONFLICTS = ("gradient_accumulation_steps", "gradient_clipping", "zero_stage",
                            "offload_optimizer_device", "offload_param_device", "offload_param_nvme_path",
                            "offload_optimizer_nvme_path", "zero3_save_16bit_model")


def section(config: dict, name: str) -> dict:
    """A nested section such as fsdp_config, or {} when it is missing or not a mapping (reported by the checks)."""
    value = config.get(name)
    return value if isinstance(value, dict) else {}


def fsdp_section(config: dict) -> dict:
    """fsdp_config with every key spelled with its `fsdp_` prefix (the launcher accepts both)."""
    return {(k if str(k).startswith("fsdp_") else f"fsdp_{k}"): v for k, v in section(config, "fsdp_config").items()}


@cache
def top_level_keys() -> frozenset[str]:
    from accelerate.commands.config.config_args import ClusterConfig

    return frozenset(ClusterConfig.__dataclass_fields__)


@cache
def _launch_dests() -> frozenset[str]:
    from accelerate.commands.launch import launch_command_parser

    parser = launch_command_parser()
    return frozenset(action.dest for action in parser._actions)


def fsdp_keys() -> frozenset[str]:
    return frozenset(d for d in _launch_dests() if d.startswith("fsdp_"))


@cache
def deepspeed_keys() -> frozenset[str]:
    # The launcher's "DeepSpeed Arguments" group, plus the JSON reference key.
    from accelerate.commands.launch import launch_command_parser

    parser = launch_command_parser()
    for group in parser._action_groups:
        if group.title and "deepspeed" in group.title.lower():
            return frozenset(a.dest for a in group._group_actions) - {"use_deepspeed"}
    return frozenset(DEEPSPEED_JSON_CONFLICTS) | {"deepspeed_config_file", "zero3_init_flag"}


def nested_keys(section: str) -> frozenset[str] | None:
    """Valid keys inside a nested section, or None when accelkit does not check that section."""
    if section == "fsdp_config":
        return fsdp_keys()
    if section == "deepspeed_config":
        return deepspeed_keys()
    if section == "parallelism_config":
        return frozenset(d for d in _launch_dests() if d.startswith("parallelism_config_"))
    return None


def nearest(name: str, valid: frozenset[str] | set[str]) -> str | None:
    match = difflib.get_close_matches(name, sorted(valid), n=1, cutoff=0.6)
    return match[0] if match else None
