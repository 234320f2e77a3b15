"""A Trainer class that carries an integer GPU id (the multigpu-tutorial shape before DDP)."""
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from accelerate import Accelerator

accelerator = Accelerator()


class Trainer:
    def __init__(self, model, train_data, optimizer, gpu_id):
        self.gpu_id = accelerator.device
        self.model = model
        self.train_data = train_data
        self.optimizer = optimizer
        self.steps = 0

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        output = self.model(source)
        loss = F.cross_entropy(output, targets)
        accelerator.backward(loss)
        self.optimizer.step()
        return loss.item()

    def _run_epoch(self, epoch):
        for source, targets in self.train_data:
            loss = self._run_batch(source, targets)
            accelerator.print(f"LOSS epoch={epoch} step={self.steps} loss={loss:.6f}")
            self.steps += 1

    def train(self, max_epochs):
        for epoch in range(max_epochs):
            self._run_epoch(epoch)


def load_train_objs():
    g = torch.Generator().manual_seed(3)
    train_set = TensorDataset(torch.randn(40, 20, generator=g), torch.randint(0, 3, (40,), generator=g))
    model = torch.nn.Linear(20, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-1)
    return train_set, model, optimizer


def main(total_epochs, batch_size):
    torch.manual_seed(0)
    gpu_id = accelerator.device
    dataset, model, optimizer = load_train_objs()
    train_data = DataLoader(dataset, batch_size=batch_size, shuffle=False)
    model, optimizer, train_data = accelerator.prepare(model, optimizer, train_data)
    trainer = Trainer(model, train_data, optimizer, gpu_id)
    trainer.train(total_epochs)


if __name__ == "__main__":
    main(total_epochs=2, batch_size=10)
