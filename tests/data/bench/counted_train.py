"""An Accelerate training script that logs, on every rank, each real optimizer step with the samples and tokens it
trained on and the time: the ground truth bench's probe is checked against. Knobs make it data-bound
(--slow-data), compute-bound (--compute), one rank a straggler (--slow-rank with --slow-data or --slow-forward),
crash (--crash-at-world-size, --crash-rank), lose a rank (--kill-rank) or hang on one rank while the others wait
for it in the next all-reduce (--hang-rank)."""

import argparse
import os
import signal
import sys
import time

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, Dataset

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=1000)
parser.add_argument("--batch", type=int, default=8)
parser.add_argument("--accumulation", type=int, default=1)
parser.add_argument("--seq", type=int, default=16, help="tokens per sample (batches are dicts with input_ids)")
parser.add_argument("--hidden", type=int, default=32)
parser.add_argument("--slow-data", type=float, default=0.0, help="seconds of sleep per __getitem__")
parser.add_argument("--slow-data-at-world-size", type=int, default=0, help="only at this world size")
parser.add_argument("--slow-forward", type=float, default=0.0, help="seconds of sleep per forward")
parser.add_argument("--slow-rank", type=int, default=-1, help="only this rank is slowed (-1: every rank)")
parser.add_argument("--compute", type=int, default=0, help="extra matmul rounds per micro-batch")
parser.add_argument("--compute-at-world-size", type=int, default=0, help="only at this world size")
parser.add_argument("--eval-every", type=int, default=0, help="iterate an evaluation loader every N steps")
parser.add_argument("--crash-at-world-size", type=int, default=0)
parser.add_argument("--kill-rank", type=int, default=-1, help="this rank SIGKILLs itself at step 2")
parser.add_argument("--crash-rank", type=int, default=-1, help="this rank raises at step 2")
parser.add_argument("--hang-rank", type=int, default=-1, help="this rank sleeps (forever) at step 2")
args = parser.parse_args()


class Tokens(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        if args.slow_data:
            time.sleep(args.slow_data)
        ids = torch.arange(args.seq) % 50 + i % 7
        return {"input_ids": ids, "labels": ids.clone()}


accelerator = Accelerator(gradient_accumulation_steps=args.accumulation)
if args.slow_data_at_world_size and accelerator.num_processes != args.slow_data_at_world_size:
    args.slow_data = 0.0
if args.slow_rank >= 0 and accelerator.process_index != args.slow_rank:
    args.slow_data = args.slow_forward = 0.0
if args.compute_at_world_size and accelerator.num_processes != args.compute_at_world_size:
    args.compute = 0
if args.crash_at_world_size and accelerator.num_processes == args.crash_at_world_size:
    raise RuntimeError(f"deliberate failure at world size {accelerator.num_processes}")


class SlowForward(torch.nn.Module):
    def forward(self, x):
        time.sleep(args.slow_forward)
        return x


torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Embedding(64, args.hidden), torch.nn.Linear(args.hidden, args.hidden),
                            torch.nn.Tanh(), torch.nn.Linear(args.hidden, 64))
if args.slow_forward:
    model.insert(0, SlowForward())
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
train = DataLoader(Tokens(100_000), batch_size=args.batch, shuffle=True)
evaluation = DataLoader(Tokens(4 * args.batch), batch_size=args.batch)
model, optimizer, train, evaluation = accelerator.prepare(model, optimizer, train, evaluation)
rank = accelerator.process_index
print(f"RANK {rank} PARAMS {sum(p.numel() for p in model.parameters())}", flush=True)
steps = samples = tokens = 0
print(f"RANK {rank} START {time.perf_counter():.6f}", flush=True)
print(f"RANK {rank} TRAINING", file=sys.stderr, flush=True)
for batch in train:
    with accelerator.accumulate(model):
        logits = model(batch["input_ids"])
        for _ in range(args.compute):
            logits = logits + 1e-6 * (logits @ torch.eye(64)).tanh()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 64), batch["labels"].reshape(-1))
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    samples += batch["input_ids"].shape[0]
    tokens += batch["input_ids"].numel()
    if not accelerator.sync_gradients:
        continue
    steps += 1
    print(f"RANK {rank} STEP {steps} SAMPLES {samples} TOKENS {tokens} T {time.perf_counter():.6f}", flush=True)
    if steps == 2 and rank == args.kill_rank:
        os.kill(os.getpid(), signal.SIGKILL)
    if steps == 2 and rank == args.crash_rank:
        raise ValueError(f"deliberate failure on rank {rank}")
    if steps == 2 and rank == args.hang_rank:
        time.sleep(3600)
    if args.eval_every and steps % args.eval_every == 0:
        with torch.no_grad():
            for eval_batch in evaluation:
                model(eval_batch["input_ids"])
    if steps == args.steps:
        break
print(f"RANK {rank} DONE", flush=True)
