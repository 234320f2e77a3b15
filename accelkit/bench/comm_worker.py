"""The rank side of `accelkit bench --comm`: time all-reduce, all-gather and reduce-scatter on the job's process
group (the one Accelerate sets up for the launch: NCCL on GPUs, gloo on CPU ranks).

    accelkit launch ... -m accelkit.bench.comm_worker --sizes 4096,65536 --iters 5 --warmup 2

Each rank writes its mean time per (collective, size) to $ACCELKIT_PROBE_DIR/comm.rank<R>.json; the launching side
averages across ranks and derives algbw/busbw (accelkit.bench.comm).
"""

from __future__ import annotations

import argparse
import time

from accelkit.bench import COMM_NAME
from accelkit.bench.comm import COLLECTIVES, fit_size
from accelkit.ranks.probes import write_rank_result


def _buffers(op: str, size: int, n: int, device, dtype):
    import torch

    count = size // torch.tensor([], dtype=dtype).element_size()
    if op == "all_reduce":
        return torch.ones(count, device=device, dtype=dtype), None
    if op == "all_gather":  # each rank contributes size / N; the output is the full size
        return torch.ones(count // n, device=device, dtype=dtype), torch.empty(count, device=device, dtype=dtype)
    return torch.ones(count, device=device, dtype=dtype), torch.empty(count // n, device=device, dtype=dtype)


def _run(op: str, source, target) -> None:
    import torch.distributed as dist

    if op == "all_reduce":
        dist.all_reduce(source)
    elif op == "all_gather":
        dist.all_gather_into_tensor(target, source)
    else:
        dist.reduce_scatter_tensor(target, source)


def time_collective(op: str, size: int, iters: int, warmup: int, device, dtype) -> float:
    """Mean seconds per call of `op` on a `size`-byte buffer, timed the nccl-tests way (barrier, then a batch of
    back-to-back calls, synchronised once at the end)."""
    import torch
    import torch.distributed as dist

    source, target = _buffers(op, size, dist.get_world_size(), device, dtype)
    for _ in range(warmup):
        _run(op, source, target)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
    dist.barrier()
    started = time.perf_counter()
    for _ in range(iters):
        _run(op, source, target)
    if cuda:
        torch.cuda.synchronize(device)
    return (time.perf_counter() - started) / iters


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="time collectives on the job's process group")
    parser.add_argument("--sizes", required=True, help="comma-separated buffer sizes in bytes")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args(argv)

    import torch
    import torch.distributed as dist
    from accelerate import PartialState

    state = PartialState()  # the process group exactly as Accelerate sets it up for this launch
    if not dist.is_initialized():
        raise SystemExit("accelkit bench --comm: no process group (run it on 2 or more processes)")
    device = state.device if state.device.type == "cuda" else torch.device("cpu")
    dtype = torch.float32
    n = dist.get_world_size()
    timings = []
    for op in COLLECTIVES:
        for requested in (int(s) for s in args.sizes.split(",")):
            size = fit_size(requested, n)
            seconds = time_collective(op, size, args.iters, args.warmup, device, dtype)
            timings.append({"op": op, "size_bytes": size, "count": size // 4, "dtype": "float32",
                            "seconds": seconds})
    write_rank_result(COMM_NAME, {"rank": dist.get_rank(), "world_size": n, "backend": dist.get_backend(),
                                  "timings": timings})
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
