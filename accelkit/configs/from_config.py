"""Read an existing Accelerate config dict back into ConfigOptions, so options can be applied on top of it."""

from __future__ import annotations

from accelkit.configs.options import ConfigOptions
from accelkit.configs.schema import backend_of, section
from accelkit.errors import AccelkitError

# Accelerate spelling -> accelkit spelling.
SHARDING_FROM_STRATEGY = {"FULL_SHARD": "full", "SHARD_GRAD_OP": "grad-op", "NO_SHARD": "no", "HYBRID_SHARD": "hybrid"}
WRAP_FROM_POLICY = {"TRANSFORMER_BASED_WRAP": "transformer", "SIZE_BASED_WRAP": "size", "NO_WRAP": "none"}
STATE_DICT_FROM_TYPE = {"SHARDED_STATE_DICT": "sharded", "FULL_STATE_DICT": "full"}


def as_bool(value: object, key: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in {"true", "1", "yes"}:
        return True
    if text in {"false", "0", "no"}:
        return False
    raise AccelkitError(f"`{key}: {value}` is not true or false", hint=f"write `{key}: true` or `{key}: false`")


def as_int(value: object, key: str) -> int:
    try:
        return int(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise AccelkitError(f"`{key}: {value}` is not an integer", hint=f"write a whole number for `{key}`") from None


def _lookup(table: dict[str, str], value: object, key: str) -> str:
    name = str(value).upper()
    if name not in table:
        raise AccelkitError(f"accelkit does not model `{key}: {value}`",
                            hint=f"use one of {', '.join(table)}, or edit that config by hand instead")
    return table[name]


def fsdp_section(config: dict) -> dict:
    """fsdp_config with every key spelled with its `fsdp_` prefix (the launcher accepts both)."""
    return {(k if str(k).startswith("fsdp_") else f"fsdp_{k}"): v for k, v in section(config, "fsdp_config").items()}


def options_from_config(config: dict) -> ConfigOptions:
    """The ConfigOptions a config dict corresponds to, for the keys accelkit models."""
    opts = ConfigOptions(backend=backend_of(config))
    for key in ("num_processes", "num_machines", "machine_rank", "main_process_port"):
        if config.get(key) is not None:
            setattr(opts, key, as_int(config[key], key))
    if opts.num_processes == -1:  # Accelerate's "not set" marker
        opts.num_processes = None
    if config.get("main_process_ip"):
        opts.main_process_ip = str(config["main_process_ip"])
    if config.get("mixed_precision") is not None:
        opts.mixed_precision = str(config["mixed_precision"])
    if opts.backend == "fsdp":
        _read_fsdp(config, opts)
    elif opts.backend == "deepspeed":
        _read_deepspeed(config, opts)
    return opts


def _read_fsdp(config: dict, opts: ConfigOptions) -> None:
    fsdp = fsdp_section(config)
    # The launcher's default is FSDP1 when the key is missing.
    opts.fsdp_version = as_int(fsdp.get("fsdp_version", 1), "fsdp_version")
    strategy = fsdp.get("fsdp_sharding_strategy") if opts.fsdp_version == 1 else None
    reshard = fsdp.get("fsdp_reshard_after_forward")
    if strategy is not None:
        opts.sharding = _lookup(SHARDING_FROM_STRATEGY, strategy, "fsdp_sharding_strategy")
    elif reshard is not None and str(reshard).upper() in SHARDING_FROM_STRATEGY:
        opts.sharding = SHARDING_FROM_STRATEGY[str(reshard).upper()]
    elif reshard is not None:
        opts.sharding = "full" if as_bool(reshard, "fsdp_reshard_after_forward") else "grad-op"
    parallel = section(config, "parallelism_config")
    if as_int(parallel.get("parallelism_config_dp_replicate_size", 1), "parallelism_config_dp_replicate_size") > 1:
        opts.sharding = "hybrid"
    if fsdp.get("fsdp_auto_wrap_policy") is not None:
        opts.wrap_policy = _lookup(WRAP_FROM_POLICY, fsdp["fsdp_auto_wrap_policy"], "fsdp_auto_wrap_policy")
    classes = fsdp.get("fsdp_transformer_layer_cls_to_wrap")
    if classes:
        names = classes if isinstance(classes, list) else str(classes).split(",")
        opts.wrap_cls = tuple(n.strip() for n in names if n.strip())
    if fsdp.get("fsdp_min_num_params") is not None and opts.wrap_policy == "size":
        opts.min_num_params = as_int(fsdp["fsdp_min_num_params"], "fsdp_min_num_params")
    if fsdp.get("fsdp_state_dict_type") is not None:
        opts.state_dict = _lookup(STATE_DICT_FROM_TYPE, fsdp["fsdp_state_dict_type"], "fsdp_state_dict_type")
    for key, attr in (("fsdp_offload_params", "offload"), ("fsdp_activation_checkpointing", "activation_checkpointing"),
                      ("fsdp_cpu_ram_efficient_loading", "cpu_ram_efficient_loading")):
        if fsdp.get(key) is not None:
            setattr(opts, attr, as_bool(fsdp[key], key))


def _read_deepspeed(config: dict, opts: ConfigOptions) -> None:
    ds = section(config, "deepspeed_config")
    if ds.get("zero_stage") is not None:
        opts.zero_stage = as_int(ds["zero_stage"], "zero_stage")
    if ds.get("offload_optimizer_device") is not None:
        opts.offload_optimizer = str(ds["offload_optimizer_device"]).lower()
    if ds.get("offload_param_device") is not None:
        opts.offload_params = str(ds["offload_param_device"]).lower()
    nvme = ds.get("offload_param_nvme_path") or ds.get("offload_optimizer_nvme_path")
    if nvme and "nvme" in (opts.offload_optimizer, opts.offload_params):
        opts.nvme_path = str(nvme)
    if ds.get("zero3_save_16bit_model") is not None:
        opts.zero3_save_16bit_model = as_bool(ds["zero3_save_16bit_model"], "zero3_save_16bit_model")
    if ds.get("gradient_accumulation_steps") is not None:
        opts.gradient_accumulation_steps = as_int(ds["gradient_accumulation_steps"], "gradient_accumulation_steps")
