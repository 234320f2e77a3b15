"""A sequence regressor written the tutorial way: everything under `if __name__ == "__main__":`, a full-batch numpy
input, the RNN's initial hidden state made in forward with torch.zeros, a `device == "cuda"` string check, and the
whole model pickled through an open file handle."""
import os

import numpy as np
import torch
import torch.nn as nn
from accelerate import Accelerator

accelerator = Accelerator()

device = accelerator.device.type


class SeqRegressor(nn.Module):
    def __init__(self, n_in, hidden, n_out):
        super().__init__()
        self.hidden = hidden
        self.rnn = nn.RNN(n_in, hidden, batch_first=True)
        self.fc = nn.Linear(hidden, n_out)

    def forward(self, x):
        h0 = torch.zeros(1, x.size(0), self.hidden, device=x.device)
        out, _ = self.rnn(x, h0)
        return self.fc(out[:, -1, :])


if __name__ == "__main__":
    torch.manual_seed(0)
    rng = np.random.RandomState(0)
    data = rng.randn(64, 5, 3).astype(np.float32)
    target = data.sum(axis=(1, 2))[:, None].astype(np.float32)
    x = torch.from_numpy(data).to(device)
    y = torch.from_numpy(target).to(device)
    # each process trains on an equal share of the samples (prepare() cannot shard hand-made batches)
    shard = slice(accelerator.process_index, len(x) - len(x) % accelerator.num_processes, accelerator.num_processes)
    x, y = x[shard], y[shard]
    model = SeqRegressor(3, 8, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    criterion = nn.MSELoss()
    model, optimizer = accelerator.prepare(model, optimizer)
    for epoch in range(12):
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        accelerator.print(f"LOSS epoch={epoch} loss={loss.item():.6f}")
    if device == "cuda":
        accelerator.print("trained on the GPU")
    else:
        accelerator.print("DEVICE cpu")
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        with open(os.path.join(os.environ.get("CKPT_DIR", "."), "regressor.pt"), "wb") as f:
            accelerator.save(accelerator.unwrap_model(model), f)
    accelerator.wait_for_everyone()
