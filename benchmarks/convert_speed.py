"""How long `accelkit convert` takes on a ~1,000-line training script, next to its floor and a reference.

    python benchmarks/convert_speed.py [--lines 1000] [--repeat 7]

Peers on the same input: a bare libcst parse + code generation round trip (the floor any libcst codemod pays),
libcst parse with the metadata accelkit resolves (parents, positions, qualified names), CPython's own compile(), and
`ruff format` of the same text (a fast Rust tool, run as a subprocess as users run it). Medians of --repeat runs.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable

import libcst as cst
from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider, QualifiedNameProvider

from accelkit.convert.codemod import convert_source

HEADER = '''"""Synthetic single-GPU training script for the convert benchmark."""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, TensorDataset
'''

BLOCK = '''

class Net{i}(nn.Module):
    def __init__(self, width={i} + 8):
        super().__init__()
        self.fc1 = nn.Linear(16, width)
        self.fc2 = nn.Linear(width, 4)

    def forward(self, x):
        # two layers and a log-softmax
        return F.log_softmax(self.fc2(F.relu(self.fc1(x))), dim=1)


def train{i}(args, model, device, train_loader, optimizer, epoch):
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if batch_idx % args.log_interval == 0:
            print(f"epoch={{epoch}} step={{batch_idx}} loss={{loss.item():.4f}}")


def test{i}(model, device, test_loader):
    model.eval()
    correct = 0
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            correct += output.argmax(dim=1).eq(target).sum().item()
    print(f"correct={{correct}}")


def run{i}(args, device):
    x, y = torch.randn(64, 16), torch.randint(0, 4, (64,))
    train_loader = DataLoader(TensorDataset(x, y), batch_size=8)
    test_loader = DataLoader(TensorDataset(x, y), batch_size=8)
    model = Net{i}().to(device)
    optimizer = optim.Adam(model.parameters(), lr=1e-3)
    scheduler = StepLR(optimizer, step_size=1, gamma=0.7)
    for epoch in range(args.epochs):
        train{i}(args, model, device, train_loader, optimizer, epoch)
        test{i}(model, device, test_loader)
        scheduler.step()
    torch.save(model.state_dict(), "net{i}.pt")
'''

FOOTER = '''

def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--log-interval", type=int, default=10)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    for run in RUNS:
        run(args, device)


RUNS = [{runs}]

if __name__ == "__main__":
    main()
'''


def make_script(lines: int) -> str:
    blocks: list[str] = []
    i = 0
    while (HEADER + "".join(blocks)).count("\n") < lines - 20:
        blocks.append(BLOCK.format(i=i))
        i += 1
    return HEADER + "".join(blocks) + FOOTER.format(runs=", ".join(f"run{j}" for j in range(i)))


def median_seconds(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    """Median wall-clock and median CPU time of this process (the CPU column is steadier on a busy machine)."""
    wall, cpu = [], []
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return statistics.median(wall), statistics.median(cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    source = make_script(args.lines)
    result = convert_source(source)  # also warms up imports and libcst's parser
    rows: list[tuple[str, tuple[float, float]]] = [
        ("accelkit convert_source (full conversion)", median_seconds(lambda: convert_source(source), args.repeat)),
        ("libcst parse + codegen round trip (floor)",
         median_seconds(lambda: cst.parse_module(source).code, args.repeat)),
        ("libcst parse + parent/position/qualified-name metadata",
         median_seconds(lambda: [MetadataWrapper(cst.parse_module(source)).resolve(p)
                                 for p in (ParentNodeProvider, PositionProvider, QualifiedNameProvider)],
                        args.repeat)),
        ("CPython compile() (reference)", median_seconds(lambda: compile(source, "bench.py", "exec"), args.repeat)),
    ]
    ruff = shutil.which("ruff")
    if ruff:
        rows.append(("ruff format - (subprocess, reference)", median_seconds(
            lambda: subprocess.run([ruff, "format", "-"], input=source, text=True, capture_output=True),
            args.repeat)))
    print(f"input: {source.count(chr(10))} lines, {len(source):,} bytes; output: {result.code.count(chr(10))} lines, "
          f"{len(result.report.changes)} report entries; median of {args.repeat} runs")
    width = max(len(name) for name, _ in rows)
    floor = rows[1][1][0]
    print(f"  {'':<{width}}  {'wall':>8}     {'cpu':>8}     wall/floor")
    for name, (wall, cpu) in rows:
        cpu_text = f"{cpu * 1000:8.1f} ms" if "subprocess" not in name else f"{'-':>8}   "
        print(f"  {name:<{width}}  {wall * 1000:8.1f} ms  {cpu_text}  {wall / floor:5.2f}x")


if __name__ == "__main__":
    main()
