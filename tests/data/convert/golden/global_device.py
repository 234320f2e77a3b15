"""A module-level `device` that helper functions use, a model with its own methods, a loader built in a helper."""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from accelerate import Accelerator

accelerator = Accelerator()

device = accelerator.device


class TinyLM(nn.Module):
    def __init__(self, vocab=12, dim=16):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens):
        return self.head(self.embed(tokens))

    @torch.no_grad()
    def greedy(self, start, steps):
        out = [start]
        for _ in range(steps):
            nxt = self(torch.tensor([out[-1]], device=device)).argmax(-1).item()
            out.append(nxt)
        return out


def get_loader():
    g = torch.Generator().manual_seed(6)
    seq = torch.randint(0, 12, (60,), generator=g)
    return accelerator.prepare(DataLoader(TensorDataset(seq[:-1], seq[1:]), batch_size=10))


def to_device(*tensors):
    return [t.to(device) for t in tensors]


def evaluate(model, loader):
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for tokens, targets in loader:
            tokens, targets = to_device(tokens, targets)
            logits = model(tokens)
            logits, targets = accelerator.gather_for_metrics((logits, targets))
            total += nn.functional.cross_entropy(logits, targets, reduction="sum").item()
            count += targets.numel()
    return total / count


def main():
    torch.manual_seed(0)
    model = TinyLM()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    loader = get_loader()
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for step in range(3):
        model.train()
        for tokens, targets in loader:
            tokens, targets = to_device(tokens, targets)
            loss = nn.functional.cross_entropy(model(tokens), targets)
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()
        accelerator.print(f"LOSS step={step} loss={loss.item():.6f} eval={evaluate(model, loader):.6f}")
    accelerator.print("SAMPLE", accelerator.unwrap_model(model).greedy(1, 5))


if __name__ == "__main__":
    main()
