"""An iterator class that moves the batches of a DataLoader the script builds to the device."""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class DeviceBatches:
    def __init__(self, loader, device):
        self.loader, self.device = loader, device

    def __iter__(self):
        self.inner = iter(self.loader)
        return self

    def __next__(self):
        inputs, labels = next(self.inner)
        return inputs.to(self.device), labels.to(self.device)

    def __len__(self):
        return len(self.loader)


def main():
    torch.manual_seed(0)
    device = torch.device("cpu")
    data = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
    batches = DeviceBatches(DataLoader(data, batch_size=8, shuffle=True), device)
    model = nn.Linear(4, 2).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        for inputs, labels in batches:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(inputs), labels)
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
