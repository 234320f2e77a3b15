"""A sequence regressor written the tutorial way: everything under `if __name__ == "__main__":`, a full-batch numpy
input, the RNN's initial hidden state made in forward with torch.zeros, a `device == "cuda"` string check, and the
whole model pickled through an open file handle."""
import os

import numpy as np
import torch
import torch.nn as nn

device = "cuda" if torch.cuda.is_available() else "cpu"


class SeqRegressor(nn.Module):
    def __init__(self, n_in, hidden, n_out):
        super().__init__()
        self.hidden = hidden
        self.rnn = nn.RNN(n_in, hidden, batch_first=True)
        self.fc = nn.Linear(hidden, n_out)

    def forward(self, x):
        h0 = torch.zeros(1, x.size(0), self.hidden)
        out, _ = self.rnn(x, h0)
        return self.fc(out[:, -1, :])


if __name__ == "__main__":
    torch.manual_seed(0)
    rng = np.random.RandomState(0)
    data = rng.randn(64, 5, 3).astype(np.float32)
    target = data.sum(axis=(1, 2))[:, None].astype(np.float32)
    x = torch.from_numpy(data).to(device)
    y = torch.from_numpy(target).to(device)
    model = SeqRegressor(3, 8, 1).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    criterion = nn.MSELoss()
    for epoch in range(12):
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        print(f"LOSS epoch={epoch} loss={loss.item():.6f}")
    if device == "cuda":
        print("trained on the GPU")
    else:
        print("DEVICE cpu")
    with open(os.path.join(os.environ.get("CKPT_DIR", "."), "regressor.pt"), "wb") as f:
        torch.save(model, f)
