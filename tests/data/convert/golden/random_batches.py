"""nanoGPT-style training without a DataLoader: random windows of a token stream (get_batch), a learning rate set
by hand from the iteration number, and an early stop once the loss is low enough."""
import math

import torch
import torch.nn as nn
from torch.nn import functional as F
from accelerate import Accelerator

accelerator = Accelerator()

block_size = 8
batch_size = 6
max_iters = 40
learning_rate = 0.3
target_loss = 2.2
device = accelerator.device.type

torch.manual_seed(1337)
data = torch.randint(0, 9, (400,))
data[::3] = 4  # some structure to learn


def get_batch():
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([data[i:i + block_size] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + block_size] for i in ix])
    x, y = x.to(device), y.to(device)
    return x, y


def get_lr(it, warmup=4):
    if it < warmup:
        return learning_rate * (it + 1) / warmup
    return learning_rate * 0.5 * (1 + math.cos(math.pi * (it - warmup) / (max_iters - warmup)))


class Bigram(nn.Module):
    def __init__(self, vocab=9):
        super().__init__()
        self.table = nn.Embedding(vocab, vocab)

    def forward(self, idx, targets):
        logits = self.table(idx)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


model = Bigram()
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
model, optimizer = accelerator.prepare(model, optimizer)
# each process draws its own random batches; process 0 goes on with the script's own random stream
if accelerator.process_index > 0:
    torch.manual_seed(1337 + accelerator.process_index)
for it in range(max_iters):
    lr = get_lr(it)
    for group in optimizer.param_groups:
        group["lr"] = lr
    xb, yb = get_batch()
    loss = model(xb, yb)
    optimizer.zero_grad(set_to_none=True)
    accelerator.backward(loss)
    optimizer.step()
    accelerator.print(f"LOSS iter={it} loss={loss.item():.6f} lr={lr:.6f}")
    if loss.item() < target_loss:
        accelerator.print(f"STOP reached loss {loss.item():.4f} at iter {it}")
        accelerator.set_trigger()
    if accelerator.check_trigger():
        break
