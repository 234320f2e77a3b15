"""Full-batch training on tensors reached through an alias: the training function names the whole training set
again at every step (`data, target = train_x, train_y`) and feeds all of it to the model, the shape of small
curve-fitting tutorials; a second phase fine-tunes on `inputs = features.float()`, an alias bound before its
loop, beside the global `targets` it reads."""
import torch

torch.manual_seed(0)
train_x = torch.linspace(-2, 2, 64).unsqueeze(1)
train_y = torch.sin(2 * train_x) + 0.05 * torch.randn(64, 1)
features = torch.linspace(-1, 1, 32, dtype=torch.float64).unsqueeze(1)
targets = torch.sin(2 * features.float())

net = torch.nn.Sequential(torch.nn.Linear(1, 24), torch.nn.Tanh(), torch.nn.Linear(24, 1))
criterion = torch.nn.MSELoss()


def fit(net, steps):
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    for step in range(steps):
        data, target = train_x, train_y
        optimizer.zero_grad()
        loss = criterion(net(data), target)
        loss.backward()
        optimizer.step()
        if step % 10 == 0:
            print(f"LOSS step {step} {loss.item():.4f}")


def fine_tune(net, steps):
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05)
    inputs = features.float()
    for step in range(steps):
        optimizer.zero_grad()
        loss = criterion(net(inputs), targets)
        loss.backward()
        optimizer.step()
    print(f"LOSS fine-tuned {loss.item():.4f}")


fit(net, 40)
fine_tune(net, 10)
