"""A streaming dataset (torch.utils.data.IterableDataset) that yields samples from a generator, read by a
DataLoader; the loss of each epoch is averaged by the caller from what the training function returns."""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, IterableDataset
from accelerate import Accelerator

accelerator = Accelerator()


class Stream(IterableDataset):
    def __init__(self, n, seed):
        self.n, self.seed = n, seed

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed)
        for _ in range(self.n):
            x = torch.randn(5, generator=g)
            yield x, x[:2].sum().unsqueeze(0)


def train_epoch(model, loader, optimizer, device):
    model.train()
    total, batches = 0.0, 0
    for x, y in loader:
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        accelerator.backward(loss)
        optimizer.step()
        total += loss.item()
        batches += 1
    total = accelerator.reduce(torch.as_tensor(total, device=accelerator.device), "sum").item()
    batches = accelerator.reduce(torch.as_tensor(batches, device=accelerator.device), "sum").item()
    return total / batches


def main():
    torch.manual_seed(0)
    device = accelerator.device
    loader = DataLoader(Stream(64, 3), batch_size=8)
    model = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for epoch in range(2):
        average = train_epoch(model, loader, optimizer, device)
        accelerator.print(f"LOSS epoch={epoch} average={average:.6f}")


if __name__ == "__main__":
    main()
