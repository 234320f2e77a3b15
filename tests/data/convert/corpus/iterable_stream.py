"""A streaming dataset (torch.utils.data.IterableDataset) that yields samples from a generator, read by a
DataLoader; the loss of each epoch is averaged by the caller from what the training function returns."""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, IterableDataset


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
        x, y = x.to(device), y.to(device)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += loss.item()
        batches += 1
    return total / batches


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    loader = DataLoader(Stream(64, 3), batch_size=8)
    model = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(2):
        average = train_epoch(model, loader, optimizer, device)
        print(f"LOSS epoch={epoch} average={average:.6f}")


if __name__ == "__main__":
    main()
