"""Two evaluation loops with the same "sum, then divide by len(dataset)" pattern: one computes the loss from
outputs and labels, the other gets the loss from the model itself; plus the average training loss per epoch."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))

    def forward(self, x, labels=None):
        logits = self.net(x)
        if labels is None:
            return logits
        return F.cross_entropy(logits, labels, reduction="sum"), logits


def dataset(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    return TensorDataset(x, x[:, :4].argmax(dim=1))


def test(model, device, test_loader):
    model.eval()
    test_loss, correct = 0.0, 0
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            test_loss += F.cross_entropy(output, target, reduction="sum").item()
            correct += (output.argmax(dim=1) == target).sum().item()
    test_loss /= len(test_loader.dataset)
    print(f"EVAL test loss={test_loss:.6f} accuracy={correct}/{len(test_loader.dataset)}")


def evaluate(model, device, loader):
    model.eval()
    total_loss, total_correct = 0.0, 0
    with torch.no_grad():
        for batch in loader:
            batch = [t.to(device) for t in batch]
            loss, logits = model(batch[0], batch[1])
            total_loss += loss.item()
            total_correct += (logits.argmax(dim=1) == batch[1]).sum().item()
    n = len(loader.dataset)
    print(f"EVAL validation loss={total_loss / n:.6f} accuracy={total_correct / n:.4f}")


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    train_loader = DataLoader(dataset(64, 1), batch_size=8, shuffle=True)
    val_loader = DataLoader(dataset(32, 2), batch_size=8)
    test_loader = DataLoader(dataset(32, 3), batch_size=8)
    model = Classifier().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for epoch in range(2):
        model.train()
        running_loss = 0.0
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
        print(f"LOSS epoch={epoch} average training loss={running_loss / len(train_loader):.6f}")
        evaluate(model, device, val_loader)
    test(model, device, test_loader)


if __name__ == "__main__":
    main()
