"""A script that fails before its first optimizer step (a typo in the training loop, say)."""

import torch
from accelerate import Accelerator

accelerator = Accelerator()
model, optimizer = accelerator.prepare(torch.nn.Linear(4, 4), torch.optim.SGD(torch.nn.Linear(4, 4).parameters()))
raise RuntimeError("lossss is not defined")
