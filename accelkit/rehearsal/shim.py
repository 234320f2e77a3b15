"""The small patches that let Accelerate's real DDP, FSDP and DeepSpeed code run on CPU ranks over gloo.

Accelerate decides the distributed type once, when the first `PartialState()` / `Accelerator()` builds its shared
state, and it only ever upgrades to FSDP or DEEPSPEED from a GPU-like type. Everything after that decision
(wrapping, sharding, checkpointing) works on CPU with gloo. So the shim changes that decision, in the rank:

- Backend selection (ddp, fsdp, deepspeed): under torchrun with no accelerator and cpu=False, Accelerate picks "no
  distributed backend" and each rank silently trains alone. That happens whenever a script touches `PartialState()`
  before `Accelerator()` (which reads ACCELERATE_USE_CPU, PartialState does not), and always for DeepSpeed, which
  Accelerate ignores when cpu=True. The patched selection yields gloo/MULTI_CPU instead, Accelerate's own CPU choice.
- FSDP upgrade (fsdp): once `AcceleratorState` settles on MULTI_CPU it is upgraded to FSDP with the plugin Accelerate
  built from the launcher's FSDP_* variables, exactly as Accelerate's own GPU branch does.

and makes the few places where the CPU type behaves differently from the GPU one behave as on GPUs:

- Uneven inputs (ddp): `accelerator.join_uneven_inputs` only joins on multi-GPU types; on MULTI_CPU it warns and
  does nothing, so the rank with more batches waits forever in DDP's gradient all-reduce while the other waits in
  the next collective (Accelerate's own test_distributed_data_loop.py hangs this way; torch's Join itself works on
  gloo). In rehearsal it runs Accelerate's multi-GPU branch, i.e. torch's Join, as it would on GPUs.
- FSDP1 full state dicts (fsdp): `FullStateDictConfig(offload_to_cpu=True)` (what `accelerator.get_state_dict` and
  FULL_STATE_DICT saving use) "moves" the unsharded parameters to the CPU and then frees the GPU copy; on CPU both
  are the same memory, so the state dict points at freed memory and the rank segfaults (or fails with "setStorage:
  ... out of bounds for storage of size 0"). In rehearsal the move is skipped when the parameters already are on
  the CPU, which is what offload_to_cpu=False does.
- N-D parallelism (ddp): Accelerate validates a ParallelismConfig (tensor parallelism alone) only on multi-device
  types and refuses MULTI_CPU; in rehearsal the check sees the ranks as multi-device, as on GPUs.
- Hand-written GPU code (every backend): see cuda_calls.py (device ids, set_device, nccl, `.to(cuda)`).

`install("one-gpu")` is not a backend: it rehearses a single-GPU script's own process on the CPU (one_gpu.py), for
`accelkit convert --check`'s run of an original written for a GPU.

DeepSpeed needs nothing more: with cpu=False Accelerate initialises deepspeed.comm on gloo and switches to DEEPSPEED.
`install(backend)` checks versions, then patches when the script imports the libraries; it refuses to patch when CUDA
is usable or when the internals it patches do not have the expected shape.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os

from accelkit.configs import Backend
from accelkit.errors import AccelkitError
from accelkit.ranks.probes import after_import

REHEARSAL_ENV = "ACCELKIT_REHEARSAL"
STATE_MODULE = "accelerate.state"  # where Accelerate decides the distributed type
BACKENDS = tuple(b.value for b in Backend if b.rehearsal is b)  # what a rank can rehearse (cpu runs as ddp)
ONE_GPU = "one-gpu"  # not a backend: one plain process whose CUDA calls run on the CPU (one_gpu.py)

_HINT = "run it through `accelkit launch --cpu`, which sets up the rehearsal environment"


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "false").lower() in ("1", "true", "yes")


def _require_signature(func, params: tuple[str, ...], what: str) -> None:
    """Fail loudly if an Accelerate internal the shim relies on changed shape."""
    names = inspect.signature(func).parameters
    missing = [p for p in params if p not in names]
    if missing:
        raise AccelkitError(
            f"CPU rehearsal cannot patch {what}: it no longer takes {', '.join(missing)} in this Accelerate version.",
            hint="install a supported Accelerate version (see `accelkit.rehearsal.versions`)",
        )


def _replace(owner, name: str, wrap) -> None:
    """owner.name = wrap(original), once per process. `wrap` may refuse (AccelkitError) before anything changes."""
    original = getattr(owner, name)
    if getattr(original, "_accelkit_patched", False):
        return
    patched = wrap(original)
    patched._accelkit_patched = True
    setattr(owner, name, patched)


def _patch_backend_selection() -> None:
    """Under torchrun with no accelerator and cpu=False, pick gloo/MULTI_CPU instead of "no distributed backend"."""
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    def wrap(original):
        _require_signature(original, ("cpu", "sagemaker_dp", "backend"), "PartialState._prepare_backend")

        @functools.wraps(original)
        def prepare_backend(self, cpu: bool = False, sagemaker_dp=False, backend: str | None = None):
            chosen_backend, distributed_type = original(self, cpu, sagemaker_dp, backend)
            under_launcher = int(os.environ.get("LOCAL_RANK", -1)) != -1
            if distributed_type == DistributedType.NO and under_launcher and backend in (None, "gloo"):
                return "gloo", DistributedType.MULTI_CPU
            return chosen_backend, distributed_type

        return prepare_backend

    _replace(PartialState, "_prepare_backend", wrap)


def _patch_fsdp_upgrade() -> None:
    """After AcceleratorState settles on MULTI_CPU, upgrade it to FSDP the way Accelerate does for GPU types."""
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    def wrap(original):
        _require_signature(original, ("mixed_precision", "cpu", "fsdp_plugin"), "AcceleratorState.__init__")
        signature = inspect.signature(original)

        @functools.wraps(original)
        def init(self, *args, **kwargs):
            shared = AcceleratorState._shared_state
            first = shared == {} or shared == PartialState._shared_state
            original(self, *args, **kwargs)
            if not first or self.distributed_type != DistributedType.MULTI_CPU:
                return
            fsdp_plugin = signature.bind(self, *args, **kwargs).arguments.get("fsdp_plugin")
            if fsdp_plugin is None and not _env_flag("ACCELERATE_USE_FSDP"):
                return
            self.distributed_type = DistributedType.FSDP
            if self._mixed_precision != "no" and fsdp_plugin is not None:
                fsdp_plugin.set_mixed_precision(self._mixed_precision)
            self.fsdp_plugin = fsdp_plugin
            PartialState._shared_state["distributed_type"] = self.distributed_type

        return init

    _replace(AcceleratorState, "__init__", wrap)


class _AsMultiDevice:
    """An accelerator, seen as a multi-device one by join_uneven_inputs and the ParallelismConfig check (every other
    attribute is its own)."""

    multi_device = True

    def __init__(self, accelerator) -> None:
        object.__setattr__(self, "_accelerator", accelerator)

    def __getattr__(self, name):
        return getattr(self._accelerator, name)

    def __setattr__(self, name, value) -> None:
        setattr(self._accelerator, name, value)


def _patch_join_uneven_inputs() -> None:
    """On a multi-process MULTI_CPU state, run join_uneven_inputs' multi-GPU branch (torch's Join) as on GPUs."""
    from accelerate.accelerator import Accelerator
    from accelerate.utils import DistributedType

    def wrap(original):
        _require_signature(original, ("joinables", "even_batches"), "Accelerator.join_uneven_inputs")

        @functools.wraps(original)
        def join_uneven_inputs(self, joinables, even_batches=None):
            if self.distributed_type == DistributedType.MULTI_CPU and self.num_processes > 1:
                return original(_AsMultiDevice(self), joinables, even_batches)
            return original(self, joinables, even_batches)

        return join_uneven_inputs

    _replace(Accelerator, "join_uneven_inputs", wrap)


def _patch_parallelism_validation() -> None:
    """A ParallelismConfig (tensor parallelism without FSDP) on MULTI_CPU ranks is validated as on MULTI_GPU ranks.

    Accelerate accepts a ParallelismConfig on multi-device types, FSDP2 and DeepSpeed, and refuses MULTI_CPU, the
    type DDP ranks run as in rehearsal. Everything after the check (the device mesh, TP preparation, data sharding
    over the data-parallel dimensions) is the same code on both types."""
    from accelerate.parallelism_config import ParallelismConfig
    from accelerate.utils import DistributedType

    def wrap(original):
        _require_signature(original, ("accelerator",), "ParallelismConfig._validate_accelerator")

        @functools.wraps(original)
        def validate(self, accelerator):
            if accelerator.distributed_type == DistributedType.MULTI_CPU and accelerator.num_processes > 1:
                return original(self, _AsMultiDevice(accelerator))
            return original(self, accelerator)

        return validate

    _replace(ParallelismConfig, "_validate_accelerator", wrap)


def _patch_fsdp1_offload_to_cpu() -> None:
    """FSDP1's FlatParamHandle.to_cpu() is a no-op when the parameters already are on the CPU (see the docstring)."""
    from torch.distributed.fsdp._flat_param import FlatParamHandle

    def wrap(original):
        @contextlib.contextmanager
        def to_cpu(self):
            if self.flat_param.device.type == "cpu":  # nothing to move, and nothing may be freed
                yield
                return
            with original(self):
                yield

        return to_cpu

    _replace(FlatParamHandle, "to_cpu", wrap)


def _apply(backend: str) -> None:
    """Patch Accelerate's state for `backend` (it is imported by now, and with it torch)."""
    import torch

    if torch.cuda.is_available():
        raise AccelkitError(
            "CPU rehearsal refuses to patch Accelerate in a process that can see a CUDA device.",
            hint="launch without --cpu to use the GPUs, or hide them with CUDA_VISIBLE_DEVICES=''",
        )
    _patch_backend_selection()
    if backend == "fsdp":
        _patch_fsdp_upgrade()


def install(backend: str) -> None:
    """Install the patches rehearsal of `backend` needs in this (rank) process.

    Versions are checked now; the patches themselves are applied when the script imports the libraries they patch,
    so the bootstrap adds no torch/Accelerate import time of its own before the script's first line."""
    if backend == ONE_GPU:  # a single-GPU script's own process (convert --check's original): no Accelerate to patch
        from accelkit.rehearsal import one_gpu

        after_import("torch", one_gpu.install)
        return
    if backend not in BACKENDS:
        raise AccelkitError(f"Unknown rehearsal backend {backend!r} in ${REHEARSAL_ENV}.", hint=_HINT)
    if backend == "single":
        return  # one process: Accelerate's own CPU path is already right, nothing to patch
    from accelkit.rehearsal import cuda_calls
    from accelkit.rehearsal.versions import check_versions

    check_versions(backend)
    after_import(STATE_MODULE, functools.partial(_apply, backend), required=True)
    after_import("torch", cuda_calls.install)
    if backend == "ddp":
        after_import("accelerate.accelerator", _patch_join_uneven_inputs)
        after_import("accelerate.accelerator", _patch_parallelism_validation)
    if backend == "fsdp":
        after_import("torch.distributed.fsdp._flat_param", _patch_fsdp1_offload_to_cpu)
