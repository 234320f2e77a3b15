"""A full-batch LBFGS trainer in the shape of pytorch/examples' time_sequence_prediction: the whole training tensor
goes through a closure that `optimizer.step(closure)` evaluates several times per step (its line search decides
on the loss the closure returns); an evaluation on held-out rows after each step."""
import argparse

import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))

    def forward(self, x):
        return self.body(x)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    opt = parser.parse_args()
    torch.manual_seed(0)
    data = torch.randn(40, 7, dtype=torch.double)
    input = data[4:, :-1]
    target = data[4:, -1:]
    test_input = data[:4, :-1]
    test_target = data[:4, -1:]
    net = Net().double()
    criterion = nn.MSELoss()
    optimizer = torch.optim.LBFGS(net.parameters(), lr=0.5, max_iter=5)
    for i in range(opt.steps):
        print("STEP:", i)

        def closure():
            optimizer.zero_grad()
            loss = criterion(net(input), target)
            print("loss:", round(loss.item(), 6))
            loss.backward()
            return loss
        optimizer.step(closure)
        with torch.no_grad():
            pred = net(test_input)
            print("test loss:", round(criterion(pred, test_target).item(), 6))
