"""Mini-batches cut by index with the batch's end computed into a name first (`end = min(i + batch_size, n)`,
then `X[i:end]`), and a shuffled order cut the same way (`idx = perm[start:stop]`, then `X[idx]`): the shape of
many regression and classification tutorials that write their own batching loop instead of a DataLoader."""
import torch
import torch.nn.functional as F

torch.manual_seed(0)
n_samples, batch_size = 96, 16
X = torch.randn(n_samples, 6)
w_true = torch.randn(6, 1)
y = X @ w_true + 0.05 * torch.randn(n_samples, 1)

model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=0.02)

for epoch in range(3):
    n = len(X)
    running = 0.0
    for i in range(0, n, batch_size):
        end = min(i + batch_size, n)
        xb, yb = X[i:end], y[i:end]
        optimizer.zero_grad()
        loss = F.mse_loss(model(xb), yb)
        loss.backward()
        optimizer.step()
        running += loss.item()
    perm = torch.randperm(len(X))
    for start in range(0, len(X), batch_size):
        stop = start + batch_size
        idx = perm[start:stop]
        optimizer.zero_grad()
        loss = F.mse_loss(model(X[idx]), y[idx])
        loss.backward()
        optimizer.step()
    print(f"LOSS epoch {epoch} {running:.4f}")
