"""The config options shared by `accelkit config` and `accelkit launch`, so both spell them the same way.

Imports only click (and, inside options_from_kwargs, the light accelkit.configs.options): `accelkit --help` stays fast.
Every option defaults to None, meaning "not given": the preset, the base config or the backend default decides.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

# Kept literal here (not imported from accelkit.configs) so this module imports nothing but click;
# tests/test_config_cli.py checks they match accelkit.configs.options.
_BACKENDS = ("single", "cpu", "ddp", "fsdp", "deepspeed")
_OFFLOAD_DEVICES = ("none", "cpu", "nvme")


def _to_int(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    return None if value is None else int(value)


_OPTIONS: list[Callable[[Callable[..., Any]], Callable[..., Any]]] = [
    click.option("--backend", type=click.Choice(_BACKENDS), default=None,
                 help="Distributed backend. Default: ddp with 2+ GPUs, else single (or the preset's)."),
    click.option("--preset", default=None, metavar="NAME",
                 help="Start from accelerate_configs/NAME.yaml (see `accelkit config --list`); other options "
                      "apply on top."),
    click.option("--num-processes", type=int, default=None, metavar="N",
                 help="Total processes across all machines. Default: GPUs detected x machines; without GPUs 1 "
                      "for single, 2 otherwise."),
    click.option("--num-machines", type=int, default=None, metavar="N", help="Number of machines (nodes). Default 1."),
    click.option("--machine-rank", type=int, default=None, metavar="R", help="Rank of this machine, 0..N-1."),
    click.option("--main-process-ip", default=None, metavar="IP", help="Address of machine 0 (multi-node)."),
    click.option("--main-process-port", type=int, default=None, metavar="PORT", help="Port on machine 0."),
    click.option("--mixed-precision", type=click.Choice(("no", "fp16", "bf16")), default=None,
                 help="Mixed precision. Default: no."),
    click.option("--gradient-accumulation-steps", type=int, default=None, metavar="N",
                 help="Gradient accumulation steps (stored in the config for DeepSpeed)."),
    # FSDP
    click.option("--fsdp-version", type=click.Choice(("1", "2")), default=None, callback=_to_int,
                 help="FSDP version. Default 2 (fully_shard)."),
    click.option("--sharding", type=click.Choice(("full", "grad-op", "no", "hybrid")), default=None,
                 help="FSDP sharding. v1 writes fsdp_sharding_strategy; v2 maps to fsdp_reshard_after_forward."),
    click.option("--wrap-policy", type=click.Choice(("transformer", "size", "none")), default=None,
                 help="FSDP auto-wrap policy. Default: transformer."),
    click.option("--wrap-cls", multiple=True, metavar="NAME",
                 help="Layer class to wrap with --wrap-policy transformer (repeatable), e.g. LlamaDecoderLayer."),
    click.option("--min-num-params", type=int, default=None, metavar="N",
                 help="Minimum parameters per unit for --wrap-policy size. Default 100000000."),
    click.option("--state-dict", type=click.Choice(("sharded", "full")), default=None,
                 help="FSDP checkpoint state dict type. Default: sharded."),
    click.option("--offload/--no-offload", default=None,
                 help="FSDP: params and grads to CPU. DeepSpeed: optimizer (and params at stage 3) to CPU."),
    click.option("--activation-checkpointing/--no-activation-checkpointing", default=None,
                 help="FSDP activation checkpointing."),
    click.option("--cpu-ram-efficient-loading/--no-cpu-ram-efficient-loading", default=None,
                 help="FSDP: only rank 0 loads pretrained weights (Transformers models)."),
    # DeepSpeed
    click.option("--zero-stage", type=click.Choice(("0", "1", "2", "3")), default=None, callback=_to_int,
                 help="DeepSpeed ZeRO stage. Default 2."),
    click.option("--offload-optimizer", type=click.Choice(_OFFLOAD_DEVICES), default=None,
                 help="DeepSpeed optimizer state offload device."),
    click.option("--offload-params", type=click.Choice(_OFFLOAD_DEVICES), default=None,
                 help="DeepSpeed parameter offload device (stage 3 only)."),
    click.option("--nvme-path", default=None, metavar="DIR", help="Directory for DeepSpeed NVMe offload."),
    click.option("--zero3-save-16bit-model/--no-zero3-save-16bit-model", default=None,
                 help="DeepSpeed stage 3: gather a 16-bit model when saving."),
    click.option("--deepspeed-json", type=click.Path(dir_okay=False, path_type=Path), default=None,
                 help="Write a full DeepSpeed JSON (\"auto\" values) here and reference it from the YAML."),
]

OPTION_NAMES = ("backend", "preset", "num_processes", "num_machines", "machine_rank", "main_process_ip",
                "main_process_port", "mixed_precision", "gradient_accumulation_steps", "fsdp_version", "sharding",
                "wrap_policy", "wrap_cls", "min_num_params", "state_dict", "offload", "activation_checkpointing",
                "cpu_ram_efficient_loading", "zero_stage", "offload_optimizer", "offload_params", "nvme_path",
                "zero3_save_16bit_model", "deepspeed_json")


def config_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator adding the shared config options to a click command (in --help order)."""
    for option in reversed(_OPTIONS):
        func = option(func)
    return func


def config_options_except(*names: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Like config_options, without the options named (a command that spells one of them its own way, e.g.
    `accelkit bench --num-processes 1,2,4,8`)."""

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        for option, name in reversed(list(zip(_OPTIONS, OPTION_NAMES, strict=True))):
            if name not in names:
                func = option(func)
        return func

    return decorate


def options_from_kwargs(kwargs: dict[str, Any]):
    """Pop the shared options out of a click callback's kwargs and return them as a ConfigOptions."""
    from accelkit.configs.options import ConfigOptions

    values = {name: kwargs.pop(name) for name in OPTION_NAMES if name in kwargs}
    values["wrap_cls"] = tuple(values.get("wrap_cls") or ())
    return ConfigOptions(**values)
