"""Preset or base config + command-line options -> a validated Accelerate config dict.

Steps: read the base (preset file or loaded --config) back into ConfigOptions, lay the given options on top, fill
defaults, reject bad combinations naming the flag, write the keys Accelerate reads, and pass the result through
Accelerate's own ClusterConfig so that what we return is exactly what its loader will accept.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path

from accelkit.configs import hardware
from accelkit.configs.deepspeed_json import deepspeed_json_content
from accelkit.configs.from_config import fsdp_section, options_from_config
from accelkit.configs.option_checks import check_options
from accelkit.configs.options import ConfigOptions, flag_name
from accelkit.configs.schema import BACKEND_TYPES, DEEPSPEED_JSON_CONFLICTS, backend_of, section
from accelkit.errors import AccelkitError

DEFAULT_PORT = 29500
DEFAULT_MIN_NUM_PARAMS = 100_000_000
STRATEGY = {"full": "FULL_SHARD", "grad-op": "SHARD_GRAD_OP", "no": "NO_SHARD", "hybrid": "HYBRID_SHARD"}
WRAP = {"transformer": "TRANSFORMER_BASED_WRAP", "size": "SIZE_BASED_WRAP", "none": "NO_WRAP"}
STATE_DICT = {"sharded": "SHARDED_STATE_DICT", "full": "FULL_STATE_DICT"}

# Keys build_config decides; anything else found in a base config of the same backend is kept as it is.
OWNED_TOP = {"compute_environment", "distributed_type", "num_processes", "num_machines", "machine_rank",
             "main_process_ip", "main_process_port", "mixed_precision", "use_cpu", "fsdp_config", "deepspeed_config",
             "parallelism_config"}
FSDP1_ONLY_DEFAULTS = {"fsdp_backward_prefetch": "BACKWARD_PRE", "fsdp_forward_prefetch": False,
                       "fsdp_use_orig_params": True}
OWNED_DEEPSPEED = {*DEEPSPEED_JSON_CONFLICTS, "deepspeed_config_file", "zero3_init_flag"}


class BuiltConfig(dict):
    """An Accelerate config dict; `deepspeed_json` holds the DeepSpeed JSON to write with it (or None)."""

    deepspeed_json: dict | None = None


def build_config(options: ConfigOptions, base: dict | None = None) -> BuiltConfig:
    """Accelerate config dict. Starts from `base` (a loaded --config file) or the preset/backend defaults, applies
    every option that is not None on top, validates (AccelkitError on bad combinations)."""
    if options.preset and base is not None:
        raise AccelkitError("both a preset and a base config were given", hint="start from one of them, not both")
    if options.preset:
        from accelkit.configs.presets import load_preset

        base = load_preset(options.preset)
    base = copy.deepcopy(base) if base else {}
    base_backend = backend_of(base) if base else None
    if base and base_backend is None:
        raise AccelkitError(f"distributed_type `{base.get('distributed_type')}` is not one accelkit configures",
                            hint="accelkit writes single, cpu, ddp, fsdp and deepspeed configs; edit this one by hand")
    if options.backend and base_backend and options.backend != base_backend:
        origin = f"preset `{options.preset}`" if options.preset else "the base config"
        raise AccelkitError(f"--backend {options.backend} contradicts {origin}, which is a {base_backend} config",
                            hint=f"drop --backend, or start from a {options.backend} preset (`accelkit config --list`)")

    merged = _merge(options_from_config(base) if base else ConfigOptions(), options)
    _check_json_reference(base, options)
    keeps_json = bool(section(base, "deepspeed_config").get("deepspeed_config_file"))
    resolved = _resolve(merged, keeps_json=keeps_json and options.deepspeed_json is None)
    check_options(resolved)
    config = _generate(resolved, base)
    config = _through_accelerate(config)
    built = BuiltConfig(config)
    if resolved.backend == "deepspeed" and resolved.deepspeed_json is not None:
        built.deepspeed_json = deepspeed_json_content(resolved)

    from accelkit.configs.validate import problems

    errors = [f for f in problems(built, deepspeed_json=built.deepspeed_json) if f.severity == "error"]
    if errors:
        raise AccelkitError(errors[0].message, hint=errors[0].fix)
    return built


def _merge(from_base: ConfigOptions, given: ConfigOptions) -> ConfigOptions:
    out = replace(from_base)
    for name, value in given.given().items():
        setattr(out, name, value)
    # A given option can make values inherited from the base meaningless; drop those instead of failing on them.
    if given.zero_stage is not None and given.zero_stage < 3:
        if given.offload_params is None:
            out.offload_params = None
        if given.zero3_save_16bit_model is None:
            out.zero3_save_16bit_model = None
    if given.zero_stage == 0 and given.offload_optimizer is None:
        out.offload_optimizer = None
    if given.offload is not None and out.backend == "deepspeed":
        out.offload_optimizer = given.offload_optimizer
        out.offload_params = given.offload_params
    if given.wrap_policy is not None:
        if given.wrap_policy != "transformer" and not given.wrap_cls:
            out.wrap_cls = ()
        if given.wrap_policy != "size" and given.min_num_params is None:
            out.min_num_params = None
    # --wrap-cls / --min-num-params imply their policy over a base's other policy.
    if given.wrap_cls and given.wrap_policy is None and out.wrap_policy not in (None, "transformer"):
        out.wrap_policy = "transformer"
    if given.min_num_params is not None and given.wrap_policy is None and out.wrap_policy not in (None, "size"):
        out.wrap_policy = "size"
    return out


def _check_json_reference(base: dict, given: ConfigOptions) -> None:
    """A base that points at a DeepSpeed JSON keeps those settings in the JSON: inline options would conflict."""
    if not section(base, "deepspeed_config").get("deepspeed_config_file") or given.deepspeed_json is not None:
        return
    inline = [flag_name(n) for n in ("zero_stage", "offload_optimizer", "offload_params", "offload", "nvme_path",
                                     "zero3_save_16bit_model", "gradient_accumulation_steps", "mixed_precision")
              if getattr(given, n) is not None]
    if inline:
        json_file = section(base, "deepspeed_config")["deepspeed_config_file"]
        raise AccelkitError(f"this config takes its DeepSpeed settings from {json_file}, so {', '.join(inline)} "
                            "cannot be set in the YAML",
                            hint="edit the DeepSpeed JSON, or pass --deepspeed-json PATH to write a new one with these "
                                 "settings")


def _resolve(m: ConfigOptions, keeps_json: bool = False) -> ConfigOptions:
    """Fill every default; the result has a concrete value for each setting of its backend. `keeps_json`: the base
    references a DeepSpeed JSON that stays in charge of precision."""
    r = replace(m)
    r.backend = r.backend or hardware.default_backend()
    r.num_machines = 1 if r.num_machines is None else r.num_machines
    r.machine_rank = 0 if r.machine_rank is None else r.machine_rank
    if r.num_processes is None:
        r.num_processes = hardware.default_num_processes(r.backend, max(r.num_machines, 1))
    if r.num_machines > 1 and r.main_process_port is None:
        r.main_process_port = DEFAULT_PORT
    if not (r.backend == "deepspeed" and (r.deepspeed_json is not None or keeps_json)):  # the JSON decides
        r.mixed_precision = r.mixed_precision or "no"
    if r.backend == "fsdp":
        r.fsdp_version = r.fsdp_version or 2
        r.sharding = r.sharding or "full"
        r.wrap_policy = r.wrap_policy or ("size" if r.min_num_params is not None else "transformer")
        if r.wrap_policy == "size" and r.min_num_params is None:
            r.min_num_params = DEFAULT_MIN_NUM_PARAMS
        r.state_dict = r.state_dict or "sharded"
        r.offload = bool(r.offload)
        r.activation_checkpointing = bool(r.activation_checkpointing)
        r.cpu_ram_efficient_loading = bool(r.cpu_ram_efficient_loading)
    elif r.backend == "deepspeed":
        r.zero_stage = 2 if r.zero_stage is None else r.zero_stage
        default_device = "cpu" if r.offload else "none"
        r.offload_optimizer = r.offload_optimizer or default_device
        r.offload_params = r.offload_params or (default_device if r.zero_stage == 3 else "none")
        if r.zero_stage == 3:
            r.zero3_save_16bit_model = bool(r.zero3_save_16bit_model)
        if r.gradient_accumulation_steps is None and r.deepspeed_json is None:
            r.gradient_accumulation_steps = 1
    return r


def _generate(r: ConfigOptions, base: dict) -> dict:
    same_backend = backend_of(base) == r.backend if base else False
    dtype = BACKEND_TYPES[r.backend]
    if r.backend == "cpu" and r.num_processes == 1:
        dtype = "NO"
    config: dict = {"compute_environment": "LOCAL_MACHINE", "distributed_type": dtype,
                    "num_machines": r.num_machines, "num_processes": r.num_processes, "machine_rank": r.machine_rank}
    if r.main_process_ip:
        config["main_process_ip"] = r.main_process_ip
    if r.main_process_port is not None:
        config["main_process_port"] = r.main_process_port
    base_json = same_backend and bool(section(base, "deepspeed_config").get("deepspeed_config_file"))
    json_mode = r.backend == "deepspeed" and (r.deepspeed_json is not None or base_json)
    if not json_mode:  # with a DeepSpeed JSON, precision lives in the JSON; Accelerate rejects it in the YAML
        config["mixed_precision"] = r.mixed_precision
    config["use_cpu"] = r.backend == "cpu"
    if r.backend == "fsdp":
        config["fsdp_config"] = _fsdp_section(r, fsdp_section(base) if same_backend else {})
        if r.fsdp_version == 2 and r.sharding == "hybrid":
            config["parallelism_config"] = {
                "parallelism_config_dp_replicate_size": r.num_machines,
                "parallelism_config_dp_shard_size": r.num_processes // r.num_machines,
                "parallelism_config_tp_size": 1, "parallelism_config_cp_size": 1}
    elif r.backend == "deepspeed":
        config["deepspeed_config"] = _deepspeed_section(r, section(base, "deepspeed_config") if same_backend else {})
    if same_backend:
        for key, value in base.items():
            if key not in OWNED_TOP:
                config[key] = value
    return config


def _fsdp_section(r: ConfigOptions, old: dict) -> dict:
    out: dict = {"fsdp_version": r.fsdp_version}
    if r.fsdp_version == 1:
        # FSDP1 reads fsdp_sharding_strategy, and the launcher fills FULL_SHARD when it is missing: write it.
        out["fsdp_sharding_strategy"] = STRATEGY[r.sharding]
        out["fsdp_reshard_after_forward"] = STRATEGY[r.sharding]
    else:
        # FSDP2: full = reshard parameters after forward (ZeRO-3 like); grad-op = keep them (ZeRO-2 like).
        out["fsdp_reshard_after_forward"] = r.sharding in ("full", "hybrid")
    out["fsdp_auto_wrap_policy"] = WRAP[r.wrap_policy]
    if r.wrap_policy == "transformer" and r.wrap_cls:
        out["fsdp_transformer_layer_cls_to_wrap"] = ",".join(r.wrap_cls)
    if r.wrap_policy == "size":
        out["fsdp_min_num_params"] = r.min_num_params
    out["fsdp_state_dict_type"] = STATE_DICT[r.state_dict]
    out["fsdp_offload_params"] = r.offload
    out["fsdp_activation_checkpointing"] = r.activation_checkpointing
    out["fsdp_cpu_ram_efficient_loading"] = r.cpu_ram_efficient_loading
    if r.fsdp_version == 1:
        # cpu_ram_efficient_loading requires sync_module_states (the launcher refuses otherwise).
        out["fsdp_sync_module_states"] = True if r.cpu_ram_efficient_loading else old.get(
            "fsdp_sync_module_states", True)
        for key, default in FSDP1_ONLY_DEFAULTS.items():
            out[key] = old.get(key, default)
    owned = {*out, *FSDP1_ONLY_DEFAULTS, "fsdp_sync_module_states", "fsdp_sharding_strategy",
             "fsdp_transformer_layer_cls_to_wrap", "fsdp_min_num_params"}
    out.update({k: v for k, v in old.items() if k not in owned})
    return out


def _deepspeed_section(r: ConfigOptions, old: dict) -> dict:
    out: dict = {}
    if r.deepspeed_json is not None:
        # Absolute: the ranks resolve it from wherever `accelerate launch` runs, not from the YAML's folder.
        out["deepspeed_config_file"] = str(Path(r.deepspeed_json).expanduser().resolve())
    elif old.get("deepspeed_config_file"):
        out["deepspeed_config_file"] = old["deepspeed_config_file"]  # kept as the base had it
    else:
        out["zero_stage"] = r.zero_stage
        out["offload_optimizer_device"] = r.offload_optimizer
        out["offload_param_device"] = r.offload_params
        if r.offload_optimizer == "nvme":
            out["offload_optimizer_nvme_path"] = r.nvme_path
        if r.offload_params == "nvme":
            out["offload_param_nvme_path"] = r.nvme_path
        if r.zero_stage == 3:
            out["zero3_save_16bit_model"] = r.zero3_save_16bit_model
        out["gradient_accumulation_steps"] = r.gradient_accumulation_steps
        if old.get("gradient_clipping") is not None:
            out["gradient_clipping"] = old["gradient_clipping"]
    if r.zero_stage == 3 or (out.get("deepspeed_config_file") and "zero3_init_flag" in old):
        out["zero3_init_flag"] = old.get("zero3_init_flag", True)
    if r.num_machines > 1 and "deepspeed_multinode_launcher" not in old:
        # "standard" runs torchrun on every machine (like DDP/FSDP); the default, pdsh, needs a hostfile and ssh.
        out["deepspeed_multinode_launcher"] = "standard"
    out.update({k: v for k, v in old.items() if k not in OWNED_DEEPSPEED and k not in out})
    return out


def _through_accelerate(config: dict) -> dict:
    """Construct Accelerate's ClusterConfig from the dict (its own checks and enum conversion) and read it back."""
    from accelerate.commands.config.config_args import ClusterConfig

    from accelkit.configs.schema import nearest, top_level_keys

    unknown = sorted(set(config) - top_level_keys())
    if unknown:
        guess = nearest(unknown[0], top_level_keys())
        raise AccelkitError(f"unknown Accelerate config key `{unknown[0]}`",
                            hint=f"did you mean `{guess}`?" if guess else "remove it: Accelerate refuses unknown keys")
    try:
        cluster = ClusterConfig(**ClusterConfig.process_config(copy.deepcopy(config)))
    except (TypeError, ValueError) as exc:
        raise AccelkitError(f"Accelerate rejects this config: {exc}", hint="fix the value it names") from None
    normalized = cluster.to_dict()
    return {key: normalized[key] for key in config if key in normalized}
