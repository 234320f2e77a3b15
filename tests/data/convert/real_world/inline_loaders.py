"""DataLoaders made where they are used, bound to no name: handed to a Trainer built and run in one statement,
and to an evaluation function (a summed loss over 44 test samples in batches of 8). The converter refused the
first ("batches that do not come from a DataLoader") and left a loop-header `DataLoader(...)` unprepared (every
process trained on all of it)."""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
args = parser.parse_args()


class Trainer:
    def __init__(self, model, train_data, optimizer):
        self.model = model
        self.train_data = train_data
        self.optimizer = optimizer

    def train(self, epochs, test_set):
        for epoch in range(epochs):
            for source, targets in self.train_data:
                self.optimizer.zero_grad()
                loss = F.mse_loss(self.model(source), targets)
                loss.backward()
                self.optimizer.step()
            evaluate(self.model, DataLoader(test_set, batch_size=8), epoch)


def evaluate(model, data, epoch):
    model.eval()
    total = 0.0
    with torch.no_grad():
        for source, targets in data:
            total += F.mse_loss(model(source), targets, reduction="sum").item()
    model.train()
    print(f"epoch {epoch}: test loss {total / len(data.dataset):.5f}")


def main():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    train_set = TensorDataset(torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g))
    test_set = TensorDataset(torch.randn(44, 8, generator=g), torch.randn(44, 1, generator=g))
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    Trainer(model, DataLoader(train_set, batch_size=8, shuffle=True), optimizer).train(args.epochs, test_set)


if __name__ == "__main__":
    main()
