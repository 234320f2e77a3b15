"""nanoGPT's train.py shape, shrunk: DDP when launched by torchrun (RANK in the environment), else one device;
master_process and seed_offset from the rank, gradient accumulation divided by the world size, the gradient sync
switched off between micro-steps by hand, a GradScaler, `model.module if ddp else model`, and random batches."""
import os

import torch
import torch.nn as nn
from accelerate import Accelerator

accelerator = Accelerator(mixed_precision="fp16" if False else "no")

batch_size = 4
block_size = 8
gradient_accumulation_steps = 2
max_iters = 12
learning_rate = 1e-2
device = accelerator.device.type
backend = "nccl"

ddp = accelerator.process_index != -1
if ddp:
    ddp_rank = accelerator.process_index
    ddp_local_rank = accelerator.local_process_index
    ddp_world_size = accelerator.num_processes
    device = str(accelerator.device)
    master_process = ddp_rank == 0
    seed_offset = ddp_rank
    assert gradient_accumulation_steps % ddp_world_size == 0
    gradient_accumulation_steps //= ddp_world_size
else:
    master_process = True
    seed_offset = 0
    ddp_world_size = 1
torch.manual_seed(1337 + seed_offset)
device_type = accelerator.device.type

data = (torch.arange(600) * 5 % 13).long()


def get_batch():
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([data[i:i + block_size] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + block_size] for i in ix])
    return x.to(device), y.to(device)


class TinyLM(nn.Module):
    def __init__(self, vocab=13, dim=16):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, idx, targets):
        logits = self.head(torch.tanh(self.emb(idx)))
        return logits, nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


model = TinyLM()
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
raw_model = accelerator.unwrap_model(model) if ddp else model

X, Y = get_batch()
model, optimizer = accelerator.prepare(model, optimizer)
# each process draws its own random batches; process 0 goes on with the script's own random stream
if accelerator.process_index > 0:
    torch.manual_seed(1337 + seed_offset + accelerator.process_index)
for iter_num in range(max_iters):
    for micro_step in range(gradient_accumulation_steps):
        if ddp:
            model.require_backward_grad_sync = micro_step == gradient_accumulation_steps - 1
        logits, loss = model(X, Y)
        loss = loss / gradient_accumulation_steps
        X, Y = get_batch()
        accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if master_process:
        accelerator.print(f"LOSS iter={iter_num} loss={loss.item() * gradient_accumulation_steps:.6f}")
if master_process:
    accelerator.print(f"PARAMS {sum(p.numel() for p in raw_model.parameters())}")
