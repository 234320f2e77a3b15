"""Module-level GPT training in the build-nanogpt shape: torchrun or a single process, a hand-made loader class that
reads its own part of the token stream from the rank it is given (`process_rank=ddp_rank`), tokens loaded by a
helper whose local shares the loop's data name, the optimizer from the unwrapped model (`raw_model = model.module
if ddp else model`), and an `all_reduce` of the logged loss."""
import os

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP

from tiny_gpt import TinyLM

ddp = int(os.environ.get("RANK", -1)) != -1
if ddp:
    init_process_group(backend="gloo")
    ddp_rank = int(os.environ["RANK"])
    ddp_world_size = int(os.environ["WORLD_SIZE"])
    master_process = ddp_rank == 0
else:
    ddp_rank = 0
    ddp_world_size = 1
    master_process = True
device = "cpu"
torch.manual_seed(1337)


def load_tokens():
    npt = (np.arange(6000) ** 2 // 7 % 16).astype(np.int64)
    return torch.tensor(npt, dtype=torch.long)


class LoaderLite:
    def __init__(self, B, T, process_rank, num_processes):
        self.B, self.T = B, T
        self.process_rank, self.num_processes = process_rank, num_processes
        self.tokens = load_tokens()
        self.position = B * T * process_rank

    def next_batch(self):
        B, T = self.B, self.T
        buf = self.tokens[self.position:self.position + B * T + 1]
        x, y = buf[:-1].view(B, T), buf[1:].view(B, T)
        self.position += B * T * self.num_processes
        if self.position + B * T * self.num_processes + 1 > len(self.tokens):
            self.position = B * T * self.process_rank
        return x, y


train_loader = LoaderLite(B=4, T=8, process_rank=ddp_rank, num_processes=ddp_world_size)
model = TinyLM()
model.to(device)
if ddp:
    model = DDP(model)
raw_model = model.module if ddp else model
optimizer = raw_model.configure_optimizers(3e-2)

for step in range(30):
    optimizer.zero_grad()
    x, y = train_loader.next_batch()
    x, y = x.to(device), y.to(device)
    _, loss = model(x, y)
    loss.backward()
    optimizer.step()
    loss_accum = loss.detach()
    if ddp:
        dist.all_reduce(loss_accum, op=dist.ReduceOp.AVG)
    if master_process and step % 10 == 0:
        print(f"step {step}: loss {loss_accum.item():.4f}")
if ddp:
    destroy_process_group()
