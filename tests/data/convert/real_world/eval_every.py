"""Step-counted training in makemore's shape: an endless loop over a sampler with replacement, an evaluation
every few steps (`if step > 0 and step % 3 == 0:`) by a function that builds its own DataLoader, a step limit."""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, RandomSampler, TensorDataset


@torch.no_grad()
def evaluate(model, dataset, batch_size=8):
    model.eval()
    loader = DataLoader(dataset, shuffle=False, batch_size=batch_size)
    total = 0.0
    for x, y in loader:
        total += nn.functional.mse_loss(model(x), y, reduction="sum").item()
    model.train()
    return total / len(loader.dataset)


torch.manual_seed(0)
g = torch.Generator().manual_seed(1)
train_set = TensorDataset(torch.randn(256, 4, generator=g), torch.randn(256, 1, generator=g))
test_set = TensorDataset(torch.randn(32, 4, generator=g), torch.randn(32, 1, generator=g))
model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
loader = DataLoader(train_set, batch_size=8, sampler=RandomSampler(train_set, replacement=True, num_samples=10**6))
batches = iter(loader)
step = 0
while True:
    x, y = next(batches)
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step > 0 and step % 3 == 0:
        print(f"step {step} test loss {evaluate(model, test_set):.4f}")
    step += 1
    if step >= 8:
        break
