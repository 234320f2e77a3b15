# A script with no main(): everything runs at module level, top to bottom.
import os
import tempfile

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from accelerate import Accelerator

accelerator = Accelerator()

torch.manual_seed(0)
device = accelerator.device

g = torch.Generator().manual_seed(8)
dataset = TensorDataset(torch.randn(36, 5, generator=g), torch.randn(36, 2, generator=g))
loader = DataLoader(dataset, batch_size=6, shuffle=True, generator=torch.Generator().manual_seed(1))

model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=12)

model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
for epoch in range(2):
    model.train()
    for step, (inputs, labels) in enumerate(loader):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(inputs), labels)
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        accelerator.print(f"LOSS epoch={epoch} step={step} loss={loss.item():.6f} lr={scheduler.get_last_lr()[0]:.6f}")

out_dir = os.environ.get("CKPT_DIR", tempfile.gettempdir())
accelerator.wait_for_everyone()
accelerator.save({"model": accelerator.unwrap_model(model).state_dict(), "optimizer": optimizer.state_dict()}, os.path.join(out_dir, "ckpt.pt"))
accelerator.wait_for_everyone()
accelerator.print("SAVED", sorted(torch.load(os.path.join(out_dir, "ckpt.pt"))["model"].keys()))
