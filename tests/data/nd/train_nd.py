"""A tiny Llama trained for 3 steps under whatever layout the launcher gives (plain script: one process).

argv: WORKDIR (holds base/, a saved tiny Llama). Loads the model split by its TP plan when the layout has tensor
parallelism, feeds each data-parallel rank its slice of one fixed global batch, saves state after step 2,
takes step 3, loads the state back and takes step 3 again. Rank 0 writes result.json: the data-parallel mean loss
of every step, both step-3 losses, the mesh and whether any parameter is a DTensor.
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from accelerate import Accelerator
from transformers import LlamaForCausalLM

work = Path(sys.argv[1])
accelerator = Accelerator()
pc = accelerator.parallelism_config
tp = pc.tp_size if pc else 1
kwargs = {}
if tp > 1:  # the installed transformers' TP loading API: DistributedConfig(tp_size) from 5.1, the mesh up to 5.0
    import dataclasses

    try:
        from transformers.distributed import DistributedConfig
    except ImportError:
        DistributedConfig = None
    if DistributedConfig is not None and "tp_size" in {f.name for f in dataclasses.fields(DistributedConfig)}:
        # Its mesh must cover every rank: TP alone. Under FSDP2 x TP the model loads whole and Accelerate's
        # preparation splits it by its TP plan over the mesh's "tp" dimension (accelkit.ranks.fsdp2_tp_compat).
        if tp == accelerator.num_processes:
            kwargs["distributed_config"] = DistributedConfig(tp_size=tp)
    else:  # transformers takes the mesh's "tp" dimension (FSDP2 x TP: Accelerate shards the rest)
        kwargs.update(tp_plan="auto", device_mesh=accelerator.torch_device_mesh)
model = LlamaForCausalLM.from_pretrained(work / "base", **kwargs)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
model, optimizer = accelerator.prepare(model, optimizer)

inner = pc.non_data_parallel_size if pc else 1  # tp/cp/sp ranks see the same rows (innermost in the mesh)
dp_size, dp_rank = accelerator.num_processes // inner, accelerator.process_index // inner
generator = torch.Generator().manual_seed(0)
batches = [torch.randint(0, 64, (4, 16), generator=generator) for _ in range(3)]


measured: dict[str, int] = {}


def local_bytes(tensor) -> int:
    """Bytes this rank holds of a tensor (its shard of a DTensor)."""
    if tensor is None:
        return 0
    tensor = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return tensor.numel() * tensor.element_size()


def measure_states() -> None:
    """This rank's parameters, gradients and optimizer moments, as `accelkit plan`'s N-D rows predict them."""
    params = list(model.parameters())
    moments = [value for state in optimizer.state.values() for key, value in state.items() if key != "step"]
    measured.update(parameters=sum(local_bytes(p) for p in params), gradients=sum(local_bytes(p.grad) for p in params),
                    optimizer=sum(local_bytes(m) for m in moments))


def step(ids: torch.Tensor) -> float:
    rows = ids.chunk(dp_size)[dp_rank]
    loss = model(input_ids=rows, labels=rows).loss
    accelerator.backward(loss)
    optimizer.step()
    if not measured:
        measure_states()
    optimizer.zero_grad()
    mean = loss.detach().clone()
    if dist.is_initialized():
        dist.all_reduce(mean)
        mean /= accelerator.num_processes  # every rank holds its dp slice's loss (tp ranks the same one)
    return mean.item()


def save(folder: Path) -> None:
    if accelerator.is_fsdp2 or not dist.is_initialized():
        accelerator.save_state(str(folder))
        return
    # Tensor parallelism without FSDP: Accelerate 1.15's save_state runs DTensors through safetensors and fails
    # ("invalid python storage"); torch's distributed checkpoint is the idiom for a TP model.
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(folder))


def load(folder: Path) -> None:
    if accelerator.is_fsdp2 or not dist.is_initialized():
        accelerator.load_state(str(folder))
        return
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=str(folder))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def write_full_model(path: Path) -> None:
    """The whole model gathered from every rank, as `merge-ckpt` must rebuild it from the checkpoint."""
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if dist.is_initialized():
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    else:
        full = model.state_dict()
    if accelerator.is_main_process:
        save_file({k: v.contiguous() for k, v in full.items()}, str(path))


losses = [step(batches[0]), step(batches[1])]
save(work / "ckpt")
write_full_model(work / "full.safetensors")
losses.append(step(batches[2]))
load(work / "ckpt")
resumed = step(batches[2])
mesh = accelerator.torch_device_mesh
if accelerator.is_main_process:
    (work / "result.json").write_text(json.dumps({
        "losses": losses, "resumed": resumed, "state_bytes": measured,
        "distributed_type": str(accelerator.distributed_type),
        "mesh": dict(zip(mesh.mesh_dim_names, mesh.shape, strict=True)) if mesh is not None else None,
        "dtensor": any(type(p).__name__ == "DTensor" or type(getattr(p, "data", None)).__name__ == "DTensor"
                       for p in model.parameters())}))
