"""Two schedulers on one optimizer: a linear warmup stepped with every batch, and ReduceLROnPlateau stepped once
per epoch with the validation loss (the fine-tuning recipe of many tutorials)."""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from accelerate import Accelerator


def make_split(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 12, generator=g)
    y = (x[:, :3].sum(dim=1) > 0).long()
    return TensorDataset(x, y)


def validate(model, loader, device):
    model.eval()
    total, seen = 0.0, 0
    with torch.no_grad():
        for x, y in loader:
            logits = model(x)
            logits, y = accelerator.gather_for_metrics((logits, y))
            total += F.cross_entropy(logits, y, reduction="sum").item()
            seen += y.size(0)
    return total / seen


def main():
    global accelerator
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--warmup", type=int, default=6)
    args = parser.parse_args()
    accelerator = Accelerator()
    torch.manual_seed(0)
    device = accelerator.device.type

    train_loader = DataLoader(make_split(64, 1), batch_size=8, shuffle=True)
    val_loader = DataLoader(make_split(32, 2), batch_size=8)
    model = nn.Sequential(nn.Linear(12, 24), nn.ReLU(), nn.Linear(24, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / args.warmup))
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5, patience=0)

    model, optimizer, train_loader, val_loader, warmup = accelerator.prepare(
        model, optimizer, train_loader, val_loader, warmup
    )
    for epoch in range(args.epochs):
        model.train()
        for step, (x, y) in enumerate(train_loader):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            warmup.step()
            accelerator.print(f"LOSS epoch={epoch} step={step} loss={loss.item():.6f} lr={optimizer.param_groups[0]['lr']:.6f}")
        val_loss = validate(model, val_loader, device)
        plateau.step(val_loss)
        accelerator.print(f"EVAL epoch={epoch} val_loss={val_loss:.6f}")


if __name__ == "__main__":
    main()
