"""A custom batch iterator class bound to a loader-like name (`train_loader`): not a DataLoader, so prepare() would
hand it back unchanged and every process would train on all of the data."""
import torch
from torch import nn


class ShuffledBatches:
    def __init__(self, x, y, batch_size):
        self.x, self.y, self.batch_size = x, y, batch_size

    def __iter__(self):
        order = torch.randperm(len(self.x))
        for start in range(0, len(order), self.batch_size):
            index = order[start:start + self.batch_size]
            yield self.x[index], self.y[index]


def main():
    torch.manual_seed(0)
    x = torch.randn(96, 4)
    y = x.sum(dim=1, keepdim=True)
    train_loader = ShuffledBatches(x, y, batch_size=8)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(2):
        for inputs, labels in train_loader:
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(inputs), labels)
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
