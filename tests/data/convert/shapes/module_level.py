# A script with no main(): everything runs at module level, top to bottom.
import os
import tempfile

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

g = torch.Generator().manual_seed(8)
dataset = TensorDataset(torch.randn(36, 5, generator=g), torch.randn(36, 2, generator=g))
loader = DataLoader(dataset, batch_size=6, shuffle=True, generator=torch.Generator().manual_seed(1))

model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 2))
if torch.cuda.device_count() > 1:
    model = nn.DataParallel(model)  # use every GPU of the box
model = model.cuda() if torch.cuda.is_available() else model
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=12)

for epoch in range(2):
    model.train()
    for step, (inputs, labels) in enumerate(loader):
        inputs, labels = inputs.to(device), labels.to(device)
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(inputs), labels)
        loss.backward()
        optimizer.step()
        scheduler.step()
        print(f"LOSS epoch={epoch} step={step} loss={loss.item():.6f} lr={scheduler.get_last_lr()[0]:.6f}")

out_dir = os.environ.get("CKPT_DIR", tempfile.gettempdir())
torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, os.path.join(out_dir, "ckpt.pt"))
print("SAVED", sorted(torch.load(os.path.join(out_dir, "ckpt.pt"))["model"].keys()))
