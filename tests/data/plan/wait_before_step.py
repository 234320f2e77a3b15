"""A training step that waits before its backward: the ranks are up and measuring when a signal arrives."""

import sys
import time

import torch
from accelerate import Accelerator

accelerator = Accelerator()
model = torch.nn.Linear(8, 8)
optimizer = torch.optim.AdamW(model.parameters())
model, optimizer = accelerator.prepare(model, optimizer)
loss = model(torch.randn(4, 8)).square().mean()
print(f"READY rank {accelerator.process_index}", file=sys.stderr, flush=True)
time.sleep(120)
accelerator.backward(loss)
optimizer.step()
