"""What a rank really holds, by kind, counted in storage bytes (each storage once, padding included).

Runs inside the ranks (see probe.py). The model and optimizer come from Accelerate (`accelerator._models`,
`_optimizers`) or from the optimizer that stepped. Per backend:

- torch / DDP / FSDP2: parameters are the model's parameters (DTensors count their local shard), gradients their
  `.grad`, optimizer states the tensors in `optimizer.state`.
- DeepSpeed ZeRO (0.19): parameters also include the flat 16-bit buffers and ZeRO-3's partitions (`ds_tensor`);
  gradients are ZeRO's gradient partitions (`averaged_gradients`, `grads_in_partition`,
  `grad_partitions_flat_buffer`) plus any `.grad` still on a parameter; the optimizer side is the fp32 master
  partition (`single_partition_of_fp32_groups` / `fp32_partitioned_groups_flat`) plus the inner optimizer's state.
  The reduce buckets (`ipg_buckets`) are buffers, never gradients, even while gradients are views into them.
"""

from __future__ import annotations

from typing import Any

from accelkit.plan.activations.count import storage_key

DS_PARAMS = ("bit16_groups_flat", "fp16_partitioned_groups_flat")
DS_GRADS = ("averaged_gradients", "grads_in_partition", "grad_partitions_flat_buffer",
            "_DeepSpeedZeroOptimizer_Stage3__param_id_to_grad_partition")
DS_MASTER = ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat")
DS_BUFFERS = ("ipg_buckets", "ipg_buffer")


def tensors_in(value, depth: int = 0):
    """Every tensor inside nested lists/tuples/dicts and DeepSpeed bucket objects (a few levels deep)."""
    import torch

    if isinstance(value, torch.Tensor):
        yield value
        return
    if depth > 4:
        return
    if isinstance(value, dict):
        for item in value.values():
            yield from tensors_in(item, depth + 1)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from tensors_in(item, depth + 1)
    elif hasattr(value, "__dict__") and type(value).__module__.startswith("deepspeed"):
        for item in vars(value).values():
            yield from tensors_in(item, depth + 1)


class Storages:
    """Storage bytes by identity: adding the same storage twice counts it once."""

    def __init__(self) -> None:
        self.sizes: dict[int, int] = {}

    def add(self, tensor) -> None:
        key = storage_key(tensor)
        if key is not None and key[1] > 0 and tensor.device.type != "meta":
            self.sizes.setdefault(*key)

    def add_all(self, values) -> None:
        for tensor in tensors_in(values):
            self.add(tensor)

    def without(self, other: Storages) -> int:
        return sum(size for key, size in self.sizes.items() if key not in other.sizes)

    @property
    def total(self) -> int:
        return sum(self.sizes.values())


def unwrap_engine(model):
    """(module, DeepSpeed engine or None)."""
    if type(model).__name__ == "DeepSpeedEngine":
        return model.module, model
    return model, None


def inner_optimizer(optimizer):
    """The torch optimizer under Accelerate's and DeepSpeed's wrappers (DeepSpeed's ZeRO optimizer stays)."""
    if type(optimizer).__name__ == "DeepSpeedEngine":
        return optimizer.optimizer
    while type(optimizer).__name__ in {"AcceleratedOptimizer", "DeepSpeedOptimizerWrapper"}:
        optimizer = optimizer.optimizer
    return optimizer


def is_zero(optimizer) -> bool:
    return type(optimizer).__module__.startswith("deepspeed.runtime.zero")


def _with_zero(found: Storages, optimizer, names: tuple[str, ...]) -> Storages:
    """`found` plus the tensors in these attributes of a ZeRO optimizer (nothing for other optimizers)."""
    if is_zero(optimizer):
        found.add_all([getattr(optimizer, n) for n in names if getattr(optimizer, n, None) is not None])
    return found


def buffer_storages(optimizer) -> Storages:
    return _with_zero(Storages(), optimizer, DS_BUFFERS)


def parameter_storages(module, optimizer) -> Storages:
    found = Storages()
    for param in module.parameters():
        found.add(param)
        if getattr(param, "ds_tensor", None) is not None:  # ZeRO-3's partition of it
            found.add(param.ds_tensor)
    return _with_zero(found, optimizer, DS_PARAMS)


def gradient_bytes(module, optimizer) -> int:
    found = Storages()
    for param in module.parameters():
        if param.grad is not None:
            found.add(param.grad)
    return _with_zero(found, optimizer, DS_GRADS).without(buffer_storages(optimizer))


def optimizer_bytes(optimizer) -> int:
    found = _with_zero(Storages(), optimizer, DS_MASTER)
    torch_optimizer = optimizer.optimizer if is_zero(optimizer) else optimizer
    found.add_all(list(torch_optimizer.state.values()))
    return found.total


def group_names(module, optimizer) -> list[list[str]]:
    """The optimizer's parameter groups by parameter name (DeepSpeed: the groups it flattened)."""
    names = {id(p): n for n, p in module.named_parameters()}
    groups = getattr(optimizer, "bit16_groups", None) or getattr(optimizer, "fp16_groups", None)
    if groups is None:
        groups = [g["params"] for g in inner_optimizer(optimizer).param_groups]
    return [[names[id(p)] for p in group if id(p) in names] for group in groups]


def full_shapes(module) -> list[tuple[str, list[int], bool]]:
    """(name, global shape, trainable) of every parameter: DTensor and ZeRO-3 report their unsharded shape."""
    out = []
    for name, param in module.named_parameters():
        shape = getattr(param, "ds_shape", None) or param.shape
        out.append((name, list(shape), bool(param.requires_grad)))
    return out


def backend_facts(model, optimizer) -> dict[str, Any]:
    """Backend facts the plan needs to be compared with this rank: which strategy ran, with what settings."""
    module, engine = unwrap_engine(model)
    inner = getattr(module, "module", module) if type(module).__name__ == "DistributedDataParallel" else module
    name = type(inner).__name__
    if hasattr(inner, "_get_fsdp_state") and name.startswith("FSDP"):  # fully_shard's dynamic subclass
        name = name[len("FSDP"):]
    info: dict[str, Any] = {"model": name}
    if engine is not None:
        info["backend"] = "deepspeed"
        info["zero_stage"] = int(engine.zero_optimization_stage())
        info["precision"] = "bf16" if engine.bfloat16_enabled() else "fp16" if engine.fp16_enabled() else "fp32"
        zero = engine._config.zero_config
        info["reduce_bucket_size"] = int(zero.reduce_bucket_size)
        info["overlap_comm"] = bool(zero.overlap_comm)
        info["persistence_threshold"] = int(zero.param_persistence_threshold)
    elif type(model).__name__ == "DistributedDataParallel":
        info["backend"] = "ddp"
        info["gradient_as_bucket_view"] = bool(model.gradient_as_bucket_view)
        # The reducer keeps each bucket as a flat tensor; without gradient_as_bucket_view it is a second copy of
        # the gradients. Its sizes (bytes) are in DDP's own logging data.
        sizes = str(model._get_ddp_logging_data().get("bucket_sizes", ""))
        info["ddp_bucket_bytes"] = sum(int(size) for size in sizes.split(",") if size.strip().isdigit())
    elif hasattr(model, "_get_fsdp_state"):
        info["backend"] = "fsdp"
        info["fsdp_units"] = fsdp_units(model)
    else:
        info["backend"] = "torch"
    info["first_param_dtype"] = str(next(inner.parameters()).dtype).replace("torch.", "")
    return info


def fsdp_units(model) -> list[dict[str, Any]]:
    """The FSDP2 parameter groups (units) as fully_shard built them: parameter names, resharded after forward."""
    names = {id(p): n for n, p in model.named_parameters()}
    units, seen = [], set()
    for module in model.modules():
        state = module._get_fsdp_state() if hasattr(module, "_get_fsdp_state") else None
        group = getattr(state, "_fsdp_param_group", None) if state is not None else None
        if group is None or id(group) in seen:
            continue
        seen.add(id(group))
        params = [names.get(id(fp.sharded_param), "?") for fp in group.fsdp_params]
        units.append({"params": params, "reshard_after_forward": group.post_forward_mesh_info is not None})
    return units
