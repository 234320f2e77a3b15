"""A DataLoader seen through a progress bar: enumerate(tqdm(loader))."""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from tqdm import tqdm


def main():
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(48, 6), torch.randint(0, 3, (48,)))
    train_loader = DataLoader(data, batch_size=6, shuffle=True)
    model = nn.Linear(6, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        for step, (inputs, labels) in enumerate(tqdm(train_loader, desc=f"epoch {epoch}")):  # noqa: B007
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(inputs), labels)
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch} last step {step} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
