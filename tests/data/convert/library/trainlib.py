"""A small training library: the script that uses it (train_main.py) builds the model and the data; this module
only knows how to train and evaluate. Nothing here runs at import time."""
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

DEFAULT_LR = 1e-2


class Trainer:
    """Trains `model` on `dataset` with Adam, one DataLoader pass per epoch."""

    def __init__(self, model, dataset, batch_size=8, lr=DEFAULT_LR):
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.model = model.to(self.device)
        self.loader = DataLoader(dataset, batch_size=batch_size)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=lr)

    def fit(self, epochs):
        for epoch in range(epochs):
            for x, y in self.loader:
                x, y = x.to(self.device), y.to(self.device)
                self.optimizer.zero_grad()
                loss = F.cross_entropy(self.model(x), y)
                loss.backward()
                self.optimizer.step()
                print(f"LOSS epoch={epoch} loss={loss.item():.6f}")
        return self.model


def save(model, path):
    torch.save(model.state_dict(), path)
