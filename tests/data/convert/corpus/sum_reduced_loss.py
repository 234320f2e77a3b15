import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
x = torch.randn(96, 4)
y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.1 * torch.randn(96)
loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
model = nn.Linear(4, 1)
loss_fn = nn.MSELoss(reduction="sum")
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(2):
    for xb, yb in loader:
        optimizer.zero_grad()
        loss = loss_fn(model(xb).squeeze(1), yb)
        loss.backward()
        optimizer.step()
    print(f"LOSS epoch={epoch} loss={loss.item():.4f}")
