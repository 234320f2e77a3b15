"""A plain torch (no Accelerate) loop with two optimizers per iteration, like a GAN; prints each iteration."""

import torch

torch.manual_seed(0)
d, g = torch.nn.Linear(4, 1), torch.nn.Linear(2, 4)
opt_d = torch.optim.SGD(d.parameters(), lr=0.1)
opt_g = torch.optim.Adam(g.parameters(), lr=0.1)
for it in range(1, 6):
    opt_d.zero_grad()
    d(g(torch.randn(8, 2)).detach()).mean().backward()
    opt_d.step()
    opt_g.zero_grad()
    (-d(g(torch.randn(8, 2)))).mean().backward()
    opt_g.step()
    print(f"ITER {it}", flush=True)
print("DONE", flush=True)
