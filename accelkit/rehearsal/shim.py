"""The two small patches that let Accelerate's real DDP, FSDP and DeepSpeed code run on CPU ranks over gloo.

Accelerate decides the distributed type once, when the first `PartialState()` / `Accelerator()` builds its shared
state, and it only ever upgrades to FSDP or DEEPSPEED from a GPU-like type. Everything after that decision
(wrapping, sharding, checkpointing) works on CPU with gloo. So the shim changes only that decision, in the rank:

- Backend selection (ddp, fsdp, deepspeed): under torchrun with no accelerator and cpu=False, Accelerate picks "no
  distributed backend" and each rank silently trains alone. That happens whenever a script touches `PartialState()`
  before `Accelerator()` (which reads ACCELERATE_USE_CPU, PartialState does not), and always for DeepSpeed, which
  Accelerate ignores when cpu=True. The patched selection yields gloo/MULTI_CPU instead, Accelerate's own CPU choice.
- FSDP upgrade (fsdp): once `AcceleratorState` settles on MULTI_CPU it is upgraded to FSDP with the plugin Accelerate
  built from the launcher's FSDP_* variables, exactly as Accelerate's own GPU branch does.

DeepSpeed needs nothing more: with cpu=False Accelerate initialises deepspeed.comm on gloo and switches to DEEPSPEED.
`install(backend)` checks versions, then patches when the script imports Accelerate; it refuses to patch when CUDA is
usable or when Accelerate's hooks do not have the expected shape.
"""

from __future__ import annotations

import functools
import importlib.abc
import inspect
import os
import sys

from accelkit.configs.choices import Backend
from accelkit.errors import AccelkitError

REHEARSAL_ENV = "ACCELKIT_REHEARSAL"
STATE_MODULE = "accelerate.state"  # where Accelerate decides the distributed type
BACKENDS = tuple(b.value for b in Backend if b.rehearsal is b)  # what a rank can rehearse (cpu runs as ddp)

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


def _patch_backend_selection() -> None:
    """Under torchrun with no accelerator and cpu=False, pick gloo/MULTI_CPU instead of "no distributed backend"."""
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    original = PartialState._prepare_backend
    if getattr(original, "_accelkit_patched", False):
        return
    _require_signature(original, ("cpu", "sagemaker_dp", "backend"), "PartialState._prepare_backend")

    @functools.wraps(original)
    def prepare_backend(self, cpu: bool = False, sagemaker_dp=False, backend: str | None = None):
        chosen_backend, distributed_type = original(self, cpu, sagemaker_dp, backend)
        under_launcher = int(os.environ.get("LOCAL_RANK", -1)) != -1
        if distributed_type == DistributedType.NO and under_launcher and backend in (None, "gloo"):
            return "gloo", DistributedType.MULTI_CPU
        return chosen_backend, distributed_type

    prepare_backend._accelkit_patched = True
    PartialState._prepare_backend = prepare_backend


def _patch_fsdp_upgrade() -> None:
    """After AcceleratorState settles on MULTI_CPU, upgrade it to FSDP the way Accelerate does for GPU types."""
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    original = AcceleratorState.__init__
    if getattr(original, "_accelkit_patched", False):
        return
    _require_signature(original, ("mixed_precision", "cpu", "fsdp_plugin"), "AcceleratorState.__init__")
    signature = inspect.signature(original)

    @functools.wraps(original)
    def init(self, *args, **kwargs):
        first = AcceleratorState._shared_state == {} or AcceleratorState._shared_state == PartialState._shared_state
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

    init._accelkit_patched = True
    AcceleratorState.__init__ = init


def _apply(backend: str) -> None:
    """Patch Accelerate for `backend` (it is imported by now, and with it torch)."""
    import torch

    if torch.cuda.is_available():
        raise AccelkitError(
            "CPU rehearsal refuses to patch Accelerate in a process that can see a CUDA device.",
            hint="launch without --cpu to use the GPUs, or hide them with CUDA_VISIBLE_DEVICES=''",
        )
    _patch_backend_selection()
    if backend == "fsdp":
        _patch_fsdp_upgrade()


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Runs `patch` right after `module` finishes executing, wherever the script first imports it."""

    def __init__(self, module: str, patch) -> None:
        self.module = module
        self.patch = patch

    def find_spec(self, fullname, path, target=None):
        if fullname != self.module:
            return None
        sys.meta_path.remove(self)  # one shot; also keeps the lookup below from finding this finder again
        spec = next((found for finder in sys.meta_path if hasattr(finder, "find_spec")
                     for found in [finder.find_spec(fullname, path, target)] if found is not None), None)
        if spec is None:
            return None  # the import fails as it would have anyway
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            raise AccelkitError(f"CPU rehearsal cannot hook the import of {fullname} (unusual module loader).",
                                hint="install Accelerate normally (pip install accelerate)")
        exec_module, patch = spec.loader.exec_module, self.patch

        def exec_then_patch(module) -> None:
            exec_module(module)
            patch()

        spec.loader.exec_module = exec_then_patch
        return spec


def install(backend: str) -> None:
    """Install the patches rehearsal of `backend` needs in this (rank) process.

    Versions are checked now; the patches themselves are applied when the script imports Accelerate, so the
    bootstrap adds no torch/Accelerate import time of its own before the script's first line."""
    if backend not in BACKENDS:
        raise AccelkitError(f"Unknown rehearsal backend {backend!r} in ${REHEARSAL_ENV}.", hint=_HINT)
    if backend == "single":
        return  # one process: Accelerate's own CPU path is already right, nothing to patch
    from accelkit.rehearsal.versions import check_versions

    check_versions(backend)
    if STATE_MODULE in sys.modules:
        _apply(backend)
    elif not any(isinstance(finder, _PatchAfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PatchAfterImport(STATE_MODULE, functools.partial(_apply, backend)))
