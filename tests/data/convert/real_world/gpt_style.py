"""Module-level LM training in the nanoGPT shape: globals overridden by an exec'd file, a torchrun-or-single switch,
a string device, the model from a local module built in `if init_from` branches, the optimizer from
configure_optimizers, an autocast context object with a GradScaler stepped through `scaler.step`, random batches."""
import os
from contextlib import nullcontext

import numpy as np
import torch
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP

from tiny_gpt import TinyLM

device = "cuda"
init_from = "scratch"
batch_size = 8
block = 6
max_iters = 30
lr = 3e-2
exec(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "overrides.py")).read())

ddp = int(os.environ.get("RANK", -1)) != -1
if ddp:
    init_process_group(backend="nccl")
    ddp_rank = int(os.environ["RANK"])
    ddp_local_rank = int(os.environ["LOCAL_RANK"])
    device = f"cuda:{ddp_local_rank}"
    torch.cuda.set_device(device)
    master_process = ddp_rank == 0
    seed_offset = ddp_rank
else:
    master_process = True
    seed_offset = 0
torch.manual_seed(1234 + seed_offset)
device_type = "cuda" if "cuda" in device else "cpu"
dtype = "bfloat16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "float16"
ptdtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
ctx = nullcontext() if device_type == "cpu" else torch.amp.autocast(device_type=device_type, dtype=ptdtype)

stream = torch.from_numpy((np.arange(4000) * 7 % 16).astype(np.int64))


def get_batch():
    ix = torch.randint(len(stream) - block - 1, (batch_size,))
    x = torch.stack([stream[i:i + block] for i in ix])
    y = torch.stack([stream[i + 1:i + 1 + block] for i in ix])
    return x.to(device), y.to(device)


if init_from == "scratch":
    model = TinyLM()
elif init_from == "resume":
    model = TinyLM()
    model.load_state_dict(torch.load("ckpt.pt", map_location=device))
model.to(device)
scaler = torch.cuda.amp.GradScaler(enabled=(dtype == "float16" and device_type == "cuda"))
optimizer = model.configure_optimizers(lr)
if ddp:
    model = DDP(model, device_ids=[ddp_local_rank])
raw_model = model.module if ddp else model

it = 0
while True:
    x, y = get_batch()
    with ctx:
        _, loss = model(x, y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    if master_process and it % 10 == 0:
        print(f"iter {it}: loss {loss.item():.4f}, {sum(p.numel() for p in raw_model.parameters())} parameters")
    it += 1
    if it >= max_iters:
        break
if ddp:
    destroy_process_group()
