"""Metrics printed by the caller, not by the evaluating function: `evaluate()` returns a small result object, the
epoch loop prints it on one line with the epoch's training loss and its duration, and logs a dict (the training
figures and the evaluation's) as JSON; the test loss and perplexity are printed at the end."""
import json
import math
import time
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


@dataclass
class EvalResult:
    loss: float
    accuracy: float


def make_data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 10, generator=g)
    return TensorDataset(x, (x[:, :3].sum(1) > 0).long())


def train_epoch(model, loader, optimizer, device):
    model.train()
    total = 0.0
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        total += loss.item()
    return total / len(loader)


def evaluate(model, loader, device):
    model.eval()
    total_loss, correct = 0.0, 0
    with torch.no_grad():
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            output = model(x)
            total_loss += F.cross_entropy(output, y, reduction="sum").item()
            correct += (output.argmax(1) == y).sum().item()
    return EvalResult(total_loss / len(loader.dataset), correct / len(loader.dataset))


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    train_loader = DataLoader(make_data(64, 1), batch_size=8, shuffle=True)
    val_loader = DataLoader(make_data(36, 2), batch_size=8)
    test_loader = DataLoader(make_data(20, 3), batch_size=8)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 2)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    history = []
    for epoch in range(1, 3):
        start = time.time()
        train_loss = train_epoch(model, train_loader, optimizer, device)
        print(f"LOSS epoch={epoch} train_loss={train_loss:.6f}")
        result = evaluate(model, val_loader, device)
        print(f"| end of epoch {epoch:3d} | time: {time.time() - start:5.2f}s | train loss {train_loss:5.4f} | "
              f"valid loss {result.loss:5.4f} | valid acc {result.accuracy:5.4f}")
        history.append({"epoch": epoch, "train_loss": round(train_loss, 5), "val_loss": round(result.loss, 5),
                        "val_accuracy": round(result.accuracy, 5)})
        print(json.dumps(history[-1]))
    test = evaluate(model, test_loader, device)
    print(f"| End of training | test loss {test.loss:5.4f} | test ppl {math.exp(test.loss):8.4f}")


if __name__ == "__main__":
    main()
