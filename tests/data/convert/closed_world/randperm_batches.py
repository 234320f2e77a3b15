"""Batches drawn by a random permutation of the indices each epoch (no DataLoader)."""
import torch
from torch import nn


def main():
    torch.manual_seed(0)
    inputs = torch.randn(80, 4)
    labels = torch.randint(0, 2, (80,))
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batch_size = 10
    for epoch in range(2):
        order = torch.randperm(len(inputs))
        for start in range(0, len(inputs), batch_size):
            index = order[start:start + batch_size]
            loss = nn.functional.cross_entropy(model(inputs[index]), labels[index])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
