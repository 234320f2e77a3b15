"""Times torch.distributed.all_reduce directly (no accelkit): the reference `accelkit bench --comm` is checked
against. Prints `SECONDS <fastest> <median> <slowest>` on rank 0: mean seconds per call of five batches of
back-to-back calls (the machine is shared: the spread says how much)."""

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
    fastest, _, median, _, slowest = sorted(batches)
    print(f"SECONDS {fastest} {median} {slowest}", flush=True)
dist.destroy_process_group()
