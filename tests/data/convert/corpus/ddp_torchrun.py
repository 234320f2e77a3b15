"""A torch.distributed script written for torchrun (and runnable as plain `python`): the process group from the
launcher's environment, DDP with device_ids, a DistributedSampler with set_epoch, gradient accumulation with
no_sync, a validation loss summed with dist.all_reduce, and rank-0 printing and checkpointing."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

ACCUM = 2


def setup():
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    rank = int(os.environ.get("RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend=backend, rank=rank, world_size=world_size)
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
    return rank, local_rank, world_size


def make_data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    return TensorDataset(x, (x[:, :2].sum(1) > 0).long())


def main():
    rank, local_rank, world_size = setup()
    torch.manual_seed(0)
    device = torch.device(f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")
    train_set, val_set = make_data(96, 1), make_data(32, 2)
    train_sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
    train_loader = DataLoader(train_set, batch_size=8, sampler=train_sampler)
    val_loader = DataLoader(val_set, batch_size=8, sampler=DistributedSampler(val_set, shuffle=False))
    model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 2)).to(device)
    model = DDP(model, device_ids=[local_rank] if torch.cuda.is_available() else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    criterion = nn.CrossEntropyLoss()
    for epoch in range(2):
        train_sampler.set_epoch(epoch)
        model.train()
        for step, (x, y) in enumerate(train_loader):
            x, y = x.to(device), y.to(device)
            if (step + 1) % ACCUM != 0:
                with model.no_sync():
                    loss = criterion(model(x), y) / ACCUM
                    loss.backward()
                continue
            loss = criterion(model(x), y) / ACCUM
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if rank == 0:
                print(f"LOSS epoch={epoch} step={step} loss={loss.item():.6f}")
        model.eval()
        totals = torch.zeros(2, device=device)
        with torch.no_grad():
            for x, y in val_loader:
                x, y = x.to(device), y.to(device)
                totals[0] += criterion(model(x), y).item() * y.size(0)
                totals[1] += y.size(0)
        dist.all_reduce(totals, op=dist.ReduceOp.SUM)
        if rank == 0:
            print(f"EVAL epoch={epoch} val loss={(totals[0] / totals[1]).item():.6f}")
            torch.save(model.module.state_dict(), os.path.join(os.environ.get("CKPT_DIR", "."), "ddp.pt"))
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
