"""A one-GPU trainer that copies its batches on a side CUDA stream: a need only a GPU has (a CUDA stream has no CPU
meaning), so `--check` on a machine without one says the original fails, with the stream's own error."""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=8, shuffle=True)
model = nn.Linear(4, 1).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
copies = torch.cuda.Stream()
for x, y in loader:
    with torch.cuda.stream(copies):
        x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
    torch.cuda.current_stream().wait_stream(copies)
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
