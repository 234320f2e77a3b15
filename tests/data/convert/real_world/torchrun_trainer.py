"""A torchrun-only script in the shape of the DDP tutorials' `multigpu_torchrun.py`: a Trainer class that reads
LOCAL_RANK from the environment with no fallback, a process group made from the environment, DDP, a
DistributedSampler re-seeded every epoch, and a snapshot saved by local rank 0 every other epoch. A plain
`python torchrun_trainer.py` stops with KeyError 'LOCAL_RANK': only a launcher starts it."""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def ddp_setup():
    init_process_group(backend="gloo")


class Trainer:
    def __init__(self, model, train_data, optimizer, save_every, snapshot_path):
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.model = DDP(model)
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.snapshot_path = snapshot_path

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        loss = F.mse_loss(self.model(source), targets)
        loss.backward()
        self.optimizer.step()
        return loss.item()

    def _run_epoch(self, epoch):
        self.train_data.sampler.set_epoch(epoch)
        total = 0.0
        for source, targets in self.train_data:
            total += self._run_batch(source, targets)
        if self.local_rank == 0:
            print(f"epoch {epoch}: mean loss {total / len(self.train_data):.4f}")

    def _save_snapshot(self, epoch):
        torch.save({"MODEL_STATE": self.model.module.state_dict(), "EPOCHS_RUN": epoch}, self.snapshot_path)
        print(f"epoch {epoch}: snapshot saved at {self.snapshot_path}")

    def train(self, max_epochs):
        for epoch in range(max_epochs):
            self._run_epoch(epoch)
            if self.local_rank == 0 and epoch % self.save_every == 0:
                self._save_snapshot(epoch)


def main(total_epochs, save_every, batch_size):
    ddp_setup()
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    dataset = TensorDataset(torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g))
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, sampler=DistributedSampler(dataset))
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    trainer = Trainer(model, loader, optimizer, save_every, "snapshot.pt")
    trainer.train(total_epochs)
    destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 8)
