"""A regression trained on fresh random batches from a generator function (no dataset at all): every step draws
new inputs with torch.randn and labels them with the function to learn."""
import torch
import torch.nn as nn

torch.manual_seed(42)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
W_TRUE = torch.tensor([[2.0], [-1.0], [0.5]])


def make_batch(batch_size=16):
    x = torch.randn(batch_size, 3)
    y = x @ W_TRUE + 0.3 + 0.01 * torch.randn(batch_size, 1)
    return x.to(device), y.to(device)


def batches(n_steps, batch_size):
    for _ in range(n_steps):
        yield make_batch(batch_size)


model = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1)).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
loss_fn = nn.MSELoss()
for step, (x, y) in enumerate(batches(30, 16)):
    pred = model(x)
    loss = loss_fn(pred, y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"LOSS step={step} loss={loss.item():.6f}")
