"""A regression trained on fresh random batches from a generator function (no dataset at all): every step draws
new inputs with torch.randn and labels them with the function to learn."""
import torch
import torch.nn as nn
from accelerate import Accelerator

accelerator = Accelerator()

torch.manual_seed(42)
device = accelerator.device
W_TRUE = torch.tensor([[2.0], [-1.0], [0.5]])


def make_batch(batch_size=16):
    x = torch.randn(batch_size, 3)
    y = x @ W_TRUE + 0.3 + 0.01 * torch.randn(batch_size, 1)
    return x.to(device), y.to(device)


def batches(n_steps, batch_size):
    for _ in range(n_steps):
        yield make_batch(batch_size)


model = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
loss_fn = nn.MSELoss()
model, optimizer = accelerator.prepare(model, optimizer)
# each process draws its own random batches; process 0 goes on with the script's own random stream
if accelerator.process_index > 0:
    torch.manual_seed(42 + accelerator.process_index)
for step, (x, y) in enumerate(batches(30, 16)):
    pred = model(x)
    loss = loss_fn(pred, y)
    optimizer.zero_grad()
    accelerator.backward(loss)
    optimizer.step()
    accelerator.print(f"LOSS step={step} loss={loss.item():.6f}")
