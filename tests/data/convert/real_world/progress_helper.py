"""kuangliu/pytorch-cifar's shape: a module-level CIFAR-style trainer whose progress bar comes from the project's own
`utils`-like module (terminal_bar.py, not converted), drawn after every training and evaluation batch with a running
loss and accuracy."""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from terminal_bar import draw_bar

torch.manual_seed(0)
g = torch.Generator().manual_seed(5)
x = torch.randn(80, 6, generator=g)
y = (x[:, :3].sum(1) > 0).long()
trainloader = DataLoader(TensorDataset(x[:64], y[:64]), batch_size=8, shuffle=True,
                         generator=torch.Generator().manual_seed(6))
testloader = DataLoader(TensorDataset(x[64:], y[64:]), batch_size=8)
net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(net.parameters(), lr=0.1)


def train(epoch):
    print("\nEpoch: %d" % epoch)
    net.train()
    train_loss, correct, total = 0, 0, 0
    for batch_idx, (inputs, targets) in enumerate(trainloader):
        optimizer.zero_grad()
        outputs = net(inputs)
        loss = criterion(outputs, targets)
        loss.backward()
        optimizer.step()
        train_loss += loss.item()
        correct += outputs.argmax(1).eq(targets).sum().item()
        total += targets.size(0)
        draw_bar(batch_idx, len(trainloader), "Loss: %.3f | Acc: %.3f%% (%d/%d)"
                 % (train_loss / (batch_idx + 1), 100. * correct / total, correct, total))


def test(epoch):
    net.eval()
    correct, total = 0, 0
    with torch.no_grad():
        for batch_idx, (inputs, targets) in enumerate(testloader):
            outputs = net(inputs)
            correct += outputs.argmax(1).eq(targets).sum().item()
            total += targets.size(0)
            draw_bar(batch_idx, len(testloader), "Acc: %.3f%% (%d/%d)" % (100. * correct / total, correct, total))
    print("test accuracy: %.4f" % (correct / total))


for epoch in range(2):
    train(epoch)
    test(epoch)
