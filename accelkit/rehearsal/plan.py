"""Turn an Accelerate config meant for GPUs into the launch config + environment that rehearse it on CPU ranks.

Pure apart from reading a DeepSpeed JSON the config points to and checking installed versions: nothing starts here.
Everything that cannot work on CPU is refused before any process exists.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accelkit.errors import AccelkitError
from accelkit.rehearsal.shim import REHEARSAL_ENV
from accelkit.rehearsal.versions import DEEPSPEED_INSTALL_HINT, check_versions, installed_version

# distributed_type -> rehearsal backend
_BACKEND_OF = {"NO": "single", "MULTI_CPU": "ddp", "MULTI_GPU": "ddp", "FSDP": "fsdp", "DEEPSPEED": "deepspeed"}

# DeepSpeed JSON optimizers built only from CUDA kernels (1-bit compression, FusedLamb; FusedLion unless the
# optimizer is offloaded, which gives DeepSpeed's CPU Lion). Adam/AdamW use a JIT-built CPU FusedAdam (verified),
# Adagrad/SGD and other torch.optim names run as torch's own.
_DS_GPU_ONLY_OPTIMIZERS = {"lamb", "onebitadam", "zerooneadam", "onebitlamb"}


@dataclass(frozen=True)
class RehearsalPlan:
    """What `accelerate launch` needs to rehearse `backend` on CPU: its config, extra env for the ranks, and notes
    about anything accelkit changed from the original config (for the launcher to print)."""

    launch_config: dict[str, Any]
    env: dict[str, str]
    backend: str
    notes: tuple[str, ...] = field(default=())
    # Whether ranks must start in accelkit.rehearsal.bootstrap (False for one process: nothing to patch).
    bootstrap: bool = True


def _distributed_type(config: dict[str, Any]) -> str:
    value = config.get("distributed_type", "NO")
    value = getattr(value, "value", value)  # accept accelerate's DistributedType enum too
    return str(value).upper()


def _truthy(value: Any) -> bool:
    return str(value).lower() in ("1", "true", "yes")


def _check_mixed_precision(mixed_precision: str, backend: str) -> None:
    if mixed_precision == "fp16":
        raise AccelkitError(
            f"fp16 mixed precision cannot be rehearsed on CPU ({backend}): CPUs have no fp16 training path.",
            hint="rehearse with --mixed-precision bf16 (or no); keep fp16 for the GPU run",
        )
    if mixed_precision not in ("no", "bf16"):
        raise AccelkitError(
            f"{mixed_precision} mixed precision cannot be rehearsed on CPU.",
            hint="rehearse with --mixed-precision bf16 (or no)",
        )


def _plan_fsdp(launch: dict[str, Any], notes: list[str]) -> None:
    fsdp = launch.setdefault("fsdp_config", {})
    if _truthy(fsdp.get("fsdp_offload_params", False)):
        # On CPU the parameters already live in host memory, and FSDP's offload pins memory, which needs a GPU.
        fsdp["fsdp_offload_params"] = False
        notes.append("fsdp_offload_params turned off for the rehearsal: on CPU parameters are already in host memory "
                     "(pinning them needs a GPU).")
    if int(fsdp.get("fsdp_version", 1)) != 1:
        return
    # FSDP1's sync_module_states looks up the current GPU to materialise modules and fails on CPU; with it off every
    # rank keeps the weights it built (identical when the script seeds or loads a checkpoint).
    changed = [key for key in ("fsdp_sync_module_states", "fsdp_cpu_ram_efficient_loading")
               if _truthy(fsdp.get(key, True))]
    for key in changed:
        fsdp[key] = False
    if changed:
        notes.append(f"FSDP1 on CPU: {' and '.join(changed)} turned off for the rehearsal (FSDP1 needs a GPU for "
                     "them); seed your model init so every rank builds the same weights.")


def _load_deepspeed_json(path_value: str) -> dict[str, Any]:
    path = Path(path_value).expanduser()
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise AccelkitError(f"DeepSpeed config file {path} does not exist.",
                            hint="fix deepspeed_config_file in the config") from None
    except (OSError, json.JSONDecodeError) as err:
        raise AccelkitError(f"Cannot read DeepSpeed config file {path}: {err}",
                            hint="fix the JSON, or let `accelkit config --backend deepspeed` write it") from None


def _plan_deepspeed(launch: dict[str, Any], notes: list[str]) -> None:
    if installed_version("deepspeed") is None:
        raise AccelkitError("The deepspeed backend needs DeepSpeed, which is not installed.",
                            hint=DEEPSPEED_INSTALL_HINT)
    ds = launch.get("deepspeed_config") or {}
    offload = {"optimizer": ds.get("offload_optimizer_device", "none"),
               "parameters": ds.get("offload_param_device", "none")}
    optimizer_type = None
    json_file = ds.get("deepspeed_config_file")
    if json_file:
        content = _load_deepspeed_json(json_file)
        zero = content.get("zero_optimization") or {}
        offload["optimizer"] = (zero.get("offload_optimizer") or {}).get("device", "none")
        offload["parameters"] = (zero.get("offload_param") or {}).get("device", "none")
        if _truthy((content.get("fp16") or {}).get("enabled", False)):
            _check_mixed_precision("fp16", "deepspeed")
        optimizer_type = (content.get("optimizer") or {}).get("type")
    for what, device in offload.items():
        if str(device).lower() == "nvme":
            raise AccelkitError(
                f"NVMe offload of {what} cannot be rehearsed on CPU (it needs DeepSpeed's async-io op and a GPU).",
                hint="rehearse with offload to cpu or none; keep nvme for the GPU run",
            )
    if int(launch.get("num_machines", 1) or 1) > 1 and ds.get("deepspeed_multinode_launcher", "pdsh") != "standard":
        # pdsh/mpi launchers need a hostfile and ssh; torchrun ("standard") is what a rehearsal can start.
        launch["deepspeed_config"] = {**ds, "deepspeed_multinode_launcher": "standard"}
        notes.append("DeepSpeed multi-node rehearsal uses the torchrun launcher (deepspeed_multinode_launcher: "
                     "standard): one `accelkit launch` per machine.")
    offload_optimizer = str(offload["optimizer"]).lower() == "cpu"
    name = str(optimizer_type or "").lower()
    if name in _DS_GPU_ONLY_OPTIMIZERS or (name == "lion" and not offload_optimizer):
        raise AccelkitError(
            f"DeepSpeed optimizer {optimizer_type!r} from {json_file} has no CPU implementation (CUDA kernels only).",
            hint="rehearse with AdamW (or Adam, SGD, Adagrad) in the JSON, or drop the optimizer section and create "
            "torch.optim.AdamW in the script",
        )
    if offload_optimizer:
        notes.append("Optimizer offload uses DeepSpeed's CPU Adam, which DeepSpeed compiles on first use (a few "
                     "minutes; cached in ~/.cache/torch_extensions).")
    elif name in ("adam", "adamw"):
        notes.append(f"The JSON's {optimizer_type} optimizer is DeepSpeed's FusedAdam, which DeepSpeed compiles for "
                     "CPU on first use (a few minutes; cached in ~/.cache/torch_extensions).")


def prepare_rehearsal(config: dict[str, Any]) -> RehearsalPlan:
    """Check `config` (an Accelerate config dict) can be rehearsed on CPU and return the launch config + env that
    make `accelerate launch --config_file <launch_config> -m accelkit.rehearsal.bootstrap SCRIPT` start real gloo
    ranks running the backend's real code. AccelkitError for anything that cannot work on CPU."""
    distributed_type = _distributed_type(config)
    backend = _BACKEND_OF.get(distributed_type)
    if backend is None:
        raise AccelkitError(
            f"distributed_type {distributed_type} cannot be rehearsed on CPU.",
            hint="CPU rehearsal covers single, ddp (MULTI_GPU), fsdp and deepspeed",
        )
    mixed_precision = str(config.get("mixed_precision") or "no").lower()
    _check_mixed_precision(mixed_precision, backend)
    num_processes = int(config.get("num_processes", 1))
    if backend == "ddp" and num_processes < 2:
        raise AccelkitError(f"DDP rehearsal needs at least 2 processes (num_processes is {num_processes}).",
                            hint="pass --num-processes 2 (or more)")

    launch = copy.deepcopy(config)
    notes: list[str] = []
    if backend == "ddp":
        # Accelerate's MULTI_CPU launcher wants mpirun; the torchrun-based MULTI_GPU launcher starts real ranks.
        launch["distributed_type"] = "MULTI_GPU"
    elif backend == "fsdp":
        _plan_fsdp(launch, notes)
    elif backend == "deepspeed":
        _plan_deepspeed(launch, notes)
    check_versions(backend)
    launch["use_cpu"] = True  # lets the launcher size threads per rank for CPU
    launch.pop("gpu_ids", None)  # no CUDA_VISIBLE_DEVICES from the GPU config

    env = {
        REHEARSAL_ENV: backend,
        "ACCELERATE_TORCH_DEVICE": "cpu",  # plain "cpu" (not cpu:0), which FSDP1 requires
        "CUDA_VISIBLE_DEVICES": "",  # a rehearsal is CPU-only even on a GPU machine; the shim never runs beside CUDA
        # DeepSpeed must see cpu=False inside Accelerate (the shim then picks gloo); the others use its CPU path.
        "ACCELERATE_USE_CPU": "false" if backend == "deepspeed" else "true",
    }
    if backend == "deepspeed":
        env["DS_ACCELERATOR"] = "cpu"
    return RehearsalPlan(launch_config=launch, env=env, backend=backend, notes=tuple(notes),
                         bootstrap=backend != "single")
