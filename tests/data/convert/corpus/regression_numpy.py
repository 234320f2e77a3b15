"""A tutorial-style linear regression on numpy arrays: full-batch steps, tensors made with torch.from_numpy inside
the loop, an explicit CPU device unless --cuda is given, and predictions read back with .numpy()."""
import argparse

import numpy as np
import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--cuda", action="store_true", help="train on the GPU")
parser.add_argument("--epochs", type=int, default=12)
args = parser.parse_args()

device = torch.device("cpu")
if args.cuda:
    device = torch.device("cuda")

rng = np.random.default_rng(0)
x_train = rng.uniform(-1, 1, size=(40, 1)).astype(np.float32)
y_train = (3.0 * x_train - 0.5 + rng.normal(0, 0.05, size=(40, 1))).astype(np.float32)

torch.manual_seed(0)
model = nn.Linear(1, 1).to(device)
criterion = nn.MSELoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.2)

for epoch in range(args.epochs):
    inputs = torch.from_numpy(x_train).to(device)
    targets = torch.from_numpy(y_train).to(device)
    outputs = model(inputs)
    loss = criterion(outputs, targets)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"LOSS epoch={epoch} loss={loss.item():.6f}")

predicted = model(torch.from_numpy(x_train[:3]).to(device)).detach().numpy()
print("PREDICTED", " ".join(f"{v:.4f}" for v in predicted.ravel()))
