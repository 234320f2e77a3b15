"""A tutorial-style linear regression on numpy arrays: full-batch steps, tensors made with torch.from_numpy inside
the loop, an explicit CPU device unless --cuda is given, and predictions read back with .numpy()."""
import argparse

import numpy as np
import torch
import torch.nn as nn
from accelerate import Accelerator

parser = argparse.ArgumentParser()
parser.add_argument("--cuda", action="store_true", help="train on the GPU")
parser.add_argument("--epochs", type=int, default=12)
args = parser.parse_args()
accelerator = Accelerator(cpu=not args.cuda)

device = accelerator.device
if args.cuda:
    device = accelerator.device

rng = np.random.default_rng(0)
x_train = rng.uniform(-1, 1, size=(40, 1)).astype(np.float32)
y_train = (3.0 * x_train - 0.5 + rng.normal(0, 0.05, size=(40, 1))).astype(np.float32)
# each process trains on an equal share of the samples (prepare() cannot shard hand-made batches)
shard = slice(accelerator.process_index, len(x_train) - len(x_train) % accelerator.num_processes, accelerator.num_processes)
x_train, y_train = x_train[shard], y_train[shard]

torch.manual_seed(0)
model = nn.Linear(1, 1)
criterion = nn.MSELoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.2)

model, optimizer = accelerator.prepare(model, optimizer)
for epoch in range(args.epochs):
    inputs = torch.from_numpy(x_train).to(device)
    targets = torch.from_numpy(y_train).to(device)
    outputs = model(inputs)
    loss = criterion(outputs, targets)
    optimizer.zero_grad()
    accelerator.backward(loss)
    optimizer.step()
    accelerator.print(f"LOSS epoch={epoch} loss={loss.item():.6f}")

predicted = model(torch.from_numpy(x_train[:3]).to(device)).detach().cpu().numpy()
accelerator.print("PREDICTED", " ".join(f"{v:.4f}" for v in predicted.ravel()))
