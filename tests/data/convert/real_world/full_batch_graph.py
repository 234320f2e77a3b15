"""Full-batch node classification: the whole graph every step, the loss on a fixed training mask in a helper."""
import torch
import torch.nn as nn


class GraphNet(nn.Module):
    def __init__(self, features, classes):
        super().__init__()
        self.lin = nn.Linear(features, classes)

    def forward(self, x, adj):
        return adj @ self.lin(x)


def train_step(model, optimizer, inputs, target, mask):
    model.train()
    optimizer.zero_grad()
    output = model(*inputs)
    loss = nn.functional.cross_entropy(output[mask], target[mask])
    loss.backward()
    optimizer.step()
    return loss.item()


if __name__ == "__main__":
    g = torch.Generator().manual_seed(0)
    nodes = 30
    x = torch.randn(nodes, 8, generator=g)
    adj = (torch.rand(nodes, nodes, generator=g) > 0.8).float() + torch.eye(nodes)
    adj = adj / adj.sum(1, keepdim=True)
    labels = torch.randint(0, 3, (nodes,), generator=g)
    idx_train = torch.arange(20)
    model = GraphNet(8, 3)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    for epoch in range(20):
        loss = train_step(model, optimizer, (x, adj), labels, idx_train)
        if epoch % 5 == 0:
            print(f"epoch {epoch}: loss {loss:.4f}")
