"""No DataLoader: the data is cut into a list of (inputs, targets) batches up front; the optimizer is chosen by a
flag; the predictions go to numpy at the end."""
import argparse

import torch
import torch.nn as nn


def make_batches(x, y, batch_size):
    return [(x[i:i + batch_size], y[i:i + batch_size]) for i in range(0, len(x), batch_size)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--optimizer", choices=["sgd", "adam"], default="adam")
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")

    g = torch.Generator().manual_seed(21)
    x = torch.randn(64, 6, generator=g)
    y = x @ torch.randn(6, 1, generator=g) + 0.05 * torch.randn(64, 1, generator=g)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1)).to(device)
    if args.optimizer == "sgd":
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    batches = make_batches(x, y, 8)

    for epoch in range(args.epochs):
        for step, (xb, yb) in enumerate(batches):
            xb, yb = xb.to(device), yb.to(device)
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(xb), yb)
            loss.backward()
            optimizer.step()
            print(f"LOSS epoch={epoch} step={step} loss={loss.item():.6f}")
    with torch.no_grad():
        predictions = model(x[:4].to(device)).squeeze(1).numpy()
    print("PREDICTIONS", " ".join(f"{p:.4f}" for p in predictions))


if __name__ == "__main__":
    main()
