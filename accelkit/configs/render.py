"""A config -> commented YAML text, and writing it (plus its DeepSpeed JSON) without partial files."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from accelkit.fsio import atomic_write, atomic_write_many

if TYPE_CHECKING:
    from accelkit.configs.resolved import ResolvedConfig

# One short line per key a user is likely to edit; the YAML explains itself.
TOP_COMMENTS = {
    "distributed_type": "NO = one process, MULTI_CPU, MULTI_GPU = DDP, FSDP, DEEPSPEED",
    "num_processes": "TOTAL processes across all machines (not per machine)",
    "machine_rank": "this machine's rank: 0 on the main machine, 1..num_machines-1 on the others",
    "main_process_ip": "address of machine 0; the same on every machine",
    "mixed_precision": "no | fp16 | bf16 (fp16 needs a GPU)",
    "use_cpu": "true runs on CPU even where GPUs exist",
    "parallelism_config": "FSDP2 hybrid sharding: shard within a machine, replicate across machines",
}
NESTED_COMMENTS = {
    "fsdp_version": "1 = FullyShardedDataParallel wrapper, 2 = fully_shard (per-parameter); launcher default: 1",
    "fsdp_sharding_strategy": "FSDP1 reads this; written explicitly because the launcher's default is FULL_SHARD",
    "fsdp_auto_wrap_policy": "which modules become FSDP units",
    "fsdp_state_dict_type": "SHARDED_STATE_DICT saves one shard per rank (merge with `accelkit merge-ckpt`)",
    "fsdp_offload_params": "keep parameters and gradients on CPU between uses (slower, far less GPU memory)",
    "fsdp_cpu_ram_efficient_loading": "only rank 0 loads pretrained weights (Transformers models)",
    "zero_stage": "1 = shard optimizer states, 2 = + gradients, 3 = + parameters",
    "offload_optimizer_device": "none | cpu | nvme: where optimizer states live",
    "offload_param_device": "none | cpu | nvme: where parameters live (stage 3 only)",
    "zero3_init_flag": "build the model already partitioned (stage 3)",
    "zero3_save_16bit_model": "gather a 16-bit copy of the model when saving (stage 3)",
    "deepspeed_config_file": "ZeRO stage, offload, precision and accumulation live in this JSON, not here",
    "deepspeed_multinode_launcher": "standard = torchrun on every machine (no pdsh/ssh hostfile needed)",
}


def _reshard_comment(value: object) -> str:
    if isinstance(value, bool):
        return "FSDP2: true = free parameters after forward (full shard), false = keep them (grad-op)"
    return "FSDP1: same strategy as fsdp_sharding_strategy"


def _dump_one(key: str, value: object) -> str:
    import yaml

    return yaml.safe_dump({key: value}, default_flow_style=False, sort_keys=False, width=1000)


# The header line that marks a config written for a cluster job (launch --slurm/--skypilot/--kubernetes): its
# machine_rank and main_process_ip are given on each node at run time, so `config --check` does not ask for them.
CLUSTER_JOB_MARK = "# Cluster job: machine_rank and main_process_ip are filled in on each node at run time"


def _is_cluster_template(config: ResolvedConfig | Mapping) -> bool:
    from accelkit.configs.resolved import ResolvedConfig

    return isinstance(config, ResolvedConfig) and not config.per_machine and config.num_machines > 1


def is_cluster_template_text(text: str) -> bool:
    """The file was written for a cluster job (it starts with the CLUSTER_JOB_MARK header)."""
    return any(line.strip() == CLUSTER_JOB_MARK for line in text.splitlines()[:5])


def render_yaml(config: ResolvedConfig | Mapping, command_line: str, *, cluster_job: bool | None = None) -> str:
    """YAML text starting with a comment naming the command that made it. `config`: a ResolvedConfig or a dict;
    `cluster_job`: written for a cluster job (default: a ResolvedConfig's own say)."""
    cluster_job = _is_cluster_template(config) if cluster_job is None else cluster_job
    config_object, config = config, _parts(config)[0]
    lines = [f"# Written by: {command_line}"]
    if cluster_job:  # the job script passes each node's rank and machine 0's address to the launcher
        lines += [CLUSTER_JOB_MARK, "# Run with: the job file written beside it (it passes --machine_rank and "
                  "--main_process_ip on each node)"]
    else:
        lines.append("# Run with: accelerate launch --config_file THIS_FILE your_script.py  (or: accelkit launch "
                     "--config ...)")
    lines.append("# Check with: accelkit config --check THIS_FILE")
    lines += _compression_lines(config_object)
    lines += _pipeline_lines(config_object)
    lines.append("")
    for key, value in config.items():
        if key in TOP_COMMENTS:
            lines.append(f"# {TOP_COMMENTS[key]}")
        if isinstance(value, dict) and value:
            lines.append(f"{key}:")
            for sub_key, sub_value in value.items():
                comment = _reshard_comment(sub_value) if sub_key == "fsdp_reshard_after_forward" else \
                    NESTED_COMMENTS.get(sub_key)
                if comment:
                    lines.append(f"  # {comment}")
                lines.extend("  " + line for line in _dump_one(sub_key, sub_value).splitlines())
        else:
            lines.extend(_dump_one(key, value).splitlines())
    return "\n".join(lines) + "\n"


def _compression_lines(config: object) -> list[str]:
    """The gradient compression of a DDP/FSDP config, in the one place accelkit keeps it
    (accelkit.compression.compression_spec: Accelerate has no key for it, and ignores comments)."""
    spec = getattr(config, "grad_compression", None)
    if spec is None or spec.method == "int8":  # int8 (ZeRO++) is in the DeepSpeed JSON
        return []
    from accelkit.compression.compression_spec import ENV_VAR, compression_comment_line

    return [f"# Gradient compression: accelkit launch reads the next line; with accelerate launch set {ENV_VAR}="
            f"{spec.env_value()} (accelkit templates apply it)", compression_comment_line(spec)]


def _pipeline_lines(config: object) -> list[str]:
    """The pipeline layout, which has no Accelerate key either (accelkit.configs.pipeline_spec)."""
    from accelkit.configs.pipeline_spec import header_lines

    return header_lines(config)


def render_json(content: dict) -> str:
    return json.dumps(content, indent=2) + "\n"


def _parts(config: ResolvedConfig | Mapping) -> tuple[dict, Mapping | None, Path | None]:
    """(the Accelerate dict, the DeepSpeed JSON content to write or None, where it goes). A plain Accelerate dict
    (a file's content) carries no JSON to write."""
    from accelkit.configs.resolved import ResolvedConfig

    if isinstance(config, ResolvedConfig):
        content = config.deepspeed.json_content if config.deepspeed is not None else None
        return config.to_accelerate_dict(), content, config.json_path()
    return dict(config), None, None


def write_config(config: ResolvedConfig | Mapping, path: Path, command_line: str, *, with_json: bool = True) -> None:
    """Write the YAML (and the DeepSpeed JSON it references, if accelkit makes one and `with_json`). Both files
    appear together or not at all. `config`: a ResolvedConfig, or an Accelerate dict (YAML only)."""
    data, content, json_path = _parts(config)
    files: list[tuple[Path, str]] = []
    if with_json and content is not None and json_path is not None:
        files.append((json_path, render_json(dict(content))))
    files.append((Path(path), render_yaml(config if hasattr(config, "grad_compression") else data, command_line,
                                          cluster_job=_is_cluster_template(config))))
    atomic_write_many(files)


def write_deepspeed_json(config: ResolvedConfig | Mapping) -> Path | None:
    """Write only the DeepSpeed JSON a config references (used when the YAML goes to stdout or to a launch)."""
    _, content, json_path = _parts(config)
    if content is None or json_path is None:
        return None
    atomic_write(json_path, render_json(dict(content)))
    return json_path
