"""A tiny next-value model with a configure_optimizers method, imported by gpt_style.py (a local module)."""
import torch
import torch.nn as nn


class TinyLM(nn.Module):
    def __init__(self, vocab=16, width=8):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.head = nn.Linear(width, vocab)
        # nanoGPT's model.py prints this on every process (the module is not converted, only the script)
        print(f"number of parameters: {sum(p.numel() for p in self.parameters())}")

    def forward(self, idx, targets=None):
        logits = self.head(self.embed(idx))
        loss = None if targets is None else nn.functional.cross_entropy(logits.view(-1, logits.size(-1)),
                                                                        targets.view(-1))
        return logits, loss

    def configure_optimizers(self, lr):
        return torch.optim.AdamW(self.parameters(), lr=lr)
