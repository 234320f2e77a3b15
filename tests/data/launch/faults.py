"""Rank behaviours for the launch fault and watchdog tests: `accelkit launch ... faults.py MODE [ARGS]`.

Every rank prints `FAULTS ready rank=R` once its job is up (tests wait for it before sending signals).
"""

import os
import sys
import time
from pathlib import Path

mode = sys.argv[1]
rank = int(os.environ.get("RANK", "0"))


def ready() -> None:
    print(f"FAULTS ready rank={rank} t={time.time():.3f}", flush=True)


def segfault() -> None:  # rank 0 dies of SIGSEGV in native code; rank 1 would wait forever
    import ctypes

    ready()
    if rank == 0:
        ctypes.string_at(0)  # rank 0 dies here
    time.sleep(600)


def sleep() -> None:  # every rank just waits (signal tests); "all ready" once both ranks run this script
    ready()
    Path(f"ready-{rank}").touch()  # in the current directory, which the tests own
    while not all(Path(f"ready-{r}").exists() for r in range(int(os.environ.get("WORLD_SIZE", "1")))):
        time.sleep(0.05)
    print(f"FAULTS all ready rank={rank}", flush=True)
    time.sleep(600)


def collectives() -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    tensor = torch.ones(4)
    dist.all_reduce(tensor)
    ready()
    if mode == "stall-in-python":  # rank 1 stalls outside any collective while rank 0 waits in all_reduce
        if rank == 1:
            time.sleep(600)  # rank 1 stalls here
        dist.all_reduce(tensor)  # rank 0 waits here
    elif mode == "branch":  # rank 1 took another branch: barrier while rank 0 is in all_reduce
        if rank == 1:
            dist.barrier()  # rank 1 branch
        else:
            dist.all_reduce(tensor)  # rank 0 branch
    elif mode == "slow":  # slow but progressing: silent pauses, each shorter than the stall timeout
        steps, pause = int(sys.argv[2]), float(sys.argv[3])
        for step in range(steps):
            time.sleep(pause)
            dist.all_reduce(tensor)
            print(f"FAULTS step {step} rank={rank}", flush=True)
    dist.destroy_process_group()


def scalar_parameter() -> None:  # a model with a 0-dim parameter, prepared by Accelerate
    import torch
    from accelerate import Accelerator
    from torch.utils.data import DataLoader, TensorDataset

    class Scaled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)
            self.temperature = torch.nn.Parameter(torch.tensor(1.0))

        def forward(self, x):
            return self.linear(x) / self.temperature

    accelerator = Accelerator()
    model = Scaled()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=2)  # DeepSpeed takes its batch size from it
    accelerator.prepare(model, optimizer, loader)


{"segfault": segfault, "sleep": sleep, "stall-in-python": collectives, "branch": collectives, "slow": collectives,
 "scalar-parameter": scalar_parameter}[mode]()
