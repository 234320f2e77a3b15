"""A torch.distributed script written for torchrun (and runnable as plain `python`): the process group from the
launcher's environment, DDP with device_ids, a DistributedSampler with set_epoch, gradient accumulation with
no_sync, a validation loss summed with dist.all_reduce, and rank-0 printing and checkpointing."""
import os

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from accelerate import Accelerator

accelerator = Accelerator()

ACCUM = 2


def setup():
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    rank = accelerator.process_index
    world_size = accelerator.num_processes
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    local_rank = accelerator.local_process_index
    return rank, local_rank, world_size


def make_data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    return TensorDataset(x, (x[:, :2].sum(1) > 0).long())


def main():
    rank, local_rank, world_size = setup()
    torch.manual_seed(0)
    device = accelerator.device
    train_set, val_set = make_data(96, 1), make_data(32, 2)
    train_loader = DataLoader(train_set, batch_size=8, shuffle=True)
    val_loader = DataLoader(val_set, batch_size=8, shuffle=False)
    model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    criterion = nn.CrossEntropyLoss()
    model, optimizer, train_loader, val_loader = accelerator.prepare(
        model, optimizer, train_loader, val_loader
    )
    for epoch in range(2):
        model.train()
        for step, (x, y) in enumerate(train_loader):
            if (step + 1) % ACCUM != 0:
                with accelerator.no_sync(model):
                    loss = criterion(model(x), y) / ACCUM
                    accelerator.backward(loss)
                continue
            loss = criterion(model(x), y) / ACCUM
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            if rank == 0:
                accelerator.print(f"LOSS epoch={epoch} step={step} loss={loss.item():.6f}")
        model.eval()
        totals = torch.zeros(2, device=device)
        with torch.no_grad():
            for x, y in val_loader:
                totals[0] += criterion(model(x), y).item() * y.size(0)
                totals[1] += y.size(0)
        totals.copy_(accelerator.reduce(totals, "sum"))
        model_state_dict = accelerator.get_state_dict(model)
        if rank == 0:
            accelerator.print(f"EVAL epoch={epoch} val loss={(totals[0] / totals[1]).item():.6f}")
            accelerator.save(model_state_dict, os.path.join(os.environ.get("CKPT_DIR", "."), "ddp.pt"))
        accelerator.wait_for_everyone()


if __name__ == "__main__":
    main()
