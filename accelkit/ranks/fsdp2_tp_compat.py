"""FSDP2 x TP on transformers releases that no longer have what Accelerate's FSDP2+TP preparation imports.

Accelerate 1.10 to 1.15 prepare an FSDP2 x TP model by importing `transformers.integrations.tensor_parallel.
ReplicateParallel` (gone from transformers 5.1 on): every rank dies with an ImportError. Newer transformers also
cannot load a model split over only the `tp` part of a larger mesh (its `DistributedConfig` mesh must cover the whole
world), so a script loads the model whole and nothing would split it. When (and only when) the installed versions
have that gap (accelkit.configs.compat.fsdp2_tp_workaround_needed), each rank, before the user's script runs:

- makes `ReplicateParallel` importable again, built on torch's DTensor: the module's input becomes a replicated
  DTensor on the `tp` mesh, its output a local tensor again (what the removed class did for the parameters Accelerate
  replicates over `tp`: norms, and anything the TP plan leaves whole);
- when Accelerate prepares a model none of whose parameters is a DTensor, applies the model's own TP plan over
  Accelerate's `tp` mesh with the installed transformers' `apply_tensor_parallelism` (the same styles its
  `from_pretrained` uses), and points the optimizer at the split parameters; Accelerate then does the rest as usual.

Installed through accelkit.ranks.bootstrap as a per-rank module (its `install()`), on CPU rehearsals and GPUs alike;
`accelkit launch` adds it only for an FSDP2 layout with tp > 1 on such versions.
"""

from __future__ import annotations

import functools

MODULE = "accelkit.ranks.fsdp2_tp_compat"


class ReplicateParallel:
    """What Accelerate's FSDP2+TP preparation expects of transformers' removed class: `prepare_module_tp(module,
    tp_mesh)` hooks a module whose parameters Accelerate made replicated DTensors, so its input meets them as a
    replicated DTensor and its output leaves as a local tensor."""

    def prepare_module_tp(self, module, device_mesh):
        if getattr(module, "_accelkit_replicated_tp", False):  # Accelerate calls it once per parameter
            return module
        from torch.distributed.tensor import DTensor, Replicate

        def to_replicated(_module, inputs):
            if not inputs or not hasattr(inputs[0], "dim") or isinstance(inputs[0], DTensor):
                return None
            return (DTensor.from_local(inputs[0], device_mesh, [Replicate()], run_check=False), *inputs[1:])

        def to_local(_module, _inputs, output):
            return output.to_local() if isinstance(output, DTensor) else None

        module.register_forward_pre_hook(to_replicated)
        module.register_forward_hook(to_local)
        module._accelkit_replicated_tp = True
        return module


def split_by_tp_plan(model, optimizers, tp_mesh) -> bool:
    """Apply the model's TP plan over `tp_mesh` to a model loaded whole, and swap the optimizers' parameters for the
    split ones (matched by name). False when the model is already split or has no TP plan."""
    from torch.distributed.tensor import DTensor

    if any(isinstance(p, DTensor) for p in model.parameters()):
        return False
    plan = dict(getattr(model, "tp_plan", None) or {})
    if not plan or not hasattr(model, "_expand_parallel_plan"):
        return False
    from transformers.distributed.tensor_parallel import apply_tensor_parallelism

    names = {id(p): name for name, p in model.named_parameters()}
    apply_tensor_parallelism(model, tp_mesh, model._expand_parallel_plan(plan))
    split = dict(model.named_parameters())
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            group["params"] = [split[names[id(p)]] if id(p) in names else p for p in group["params"]]
    return True


def _patched_prepare_tp(original):
    @functools.wraps(original)
    def _prepare_tp(self, *args):
        import torch

        mesh = self.torch_device_mesh
        if self.is_fsdp2 and mesh is not None and "tp" in (mesh.mesh_dim_names or ()):
            optimizers = [a for a in args if isinstance(a, torch.optim.Optimizer)]
            for model in (a for a in args if isinstance(a, torch.nn.Module)):
                split_by_tp_plan(model, optimizers, mesh["tp"])
        return original(self, *args)

    _prepare_tp._accelkit_fsdp2_tp = True
    return _prepare_tp


def install() -> None:
    """Patch only when the installed versions need it (compatible ones are left untouched)."""
    from accelkit.package_files import fsdp2_tp_workaround_needed

    if not fsdp2_tp_workaround_needed():
        return
    import transformers.integrations.tensor_parallel as tensor_parallel
    from accelerate import Accelerator

    if not hasattr(tensor_parallel, "ReplicateParallel"):
        tensor_parallel.ReplicateParallel = ReplicateParallel
    if not getattr(Accelerator._prepare_tp, "_accelkit_fsdp2_tp", False):
        Accelerator._prepare_tp = _patched_prepare_tp(Accelerator._prepare_tp)
