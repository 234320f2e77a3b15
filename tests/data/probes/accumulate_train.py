"""An Accelerate script with gradient accumulation, two parameter groups and a scheduler; prints each real step."""

import argparse

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--accumulation", type=int, default=2)
args = parser.parse_args()

accelerator = Accelerator(gradient_accumulation_steps=args.accumulation)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
decay = [p for n, p in model.named_parameters() if n.endswith("weight")]
no_decay = [p for n, p in model.named_parameters() if n.endswith("bias")]
optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                              lr=1e-2)
data = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
loader = DataLoader(data, batch_size=4)
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
steps = 0
for x, y in loader:
    with accelerator.accumulate(model):
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    if accelerator.sync_gradients:
        steps += 1
        accelerator.print(f"STEP {steps}", flush=True)
        if steps == args.steps:
            break
accelerator.print("DONE", flush=True)
