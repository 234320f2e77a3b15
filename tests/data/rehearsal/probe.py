"""Tiny Accelerate training script used by the rehearsal tests: it knows nothing about accelkit.

Trains a 2-layer MLP for a few steps, saves state, takes one more step, loads the state back, and writes one
probe_rank<N>.json file per rank describing what Accelerate really ran.
"""

import json
import os
import sys

import torch
from accelerate import Accelerator, PartialState
from torch.distributed.tensor import DTensor
from torch.utils.data import DataLoader, TensorDataset

out_dir = sys.argv[1]
if "--partial-state-first" in sys.argv:
    # Many scripts touch PartialState (main_process_first, logging) before creating the Accelerator.
    assert PartialState().num_processes == int(os.environ["WORLD_SIZE"])
accelerator = Accelerator()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
data = TensorDataset(torch.randn(32, 8), torch.randn(32, 4))
loader = DataLoader(data, batch_size=4)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
# Layout right after prepare (FSDP2 keeps the root module's parameters unsharded after a forward).
first = next(accelerator.unwrap_model(model).parameters())
layout = {
    "is_dtensor": isinstance(first, DTensor),
    "first_param_shape": list(first.shape),
    "local_shard_shape": list(first.to_local().shape) if isinstance(first, DTensor) else None,
}
dtype = next(model.parameters()).dtype  # DeepSpeed bf16 casts the model; inputs must follow
probe_x, probe_y = torch.randn(4, 8, generator=torch.Generator().manual_seed(1)), torch.zeros(4, 4)


def step(x, y):
    loss = torch.nn.functional.mse_loss(model(x.to(dtype)).float(), y)
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    return loss.item()


def probe_loss():
    with torch.no_grad():
        return torch.nn.functional.mse_loss(model(probe_x.to(dtype)).float(), probe_y).item()


losses = [step(x, y) for x, y in loader]
ckpt = os.path.join(out_dir, "ckpt")
accelerator.save_state(ckpt)
accelerator.wait_for_everyone()
saved_loss = probe_loss()
step(probe_x, probe_y)  # move the weights away from the checkpoint
moved_loss = probe_loss()
accelerator.load_state(ckpt)
restored_loss = probe_loss()

info = {
    **layout,
    "rank": accelerator.process_index,
    "world_size": accelerator.num_processes,
    "distributed_type": str(accelerator.distributed_type).split(".")[-1],
    "backend": torch.distributed.get_backend() if torch.distributed.is_initialized() else None,
    "wrapper": type(model).__name__,
    "zero_stage": model.zero_optimization_stage() if hasattr(model, "zero_optimization_stage") else None,
    # ZeRO-3 replaces each parameter by a placeholder; ds_shape is the full shape, ds_tensor this rank's partition.
    "ds_shape": list(first.ds_shape) if hasattr(first, "ds_shape") else None,
    "ds_partition_numel": first.ds_tensor.numel() if hasattr(first, "ds_tensor") else None,
    "losses_finite": all(loss == loss for loss in losses),
    "saved_loss": saved_loss,
    "moved_loss": moved_loss,
    "restored_loss": restored_loss,
}
# One file per rank: ranks share stdout, where their lines can interleave.
with open(os.path.join(out_dir, f"probe_rank{accelerator.process_index}.json"), "w") as handle:
    json.dump(info, handle)
