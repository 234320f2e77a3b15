"""ResolvedConfig: one job's Accelerate config as typed, frozen values, each with where it came from.

Built once by accelkit.configs.resolve (command-line options on top of a preset or a config file, defaults filled)
or read as it is from a file (accelkit.configs.reader); every other package reads it: the rules, the renderer, the
launch plan and summary, the CPU rehearsal (which turns one ResolvedConfig into another). `to_accelerate_dict()` is
the one place that spells it as Accelerate's config keys, for the YAML renderer and the launcher.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accelkit.configs.choices import (
    CP_BACKENDS,
    SP_BACKENDS,
    Backend,
    MixedPrecision,
    OffloadDevice,
    Sharding,
    StateDict,
    WrapPolicy,
)
from accelkit.configs.findings import Finding
from accelkit.configs.mesh import ACCELERATE_DIMENSIONS, MESH_DIMENSIONS, Mesh
from accelkit.configs.options import config_key, flag_name

# option name -> ParallelismSettings field
ND_FIELDS = {"dp_replicate_size": "dp_replicate", "dp_shard_size": "dp_shard", "tp_size": "tp", "cp_size": "cp",
             "sp_size": "sp", "cp_backend": "cp_backend", "sp_backend": "sp_backend", "pp_size": "pp",
             "pp_schedule": "pp_schedule", "microbatches": "microbatches"}
FLAG, FILE, PRESET, DEFAULT, ABSENT, LABEL = "flag", "file", "preset", "default", "absent", "label"


@dataclass(frozen=True)
class Source:
    """Where one value came from. `absent`: not in the file that was read; Accelerate assumes the value shown,
    and the value is not written back."""

    kind: str  # FLAG | FILE | PRESET | DEFAULT | ABSENT | LABEL
    label: str = ""  # the flag (`--num-processes`), the file, the preset's name, or a label such as "--cpu"

    @classmethod
    def labelled(cls, label: str) -> Source:
        """A value set for a reason the label says (`--cpu`: the rehearsal chose it)."""
        return cls(LABEL, label)

    @property
    def from_file(self) -> bool:
        return self.kind == FILE

    def __str__(self) -> str:
        if self.kind == PRESET:
            return f"preset {self.label}"
        if self.kind == DEFAULT:
            return self.label or "default"  # a label says which default: "default for 2 processes"
        if self.kind == ABSENT:
            return f"not set in {self.label}" if self.label else "not set"
        return self.label


@dataclass(frozen=True)
class FsdpSettings:
    version: int
    sharding: Sharding | None = None
    wrap_policy: WrapPolicy | None = None
    wrap_cls: tuple[str, ...] = ()
    min_num_params: int | None = None
    state_dict: StateDict | None = None
    offload: bool | None = None
    activation_checkpointing: bool | None = None
    cpu_ram_efficient_loading: bool | None = None
    sync_module_states: bool | None = None  # FSDP1
    extra: Mapping[str, Any] = field(default_factory=dict)  # fsdp_config keys accelkit does not model, as given


@dataclass(frozen=True)
class DeepSpeedSettings:
    zero_stage: int | None = None  # None: the DeepSpeed JSON decides
    offload_optimizer: OffloadDevice | None = None
    offload_params: OffloadDevice | None = None
    nvme_path: str | None = None
    zero3_save_16bit_model: bool | None = None
    zero3_init_flag: bool | None = None
    json_file: str | None = None  # deepspeed_config_file: ZeRO settings, precision and accumulation live there
    json_content: Mapping[str, Any] | None = None  # what accelkit writes to json_file (--deepspeed-json)
    extra: Mapping[str, Any] = field(default_factory=dict)  # deepspeed_config keys accelkit does not model

    @property
    def uses_json(self) -> bool:
        return self.json_file is not None


@dataclass(frozen=True)
class ParallelismSettings:
    """Accelerate's ParallelismConfig: the size of each mesh dimension (1 = not used) and the CP/SP backends, plus
    the pipeline dimension Accelerate does not have (pp, its schedule and microbatches:
    accelkit.configs.pipeline_spec)."""

    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1
    cp: int = 1
    sp: int = 1
    cp_backend: str | None = None
    sp_backend: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)  # parallelism_config keys accelkit does not model
    pp: int = 1  # pipeline stages (groups of ranks), outermost in the mesh; not an Accelerate dimension
    pp_schedule: str | None = None
    microbatches: int | None = None

    @property
    def sizes(self) -> dict[str, int]:
        """Dimension -> size, in mesh order (outermost first, tp innermost); pp, when used, comes first."""
        accelerate_sizes = {name: getattr(self, name) for name in ACCELERATE_DIMENSIONS}
        return {"pp": self.pp, **accelerate_sizes} if self.pp != 1 else accelerate_sizes

    @property
    def mesh(self) -> Mesh:
        """The resolved sizes as the one mesh type (accelkit.configs.mesh) bench and plan use."""
        return Mesh(**{name: getattr(self, name) for name in MESH_DIMENSIONS})

    @property
    def pipelined(self) -> bool:
        return self.pp > 1

    @property
    def total(self) -> int:
        return math.prod(self.sizes.values())

    @property
    def active(self) -> dict[str, int]:
        """The dimensions in use (size > 1), in mesh order: the names Accelerate gives its mesh dimensions."""
        return {name: size for name, size in self.sizes.items() if size > 1}

    @property
    def model_parallel(self) -> bool:
        """Anything beyond data parallelism (TP, CP or SP)."""
        return self.tp > 1 or self.cp > 1 or self.sp > 1

    @property
    def inner_group(self) -> int:
        """Consecutive ranks that must share a machine: the tp group and the cp/sp groups around it (mesh order puts
        them innermost, so they are neighbouring ranks)."""
        return self.tp * self.cp * self.sp

    @classmethod
    def of(cls, options: Any, extra: Mapping[str, Any] | None = None) -> ParallelismSettings | None:
        """The N-D settings a ConfigOptions asks for (sizes not given are 1), or None when it sets none of them."""
        values = {name: getattr(options, option) for option, name in ND_FIELDS.items()}
        if all(value is None for value in values.values()):
            return None
        return cls(**{name: (1 if value is None else value) if name in MESH_DIMENSIONS else value
                      for name, value in values.items()}, extra=dict(extra or {}))

    def describe(self) -> str:
        """`dp_shard 2 x tp 2` (or `1 process` when nothing is split)."""
        return " x ".join(f"{name} {size}" for name, size in self.active.items()) or "no split"


@dataclass(frozen=True)
class ResolvedConfig:
    backend: Backend
    num_processes: int  # total across machines
    num_machines: int = 1
    machine_rank: int = 0
    main_process_ip: str | None = None
    main_process_port: int | None = None
    mixed_precision: MixedPrecision | None = MixedPrecision.NO  # None: the DeepSpeed JSON decides
    gradient_accumulation_steps: int | None = None  # in the config for DeepSpeed; an environment variable otherwise
    use_cpu: bool = False
    fsdp: FsdpSettings | None = None
    deepspeed: DeepSpeedSettings | None = None
    parallelism: ParallelismSettings | None = None  # N-D sizes (Accelerate's parallelism_config), when given
    compute_environment: str | None = "LOCAL_MACHINE"
    extra: Mapping[str, Any] = field(default_factory=dict)  # top-level keys accelkit does not model, as given
    sources: Mapping[str, Source] = field(default_factory=dict)  # field name -> where its value came from
    # False for a cluster template (SLURM): each node supplies its rank, the main address and the port.
    per_machine: bool = True
    findings: tuple[Finding, ...] = ()  # the warnings found while resolving (errors are raised)
    # accelkit.compression's CompressionSpec (None: none); not an Accelerate key: see compression/compression_spec.py
    grad_compression: Any = None

    # -- reading -------------------------------------------------------------------------------------------------
    @property
    def distributed_type(self) -> str:
        if self.backend is Backend.CPU and self.num_processes == 1:
            return "NO"  # one CPU process needs no process group
        return self.backend.distributed_type

    @property
    def processes_per_machine(self) -> int:
        return self.num_processes // max(self.num_machines, 1)

    @property
    def runs_on_cpu(self) -> bool:
        return self.use_cpu or self.backend is Backend.CPU

    def source(self, name: str) -> Source:
        return self.sources.get(name, Source(DEFAULT))

    def pipeline_env(self) -> dict[str, str]:
        """The variable that carries the pipeline layout to the ranks (configs/pipeline_spec.py), {} without one."""
        from accelkit.configs.pipeline_spec import ENV_VAR, of_parallelism

        pipeline = of_parallelism(self.parallelism)
        return {} if pipeline is None else {ENV_VAR: pipeline.env_value()}

    def given_by_flag(self, name: str) -> bool:
        return self.source(name).kind in (FLAG, LABEL)

    def value(self, name: str) -> Any:
        """A setting by its option name (`zero_stage`, `sharding`, ...), looked up in its section."""
        for holder in (self, self.fsdp, self.deepspeed):
            if holder is not None and name in holder.__dataclass_fields__:
                return getattr(holder, name)
        if name == "fsdp_version" and self.fsdp is not None:
            return self.fsdp.version
        if name == "deepspeed_json" and self.deepspeed is not None:
            return self.deepspeed.json_file
        if self.parallelism is not None and name in ND_FIELDS:
            return getattr(self.parallelism, ND_FIELDS[name])
        return None

    def said_backend(self) -> str:
        """The backend as the user chose it: `--backend fsdp`, `the fsdp config fsdp.yaml`, `backend ddp (default)`."""
        source, name = self.source("backend"), self.backend.value
        if source.kind == FLAG:
            return f"--backend {name}"
        if source.kind == FILE:
            return f"the {name} config {source.label}"
        if source.kind in (PRESET, LABEL):
            return f"{name} ({source})"
        return f"backend {name} ({source})"

    def said(self, name: str, value: Any = None) -> str:
        """A value as the user gave it, for messages: `--num-processes 3` when it came from that flag,
        `num_processes 3` from a file, `num_processes 2 (default)` when nobody gave it."""
        if name == "backend":
            return self.said_backend()
        value = self.value(name) if value is None else value
        source = self.source(name)
        if source.kind == FLAG:
            return f"{flag_name(name)} {value}"
        key = config_key(name).rsplit(".", 1)[-1] or name
        spelled = getattr(value, "accelerate", value)
        if source.kind == LABEL:
            return f"{source.label} {value}" if source.label.startswith("--") and " " not in source.label \
                else f"{key} {spelled} ({source.label})"
        if source.kind == DEFAULT:
            return f"{key} {spelled} ({source})"
        return f"{key} {spelled}"

    # -- spelling as Accelerate's keys ---------------------------------------------------------------------------
    def _written(self, name: str) -> bool:
        return self.source(name).kind != ABSENT

    def to_accelerate_dict(self) -> dict[str, Any]:
        """The config as Accelerate's loader reads it (for the YAML renderer and the launcher only). Values read
        from a file and absent there stay absent; keys accelkit does not model are kept as they were."""
        out: dict[str, Any] = {}
        if self.compute_environment is not None:
            out["compute_environment"] = self.compute_environment
        out["distributed_type"] = self.distributed_type
        for name in ("num_machines", "num_processes", "machine_rank"):
            if self._written(name):
                out[name] = getattr(self, name)
        if self.main_process_ip:
            out["main_process_ip"] = self.main_process_ip
        if self.main_process_port is not None:
            out["main_process_port"] = self.main_process_port
        in_json = self.deepspeed is not None and self.deepspeed.uses_json
        if self.mixed_precision is not None and self._written("mixed_precision") and not in_json:
            out["mixed_precision"] = self.mixed_precision.value  # with a DeepSpeed JSON, precision lives there
        if self._written("use_cpu"):
            out["use_cpu"] = self.use_cpu
        if self.fsdp is not None:
            out["fsdp_config"] = self._fsdp_dict(self.fsdp)
            if self.parallelism is None and self.fsdp.version == 2 and self.fsdp.sharding is Sharding.HYBRID:
                out["parallelism_config"] = {
                    "parallelism_config_dp_replicate_size": self.num_machines,
                    "parallelism_config_dp_shard_size": self.processes_per_machine,
                    "parallelism_config_tp_size": 1, "parallelism_config_cp_size": 1}
        if self.deepspeed is not None:
            out["deepspeed_config"] = self._deepspeed_dict(self.deepspeed)
        if self.parallelism is not None and not self.parallelism.pipelined:
            # With a pipeline the mesh is the template's own (accelkit.configs.pipeline_spec): Accelerate's
            # ParallelismConfig has no pp and would refuse sizes that do not multiply to the processes.
            out["parallelism_config"] = self._parallelism_dict(self.parallelism)
        out.update({key: value for key, value in self.extra.items() if key not in out})
        return out

    def _fsdp_dict(self, f: FsdpSettings) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self._written("fsdp_version"):
            out["fsdp_version"] = f.version
        if f.sharding is not None and self._written("sharding"):
            if f.version == 1:
                # FSDP1 reads fsdp_sharding_strategy, and the launcher fills FULL_SHARD when it is missing: write it.
                out["fsdp_sharding_strategy"] = f.sharding.accelerate
                out["fsdp_reshard_after_forward"] = f.sharding.accelerate
            else:
                # FSDP2: full = reshard parameters after forward (ZeRO-3 like); grad-op = keep them (ZeRO-2 like).
                out["fsdp_reshard_after_forward"] = f.sharding in (Sharding.FULL, Sharding.HYBRID)
        if f.wrap_policy is not None:
            out["fsdp_auto_wrap_policy"] = f.wrap_policy.accelerate
        if f.wrap_cls:
            out["fsdp_transformer_layer_cls_to_wrap"] = ",".join(f.wrap_cls)
        if f.min_num_params is not None:
            out["fsdp_min_num_params"] = f.min_num_params
        if f.state_dict is not None:
            out["fsdp_state_dict_type"] = f.state_dict.accelerate
        for key, value in (("fsdp_offload_params", f.offload),
                           ("fsdp_activation_checkpointing", f.activation_checkpointing),
                           ("fsdp_cpu_ram_efficient_loading", f.cpu_ram_efficient_loading),
                           ("fsdp_sync_module_states", f.sync_module_states)):
            if value is not None:
                out[key] = value
        out.update({key: value for key, value in f.extra.items() if key not in out})
        return out

    @staticmethod
    def _parallelism_dict(p: ParallelismSettings) -> dict[str, Any]:
        prefix = "parallelism_config_"
        out: dict[str, Any] = {f"{prefix}{name}_size": size for name, size in
                               (("dp_replicate", p.dp_replicate), ("dp_shard", p.dp_shard), ("tp", p.tp),
                                ("cp", p.cp), ("sp", p.sp))}
        if p.cp > 1 or p.cp_backend is not None:
            out[f"{prefix}cp_backend"] = p.cp_backend or CP_BACKENDS[0]
        if p.sp > 1 or p.sp_backend is not None:
            out[f"{prefix}sp_backend"] = p.sp_backend or SP_BACKENDS[0]
        out.update({key: value for key, value in p.extra.items() if key not in out})
        return out

    def _deepspeed_dict(self, d: DeepSpeedSettings) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if d.json_file is not None:
            out["deepspeed_config_file"] = d.json_file
        else:
            for key, value in (("zero_stage", d.zero_stage),
                               ("offload_optimizer_device", getattr(d.offload_optimizer, "value", None)),
                               ("offload_param_device", getattr(d.offload_params, "value", None))):
                if value is not None:
                    out[key] = value
            if d.nvme_path is not None:
                if d.offload_optimizer is OffloadDevice.NVME:
                    out["offload_optimizer_nvme_path"] = d.nvme_path
                if d.offload_params is OffloadDevice.NVME:
                    out["offload_param_nvme_path"] = d.nvme_path
            if d.zero3_save_16bit_model is not None:
                out["zero3_save_16bit_model"] = d.zero3_save_16bit_model
            if self.gradient_accumulation_steps is not None and self._written("gradient_accumulation_steps"):
                out["gradient_accumulation_steps"] = self.gradient_accumulation_steps
        if d.zero3_init_flag is not None:
            out["zero3_init_flag"] = d.zero3_init_flag
        out.update({key: value for key, value in d.extra.items() if key not in out})
        return out

    def json_path(self) -> Path | None:
        """The DeepSpeed JSON accelkit writes for this config (--deepspeed-json), or None."""
        if self.deepspeed is None or self.deepspeed.json_content is None:
            return None
        return Path(self.deepspeed.json_file or "")
