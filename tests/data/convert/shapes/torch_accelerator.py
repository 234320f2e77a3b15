"""Device picked with the torch.accelerator API; tensors moved with .cuda()-style calls guarded for CPU."""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def pick_device():
    if torch.accelerator.is_available():
        return torch.accelerator.current_accelerator()
    return torch.device("cpu")


def main():
    torch.manual_seed(0)
    device = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else torch.device("cpu")
    g = torch.Generator().manual_seed(12)
    loader = DataLoader(TensorDataset(torch.randn(30, 4, generator=g), torch.randint(0, 3, (30,), generator=g)),
                        batch_size=5)
    model = nn.Linear(4, 3).to(device)
    optimizer = torch.optim.RMSprop(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.5, total_iters=4)
    bias = torch.zeros(3).to(device)
    for epoch in range(2):
        for step, (x, y) in enumerate(loader):
            x, y = x.to(device), y.to(device)
            loss = nn.functional.cross_entropy(model(x) + bias, y)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_value_(model.parameters(), 1.0)
            optimizer.step()
            print(f"LOSS epoch={epoch} step={step} loss={loss.item():.6f}")
        scheduler.step()
    print("DEVICE-CHECK", pick_device().type in {"cpu", "cuda", "mps", "xpu"})


if __name__ == "__main__":
    main()
