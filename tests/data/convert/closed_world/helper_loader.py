"""The DataLoader is made by a helper function of the script and returned."""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def make_loader(n, batch_size):
    features = torch.randn(n, 4)
    targets = features.mean(dim=1, keepdim=True)
    return DataLoader(TensorDataset(features, targets), batch_size=batch_size, shuffle=True)


def main():
    torch.manual_seed(0)
    loader = make_loader(64, 8)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(2):
        for inputs, targets in loader:
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(inputs), targets)
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
