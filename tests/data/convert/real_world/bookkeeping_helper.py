"""minGPT's projects' shape: the run's bookkeeping files written by a helper of the project's own module
(run_logs.setup_logging, not converted) before a step-counted training loop on an endless sampler."""
import torch
from torch.utils.data import DataLoader, RandomSampler, TensorDataset

from run_logs import Node, setup_logging

config = Node(work_dir="./out/run", lr=0.05, batch_size=8, max_iters=6, model=Node(width=16))
setup_logging(config)
torch.manual_seed(0)
g = torch.Generator().manual_seed(3)
x = torch.randn(96, 5, generator=g)
y = x @ torch.randn(5, 1, generator=g)
dataset = TensorDataset(x, y)
loader = DataLoader(dataset, sampler=RandomSampler(dataset, replacement=True, num_samples=10**6,
                                                   generator=torch.Generator().manual_seed(4)),
                    batch_size=config.batch_size)
model = torch.nn.Sequential(torch.nn.Linear(5, config.model.width), torch.nn.Tanh(),
                            torch.nn.Linear(config.model.width, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=config.lr)
data_iter = iter(loader)
for step in range(config.max_iters):
    inputs, targets = next(data_iter)
    loss = torch.nn.functional.mse_loss(model(inputs), targets)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"iter {step}: train loss {loss.item():.5f}")
torch.save(model.state_dict(), "./out/run/model.pt")
