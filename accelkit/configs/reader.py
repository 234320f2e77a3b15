"""Read an Accelerate config (a dict loaded from YAML) into accelkit's terms, with what only a file can get wrong.

`read_layer` turns the dict into the ConfigOptions it corresponds to (plus the few values a file holds that are not
options, and the keys accelkit does not model, kept as they are) and reports, as findings: keys Accelerate refuses or
silently ignores, values of the wrong type, keys `accelerate launch` ignores or overrides when they sit in a YAML,
and values accelkit cannot rewrite. `read_config` gives the file as a ResolvedConfig, values it omits marked
absent (what Accelerate assumes, never written back), for `config --check` and for rehearsing a dict as it is.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accelkit.configs import schema
from accelkit.configs.choices import Backend, Choice, MixedPrecision, OffloadDevice, Sharding, StateDict, WrapPolicy
from accelkit.configs.choices import from_accelerate as choice_from
from accelkit.configs.findings import ERROR, WARNING, Finding
from accelkit.configs.options import ND_SIZES, ConfigOptions, flag_name
from accelkit.configs.resolved import (
    ABSENT,
    DeepSpeedSettings,
    FsdpSettings,
    ParallelismSettings,
    ResolvedConfig,
    Source,
)
from accelkit.errors import AccelkitError

# Top-level keys accelkit models; any other key of a file is kept as it is.
MODELED_TOP = {"compute_environment", "distributed_type", "num_processes", "num_machines", "machine_rank",
               "main_process_ip", "main_process_port", "mixed_precision", "use_cpu", "fsdp_config",
               "deepspeed_config", "parallelism_config"}
MODELED_FSDP = {"fsdp_version", "fsdp_sharding_strategy", "fsdp_reshard_after_forward", "fsdp_auto_wrap_policy",
                "fsdp_transformer_layer_cls_to_wrap", "fsdp_min_num_params", "fsdp_state_dict_type",
                "fsdp_offload_params", "fsdp_activation_checkpointing", "fsdp_cpu_ram_efficient_loading",
                "fsdp_sync_module_states"}
MODELED_DEEPSPEED = {*schema.DEEPSPEED_JSON_CONFLICTS, "deepspeed_config_file", "zero3_init_flag"}
FSDP_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")
TRUE, FALSE = {"true", "1", "yes"}, {"false", "0", "no"}


def as_bool(value: object) -> bool | None:
    """The one reading of "is this true?" for config values: None when it is neither true nor false."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    return True if text in TRUE else False if text in FALSE else None


@dataclass
class ConfigLayer:
    """What one config file sets, in accelkit's terms."""

    origin: Source
    options: ConfigOptions
    backend: Backend | None = None
    distributed_type: str = ""
    values: dict[str, Any] = field(default_factory=dict)  # use_cpu, sync_module_states, zero3_init_flag, ...
    extra: dict[str, Any] = field(default_factory=dict)  # top-level keys accelkit does not model
    fsdp_extra: dict[str, Any] = field(default_factory=dict)
    deepspeed_extra: dict[str, Any] = field(default_factory=dict)
    parallelism_extra: dict[str, Any] = field(default_factory=dict)  # e.g. parallelism_config_cp_comm_strategy
    findings: list[Finding] = field(default_factory=list)  # what the file gets wrong (see the module docstring)
    unmodeled: list[Finding] = field(default_factory=list)  # values accelkit cannot carry into a config it writes

    @property
    def sources(self) -> dict[str, Source]:
        return {name: self.origin for name in self.options.given()}

    def refuse_if_broken(self) -> None:
        """AccelkitError when accelkit cannot build on this file: an error in it, or a value it does not model."""
        refused = [f for f in self.findings if f.is_error] + self.unmodeled
        if refused:
            raise AccelkitError(f"{self.origin}: {refused[0].message}", hint=refused[0].hint)


class _Reader:
    def __init__(self, raw: Mapping[str, Any], origin: Source) -> None:
        self.raw = raw
        self.layer = ConfigLayer(origin=origin, options=ConfigOptions())

    def find(self, code: str, severity: str, message: str, hint: str, key: str = "", option: str = "",
             accelerate_only: bool = False) -> None:
        self.layer.findings.append(Finding(code, severity, message, hint, key=key,
                                           flag=flag_name(option) if option else "", accelerate_only=accelerate_only))

    def unmodeled(self, key: str, value: object, choices: str) -> None:
        self.layer.unmodeled.append(Finding(
            "unmodeled-value", WARNING, f"accelkit does not model `{key}: {value}`, so `accelkit launch --config` and "
            "`accelkit config --preset` cannot rewrite this file", f"use one of {choices} (or launch the file as it is "
            "with `accelerate launch --config_file`)", key=key))

    def integer(self, section: Mapping[str, Any], key: str, path: str) -> int | None:
        value = section.get(key)
        if value is None:
            return None
        try:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            self.find("not-an-integer", ERROR, f"`{path}: {value}` is not an integer",
                      f"write a whole number for `{path}`", key=path)
            return None

    def boolean(self, section: Mapping[str, Any], key: str, path: str) -> bool | None:
        value = section.get(key)
        if value is None:
            return None
        result = as_bool(value)
        if result is None:
            self.find("not-a-boolean", ERROR, f"`{path}: {value}` is not true or false",
                      f"write `{path}: true` or `{path}: false`", key=path)
        return result

    def choice(self, kind: type[Choice], section: Mapping[str, Any], key: str, path: str) -> Choice | None:
        value = section.get(key)
        if value is None:
            return None
        found = choice_from(kind, value)
        if found is None:
            self.unmodeled(path, value, ", ".join(m.accelerate for m in kind))
        return found


def read_layer(raw: Mapping[str, Any], origin: Source, *, relative_to: Path | None = None,
               json_content: Mapping[str, Any] | None = None) -> ConfigLayer:
    """The options and values `raw` sets, its extra keys, and its findings. `json_content`: the DeepSpeed JSON when
    it is not on disk yet; otherwise deepspeed_config_file is read (relative paths from `relative_to`, default the
    current directory)."""
    reader = _Reader(raw, origin)
    layer, opts = reader.layer, reader.layer.options
    _structure(reader)
    layer.distributed_type = str(getattr(raw.get("distributed_type"), "value", raw.get("distributed_type", "")))
    use_cpu = reader.boolean(raw, "use_cpu", "use_cpu")
    if use_cpu is not None:
        layer.values["use_cpu"] = use_cpu
    if raw.get("compute_environment") is not None:
        layer.values["compute_environment"] = str(raw["compute_environment"])
    layer.backend = Backend.of(layer.distributed_type, bool(use_cpu)) if "distributed_type" in raw else None
    if "distributed_type" in raw and layer.backend is None:
        reader.find("unmodeled-backend", WARNING, f"accelkit does not model distributed_type "
                    f"`{layer.distributed_type}`: only Accelerate's loader checks this file",
                    "accelkit checks NO, MULTI_CPU, MULTI_GPU, FSDP and DEEPSPEED configs", key="distributed_type")
    opts.backend = layer.backend.value if layer.backend else None

    for key in ("num_processes", "num_machines", "machine_rank", "main_process_port"):
        setattr(opts, key, reader.integer(raw, key, key))
    if opts.num_processes == -1:  # Accelerate's "not set" marker
        opts.num_processes = None
    if opts.num_processes is None and layer.distributed_type.upper() not in ("", "NO"):
        reader.find("num-processes-missing", ERROR, "num_processes is not set: `accelerate launch` will refuse to "
                    "start", "add `num_processes: N` (the total across all machines)", key="num_processes",
                    option="num_processes")
    if raw.get("main_process_ip"):
        opts.main_process_ip = str(raw["main_process_ip"])
    _mixed_precision(reader, raw.get("mixed_precision"))
    for key, default in schema.IGNORED_BY_LAUNCHER.items():
        # rendezvous settings only matter across machines; CPU affinity matters anywhere
        multi_node = (opts.num_machines or 1) > 1
        if key in raw and raw[key] != default and (multi_node or key == "enable_cpu_affinity"):
            flag = "--" + key
            reader.find("yaml-key-ignored", WARNING, f"`{key}: {raw[key]}` has no effect: `accelerate launch` reads "
                        f"it only from its {flag} flag", f"remove it and pass {flag} when launching (`accelkit "
                        "launch` passes it for you)", key=key, accelerate_only=True)
    layer.extra = {key: value for key, value in raw.items() if key not in MODELED_TOP}
    if layer.backend is Backend.FSDP:
        _fsdp(reader, raw)
    elif layer.backend is Backend.DEEPSPEED:
        _deepspeed(reader, raw, relative_to, json_content)
    _parallelism(reader, raw)
    return layer


def _parallelism(reader: _Reader, raw: Mapping[str, Any]) -> None:
    """parallelism_config's sizes as options. An FSDP2 hybrid section of the shape accelkit writes for
    `--sharding hybrid` (replicate = machines, shard = processes per machine, nothing else) stays `sharding
    hybrid`, so it follows the machine count when a launch changes it."""
    layer, opts = reader.layer, reader.layer.options
    section = schema.section(raw, "parallelism_config")
    if not section:
        return
    prefix = "parallelism_config_"
    sizes = {name: reader.integer(section, f"{prefix}{name}", f"parallelism_config.{prefix}{name}")
             for name in ND_SIZES.values()}
    backends = {name: section.get(f"{prefix}{name}") for name in ("cp_backend", "sp_backend")}
    machines = opts.num_machines or 1
    legacy_hybrid = (layer.backend is Backend.FSDP and opts.sharding == Sharding.HYBRID.value
                     and all((sizes[n] or 1) == 1 for n in ("tp_size", "cp_size", "sp_size"))
                     and sizes["dp_replicate_size"] == machines and opts.num_processes is not None
                     and sizes["dp_shard_size"] == opts.num_processes // machines
                     and not any(backends.values()))
    if not legacy_hybrid:
        for name, value in sizes.items():
            setattr(opts, name, value)
        for name, value in backends.items():
            setattr(opts, name, None if value is None else str(value))
    modeled = {f"{prefix}{name}" for name in (*ND_SIZES.values(), "cp_backend", "sp_backend")}
    layer.parallelism_extra = {key: value for key, value in section.items() if key not in modeled}


def _structure(reader: _Reader) -> None:
    raw = reader.raw
    valid = schema.top_level_keys()
    for key in sorted(set(raw) - valid, key=str):
        guess = schema.nearest(str(key), valid)
        reader.find("unknown-key", ERROR, f"unknown key `{key}`: Accelerate refuses to load the file",
                    f"rename it to `{guess}`" if guess else "remove it (Accelerate's loader refuses unknown keys)",
                    key=str(key))
    if "distributed_type" not in raw:
        reader.find("missing-distributed-type", ERROR, "`distributed_type` is missing (it is the one required key)",
                    "add e.g. `distributed_type: MULTI_GPU` (or regenerate with `accelkit config`)",
                    key="distributed_type")
    for name in ("fsdp_config", "deepspeed_config", "parallelism_config", "mpirun_config", "dynamo_config"):
        if raw.get(name) is not None and not isinstance(raw[name], dict):
            reader.find("not-a-mapping", ERROR, f"`{name}` must be a mapping of keys, not {raw[name]!r}",
                        f"write `{name}:` followed by indented `key: value` lines, or remove it", key=name)
    for name in ("fsdp_config", "deepspeed_config", "parallelism_config"):
        valid_nested = schema.nested_keys(name) or frozenset()
        for key in sorted(schema.section(raw, name), key=str):
            spelled = str(key) if name != "fsdp_config" or str(key).startswith("fsdp_") else f"fsdp_{key}"
            if spelled in valid_nested:
                continue
            guess = schema.nearest(spelled, valid_nested)
            reader.find("unknown-nested-key", ERROR, f"unknown key `{name}.{key}`: `accelerate launch` silently "
                        "ignores it", f"rename it to `{guess}`" if guess else "remove it", key=f"{name}.{key}")


def _mixed_precision(reader: _Reader, value: object) -> None:
    if value is None:
        return
    text = str(value)
    if text not in ("no", "fp16", "bf16", "fp8"):
        reader.find("unknown-mixed-precision", ERROR, f"mixed_precision `{text}` is not one Accelerate knows",
                    "use no, fp16 or bf16", key="mixed_precision", option="mixed_precision")
        return
    if text == "fp8":
        reader.unmodeled("mixed_precision", text, "no, fp16, bf16")
        return
    reader.layer.options.mixed_precision = text


def _fsdp(reader: _Reader, raw: Mapping[str, Any]) -> None:
    layer, opts = reader.layer, reader.layer.options
    fsdp = schema.fsdp_section(raw)
    path = "fsdp_config.".__add__
    opts.fsdp_version = reader.integer(fsdp, "fsdp_version", path("fsdp_version"))
    if "fsdp_version" not in fsdp:
        reader.find("fsdp-version-missing", WARNING, "fsdp_version is not set: `accelerate launch` then uses FSDP1",
                    "add `fsdp_version: 2` (or 1) to fsdp_config", key=path("fsdp_version"), option="fsdp_version",
                    accelerate_only=True)
    version = opts.fsdp_version or 1
    reshard = fsdp.get("fsdp_reshard_after_forward")
    reshard_is_strategy = str(reshard).upper() in FSDP_STRATEGIES
    strategy = fsdp.get("fsdp_sharding_strategy")
    if version == 1 and strategy is None and reshard_is_strategy and str(reshard).upper() != "FULL_SHARD":
        reader.find("fsdp1-strategy-overridden", ERROR, f"FSDP1 with fsdp_reshard_after_forward {reshard} but no "
                    "fsdp_sharding_strategy: the launcher's default FULL_SHARD wins",
                    f"add `fsdp_sharding_strategy: {str(reshard).upper()}`", key=path("fsdp_sharding_strategy"),
                    option="sharding")
    if version == 2 and reshard is not None and reshard_is_strategy:
        reader.find("fsdp2-reshard-not-boolean", ERROR, f"FSDP2 takes true/false for fsdp_reshard_after_forward, "
                    f"not {reshard}", "use true (like FULL_SHARD) or false (like SHARD_GRAD_OP)",
                    key=path("fsdp_reshard_after_forward"), option="sharding")
    if version == 2 and str(strategy or "").upper() not in ("", "FULL_SHARD"):
        reader.find("fsdp2-strategy-ignored", WARNING, "fsdp_sharding_strategy is ignored by FSDP2",
                    "express it with fsdp_reshard_after_forward (true = full, false = grad-op)",
                    key=path("fsdp_sharding_strategy"), option="sharding")
    sharding = _sharding(reader, fsdp, version, strategy, reshard, reshard_is_strategy)
    replicate = reader.integer(schema.section(raw, "parallelism_config"), "parallelism_config_dp_replicate_size",
                               "parallelism_config.parallelism_config_dp_replicate_size")
    if replicate is not None and replicate > 1:
        sharding = Sharding.HYBRID
    opts.sharding = sharding.value if sharding else None
    policy = reader.choice(WrapPolicy, fsdp, "fsdp_auto_wrap_policy", path("fsdp_auto_wrap_policy"))
    opts.wrap_policy = policy.value if policy else None
    classes = fsdp.get("fsdp_transformer_layer_cls_to_wrap")
    if classes:
        names = classes if isinstance(classes, list) else str(classes).split(",")
        opts.wrap_cls = tuple(str(n).strip() for n in names if str(n).strip())
    min_params = reader.integer(fsdp, "fsdp_min_num_params", path("fsdp_min_num_params"))
    if policy is WrapPolicy.SIZE:
        opts.min_num_params = min_params
    state_dict = reader.choice(StateDict, fsdp, "fsdp_state_dict_type", path("fsdp_state_dict_type"))
    opts.state_dict = state_dict.value if state_dict else None
    for key, attr in (("fsdp_offload_params", "offload"), ("fsdp_activation_checkpointing", "activation_checkpointing"),
                      ("fsdp_cpu_ram_efficient_loading", "cpu_ram_efficient_loading")):
        setattr(opts, attr, reader.boolean(fsdp, key, path(key)))
    sync = reader.boolean(fsdp, "fsdp_sync_module_states", path("fsdp_sync_module_states"))
    if sync is not None:
        layer.values["sync_module_states"] = sync
    if opts.cpu_ram_efficient_loading and sync is False:
        reader.find("fsdp-loading-needs-sync", ERROR, "fsdp_cpu_ram_efficient_loading needs fsdp_sync_module_states: "
                    "the launcher refuses this combination", "set `fsdp_sync_module_states: true`",
                    key=path("fsdp_sync_module_states"), option="cpu_ram_efficient_loading")
    layer.fsdp_extra = {key: value for key, value in fsdp.items() if key not in MODELED_FSDP}


def _sharding(reader: _Reader, fsdp: Mapping[str, Any], version: int, strategy: object, reshard: object,
              reshard_is_strategy: bool) -> Sharding | None:
    if strategy is not None and version == 1:
        return reader.choice(Sharding, fsdp, "fsdp_sharding_strategy", "fsdp_config.fsdp_sharding_strategy")
    if reshard is not None and reshard_is_strategy:
        return reader.choice(Sharding, fsdp, "fsdp_reshard_after_forward", "fsdp_config.fsdp_reshard_after_forward")
    if reshard is not None:
        full = reader.boolean(fsdp, "fsdp_reshard_after_forward", "fsdp_config.fsdp_reshard_after_forward")
        return None if full is None else Sharding.FULL if full else Sharding.GRAD_OP
    return None


def _deepspeed(reader: _Reader, raw: Mapping[str, Any], relative_to: Path | None,
               content: Mapping[str, Any] | None) -> None:
    layer, opts = reader.layer, reader.layer.options
    ds = schema.section(raw, "deepspeed_config")
    path = "deepspeed_config.".__add__
    json_file = ds.get("deepspeed_config_file")
    if json_file:
        layer.values["json_file"] = str(json_file)
        conflicts = [k for k in schema.DEEPSPEED_JSON_CONFLICTS if k in ds]
        if raw.get("mixed_precision") is not None:
            conflicts.append("mixed_precision")
        if conflicts:
            reader.find("deepspeed-json-conflict", ERROR, f"deepspeed_config_file is set, so Accelerate refuses "
                        f"{', '.join(conflicts)} in the YAML", "remove them from the YAML and set them in the "
                        "DeepSpeed JSON instead", key=path("deepspeed_config_file"), option="deepspeed_json")
        _deepspeed_json(reader, Path(str(json_file)), relative_to, content)
    else:
        opts.zero_stage = reader.integer(ds, "zero_stage", path("zero_stage"))
        for key, attr in (("offload_optimizer_device", "offload_optimizer"),
                          ("offload_param_device", "offload_params")):
            device = reader.choice(OffloadDevice, ds, key, path(key))
            setattr(opts, attr, device.value if device else None)
        nvme = ds.get("offload_param_nvme_path") or ds.get("offload_optimizer_nvme_path")
        if nvme and "nvme" in (opts.offload_optimizer, opts.offload_params):
            opts.nvme_path = str(nvme)
        opts.zero3_save_16bit_model = reader.boolean(ds, "zero3_save_16bit_model", path("zero3_save_16bit_model"))
        opts.gradient_accumulation_steps = reader.integer(ds, "gradient_accumulation_steps",
                                                          path("gradient_accumulation_steps"))
        if ds.get("gradient_clipping") is not None:
            layer.deepspeed_extra["gradient_clipping"] = ds["gradient_clipping"]
    init = reader.boolean(ds, "zero3_init_flag", path("zero3_init_flag"))
    if init is not None:
        layer.values["zero3_init_flag"] = init
    layer.deepspeed_extra.update({k: v for k, v in ds.items() if k not in MODELED_DEEPSPEED})


def _deepspeed_json(reader: _Reader, path: Path, relative_to: Path | None, content: Mapping[str, Any] | None) -> None:
    key = "deepspeed_config.deepspeed_config_file"
    if content is None:
        full = path if path.is_absolute() else (relative_to or Path.cwd()) / path
        if not full.is_file():
            reader.find("deepspeed-json-missing", ERROR, f"deepspeed_config_file {path} does not exist (relative "
                        "paths are resolved from the directory you launch from)", "write it with `accelkit config "
                        "--backend deepspeed --deepspeed-json PATH`, or fix the path", key=key)
            return
        try:
            content = json.loads(full.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            reader.find("deepspeed-json-invalid", ERROR, f"deepspeed_config_file {path} is not valid JSON: {exc}",
                        "fix the JSON syntax", key=key)
            return
    if not isinstance(content, dict) or "zero_optimization" not in content:
        reader.find("deepspeed-json-invalid", ERROR, f"{path} has no zero_optimization section (Accelerate "
                    "requires it)", 'add "zero_optimization": {"stage": 2}', key=key)


def read_config(raw: Mapping[str, Any], origin: Source | None = None, *, relative_to: Path | None = None,
                json_content: Mapping[str, Any] | None = None) -> tuple[ResolvedConfig | None, list[Finding]]:
    """The file as it is, as a ResolvedConfig (None when accelkit cannot model it: a missing or foreign
    distributed_type, values of the wrong type), and its findings. Nothing is filled in: what the file omits is
    marked absent, with the value Accelerate assumes."""
    origin = origin or Source("file", "the config")
    layer = read_layer(raw, origin, relative_to=relative_to, json_content=json_content)
    if layer.backend is None or any(f.code in ("not-an-integer", "not-a-boolean", "not-a-mapping")
                                    for f in layer.findings):
        return None, layer.findings + layer.unmodeled
    return as_written(layer), layer.findings + layer.unmodeled


def as_written(layer: ConfigLayer) -> ResolvedConfig:
    """A layer as a ResolvedConfig without defaults: what the file omits gets Accelerate's value, marked absent."""
    opts, values = layer.options, layer.values
    sources = dict(layer.sources)
    absent = Source(ABSENT, layer.origin.label if layer.origin.kind == "file" else str(layer.origin))

    def given(name: str, value: Any, assumed: Any) -> Any:
        if value is None:
            sources[name] = absent
            return assumed
        return value

    backend = layer.backend
    assert backend is not None
    fsdp = deepspeed = None
    if backend is Backend.FSDP:
        fsdp = FsdpSettings(
            version=given("fsdp_version", opts.fsdp_version, 1), sharding=_enum(Sharding, opts.sharding),
            wrap_policy=_enum(WrapPolicy, opts.wrap_policy), wrap_cls=opts.wrap_cls,
            min_num_params=opts.min_num_params, state_dict=_enum(StateDict, opts.state_dict), offload=opts.offload,
            activation_checkpointing=opts.activation_checkpointing,
            cpu_ram_efficient_loading=opts.cpu_ram_efficient_loading,
            sync_module_states=values.get("sync_module_states"), extra=dict(layer.fsdp_extra))
    elif backend is Backend.DEEPSPEED:
        deepspeed = DeepSpeedSettings(
            zero_stage=opts.zero_stage, offload_optimizer=_enum(OffloadDevice, opts.offload_optimizer),
            offload_params=_enum(OffloadDevice, opts.offload_params), nvme_path=opts.nvme_path,
            zero3_save_16bit_model=opts.zero3_save_16bit_model, zero3_init_flag=values.get("zero3_init_flag"),
            json_file=values.get("json_file"), extra=dict(layer.deepspeed_extra))
    in_json = deepspeed is not None and deepspeed.uses_json
    return ResolvedConfig(
        backend=backend, num_processes=given("num_processes", opts.num_processes, 1),
        num_machines=given("num_machines", opts.num_machines, 1),
        machine_rank=given("machine_rank", opts.machine_rank, 0), main_process_ip=opts.main_process_ip,
        main_process_port=opts.main_process_port,
        mixed_precision=None if in_json else given("mixed_precision", _enum(MixedPrecision, opts.mixed_precision),
                                                   MixedPrecision.NO),
        gradient_accumulation_steps=opts.gradient_accumulation_steps,
        use_cpu=given("use_cpu", values.get("use_cpu"), False), fsdp=fsdp, deepspeed=deepspeed,
        parallelism=ParallelismSettings.of(opts, layer.parallelism_extra),
        compute_environment=values.get("compute_environment"), extra=dict(layer.extra), sources=sources,
        findings=tuple(f for f in layer.findings if not f.is_error))


def _enum(kind: type[Choice], value: object) -> Any:
    return None if value is None else kind(value)
