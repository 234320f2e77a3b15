"""MNIST-example style: train(args, model, device, loader, optimizer, epoch) plus a test() pass and a StepLR."""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, TensorDataset
from accelerate import Accelerator


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x):
        return F.log_softmax(self.fc2(F.relu(self.fc1(x))), dim=1)


def train(args, model, device, train_loader, optimizer, epoch):
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        accelerator.backward(loss)
        optimizer.step()
        if batch_idx % args.log_interval == 0:
            accelerator.print(f"LOSS epoch={epoch} step={batch_idx} loss={loss.item():.6f}")


def test(model, device, test_loader):
    model.eval()
    test_loss = 0
    correct = 0
    seen = 0
    with torch.no_grad():
        for data, target in test_loader:
            output = model(data)
            output, target = accelerator.gather_for_metrics((output, target))
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            pred = output.argmax(dim=1, keepdim=True)
            correct += pred.eq(target.view_as(pred)).sum().item()
            seen += target.numel()
    test_loss /= len(test_loader.dataset)
    accelerator.print(f"EVAL test_loss={test_loss:.6f} correct={correct} seen={seen}")


def main():
    global accelerator
    parser = argparse.ArgumentParser(description="tiny mnist-like example")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--no-cuda", action="store_true", default=False)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--log-interval", type=int, default=1)
    parser.add_argument("--save-model", action="store_true", default=False)
    args = parser.parse_args()
    accelerator = Accelerator(cpu=args.no_cuda)
    use_cuda = not args.no_cuda and torch.cuda.is_available()

    torch.manual_seed(args.seed)

    device = accelerator.device

    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 16, generator=g)
    y = torch.randint(0, 4, (64,), generator=g)
    train_loader = DataLoader(TensorDataset(x[:48], y[:48]), batch_size=args.batch_size)
    test_loader = DataLoader(TensorDataset(x[48:], y[48:]), batch_size=args.batch_size)

    model = Net()
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)

    scheduler = StepLR(optimizer, step_size=1, gamma=0.7)
    model, optimizer, train_loader, test_loader = accelerator.prepare(
        model, optimizer, train_loader, test_loader
    )
    for epoch in range(1, args.epochs + 1):
        train(args, model, device, train_loader, optimizer, epoch)
        test(model, device, test_loader)
        scheduler.step()

    if args.save_model:
        accelerator.wait_for_everyone()
        accelerator.save(accelerator.unwrap_model(model).state_dict(), "mnist_cnn.pt")
        accelerator.wait_for_everyone()


if __name__ == "__main__":
    main()
