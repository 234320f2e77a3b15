"""What a user can ask for on the command line, before any defaults are filled in: one table of the config options.

Each field of ConfigOptions carries its own command-line spelling, help text, choices and the Accelerate config key it
sets, so the click options of `accelkit config` and `accelkit launch` (accelkit/commands/config_options.py), the JSON
that carries a launch request between processes, and the findings that name a flag and a key all read this one table.
Light on purpose (standard library, the choices module and accelkit.pipeline_schedules): `accelkit --help` imports it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from accelkit.configs.choices import (
    CP_BACKENDS,
    FSDP_VERSIONS,
    SP_BACKENDS,
    ZERO_STAGES,
    Backend,
    MixedPrecision,
    OffloadDevice,
    Sharding,
    StateDict,
    WrapPolicy,
)
from accelkit.pipeline_schedules import SCHEDULE_NAMES


def _option(help: str, *, key: str | None = None, kind: str = "text", choices: tuple = (), metavar: str | None = None,
            group: str = "", default: Any = None) -> Any:
    """A ConfigOptions field. `kind`: text | int | path | switch (--x/--no-x) | choice | schedule (a pipeline
    schedule in any accepted spelling) | many (repeatable); `key`: the Accelerate config key it sets (dotted
    inside a section); `group`: the only backend it applies to."""
    return field(default=default, metadata={"help": help, "key": key, "kind": kind, "choices": choices,
                                            "metavar": metavar, "group": group})


@dataclass
class ConfigOptions:
    """Every field None (or empty) means "not given": the preset, the base config or the backend default decides."""

    backend: str | None = _option(
        "Distributed backend. Default: ddp with 2+ GPUs or when several processes or machines are asked for, else "
        "single (or the preset's).", key="distributed_type", kind="choice", choices=Backend.values())
    preset: str | None = _option(
        "Start from accelerate_configs/NAME.yaml (see `accelkit config --list`); other options apply on top.",
        metavar="NAME")
    num_processes: int | None = _option(
        "Total processes across all machines. Default: GPUs detected x machines; without GPUs 1 for single, 2 "
        "otherwise.", key="num_processes", kind="int", metavar="N")
    num_machines: int | None = _option("Number of machines (nodes). Default 1.", key="num_machines", kind="int",
                                       metavar="N")
    machine_rank: int | None = _option("Rank of this machine, 0..N-1.", key="machine_rank", kind="int", metavar="R")
    main_process_ip: str | None = _option("Address of machine 0 (multi-node).", key="main_process_ip", metavar="IP")
    main_process_port: int | None = _option("Port on machine 0.", key="main_process_port", kind="int",
                                            metavar="PORT")
    mixed_precision: str | None = _option("Mixed precision. Default: no.", key="mixed_precision", kind="choice",
                                          choices=MixedPrecision.values())
    gradient_accumulation_steps: int | None = _option(
        "Gradient accumulation steps (stored in the config for DeepSpeed).",
        key="deepspeed_config.gradient_accumulation_steps", kind="int", metavar="N")
    # FSDP
    fsdp_version: int | None = _option("FSDP version. Default 2 (fully_shard).", key="fsdp_config.fsdp_version",
                                       kind="choice", choices=FSDP_VERSIONS, group="fsdp")
    sharding: str | None = _option(
        "FSDP sharding. v1 writes fsdp_sharding_strategy; v2 maps to fsdp_reshard_after_forward.",
        key="fsdp_config.fsdp_sharding_strategy", kind="choice", choices=Sharding.values(), group="fsdp")
    wrap_policy: str | None = _option("FSDP auto-wrap policy. Default: transformer.",
                                      key="fsdp_config.fsdp_auto_wrap_policy", kind="choice",
                                      choices=WrapPolicy.values(), group="fsdp")
    wrap_cls: tuple[str, ...] = _option(
        "Layer class to wrap with --wrap-policy transformer (repeatable), e.g. LlamaDecoderLayer.",
        key="fsdp_config.fsdp_transformer_layer_cls_to_wrap", kind="many", metavar="NAME", group="fsdp", default=())
    min_num_params: int | None = _option("Minimum parameters per unit for --wrap-policy size. Default 100000000.",
                                         key="fsdp_config.fsdp_min_num_params", kind="int", metavar="N",
                                         group="fsdp")
    state_dict: str | None = _option("FSDP checkpoint state dict type. Default: sharded.",
                                     key="fsdp_config.fsdp_state_dict_type", kind="choice", choices=StateDict.values(),
                                     group="fsdp")
    offload: bool | None = _option(
        "FSDP: params and grads to CPU. DeepSpeed: optimizer (and params at stage 3) to CPU.",
        key="fsdp_config.fsdp_offload_params", kind="switch")
    activation_checkpointing: bool | None = _option("FSDP activation checkpointing.",
                                                    key="fsdp_config.fsdp_activation_checkpointing", kind="switch",
                                                    group="fsdp")
    cpu_ram_efficient_loading: bool | None = _option(
        "FSDP: only rank 0 loads pretrained weights (Transformers models).",
        key="fsdp_config.fsdp_cpu_ram_efficient_loading", kind="switch", group="fsdp")
    # DeepSpeed
    zero_stage: int | None = _option("DeepSpeed ZeRO stage. Default 2.", key="deepspeed_config.zero_stage",
                                     kind="choice", choices=ZERO_STAGES, group="deepspeed")
    offload_optimizer: str | None = _option("DeepSpeed optimizer state offload device.",
                                            key="deepspeed_config.offload_optimizer_device", kind="choice",
                                            choices=OffloadDevice.values(), group="deepspeed")
    offload_params: str | None = _option("DeepSpeed parameter offload device (stage 3 only).",
                                         key="deepspeed_config.offload_param_device", kind="choice",
                                         choices=OffloadDevice.values(), group="deepspeed")
    nvme_path: str | None = _option("Directory for DeepSpeed NVMe offload.",
                                    key="deepspeed_config.offload_param_nvme_path", metavar="DIR", group="deepspeed")
    zero3_save_16bit_model: bool | None = _option("DeepSpeed stage 3: gather a 16-bit model when saving.",
                                                  key="deepspeed_config.zero3_save_16bit_model", kind="switch",
                                                  group="deepspeed")
    deepspeed_json: Path | None = _option(
        "Write a full DeepSpeed JSON (\"auto\" values) here and reference it from the YAML.",
        key="deepspeed_config.deepspeed_config_file", kind="path", group="deepspeed")

    # N-D parallelism (Accelerate's ParallelismConfig): the product of the sizes is the number of processes.
    dp_replicate_size: int | None = _option(
        "N-D: replicas of the model (DDP-like all-reduce across them). With --dp-shard-size > 1: HSDP.",
        key="parallelism_config.parallelism_config_dp_replicate_size", kind="int", metavar="N")
    dp_shard_size: int | None = _option(
        "N-D: processes FSDP2 shards the model over. Default under fsdp: what the other sizes leave.",
        key="parallelism_config.parallelism_config_dp_shard_size", kind="int", metavar="N")
    tp_size: int | None = _option(
        "N-D: tensor parallelism (the model's TP plan splits each layer's weights over N processes of one machine).",
        key="parallelism_config.parallelism_config_tp_size", kind="int", metavar="N")
    cp_size: int | None = _option(
        "N-D: context parallelism (torch ring attention splits the sequence over N processes; needs fsdp v2).",
        key="parallelism_config.parallelism_config_cp_size", kind="int", metavar="N")
    cp_backend: str | None = _option("N-D: context parallelism backend.",
                                     key="parallelism_config.parallelism_config_cp_backend", kind="choice",
                                     choices=CP_BACKENDS)
    sp_size: int | None = _option(
        "N-D: sequence parallelism (DeepSpeed Ulysses/ALST splits the sequence over N processes; needs deepspeed).",
        key="parallelism_config.parallelism_config_sp_size", kind="int", metavar="N")
    sp_backend: str | None = _option("N-D: sequence parallelism backend.",
                                     key="parallelism_config.parallelism_config_sp_backend", kind="choice",
                                     choices=SP_BACKENDS)

    # Pipeline parallelism (torch.distributed.pipelining): no Accelerate key; accelkit.configs.pipeline_spec says
    # where it goes ($ACCELKIT_PIPELINE, and a comment line in the YAML).
    pp_size: int | None = _option(
        "N-D: pipeline parallelism (the decoder layers are split into N stages, one group of processes each; run by "
        "accelkit's templates with torch.distributed.pipelining).", kind="int", metavar="N")
    pp_schedule: str | None = _option(
        "Pipeline schedule: gpipe, 1f1b, interleaved1f1b or interleavedzerobubble (any case: 1F1B, "
        "Interleaved1F1B). gpipe and 1f1b run one stage per process, the interleaved ones two. Default: 1f1b.",
        kind="schedule", choices=SCHEDULE_NAMES, metavar="SCHEDULE")
    microbatches: int | None = _option(
        "Pipeline microbatches per step: at least --pp-size, at most 4096, a multiple of --pp-size for the "
        "interleaved schedules. Default: one per stage (--pp-size, twice that interleaved).", kind="int",
        metavar="M")

    # The model, for the checks that need it (tp must divide its attention heads); written to no config key.
    model_config: Path | None = _option(
        "The model's config.json (or its folder): tensor parallelism is checked against its attention heads "
        "before any rank starts.", kind="model", metavar="PATH")

    # Gradient compression (accelkit.compression): no Accelerate key; accelkit/compression/compression_spec.py says
    # where it goes (the DeepSpeed JSON for int8, else $ACCELKIT_GRAD_COMPRESSION and a comment line in the YAML).
    grad_compression: str | None = _option(
        "Gradient compression: fp16/bf16/powersgd (ddp comm hook), fp16/bf16 (fsdp reduce dtype), int8 (deepspeed "
        "ZeRO-3 as ZeRO++). Default: none.", kind="choice", choices=("none", "fp16", "bf16", "powersgd", "int8"))
    powersgd_rank: int | None = _option("PowerSGD's matrix approximation rank. Default 1.", kind="int", metavar="R")
    powersgd_start_step: int | None = _option(
        "Step from which PowerSGD compresses (plain all-reduce before). Default 1000 (torch's).", kind="int",
        metavar="S")
    reduce_dtype: str | None = _option("FSDP2's reduce dtype (MixedPrecisionPolicy): bf16/fp16 halve the "
                                       "reduce-scatter bytes. Default fp32.", kind="choice",
                                       choices=("fp32", "bf16", "fp16"), group="fsdp")

    def given(self) -> dict[str, object]:
        """The fields the user actually set, by name."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) not in (None, ())}

    def flags(self) -> list[tuple[str, object]]:
        """(--flag, value) of every field the user set, in the table's order: what `command_line` spells back."""
        return [(flag_name(name), value) for name, value in self.given().items()]

    def config_command(self, output: Path | str | None) -> str:
        """The `accelkit config` command that writes this config to `output`: the header of every written YAML."""
        from accelkit.shellwords import command_line

        return command_line("accelkit", "config", flags=[*self.flags(), ("-o", output)])

    def to_json_dict(self) -> dict[str, Any]:
        """JSON-safe values (paths as text, tuples as lists), for a launch request crossing processes."""
        out: dict[str, Any] = {}
        for name, value in ((f.name, getattr(self, f.name)) for f in fields(self)):
            out[name] = str(value) if isinstance(value, Path) else list(value) if isinstance(value, tuple) else \
                getattr(value, "value", value)
        return out

    @classmethod
    def from_json_dict(cls, data: dict[str, Any]) -> ConfigOptions:
        values = dict(data)
        values["wrap_cls"] = tuple(values.get("wrap_cls") or ())
        for name in ("deepspeed_json", "model_config"):
            if values.get(name) is not None:
                values[name] = Path(values[name])
        return cls(**values)


OPTION_FIELDS = {f.name: f for f in fields(ConfigOptions)}
# The N-D sizes, by mesh dimension, in Accelerate's mesh order (outermost first).
ND_SIZES = {"dp_replicate": "dp_replicate_size", "dp_shard": "dp_shard_size", "cp": "cp_size", "sp": "sp_size",
            "tp": "tp_size"}
PP_OPTIONS = ("pp_size", "pp_schedule", "microbatches")
ND_OPTIONS = (*ND_SIZES.values(), "cp_backend", "sp_backend", *PP_OPTIONS)


def flag_name(field_name: str) -> str:
    """`zero_stage` -> `--zero-stage`: how the option is spelled on the command line."""
    return "--" + field_name.replace("_", "-")


# The options as the command line spells them (`--zero-stage` -> its field), in the table's order: what the commands
# turn into click options, so a flag and the messages that name it (flag_name) cannot differ.
OPTION_FLAGS = {flag_name(name): f for name, f in OPTION_FIELDS.items()}


def config_key(field_name: str) -> str:
    """The Accelerate config key an option sets (`fsdp_config.fsdp_version`), or "" for options that set none."""
    return OPTION_FIELDS[field_name].metadata["key"] or "" if field_name in OPTION_FIELDS else ""


def backend_group(field_name: str) -> str:
    """The one backend an option belongs to ("fsdp", "deepspeed"), or "" when it applies to several."""
    return OPTION_FIELDS[field_name].metadata["group"]
