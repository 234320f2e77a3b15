"""A small GPT trainer class in the style of minGPT: the model is built in main() and handed to a Trainer, which
moves it to its device in __init__ and creates the optimizer with model.configure_optimizers() inside run()."""
import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset
from accelerate import Accelerator

accelerator = Accelerator()


class CharDataset(Dataset):
    def __init__(self, n=48, block=8, vocab=11):
        g = torch.Generator().manual_seed(13)
        self.data = torch.randint(0, vocab, (n + block + 1,), generator=g)
        self.n, self.block = n, block

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        chunk = self.data[i:i + self.block + 1]
        return chunk[:-1], chunk[1:]


class TinyGPT(nn.Module):
    def __init__(self, vocab=11, width=16):
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.mix = nn.Linear(width, width)
        self.ln = nn.LayerNorm(width)
        self.out = nn.Linear(width, vocab, bias=False)

    def forward(self, idx, targets=None):
        h = self.ln(torch.tanh(self.mix(self.tok(idx))))
        logits = self.out(h)
        loss = None if targets is None else F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss

    def configure_optimizers(self, config):
        decay = [p for n, p in self.named_parameters() if p.dim() >= 2]
        no_decay = [p for n, p in self.named_parameters() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=config.learning_rate, betas=(0.9, 0.95))


class TrainerConfig:
    device = "auto"
    batch_size = 4
    learning_rate = 3e-3
    weight_decay = 0.1
    grad_norm_clip = 1.0
    max_iters = 12


class Trainer:
    def __init__(self, config, model, train_dataset):
        self.config = config
        self.model = model
        self.train_dataset = train_dataset
        if config.device == "auto":
            self.device = accelerator.device.type
        else:
            self.device = accelerator.device
        accelerator.print("running on device", self.device)
        self.iter_num = 0

    def run(self):
        model, config = self.model, self.config
        self.optimizer = model.configure_optimizers(config)
        train_loader = DataLoader(self.train_dataset, shuffle=False, batch_size=config.batch_size)
        model.train()
        model, self.optimizer, train_loader = accelerator.prepare(
            model, self.optimizer, train_loader
        )
        data_iter = iter(train_loader)
        while True:
            try:
                batch = next(data_iter)
            except StopIteration:
                data_iter = iter(train_loader)
                batch = next(data_iter)
            batch = [t.to(self.device) for t in batch]
            x, y = batch
            logits, self.loss = model(x, y)
            model.zero_grad(set_to_none=True)
            accelerator.backward(self.loss)
            accelerator.clip_grad_norm_(model.parameters(), config.grad_norm_clip)
            self.optimizer.step()
            accelerator.print(f"LOSS iter={self.iter_num} loss={self.loss.item():.6f}")
            self.iter_num += 1
            if config.max_iters is not None and self.iter_num >= config.max_iters:
                break


def main():
    torch.manual_seed(3)
    model = TinyGPT()
    trainer = Trainer(TrainerConfig(), model, CharDataset())
    trainer.run()


if __name__ == "__main__":
    main()
