"""An autoencoder whose evaluation sums a per-sample loss (`reduction='sum'` inside the script's own loss
function, no labels used) over a test set that does not split into whole batches on 2 processes (44 samples,
batches of 8), then divides by the dataset's length: the shape of pytorch/examples' VAE."""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch-size", type=int, default=8)
args = parser.parse_args()
torch.manual_seed(1)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

g = torch.Generator().manual_seed(3)
train_loader = DataLoader(TensorDataset(torch.rand(64, 12, generator=g), torch.zeros(64)),
                          batch_size=args.batch_size, shuffle=True)
test_loader = DataLoader(TensorDataset(torch.rand(44, 12, generator=g), torch.zeros(44)),
                         batch_size=args.batch_size, shuffle=False)


class AutoEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.encode = nn.Linear(12, 4)
        self.decode = nn.Linear(4, 12)

    def forward(self, x):
        return torch.sigmoid(self.decode(F.relu(self.encode(x))))


def loss_function(recon, x):
    return F.binary_cross_entropy(recon, x, reduction='sum')


model = AutoEncoder().to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)


def train(epoch):
    model.train()
    for data, _ in train_loader:
        data = data.to(device)
        optimizer.zero_grad()
        loss = loss_function(model(data), data)
        loss.backward()
        optimizer.step()


def test(epoch):
    model.eval()
    test_loss = 0
    with torch.no_grad():
        for i, (data, _) in enumerate(test_loader):
            data = data.to(device)
            test_loss += loss_function(model(data), data).item()
    test_loss /= len(test_loader.dataset)
    print('====> Epoch {} test set loss: {:.4f}'.format(epoch, test_loss))


if __name__ == "__main__":
    for epoch in range(1, args.epochs + 1):
        train(epoch)
        test(epoch)
