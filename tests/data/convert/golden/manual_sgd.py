"""No optimizer object: parameters are updated by hand under torch.no_grad()."""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from accelerate import Accelerator

accelerator = Accelerator()

LR = 0.05


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(6, 1)

    def forward(self, x):
        return self.body(x)

    def l2(self):
        return sum((p ** 2).sum() for p in self.parameters())


def main():
    torch.manual_seed(0)
    device = accelerator.device
    g = torch.Generator().manual_seed(11)
    data = TensorDataset(torch.randn(48, 6, generator=g), torch.randn(48, 1, generator=g))
    loader = DataLoader(data, batch_size=12)
    model = Regressor()
    model, loader = accelerator.prepare(model, loader)
    for epoch in range(3):
        for step, (xb, yb) in enumerate(loader):
            loss = ((model(xb) - yb) ** 2).mean() + 1e-3 * accelerator.unwrap_model(model).l2()
            model.zero_grad()
            accelerator.backward(loss)
            with torch.no_grad():
                for p in model.parameters():
                    p -= LR * p.grad
            accelerator.print(f"LOSS epoch={epoch} step={step} loss={loss.item():.6f}")


if __name__ == "__main__":
    main()
