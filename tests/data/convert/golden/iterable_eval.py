"""Streams on both sides: a token-window IterableDataset for training (70 windows: the last batch is uneven) and
another for validation, whose loss the caller prints with the epoch's training loss; the streams read a corpus
generated in memory and shuffle within a buffer, like a web-scale dataset read shard by shard."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, IterableDataset
from accelerate import Accelerator

accelerator = Accelerator()

VOCAB, CONTEXT = 32, 8


class Windows(IterableDataset):
    """Windows of CONTEXT + 1 tokens from a token stream, shuffled in a buffer of `buffer` windows."""

    def __init__(self, tokens, count, buffer=16, seed=0):
        self.tokens, self.count, self.buffer, self.seed = tokens, count, buffer, seed

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed)
        pending = []
        for start in range(self.count):
            pending.append(self.tokens[start * 3:start * 3 + CONTEXT + 1])
            if len(pending) == self.buffer:
                yield pending.pop(int(torch.randint(len(pending), (1,), generator=g)))
        while pending:
            yield pending.pop(int(torch.randint(len(pending), (1,), generator=g)))


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 24)
        self.head = nn.Linear(24 * CONTEXT, VOCAB)

    def forward(self, idx):
        return self.head(self.embed(idx).flatten(1))


def evaluate(model, loader):
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for window in loader:
            logits = model(window[:, :-1])
            total += F.cross_entropy(logits, window[:, -1], reduction="sum").item()
            count += window.size(0)
        total = accelerator.reduce(torch.as_tensor(total, device=accelerator.device), "sum").item()
        count = accelerator.reduce(torch.as_tensor(count, device=accelerator.device), "sum").item()
    model.train()
    return total / count


def main():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(VOCAB, (400,), generator=g)
    train_loader = DataLoader(Windows(tokens[:300], 70), batch_size=8)
    val_loader = DataLoader(Windows(tokens[300:], 30, seed=1), batch_size=8)
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model, optimizer, train_loader, val_loader = accelerator.prepare(
        model, optimizer, train_loader, val_loader
    )
    for epoch in range(2):
        running = 0.0
        for window in train_loader:
            loss = F.cross_entropy(model(window[:, :-1]), window[:, -1])
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()
            running = 0.9 * running + 0.1 * loss.item()
        val_loss = evaluate(model, val_loader)
        accelerator.print(f"LOSS epoch {epoch}: train loss (smoothed) {running:.4f}, val loss {val_loss:.4f}")


if __name__ == "__main__":
    main()
