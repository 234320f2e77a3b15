"""A two-stage pipeline (torch.distributed.pipelining, GPipe) whose stage 1 hangs inside its forward at the third step.

Used by tests/integration/test_pipeline_stall.py: the stall watchdog must stop it with each stage's stack. Stage 0
then waits in the pipeline's point-to-point receive of stage 1's gradients.
"""

import time

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

HANG_AT_STEP = 2


class Stage(torch.nn.Module):
    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index
        self.layer = torch.nn.Linear(8, 8)
        self.step = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.index == 1 and self.step >= HANG_AT_STEP:
            hang_in_forward()
        return torch.relu(self.layer(x))


def hang_in_forward() -> None:
    time.sleep(3600)


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    module = Stage(rank)
    stage = PipelineStage(module, rank, 2, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=2, loss_fn=lambda out, target: ((out - target) ** 2).mean())
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    for step in range(5):
        module.step = step
        optimizer.zero_grad()
        x, target = torch.randn(4, 8), torch.randn(4, 8)
        if rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=target)
        optimizer.step()
        print(f"step {step} done on rank {rank}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
