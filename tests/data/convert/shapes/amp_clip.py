"""Automatic mixed precision (autocast + GradScaler) with gradient clipping after unscale_."""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

use_amp = torch.cuda.is_available()


def main():
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(2)
    ds = TensorDataset(torch.randn(40, 10, generator=g), torch.randint(0, 2, (40,), generator=g))
    loader = DataLoader(ds, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(4))
    model = nn.Sequential(nn.Linear(10, 32), nn.GELU(), nn.Linear(32, 2)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    scaler = torch.amp.GradScaler("cuda", enabled=use_amp)
    for epoch in range(2):
        for step, (x, y) in enumerate(loader):
            x = x.to(device, non_blocking=True)
            y = y.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device_type="cuda", dtype=torch.float16, enabled=use_amp):
                logits = model(x)
                loss = nn.functional.cross_entropy(logits, y)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)
            scaler.step(optimizer)
            scaler.update()
            print(f"LOSS epoch={epoch} step={step} loss={loss.item():.6f}")


if __name__ == "__main__":
    main()
