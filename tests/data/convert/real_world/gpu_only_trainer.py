"""A trainer written for one GPU and nothing else, in the shape of the ResNet-CIFAR repositories: the model wrapped
in `DataParallel` and moved with `.cuda()`, cudnn autotuning on, batches moved with `.cuda()`, labels renamed before
the forward (`target_var = target.cuda()`) and read after it, accuracy kept in an AverageMeter and returned by
`validate()`. On a machine without a GPU the original stops at its first CUDA call; `--check` runs it with its
CUDA calls rehearsed on the CPU."""
import argparse

import torch
import torch.backends.cudnn as cudnn
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("-b", "--batch-size", type=int, default=8)
args = parser.parse_args()


class AverageMeter:
    def __init__(self):
        self.sum, self.count, self.avg = 0.0, 0, 0.0

    def update(self, val, n=1):
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count


def accuracy(output, target):
    return (output.argmax(1) == target).float().mean() * 100.0


def train(loader, model, criterion, optimizer):
    model.train()
    for input, target in loader:
        target = target.cuda()
        input_var = input.cuda()
        loss = criterion(model(input_var), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def validate(loader, model, criterion):
    losses, top1 = AverageMeter(), AverageMeter()
    model.eval()
    with torch.no_grad():
        for input, target in loader:
            input_var = input.cuda()
            target_var = target.cuda()
            output = model(input_var)
            loss = criterion(output, target_var)
            losses.update(loss.item(), input.size(0))
            top1.update(accuracy(output, target_var).item(), input.size(0))
    print(f" * Prec@1 {top1.avg:.3f} loss {losses.avg:.4f}")
    return top1.avg


def main():
    assert torch.cuda.is_available(), "this trainer needs a GPU"
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(88, 6, generator=g)
    y = (x[:, 0] > x[:, 1]).long() + (x[:, 2] > 0).long()
    train_loader = DataLoader(TensorDataset(x[:64], y[:64]), batch_size=args.batch_size, shuffle=True,
                              pin_memory=True)
    val_loader = DataLoader(TensorDataset(x[64:], y[64:]), batch_size=10, shuffle=False, pin_memory=True)
    model = nn.DataParallel(nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3)))
    model.cuda()
    cudnn.benchmark = True
    criterion = nn.CrossEntropyLoss().cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    best = 0.0
    for epoch in range(args.epochs):
        train(train_loader, model, criterion, optimizer)
        best = max(best, validate(val_loader, model, criterion))
    print(f"best {best:.3f}")


if __name__ == "__main__":
    main()
