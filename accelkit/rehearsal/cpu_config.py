"""Turn a config meant for GPUs into the config + environment that rehearse it on CPU ranks: one ResolvedConfig
into another.

Pure apart from reading a DeepSpeed JSON the config points to and checking installed versions: nothing starts here.
Everything that cannot work on CPU is refused before any process exists, by the same rule set that checks every
config (accelkit.configs.refuse_rule_errors: the rehearsed config runs on CPU) plus what only a rehearsal has to know.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from accelkit.configs import (
    Backend,
    DeepSpeedSettings,
    FsdpSettings,
    MixedPrecision,
    OffloadDevice,
    ResolvedConfig,
    Source,
    as_bool,
    from_accelerate,
    refuse_rule_errors,
)
from accelkit.errors import AccelkitError
from accelkit.rehearsal.shim import REHEARSAL_ENV
from accelkit.rehearsal.versions import DEEPSPEED_INSTALL_HINT, check_versions, installed_version

# DeepSpeed JSON optimizers built only from CUDA kernels (1-bit compression, FusedLamb; FusedLion unless the
# optimizer is offloaded, which gives DeepSpeed's CPU Lion). Adam/AdamW use a JIT-built CPU FusedAdam (verified),
# Adagrad/SGD and other torch.optim names run as torch's own.
_DS_GPU_ONLY_OPTIMIZERS = {"lamb", "onebitadam", "zerooneadam", "onebitlamb"}
_ON_CPU = Source.labelled("--cpu")


@dataclass(frozen=True)
class RehearsalPlan:
    """What `accelerate launch` needs to rehearse `backend` on CPU: its config, extra env for the ranks, and notes
    about anything accelkit changed from the original config (for the launcher to print)."""

    config: ResolvedConfig
    env: dict[str, str]
    backend: Backend
    notes: tuple[str, ...] = field(default=())
    # Whether ranks must start in accelkit.ranks.bootstrap (False for one process: nothing to patch).
    bootstrap: bool = True

    @property
    def launch_config(self) -> dict[str, Any]:
        """The rehearsal's config as Accelerate's dict (what the launcher's config file holds)."""
        return self.config.to_accelerate_dict()


def _fsdp(settings: FsdpSettings, notes: list[str]) -> FsdpSettings:
    changes: dict[str, Any] = {}
    if settings.offload:
        # On CPU the parameters already live in host memory, and FSDP's offload pins memory, which needs a GPU.
        changes["offload"] = False
        notes.append("fsdp_offload_params turned off for the rehearsal: on CPU parameters are already in host memory "
                     "(pinning them needs a GPU).")
    if settings.version == 1:
        # FSDP1's sync_module_states looks up the current GPU to materialise modules and fails on CPU; with it off
        # every rank keeps the weights it built (identical when the script seeds or loads a checkpoint). Both default
        # to on when a config does not set them.
        turned_off = [key for key, attr in (("fsdp_sync_module_states", "sync_module_states"),
                                            ("fsdp_cpu_ram_efficient_loading", "cpu_ram_efficient_loading"))
                      if getattr(settings, attr) is not False]
        changes.update(sync_module_states=False, cpu_ram_efficient_loading=False)
        if turned_off:
            notes.append(f"FSDP1 on CPU: {' and '.join(turned_off)} turned off for the rehearsal (FSDP1 needs a GPU "
                         "for them); seed your model init so every rank builds the same weights.")
    return replace(settings, **changes)


def _load_deepspeed_json(path_value: str) -> dict[str, Any]:
    path = Path(path_value).expanduser()
    try:
        content = json.loads(path.read_text())
    except FileNotFoundError:
        raise AccelkitError(f"DeepSpeed config file {path} does not exist.",
                            hint="fix deepspeed_config_file in the config") from None
    except (OSError, json.JSONDecodeError) as err:
        raise AccelkitError(f"DeepSpeed config file {path} is not valid JSON: {err}",
                            hint="fix the JSON, or let `accelkit config --backend deepspeed` write it") from None
    return content if isinstance(content, dict) else {}


def _as_written_in_json(config: ResolvedConfig, content: dict[str, Any]) -> ResolvedConfig:
    """The settings a DeepSpeed JSON holds, as the config's own values (for the rules to see them)."""
    zero = content.get("zero_optimization") or {}

    def device(section: str) -> OffloadDevice | None:
        found = from_accelerate(OffloadDevice, (zero.get(section) or {}).get("device", "none"))
        return found if isinstance(found, OffloadDevice) else None

    precision = config.mixed_precision
    for name, kind in (("fp16", MixedPrecision.FP16), ("bf16", MixedPrecision.BF16)):
        if as_bool((content.get(name) or {}).get("enabled", False)):
            precision = kind
    stage = zero.get("stage")
    settings = replace(config.deepspeed, zero_stage=stage if isinstance(stage, int) else None,
                       offload_optimizer=device("offload_optimizer"), offload_params=device("offload_param"),
                       json_content=content)
    json_source = Source("file", str(config.deepspeed.json_file))
    return replace(config, deepspeed=settings, mixed_precision=precision,
                   sources={**config.sources, "mixed_precision": json_source})


def _deepspeed(config: ResolvedConfig, notes: list[str]) -> tuple[DeepSpeedSettings, ResolvedConfig]:
    """The rehearsal's DeepSpeed settings, and the config as the rules must see it (a JSON's settings included)."""
    if installed_version("deepspeed") is None:
        raise AccelkitError("The deepspeed backend needs DeepSpeed, which is not installed.",
                            hint=DEEPSPEED_INSTALL_HINT)
    settings = config.deepspeed
    assert settings is not None
    seen, optimizer_type = config, None
    if settings.json_file:
        content = _load_deepspeed_json(settings.json_file)
        seen = _as_written_in_json(config, content)
        optimizer_type = (content.get("optimizer") or {}).get("type")
    if config.num_machines > 1 and settings.extra.get("deepspeed_multinode_launcher", "pdsh") != "standard":
        # pdsh/mpi launchers need a hostfile and ssh; torchrun ("standard") is what a rehearsal can start.
        settings = replace(settings, extra={**settings.extra, "deepspeed_multinode_launcher": "standard"})
        notes.append("DeepSpeed multi-node rehearsal uses the torchrun launcher (deepspeed_multinode_launcher: "
                     "standard): one `accelkit launch` per machine.")
    offload_optimizer = seen.deepspeed.offload_optimizer is OffloadDevice.CPU
    name = str(optimizer_type or "").lower()
    if name in _DS_GPU_ONLY_OPTIMIZERS or (name == "lion" and not offload_optimizer):
        raise AccelkitError(
            f"DeepSpeed optimizer {optimizer_type!r} from {settings.json_file} has no CPU implementation (CUDA kernels "
            "only).", hint="rehearse with AdamW (or Adam, SGD, Adagrad) in the JSON, or drop the optimizer section "
                           "and create torch.optim.AdamW in the script")
    if offload_optimizer:
        notes.append("Optimizer offload uses DeepSpeed's CPU Adam, which DeepSpeed compiles on first use (a few "
                     "minutes; cached in ~/.cache/torch_extensions).")
    elif name in ("adam", "adamw"):
        notes.append(f"The JSON's {optimizer_type} optimizer is DeepSpeed's FusedAdam, which DeepSpeed compiles for "
                     "CPU on first use (a few minutes; cached in ~/.cache/torch_extensions).")
    return settings, seen


def rehearse(config: ResolvedConfig) -> RehearsalPlan:
    """The config + environment that make `accelerate launch --config_file <config> -m accelkit.ranks.bootstrap
    SCRIPT` start real gloo ranks running `config`'s backend with its real code. AccelkitError for anything that
    cannot work on CPU."""
    backend = Backend.SINGLE if config.distributed_type == "NO" else config.backend.rehearsal
    if backend is Backend.DDP and config.num_processes < 2:
        raise AccelkitError(f"DDP rehearsal needs at least 2 processes ({config.said('num_processes')}).",
                            hint="pass --num-processes 2 (or more)")
    notes: list[str] = []
    # Accelerate's MULTI_CPU launcher wants mpirun; the torchrun-based MULTI_GPU launcher starts real ranks, and
    # use_cpu lets it size threads per rank for CPU. No gpu_ids: no CUDA_VISIBLE_DEVICES from the GPU config.
    changes: dict[str, Any] = {"use_cpu": True, "sources": {**config.sources, "use_cpu": _ON_CPU},
                               "extra": {k: v for k, v in config.extra.items() if k != "gpu_ids"}}
    if backend is Backend.DDP:
        changes["backend"] = Backend.DDP
    seen = None
    if config.fsdp is not None:
        changes["fsdp"] = _fsdp(config.fsdp, notes)
    if config.deepspeed is not None:
        changes["deepspeed"], seen = _deepspeed(config, notes)
    rehearsed = replace(config, **changes)
    seen = replace(seen, use_cpu=True) if seen is not None else rehearsed
    refuse_rule_errors(seen)
    check_versions(backend)

    env = {
        REHEARSAL_ENV: backend.value,
        "ACCELERATE_TORCH_DEVICE": "cpu",  # plain "cpu" (not cpu:0), which FSDP1 requires
        "CUDA_VISIBLE_DEVICES": "",  # a rehearsal is CPU-only even on a GPU machine; the shim never runs beside CUDA
        # DeepSpeed must see cpu=False inside Accelerate (the shim then picks gloo); the others use its CPU path.
        "ACCELERATE_USE_CPU": "false" if backend is Backend.DEEPSPEED else "true",
    }
    if backend is Backend.DEEPSPEED:
        env["DS_ACCELERATOR"] = "cpu"
    return RehearsalPlan(config=rehearsed, env=env, backend=backend, notes=tuple(notes),
                         bootstrap=backend is not Backend.SINGLE)
