"""An LBFGS optimizer driven by a closure that calls backward()."""
import torch
from torch import nn, optim
from torch.utils.data import DataLoader, TensorDataset


def main():
    torch.manual_seed(0)
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    g = torch.Generator().manual_seed(1)
    x = torch.linspace(-1, 1, 32).unsqueeze(1)
    y = torch.sin(3 * x) + 0.05 * torch.randn(32, 1, generator=g)
    loader = DataLoader(TensorDataset(x, y), batch_size=32)
    model = nn.Sequential(nn.Linear(1, 12), nn.Tanh(), nn.Linear(12, 1))
    model.to(device)
    optimizer = optim.LBFGS(model.parameters(), lr=0.5, max_iter=5)
    criterion = nn.MSELoss()
    for step in range(4):
        for xb, yb in loader:
            xb, yb = xb.to(device), yb.to(device)

            def closure():
                optimizer.zero_grad()
                loss = criterion(model(xb), yb)
                loss.backward()
                return loss

            loss = optimizer.step(closure)
            print(f"LOSS step={step} loss={loss.item():.6f}")


if __name__ == "__main__":
    main()
