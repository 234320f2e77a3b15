"""What a user can ask for on the command line, before any defaults are filled in."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

BACKENDS = ("single", "cpu", "ddp", "fsdp", "deepspeed")
MIXED_PRECISIONS = ("no", "fp16", "bf16")
FSDP_VERSIONS = (1, 2)
SHARDINGS = ("full", "grad-op", "no", "hybrid")
WRAP_POLICIES = ("transformer", "size", "none")
STATE_DICTS = ("sharded", "full")
ZERO_STAGES = (0, 1, 2, 3)
OFFLOAD_DEVICES = ("none", "cpu", "nvme")

# Options that only make sense for one backend; used to name the offending flag in errors.
FSDP_ONLY = ("fsdp_version", "sharding", "wrap_policy", "wrap_cls", "min_num_params", "state_dict",
             "activation_checkpointing", "cpu_ram_efficient_loading")
DEEPSPEED_ONLY = ("zero_stage", "offload_optimizer", "offload_params", "zero3_save_16bit_model", "deepspeed_json",
                  "nvme_path")


@dataclass
class ConfigOptions:
    """Every field None (or empty) means "not given": the preset, the base config or the backend default decides."""

    backend: str | None = None  # single | cpu | ddp | fsdp | deepspeed
    preset: str | None = None  # name of accelerate_configs/<preset>.yaml
    num_processes: int | None = None  # total across machines
    num_machines: int | None = None
    machine_rank: int | None = None
    main_process_ip: str | None = None
    main_process_port: int | None = None
    mixed_precision: str | None = None  # no | fp16 | bf16
    gradient_accumulation_steps: int | None = None
    # FSDP
    fsdp_version: int | None = None
    sharding: str | None = None  # full | grad-op | no | hybrid
    wrap_policy: str | None = None  # transformer | size | none
    wrap_cls: tuple[str, ...] = ()
    min_num_params: int | None = None  # for wrap_policy "size"
    state_dict: str | None = None  # sharded | full
    offload: bool | None = None  # FSDP: params+grads to CPU; DeepSpeed: optimizer (and params at stage 3) to CPU
    activation_checkpointing: bool | None = None
    cpu_ram_efficient_loading: bool | None = None
    # DeepSpeed
    zero_stage: int | None = None
    offload_optimizer: str | None = None  # none | cpu | nvme
    offload_params: str | None = None  # none | cpu | nvme
    nvme_path: str | None = None  # where NVMe offload swaps to
    zero3_save_16bit_model: bool | None = None
    deepspeed_json: Path | None = None  # write a full DeepSpeed JSON here and reference it from the YAML

    def given(self) -> dict[str, object]:
        """The fields the user actually set, by name."""
        out: dict[str, object] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None or value == ():
                continue
            out[f.name] = value
        return out


def flag_name(field_name: str) -> str:
    """`zero_stage` -> `--zero-stage`: how the option is spelled on the command line."""
    return "--" + field_name.replace("_", "-")
