"""No DataLoader: the script slices its tensors into batches by hand."""
import torch
from torch import nn
from accelerate import Accelerator

accelerator = Accelerator()

device = accelerator.device.type


def make_data(n=64):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(n, 8, generator=g)
    w = torch.randn(8, 1, generator=g)
    return x, x @ w + 0.1 * torch.randn(n, 1, generator=g)


def main():
    torch.manual_seed(0)
    x, y = make_data()
    # each process trains on an equal share of the samples (prepare() cannot shard hand-made batches)
    shard = slice(accelerator.process_index, len(x) - len(x) % accelerator.num_processes, accelerator.num_processes)
    x, y = x[shard], y[shard]
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    loss_fn = nn.MSELoss()
    batch_size = 16
    step = 0
    model, opt = accelerator.prepare(model, opt)
    for epoch in range(2):
        for i in range(0, len(x), batch_size):
            xb = x[i:i + batch_size].to(device)
            yb = y[i:i + batch_size].to(device)
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            accelerator.backward(loss)
            opt.step()
            accelerator.print(f"LOSS step={step} loss={loss.item():.6f}")
            step += 1


if __name__ == "__main__":
    main()
