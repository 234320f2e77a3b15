"""A dataset class with torchvision's `download=True` argument, a hand-written progress line with sys.stdout, and an
evaluation that weighs each gathered batch's mean loss by the input batch's size."""
import os
import sys

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class Digits(Dataset):
    """Stands in for torchvision.datasets.MNIST(root, download=True): makes its files on first use."""

    def __init__(self, root, train=True, download=False):
        path = os.path.join(root, f"digits-{'train' if train else 'test'}.pt")
        if download and not os.path.exists(path):
            os.makedirs(root, exist_ok=True)
            g = torch.Generator().manual_seed(1 if train else 2)
            x = torch.randn(40, 6, generator=g)
            torch.save((x, x[:, :3].sum(1, keepdim=True)), path)
        self.x, self.y = torch.load(path)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def main():
    torch.manual_seed(0)
    root = os.path.join(os.environ.get("CKPT_DIR", "."), "data")
    train_loader = DataLoader(Digits(root, train=True, download=True), batch_size=8, shuffle=True)
    test_loader = DataLoader(Digits(root, train=False, download=True), batch_size=8)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))
    criterion = nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(2):
        model.train()
        for i, (xb, yb) in enumerate(train_loader):
            optimizer.zero_grad()
            loss = criterion(model(xb), yb)
            loss.backward()
            optimizer.step()
            sys.stdout.write(f"\rprogress epoch {epoch} batch {i + 1}/{len(train_loader)}")
            sys.stdout.flush()
        sys.stdout.write("\n")
        print(f"LOSS epoch={epoch} loss={loss.item():.6f}")
        model.eval()
        test_loss = 0.0
        with torch.no_grad():
            for xb, yb in test_loader:
                pred = model(xb)
                test_loss += criterion(pred, yb).item() * xb.size(0)
        print(f"EVAL test loss={test_loss / len(test_loader.dataset):.6f}")


if __name__ == "__main__":
    main()
