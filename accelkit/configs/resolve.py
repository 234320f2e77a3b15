"""Options on top of a preset or a config file, defaults filled -> one ResolvedConfig, checked, in one pass.

    read the base (a preset or a loaded --config file) into options   (reader.read_layer)
    lay the given options on top                                       (_merge)
    fill every default, noting where each value came from             (_fill)
    assemble the typed config, keeping the base's other keys           (_assemble)
    run the one rule set; errors stop here, warnings travel along      (rules.check_rules)
    let Accelerate's own ClusterConfig accept what will be written     (_through_accelerate)
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from accelkit.configs import machine_defaults, rules
from accelkit.configs.choices import Backend, MixedPrecision, OffloadDevice, Sharding, StateDict, WrapPolicy
from accelkit.configs.deepspeed_json import deepspeed_json_content
from accelkit.configs.findings import raise_first_error
from accelkit.configs.options import ND_OPTIONS, ND_SIZES, ConfigOptions, flag_name
from accelkit.configs.reader import ConfigLayer, read_layer
from accelkit.configs.resolved import (
    DEFAULT,
    FILE,
    FLAG,
    LABEL,
    PRESET,
    DeepSpeedSettings,
    FsdpSettings,
    ParallelismSettings,
    ResolvedConfig,
    Source,
)
from accelkit.errors import AccelkitError

DEFAULT_PORT = 29500
DEFAULT_MIN_NUM_PARAMS = 100_000_000
# FSDP1 keys accelkit writes with these defaults when the base config does not set them.
FSDP1_ONLY_DEFAULTS = {"fsdp_backward_prefetch": "BACKWARD_PRE", "fsdp_forward_prefetch": False,
                       "fsdp_use_orig_params": True}
_JSON_SETTINGS = ("zero_stage", "offload_optimizer", "offload_params", "offload", "nvme_path",
                  "zero3_save_16bit_model", "gradient_accumulation_steps", "mixed_precision")


def resolve_config(options: ConfigOptions, *, base: Mapping[str, Any] | None = None, base_label: str | None = None,
                   labels: Mapping[str, str] | None = None, launch: bool = False,
                   per_machine: bool = True, check_with_accelerate: bool = True) -> ResolvedConfig:
    """The config for `options` on top of `options.preset` or `base` (a loaded config file, named `base_label`).
    `labels`: option name -> how the user gave it when not by its own flag (e.g. "--cpu"). `launch`: for a launch
    rather than a file (gradient accumulation may then go to the environment). `per_machine=False`: a template for
    every machine of a cluster, whose rank and main address each node supplies. `check_with_accelerate=False`
    skips Accelerate's own check (it imports accelerate and torch: seconds), for a caller that only reads the
    backend of a config that is checked again where it runs. AccelkitError on anything that cannot work, naming
    the value as the user gave it."""
    layer = _base_layer(options, base, base_label)
    if layer is not None and options.backend and layer.backend and Backend(options.backend) is not layer.backend:
        origin = f"preset `{options.preset}`" if options.preset else f"the base config {base_label or ''}".rstrip()
        raise AccelkitError(f"--backend {options.backend} contradicts {origin}, which is a {layer.backend} config",
                            hint=f"drop --backend, or start from a {options.backend} preset (`accelkit config --list`)")
    base_options = layer.options if layer else ConfigOptions()
    merged = _merge(base_options, options)
    json_file = layer.values.get("json_file") if layer else None
    if json_file and options.deepspeed_json is None:
        _refuse_inline_deepspeed(options, json_file)

    sources: dict[str, Source] = {}
    if layer is not None:
        sources.update({name: layer.origin for name, value in base_options.given().items()
                        if getattr(merged, name) == value})
    sources.update({name: Source(FLAG, flag_name(name)) for name in options.given()})
    sources.update({name: Source(LABEL, label) for name, label in (labels or {}).items()})
    if layer is not None and layer.backend is Backend.FSDP and merged.fsdp_version is None:
        merged.fsdp_version = 1  # what the launcher runs for a file without fsdp_version
        sources["fsdp_version"] = Source(DEFAULT, f"the launcher's default: not set in {layer.origin}")
    filled = _fill(merged, sources, keeps_json=bool(json_file) and options.deepspeed_json is None)
    resolved = _assemble(filled, layer, sources, per_machine=per_machine)

    findings = rules.check_rules(resolved, options, writes_file=not launch)
    raise_first_error(findings, more=None)
    resolved = replace(resolved, grad_compression=_grad_compression(filled, resolved))
    if check_with_accelerate:
        _through_accelerate(resolved.to_accelerate_dict())
    warnings = [*(layer.findings if layer else ()), *findings]
    return replace(resolved, findings=tuple(f for f in warnings if not f.is_error))


def _grad_compression(r: ConfigOptions, resolved: ResolvedConfig) -> Any:
    """The gradient compression asked for, refused in one line where the backend cannot do it (accelkit.compression);
    None for none. int8's ZeRO++ JSON must pass DeepSpeed's own config class."""
    from accelkit.compression.checks import check_backend, spec_of_options

    spec = check_backend(spec_of_options(r), resolved, reduce_dtype_given=r.reduce_dtype is not None)
    if spec.method == "int8" and resolved.deepspeed is not None and resolved.deepspeed.json_content is not None:
        from accelkit.compression.zeropp import check_with_deepspeed

        check_with_deepspeed(resolved.deepspeed.json_content)
    return spec if spec.active else None


def _base_layer(options: ConfigOptions, base: Mapping[str, Any] | None, base_label: str | None) -> ConfigLayer | None:
    if options.preset and base is not None:
        raise AccelkitError("both a preset and a base config were given", hint="start from one of them, not both")
    if options.preset:
        from accelkit.configs.presets import load_preset

        raw, origin = load_preset(options.preset), Source(PRESET, options.preset)
    elif base:
        raw, origin = copy.deepcopy(dict(base)), Source(FILE, base_label or "the base config")
    else:
        return None
    layer = read_layer(raw, origin)
    if layer.backend is None:
        raise AccelkitError(f"distributed_type `{raw.get('distributed_type')}` is not one accelkit configures",
                            hint="accelkit writes single, cpu, ddp, fsdp and deepspeed configs; edit this one by hand")
    layer.refuse_if_broken()
    return layer


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
    if given.offload is not None and out.backend == Backend.DEEPSPEED:
        out.offload_optimizer = given.offload_optimizer
        out.offload_params = given.offload_params
    if given.wrap_policy is not None:
        if given.wrap_policy != WrapPolicy.TRANSFORMER and not given.wrap_cls:
            out.wrap_cls = ()
        if given.wrap_policy != WrapPolicy.SIZE and given.min_num_params is None:
            out.min_num_params = None
    # --wrap-cls / --min-num-params imply their policy over a base's other policy.
    if given.wrap_cls and given.wrap_policy is None and out.wrap_policy not in (None, WrapPolicy.TRANSFORMER):
        out.wrap_policy = WrapPolicy.TRANSFORMER.value
    if given.min_num_params is not None and given.wrap_policy is None and \
            out.wrap_policy not in (None, WrapPolicy.SIZE):
        out.wrap_policy = WrapPolicy.SIZE.value
    return out


def _refuse_inline_deepspeed(given: ConfigOptions, json_file: str) -> None:
    """A base that points at a DeepSpeed JSON keeps those settings in the JSON: inline options would conflict."""
    inline = [flag_name(n) for n in _JSON_SETTINGS if getattr(given, n) is not None]
    if inline:
        raise AccelkitError(f"this config takes its DeepSpeed settings from {json_file}, so {', '.join(inline)} "
                            "cannot be set in the YAML",
                            hint="edit the DeepSpeed JSON, or pass --deepspeed-json PATH to write a new one with these "
                                 "settings")


def _fill(m: ConfigOptions, sources: dict[str, Source], keeps_json: bool) -> ConfigOptions:
    """Every default filled, each noted in `sources`: the result has a concrete value for each setting of its
    backend. `keeps_json`: the base references a DeepSpeed JSON that stays in charge of precision."""
    r = replace(m)

    def default(name: str, value: Any, why: str = "") -> None:
        if getattr(r, name) is None:
            setattr(r, name, value)
            sources.setdefault(name, Source(DEFAULT, why))

    if r.backend is None:
        default("backend", machine_defaults.default_backend(r.num_processes, r.num_machines),
                _backend_default_reason(r))
    backend = Backend(r.backend)
    default("num_machines", 1)
    default("machine_rank", 0)
    if r.num_processes is None:  # counting GPUs imports torch: only when the default is needed
        default("num_processes", machine_defaults.default_num_processes(backend.value, max(r.num_machines, 1)))
    if r.num_machines > 1:
        default("main_process_port", DEFAULT_PORT)
    if not (backend is Backend.DEEPSPEED and (r.deepspeed_json is not None or keeps_json)):  # the JSON decides
        default("mixed_precision", MixedPrecision.NO.value)
    if backend is Backend.FSDP:
        default("fsdp_version", 2)
        default("sharding", Sharding.FULL.value)
        default("wrap_policy", WrapPolicy.SIZE.value if r.min_num_params is not None else WrapPolicy.TRANSFORMER.value)
        if r.wrap_policy == WrapPolicy.SIZE:
            default("min_num_params", DEFAULT_MIN_NUM_PARAMS)
        default("state_dict", StateDict.SHARDED.value)
        for name in ("offload", "activation_checkpointing", "cpu_ram_efficient_loading"):
            default(name, False)
    elif backend is Backend.DEEPSPEED:
        default("zero_stage", 2)
        device = OffloadDevice.CPU.value if r.offload else OffloadDevice.NONE.value
        for name in ("offload_optimizer", "offload_params"):
            if getattr(r, name) is None and r.offload is not None:
                sources.setdefault(name, Source(LABEL, "--offload"))
        default("offload_optimizer", device)
        default("offload_params", device if r.zero_stage == 3 else OffloadDevice.NONE.value)
        if r.zero_stage == 3:
            default("zero3_save_16bit_model", False)
        if r.deepspeed_json is None and not keeps_json:
            default("gradient_accumulation_steps", 1)
    if any(getattr(r, name) is not None for name in ND_OPTIONS):
        _fill_parallelism(r, backend, default)
    return r


def _fill_parallelism(r: ConfigOptions, backend: Backend, default: Any) -> None:
    """Sizes not given are 1, except the data-parallel dimension of the backend (FSDP's dp_shard, DDP's
    dp_replicate), which takes the processes the others leave: `--tp-size 2` on 8 GPUs = dp_shard 4 x tp 2."""
    rest = "dp_shard_size" if backend is Backend.FSDP else "dp_replicate_size" if backend is Backend.DDP else None
    if rest is not None and getattr(r, rest) is None:
        others = math.prod(getattr(r, name) or 1 for name in (*ND_SIZES.values(), "pp_size") if name != rest)
        if others > 0 and r.num_processes % others == 0:
            default(rest, r.num_processes // others, f"the processes left by the other sizes: {r.num_processes} / "
                    f"{others}")
    for name in (*ND_SIZES.values(), "pp_size"):
        default(name, 1)
    if r.pp_size > 1:
        from accelkit.pipeline_schedules import DEFAULT_SCHEDULE, default_microbatches, parse_schedule

        if r.pp_schedule is not None:  # any accepted spelling (`Interleaved1F1B`) -> the name configs carry
            r.pp_schedule = parse_schedule(r.pp_schedule).name
        default("pp_schedule", DEFAULT_SCHEDULE.name)
        stages = default_microbatches(r.pp_size, r.pp_schedule)
        default("microbatches", stages, f"default: one per stage, {stages} stages of --pp-size {r.pp_size}")


def _backend_default_reason(r: ConfigOptions) -> str:
    if (r.num_processes or 0) > 1:
        return f"default for {r.num_processes} processes"
    if (r.num_machines or 0) > 1:
        return f"default for {r.num_machines} machines"
    gpus = machine_defaults.gpu_count()
    return f"default with {gpus} GPU(s) here"


def _assemble(r: ConfigOptions, layer: ConfigLayer | None, sources: dict[str, Source], *,
              per_machine: bool) -> ResolvedConfig:
    """The typed config for filled options `r`, keeping what the base config holds that accelkit does not model."""
    backend = Backend(r.backend)
    fsdp = _fsdp_settings(r, layer) if backend is Backend.FSDP else None
    deepspeed = _deepspeed_settings(r, layer) if backend is Backend.DEEPSPEED else None
    return ResolvedConfig(
        backend=backend, num_processes=r.num_processes, num_machines=r.num_machines, machine_rank=r.machine_rank,
        main_process_ip=r.main_process_ip or None, main_process_port=r.main_process_port,
        mixed_precision=None if r.mixed_precision is None else MixedPrecision(r.mixed_precision),
        gradient_accumulation_steps=r.gradient_accumulation_steps, use_cpu=backend is Backend.CPU, fsdp=fsdp,
        deepspeed=deepspeed, parallelism=ParallelismSettings.of(r, layer.parallelism_extra if layer else None),
        extra=dict(layer.extra) if layer else {}, sources=dict(sources), per_machine=per_machine)


def _fsdp_settings(r: ConfigOptions, layer: ConfigLayer | None) -> FsdpSettings:
    old_extra = dict(layer.fsdp_extra) if layer else {}
    old_sync = layer.values.get("sync_module_states") if layer else None
    policy = WrapPolicy(r.wrap_policy)
    sync = None
    extra = {key: value for key, value in old_extra.items() if key not in FSDP1_ONLY_DEFAULTS}
    if r.fsdp_version == 1:
        # cpu_ram_efficient_loading requires sync_module_states (the launcher refuses otherwise).
        sync = True if r.cpu_ram_efficient_loading else (True if old_sync is None else old_sync)
        extra = {**{key: old_extra.get(key, value) for key, value in FSDP1_ONLY_DEFAULTS.items()}, **extra}
    return FsdpSettings(
        version=r.fsdp_version, sharding=Sharding(r.sharding), wrap_policy=policy,
        wrap_cls=r.wrap_cls, min_num_params=r.min_num_params, state_dict=StateDict(r.state_dict),
        offload=bool(r.offload), activation_checkpointing=bool(r.activation_checkpointing),
        cpu_ram_efficient_loading=bool(r.cpu_ram_efficient_loading), sync_module_states=sync, extra=extra)


def _deepspeed_settings(r: ConfigOptions, layer: ConfigLayer | None) -> DeepSpeedSettings:
    old = dict(layer.deepspeed_extra) if layer else {}
    old_json = layer.values.get("json_file") if layer else None
    old_init = layer.values.get("zero3_init_flag") if layer else None
    json_file, content = old_json, None
    if r.deepspeed_json is not None:
        # Absolute: the ranks resolve it from wherever `accelerate launch` runs, not from the YAML's folder.
        json_file = str(Path(r.deepspeed_json).expanduser().resolve())
        content = deepspeed_json_content(r)
    extra = {key: value for key, value in old.items() if not (json_file and key == "gradient_clipping")}
    if r.num_machines > 1 and "deepspeed_multinode_launcher" not in extra:
        # "standard" runs torchrun on every machine (like DDP/FSDP); the default, pdsh, needs a hostfile and ssh.
        extra["deepspeed_multinode_launcher"] = "standard"
    init = None
    if r.zero_stage == 3 or (json_file and old_init is not None):
        init = True if old_init is None else old_init
    inline = json_file is None
    return DeepSpeedSettings(
        zero_stage=r.zero_stage if inline else None,
        offload_optimizer=OffloadDevice(r.offload_optimizer) if inline and r.offload_optimizer else None,
        offload_params=OffloadDevice(r.offload_params) if inline and r.offload_params else None,
        nvme_path=r.nvme_path if inline else None,
        zero3_save_16bit_model=r.zero3_save_16bit_model if inline else None,
        zero3_init_flag=init, json_file=json_file, json_content=content, extra=extra)


def _through_accelerate(config: dict[str, Any]) -> None:
    """Accelerate's own ClusterConfig must accept the dict accelkit will write (its checks and enum conversion)."""
    from accelerate.commands.config.config_args import ClusterConfig

    try:
        ClusterConfig(**ClusterConfig.process_config(copy.deepcopy(config)))
    except (TypeError, ValueError) as exc:
        raise AccelkitError(f"Accelerate rejects this config: {exc}", hint="fix the value it names") from None
