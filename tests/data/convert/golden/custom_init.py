"""Custom initialisation after the model is built (no seed: every run starts from different weights), a frozen
stem and a replaced head: everything that must happen before DDP copies rank 0's weights to the other ranks."""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from accelerate import Accelerator

accelerator = Accelerator()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Linear(10, 32), nn.BatchNorm1d(32), nn.ReLU())
        self.body = nn.Sequential(nn.Linear(32, 32), nn.ReLU())
        self.head = nn.Linear(32, 5)

    def forward(self, x):
        return self.head(self.body(self.stem(x)))


def weights_init(m):
    if isinstance(m, nn.Linear):
        nn.init.normal_(m.weight, 0.0, 0.2)
        nn.init.zeros_(m.bias)
    elif isinstance(m, nn.BatchNorm1d):
        nn.init.normal_(m.weight, 1.0, 0.02)
        nn.init.zeros_(m.bias)


def main():
    device = accelerator.device
    g = torch.Generator().manual_seed(4)
    data = TensorDataset(torch.randn(96, 10, generator=g), torch.randint(0, 3, (96,), generator=g))
    loader = DataLoader(data, batch_size=12)

    model = Net()
    model.apply(weights_init)
    for p in model.stem.parameters():
        p.requires_grad = False
    model.head = nn.Linear(32, 3)  # this task has 3 classes
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)

    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for epoch in range(2):
        for step, (x, y) in enumerate(loader):
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            accelerator.print(f"LOSS epoch={epoch} step={step} loss={loss.item():.6f}")


if __name__ == "__main__":
    main()
