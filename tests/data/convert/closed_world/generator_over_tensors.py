"""A generator function that slices in-memory tensors into batches (no DataLoader)."""
import torch
from torch import nn

BATCH = 16


def minibatches(x, y, size):
    for start in range(0, len(x), size):
        yield x[start:start + size], y[start:start + size]


def main():
    torch.manual_seed(0)
    x = torch.randn(128, 5)
    y = (x[:, :1] > 0).float()
    model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        for xb, yb in minibatches(x, y, BATCH):
            loss = nn.functional.binary_cross_entropy_with_logits(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print("epoch", epoch, "loss", round(loss.item(), 4))


if __name__ == "__main__":
    main()
