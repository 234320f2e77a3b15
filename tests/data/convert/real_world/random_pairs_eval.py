"""A pair classifier whose test set draws its pairs with Python's `random` in `__getitem__`, evaluated as a sum
of per-batch *mean* losses over 40 samples in batches of 16: on 2 processes the last round is one real batch
of 8 and a batch made only of repeated samples, and the model flattens with `x.view(x.size(0), -1)` (which
fails on an empty batch). The shape of pytorch/examples' siamese network."""
import argparse
import random

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch-size", type=int, default=16)
args = parser.parse_args()
torch.manual_seed(1)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class Pairs(Dataset):
    def __init__(self, size, seed):
        g = torch.Generator().manual_seed(seed)
        prototypes = torch.rand(4, 2, 3, 3, generator=torch.Generator().manual_seed(0))
        self.labels = torch.randint(0, 4, (size,), generator=g)
        self.images = prototypes[self.labels] + 0.01 * torch.rand(size, 2, 3, 3, generator=g)

    def __len__(self):
        return len(self.images)

    def __getitem__(self, index):
        other = random.randint(0, len(self.images) - 1)  # the partner is drawn on every read
        same = float(self.labels[index] == self.labels[other])
        return self.images[index], self.images[other], torch.tensor(same)


class Matcher(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Conv2d(2, 4, 2)
        self.head = nn.Linear(32, 1)

    def embed(self, x):
        out = self.features(x)
        return out.view(out.size(0), -1)

    def forward(self, a, b):
        return torch.sigmoid(self.head(torch.cat([self.embed(a), self.embed(b)], 1)))


model = Matcher().to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
train_loader = DataLoader(Pairs(64, 2), batch_size=args.batch_size, shuffle=True)
test_loader = DataLoader(Pairs(40, 3), batch_size=args.batch_size)


def train(epoch):
    model.train()
    criterion = nn.BCELoss()
    for a, b, target in train_loader:
        a, b, target = a.to(device), b.to(device), target.to(device)
        optimizer.zero_grad()
        loss = criterion(model(a, b).squeeze(1), target)
        loss.backward()
        optimizer.step()


def test():
    model.eval()
    criterion = nn.BCELoss()
    test_loss = 0
    correct = 0
    with torch.no_grad():
        for (a, b, target) in test_loader:
            a, b, target = a.to(device), b.to(device), target.to(device)
            outputs = model(a, b).squeeze(1)
            test_loss += criterion(outputs, target).sum().item()  # a batch mean, summed
            correct += (outputs > 0.5).float().eq(target).sum().item()
    test_loss /= len(test_loader.dataset)
    print('Test set: Average loss: {:.4f}, Accuracy: {}/{}'.format(test_loss, correct, len(test_loader.dataset)))


def main():
    for epoch in range(1, args.epochs + 1):
        train(epoch)
        test()


if __name__ == "__main__":
    main()
