"""No seed anywhere: the task (target weights and inputs) is drawn at random at import, then trained until the
loss is small. Every process must train on the same task."""
import torch
import torch.nn as nn

true_w = torch.randn(6, 1)
inputs = torch.randn(128, 6)
targets = inputs @ true_w


def main():
    model = nn.Linear(6, 1, bias=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(inputs, targets), batch_size=16,
                                         shuffle=True)
    for epoch in range(200):
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if loss.item() < 1e-3:
            break
    print(f"stopped after epoch {epoch} with loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
