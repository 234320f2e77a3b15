"""Full-batch regression with the loss in the statement after the forward (`out = net(x)`, then
`loss = F.mse_loss(out, y)`) and a held-out set evaluated every 10 steps under an `if` in the training loop: the
shape of MorvanZhou's PyTorch-Tutorial 302_classification.py and 503_dropout.py."""
import torch
import torch.nn.functional as F

torch.manual_seed(1)
x = torch.randn(40, 1)
y = x.pow(2) + 0.1 * torch.randn(40, 1)
test_x = torch.randn(20, 1)
test_y = test_x.pow(2)
net = torch.nn.Sequential(torch.nn.Linear(1, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
for t in range(50):
    out = net(x)
    loss = F.mse_loss(out, y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if t % 10 == 0:
        net.eval()
        test_pred = net(test_x)
        print('test loss=%.4f' % F.mse_loss(test_pred, test_y).item())
        net.train()
