"""Known failures from deep inside a rank, turned into one line that names the cause, the parameter or the line,
and the way out. The bootstrap asks `explain(exc)` about any exception the script raises; None means "not one we
know": the exception then propagates with its traceback as usual.
"""

from __future__ import annotations

import linecache
import re

from accelkit.errors import AccelkitError
from accelkit.ranks.user_code import is_user_file

_SCALAR_FSDP = re.compile(r"(fully_shard|FSDP) doesn't support scalar parameters\. Change (\S+) to a 1D tensor")
_SCALAR_DEEPSPEED = "self.dim() cannot be 0 to view"
_NO_CUDA = ("Torch not compiled with CUDA enabled", "Found no NVIDIA driver", "No CUDA GPUs are available")
_PLUGIN_VERSION = re.compile(r"reshard_after_forward set to (.+?)\. This is not supported with FSDP(\d)")
_HEAD_VIEW = re.compile(r"shape '\[(\d+), (\d+), -1, (\d+)\]' is invalid for input of size (\d+)")
_INVALID_STORAGE = "invalid python storage"
_WHOLE_WORLD_MESH = re.compile(r"The parallel mesh requires (\d+) processes, but world_size is (\d+)")
_MISMATCH = re.compile(r"Rank (\d+) is running collective: CollectiveFingerPrint\(.*?OpType=(\w+).*?\), but Rank (\d+) "
                       r"is running collective: CollectiveFingerPrint\(.*?OpType=(\w+)", re.DOTALL)


def _user_line(exc: BaseException) -> tuple[str, int, str] | None:
    """(file, line, source) of the innermost frame of the user's code in the traceback."""
    found = None
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if is_user_file(code.co_filename):
            found = (code.co_filename, tb.tb_lineno, linecache.getline(code.co_filename, tb.tb_lineno).strip())
        tb = tb.tb_next
    return found


def _scalar_parameters(exc: BaseException) -> list[str]:
    """Names of 0-dim parameters of the models found in the traceback's frames (innermost model first)."""
    import torch

    tb, frames = exc.__traceback__, []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for frame in reversed(frames):
        for value in frame.f_locals.values():
            module = getattr(value, "module", value)  # a DeepSpeedEngine or DDP wrapper holds the model
            if isinstance(module, torch.nn.Module):
                names = [name for name, p in module.named_parameters()
                         if len(getattr(p, "ds_shape", p.shape)) == 0]
                if names:
                    return names
    return []


def _scalar_parameter_error(names: list[str], backend: str, ways_out: str, why: str = "") -> AccelkitError:
    listed = ", ".join(f"`{name}`" for name in names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    plural = "parameters" if len(names) > 1 else "parameter"
    return AccelkitError(
        f"the model's {plural} {listed} {'are' if len(names) > 1 else 'is'} 0-dim (a scalar), which {backend} "
        f"cannot shard{why}", hint=f"make it shape (1,) (e.g. nn.Parameter(torch.tensor([value]))), or {ways_out}")


def _explain_scalar_fsdp(exc: BaseException) -> AccelkitError | None:
    match = _SCALAR_FSDP.search(str(exc))
    if match is None:
        return None
    # Both FSDP versions refuse scalars (torch 2.13), and so does DeepSpeed ZeRO: only DDP takes the model as it is.
    version = "FSDP2 (fully_shard)" if match.group(1) == "fully_shard" else "FSDP1"
    return _scalar_parameter_error([match.group(2)], version, "use --backend ddp")


def _explain_scalar_deepspeed(exc: BaseException) -> AccelkitError | None:
    if _SCALAR_DEEPSPEED not in str(exc):
        return None
    names = _scalar_parameters(exc) or ["(unnamed)"]
    return _scalar_parameter_error(names, "DeepSpeed ZeRO", "use --backend ddp",
                                   why=" (it flattens every parameter into its partitions)")


def _explain_no_cuda(exc: BaseException) -> AccelkitError | None:
    import os

    from accelkit.rehearsal import REHEARSAL_ENV

    if not os.environ.get(REHEARSAL_ENV) or not any(text in str(exc) for text in _NO_CUDA):
        return None
    where = _user_line(exc)
    place = f"{where[0]}:{where[1]} (`{where[2]}`)" if where else "the script"
    return AccelkitError(
        f"{place} needs a CUDA device, which a CPU rehearsal does not have",
        hint="create tensors on the device of your data or model (x.device, accelerator.device) instead of a "
             "hard-coded 'cuda'; `.to(cuda)`, `.cuda()`, set_device and device_ids are mapped to the CPU already")


def _explain_collective_mismatch(exc: BaseException) -> AccelkitError | None:
    match = _MISMATCH.search(str(exc))
    if match is None:
        return None
    rank_a, op_a, rank_b, op_b = match.groups()
    where = _user_line(exc)
    place = f"; this rank called it at {where[0]}:{where[1]}" if where else ""
    return AccelkitError(
        f"ranks called different collectives: rank {rank_a} {op_a.lower()}, rank {rank_b} {op_b.lower()} "
        f"(found by TORCH_DISTRIBUTED_DEBUG=DETAIL){place}",
        hint="a rank took another branch: every rank must call the same collectives in the same order")


def _explain_plugin_version(exc: BaseException) -> AccelkitError | None:
    """The script builds its own FullyShardedDataParallelPlugin with options of the other FSDP version."""
    match = _PLUGIN_VERSION.search(str(exc))
    if match is None:
        return None
    version = match.group(2)
    other = "1" if version == "2" else "2"
    where = _user_line(exc)
    place = f"{where[0]}:{where[1]} builds" if where else "the script builds"
    option = "sharding_strategy" if version == "2" else "reshard_after_forward=True/False"
    return AccelkitError(
        f"{place} an FSDP{other}-style FullyShardedDataParallelPlugin ({option}), but the launch config says "
        f"fsdp_version {version}",
        hint=f"launch with --fsdp-version {other}, or give the plugin FSDP{version} options "
             + ("(reshard_after_forward=True/False instead of sharding_strategy)" if version == "2"
                else "(sharding_strategy instead of a bool reshard_after_forward)"))


def _frames(exc: BaseException) -> list:
    tb, frames = exc.__traceback__, []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    return frames


def _tp_size() -> int:
    import os

    try:  # what `accelerate launch` passes every rank for the parallelism_config's tp_size
        return int(os.environ.get("PARALLELISM_CONFIG_TP_SIZE", "1"))
    except ValueError:
        return 1


def _attention_heads(exc: BaseException) -> tuple[int, int] | None:
    """(attention heads, kv heads) of the model config of the innermost attention module in the traceback."""
    for frame in reversed(_frames(exc)):
        config = getattr(frame.f_locals.get("self"), "config", None)
        heads = getattr(config, "num_attention_heads", None)
        if isinstance(heads, int):
            kv_heads = getattr(config, "num_key_value_heads", None)
            return heads, kv_heads if isinstance(kv_heads, int) else heads
    return None


def _explain_tp_heads(exc: BaseException) -> AccelkitError | None:
    """A tensor-parallel shard holding part of a head: transformers' attention reshapes each rank's q/k/v slice
    into (batch, seq, heads, head_dim) and the slice is not whole heads."""
    match = _HEAD_VIEW.search(str(exc))
    tp = _tp_size()
    if match is None or tp <= 1:
        return None
    heads = _attention_heads(exc)
    if heads is not None and not (heads[0] % tp or heads[1] % tp):
        return None  # the heads split: this reshape failed for another reason
    if heads is not None:
        names = f"{heads[0]} attention heads and {heads[1]} kv heads"
        fits = [d for d in range(2, heads[0] + 1) if heads[0] % d == 0 and heads[1] % d == 0]
        fix = f"use a --tp-size that divides both ({', '.join(map(str, fits))})" if fits else \
            "use --tp-size 1 (no size splits both)"
        return AccelkitError(f"tensor parallelism tp_size {tp} does not split the model's {names}: each "
                             f"TP rank must hold whole heads (transformers: {match.group(0).split(' for input')[0]})",
                             hint=f"{fix}, or a model whose head counts tp divides")
    return AccelkitError(f"tensor parallelism tp_size {tp} splits the model's attention heads unevenly: a "
                         f"rank's slice is not whole heads of {match.group(3)} (shape {match.group(0)})",
                         hint="use a --tp-size that divides both num_attention_heads and num_key_value_heads of "
                              "the model's config.json")


def _explain_tp_save_state(exc: BaseException) -> AccelkitError | None:
    """Accelerate's save_state on a tensor-parallel model without FSDP: its safetensors path reads each weight's
    storage pointer, which a DTensor shard does not have (Accelerate's own TP example does not save state)."""
    if _INVALID_STORAGE not in str(exc):
        return None
    names = [frame.f_code.co_name for frame in _frames(exc)]
    if "id_tensor_storage" not in names or not {"save_state", "save_model", "save"} & set(names):
        return None
    tp = _tp_size()
    where = _user_line(exc)
    place = f"{where[0]}:{where[1]} (`{where[2]}`)" if where else "the script"
    layout = f"tp {tp} " if tp > 1 else ""
    return AccelkitError(
        f"{place}: Accelerate's save_state cannot write tensor-parallel weights without FSDP ({layout}with no "
        "dp_shard): safetensors refuses their DTensor storage (\"invalid python storage\")",
        hint="checkpoint a TP-only model with torch.distributed.checkpoint (dcp.save of get_state_dict(model, "
             "optimizer), as `accelkit init --template causal-lm` does; merge-ckpt reads it), or shard it too: "
             "--backend fsdp --dp-shard-size 2 or more")


def _explain_tp_mesh_of_the_whole_world(exc: BaseException) -> AccelkitError | None:
    """transformers' DistributedConfig(tp_size=N) (5.1 and later) builds its mesh over every process, so under FSDP2
    x TP (tp smaller than the world) from_pretrained refuses it; the model has to load whole, and accelkit's launch
    splits it by its TP plan over Accelerate's tp dimension when Accelerate prepares it (ranks.fsdp2_tp_compat)."""
    match = _WHOLE_WORLD_MESH.search(str(exc))
    tp = _tp_size()
    if match is None or tp <= 1 or int(match.group(1)) >= int(match.group(2)):
        return None
    where = _user_line(exc)
    place = f"{where[0]}:{where[1]} (`{where[2]}`)" if where else "the script"
    return AccelkitError(
        f"{place}: transformers' DistributedConfig builds its mesh over all {match.group(2)} processes, but it was "
        f"given {match.group(1)} (tp {tp}); the other processes are Accelerate's data-parallel ranks",
        hint="under FSDP2 x TP load the model whole (from_pretrained without distributed_config): accelkit launch "
             "splits it by its TP plan over the tp dimension when Accelerate prepares it; keep "
             "DistributedConfig(tp_size=N) for TP alone")


_RULES = (_explain_tp_heads, _explain_tp_save_state, _explain_tp_mesh_of_the_whole_world, _explain_scalar_fsdp,
          _explain_scalar_deepspeed, _explain_no_cuda, _explain_plugin_version,
          _explain_collective_mismatch)


def explain(exc: BaseException) -> AccelkitError | None:
    for rule in _RULES:
        error = rule(exc)
        if error is not None:
            return error
    return None
