"""Times torch.distributed.all_reduce directly (no accelkit): the reference `accelkit bench --comm` is checked
against. Prints `SECONDS <mean seconds per call>` on rank 0: the median of five batches of back-to-back calls."""

import sys
import time

import torch
import torch.distributed as dist

size, iters = int(sys.argv[1]), int(sys.argv[2])
dist.init_process_group("gloo")
tensor = torch.ones(size // 4)
for _ in range(2):
    dist.all_reduce(tensor)
batches = []
for _ in range(5):  # the machine is shared: the median batch
    dist.barrier()
    started = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(tensor)
    batches.append((time.perf_counter() - started) / iters)
if dist.get_rank() == 0:
    print(f"SECONDS {sorted(batches)[2]}", flush=True)
dist.destroy_process_group()
