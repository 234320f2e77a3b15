"""Automatic mixed precision (autocast + GradScaler) with gradient clipping after unscale_."""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from accelerate import Accelerator

use_amp = torch.cuda.is_available()
accelerator = Accelerator(mixed_precision="fp16" if use_amp else "no")


def main():
    torch.manual_seed(0)
    device = accelerator.device.type
    g = torch.Generator().manual_seed(2)
    ds = TensorDataset(torch.randn(40, 10, generator=g), torch.randint(0, 2, (40,), generator=g))
    loader = DataLoader(ds, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(4))
    model = nn.Sequential(nn.Linear(10, 32), nn.GELU(), nn.Linear(32, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for epoch in range(2):
        for step, (x, y) in enumerate(loader):
            optimizer.zero_grad(set_to_none=True)
            with accelerator.autocast():
                logits = model(x)
                loss = nn.functional.cross_entropy(logits, y)
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), max_norm=0.5)
            optimizer.step()
            accelerator.print(f"LOSS epoch={epoch} step={step} loss={loss.item():.6f}")


if __name__ == "__main__":
    main()
