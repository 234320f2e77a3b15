"""A custom batch iterator class (no DataLoader) over in-memory tensors."""
import torch
from torch import nn


class Batches:
    def __init__(self, x, y, batch_size):
        self.x, self.y, self.batch_size = x, y, batch_size

    def __iter__(self):
        self.position = 0
        return self

    def __next__(self):
        if self.position >= len(self.x):
            raise StopIteration
        end = self.position + self.batch_size
        batch = self.x[self.position:end], self.y[self.position:end]
        self.position = end
        return batch


def main():
    torch.manual_seed(0)
    features = torch.randn(96, 4)
    targets = features.sum(dim=1, keepdim=True)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(2):
        for inputs, labels in Batches(features, targets, 8):
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(inputs), labels)
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
