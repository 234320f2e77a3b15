"""Data-dependent initialisation (Glow's ActNorm): the statistics of the first batch set the normalisation layer's
parameters before training, so that its outputs start at zero mean and unit variance. It must read the loader and run
before DDP copies rank 0's weights to the other ranks: run per rank after, each rank's own first batch would give each
rank other parameters."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class ActNorm(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.loc = nn.Parameter(torch.zeros(features))
        self.log_scale = nn.Parameter(torch.zeros(features))

    def forward(self, x):
        return (x + self.loc) * torch.exp(self.log_scale)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = ActNorm(6)
        self.body = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))

    def forward(self, x):
        return self.body(self.norm(x))


def data_init(model, loader):
    x, _ = next(iter(loader))
    with torch.no_grad():
        model.norm.loc.copy_(-x.mean(dim=0))
        model.norm.log_scale.copy_(-torch.log(x.std(dim=0) + 1e-6))


def main():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(64, 6, generator=g) * torch.arange(1.0, 7.0) + torch.arange(6.0) * 3
    y = x[:, :2].sum(dim=1, keepdim=True) / 10
    loader = DataLoader(TensorDataset(x, y), batch_size=8)
    model = Net()
    data_init(model, loader)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(2):
        for step, (xb, yb) in enumerate(loader):
            optimizer.zero_grad()
            loss = F.mse_loss(model(xb), yb)
            loss.backward()
            optimizer.step()
            print(f"LOSS epoch={epoch} step={step} loss={loss.item():.6f}")


if __name__ == "__main__":
    main()
