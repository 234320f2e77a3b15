"""A hand-written DDP script in the style of PyTorch's DDP tutorial: every rank pins itself to "its" GPU by hand.

Under `accelkit launch --cpu` each GPU-ism is mapped to the CPU; the script checks that DDP really averaged the
gradients (identical weights on every rank after three steps on different data) and prints one TUTORIAL line per rank.
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
dist.init_process_group("nccl")
rank, world = dist.get_rank(), dist.get_world_size()
device = torch.device(f"cuda:{local_rank}")

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to(device)
head = nn.Linear(4, 2).cuda(local_rank)
ddp = DDP(nn.Sequential(model, head), device_ids=[local_rank], output_device=local_rank)
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)

torch.manual_seed(100 + rank)  # each rank trains on its own data
for _ in range(3):
    x = torch.randn(16, 8).to(device)
    y = torch.randn(16, 2).cuda(local_rank)
    loss = nn.functional.mse_loss(ddp(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    torch.cuda.synchronize()

weight = model[0].weight.detach().clone()
gathered = [torch.zeros_like(weight) for _ in range(world)]
dist.all_gather(gathered, weight)
same = all(torch.equal(gathered[0], other) for other in gathered)
print(f"TUTORIAL rank={rank} world={world} same_weights={same} device={weight.device} "
      f"current_device={torch.cuda.current_device()}", flush=True)
dist.barrier()  # as the tutorial does: no rank tears its process group down while another still uses it
dist.destroy_process_group()
