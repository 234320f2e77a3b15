"""An LBFGS optimizer driven by a closure that calls backward()."""
import torch
from torch import nn, optim
from torch.utils.data import DataLoader, TensorDataset
from accelerate import Accelerator

accelerator = Accelerator()


def main():
    torch.manual_seed(0)
    device = accelerator.device
    g = torch.Generator().manual_seed(1)
    x = torch.linspace(-1, 1, 32).unsqueeze(1)
    y = torch.sin(3 * x) + 0.05 * torch.randn(32, 1, generator=g)
    loader = DataLoader(TensorDataset(x, y), batch_size=32)
    model = nn.Sequential(nn.Linear(1, 12), nn.Tanh(), nn.Linear(12, 1))
    optimizer = optim.LBFGS(model.parameters(), lr=0.5, max_iter=5)
    criterion = nn.MSELoss()
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for step in range(4):
        for xb, yb in loader:

            def closure():
                optimizer.zero_grad()
                loss = criterion(model(xb), yb)
                accelerator.backward(loss)
                return loss

            loss = optimizer.optimizer.step(closure)
            accelerator.print(f"LOSS step={step} loss={loss.item():.6f}")


if __name__ == "__main__":
    main()
