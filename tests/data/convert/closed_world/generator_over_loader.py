"""A generator function that yields batches taken from a DataLoader the script builds."""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def batches(loader, scale):
    for inputs, labels in loader:
        yield inputs * scale, labels


def main():
    torch.manual_seed(0)
    features = torch.randn(64, 3)
    targets = features @ torch.tensor([[1.0], [-2.0], [0.5]])
    loader = DataLoader(TensorDataset(features, targets), batch_size=8, shuffle=True)
    model = nn.Linear(3, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for epoch in range(3):
        for inputs, labels in batches(loader, 2.0):
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(inputs), labels)
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
