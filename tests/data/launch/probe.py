"""Probe for `accelkit launch` tests: reports what each rank really runs, trains two steps, saves its state.

Every line it prints starts with PROBE so tests can parse it out of the launcher's noise.
"""

import os
import sys
import time

sys.stdout.write(f"PROBE first_line rank={os.environ.get('RANK')} t={time.time():.6f}\n")
sys.stdout.flush()

import argparse  # noqa: E402


def say(text: str) -> None:
    """One write per line: ranks share stdout, and print() writes the text and its newline separately."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


parser = argparse.ArgumentParser()
parser.add_argument("--output", default=None, help="save_state here")
parser.add_argument("--crash-rank", type=int, default=-1, help="this rank exits with --crash-code after prepare")
parser.add_argument("--crash-code", type=int, default=3)
parser.add_argument("--sleep", type=float, default=0.0, help="sleep this long after prepare (signal tests)")
parser.add_argument("--first-line-only", action="store_true", help="exit right after the first line (benchmark)")
parser.add_argument("--early", action="store_true",
                    help="crash/sleep before importing torch (a rank busy elsewhere, cheap to start)")
args, unknown = parser.parse_known_args()
if args.first_line_only:
    sys.exit(0)
if args.early:
    if int(os.environ.get("RANK", "0")) == args.crash_rank:
        say(f"PROBE crashing rank={args.crash_rank} code={args.crash_code} t={time.time():.6f}")
        sys.exit(args.crash_code)
    time.sleep(args.sleep)

import torch  # noqa: E402
from accelerate import Accelerator  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

torch.manual_seed(0)
accelerator = Accelerator()
if "--exit-after-accelerator" in unknown:  # benchmark: the job is up (torch imported, process group formed)
    say(f"PROBE accelerator rank={accelerator.process_index} t={time.time():.6f} world={accelerator.num_processes} "
        f"type={accelerator.distributed_type.value}")
    sys.exit(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
loader = DataLoader(TensorDataset(torch.randn(32, 8), torch.randn(32, 4)), batch_size=4)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
rank = accelerator.process_index
say(f"PROBE ready rank={rank} pid={os.getpid()}")

if rank == args.crash_rank:
    say(f"PROBE crashing rank={rank} code={args.crash_code} t={time.time():.6f}")
    sys.exit(args.crash_code)
if args.sleep:
    time.sleep(args.sleep)

for step, (x, y) in enumerate(loader):
    loss = torch.nn.functional.mse_loss(model(x), y)
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    if step == 1:
        break

param = next(model.parameters())
backend = torch.distributed.get_backend() if torch.distributed.is_initialized() else "none"
if type(param).__name__ == "DTensor":  # FSDP2: this rank holds one shard of each parameter
    shard = f"dtensor:{param.to_local().numel()}/{param.numel()}"
elif hasattr(param, "ds_tensor"):  # DeepSpeed ZeRO-3: this rank holds one partition of each parameter
    shard = f"zero3:{param.ds_tensor.numel()}/{param.ds_numel}"
else:
    shard = f"full:{param.numel()}/{param.numel()}"
say(f"PROBE rank={rank} world={accelerator.num_processes} type={accelerator.distributed_type.value} "
    f"wrapper={type(model).__name__} shard={shard} backend={backend} argv={sys.argv[1:]!r}")
if args.output:
    accelerator.save_state(args.output)
accelerator.wait_for_everyone()
say(f"PROBE done rank={rank} slurm_node={os.environ.get('SLURMD_NODENAME', '-')}")
