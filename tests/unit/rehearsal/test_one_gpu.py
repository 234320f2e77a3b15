"""The one-GPU rehearsal (ACCELKIT_REHEARSAL=one-gpu, accelkit.rehearsal.one_gpu): a script written for one GPU,
using each CUDA idiom, runs through the bootstrap on this CPU-only process; what has no CPU meaning still fails
with its own error. Each test starts a real process that imports torch: marked slow."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

EVERY_IDIOM = """
    import torch, torch.nn as nn, torch.distributed as dist, torch.backends.cudnn as cudnn
    from torch.nn.parallel import DistributedDataParallel as DDP

    assert torch.cuda.is_available() and torch.cuda.device_count() == 1 and torch.cuda.is_bf16_supported()
    cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.cuda.set_device(0)
    torch.cuda.manual_seed_all(0)
    dist.init_process_group(backend="nccl", init_method="tcp://127.0.0.1:{port}", rank=0, world_size=1)
    gpu = torch.device("cuda")
    model = nn.Linear(4, 2).cuda()
    model = model.to(0).to("cuda:0").to(gpu)
    ddp = DDP(model, device_ids=[0], output_device=0)
    single = nn.DataParallel(nn.Linear(4, 2)).cuda()
    criterion = nn.CrossEntropyLoss().cuda()
    scaler = torch.cuda.amp.GradScaler()
    optimizer = torch.optim.SGD(list(ddp.parameters()) + list(single.parameters()), lr=0.1)
    x = torch.randn(8, 4).pin_memory().cuda(non_blocking=True)
    y = torch.zeros(8, dtype=torch.long, device="cuda")
    noise = torch.randn(8, 4, device=gpu) * 0 + torch.ones(8, 4, device=0) * 0
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = criterion(ddp(x + noise) + single(x.to(gpu, non_blocking=True)), y.to(0))
    before = model.weight.detach().clone()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    torch.cuda.synchronize()
    assert scaler.is_enabled() and not torch.equal(before, model.weight)
    assert all(p.device.type == "cpu" for p in ddp.parameters())
    torch.save(ddp.module.state_dict(), "w.pt")
    ddp.module.load_state_dict(torch.load("w.pt", map_location="cuda:0"))
    print("peak", torch.cuda.max_memory_allocated(), torch.cuda.memory_allocated(), torch.cuda.get_device_name(0))
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    dist.destroy_process_group()
    print("trained on", x.device, "loss", round(loss.item(), 3) >= 0)
"""


def run(tmp_path: Path, source: str, rehearsed: bool) -> subprocess.CompletedProcess[str]:
    from accelkit.launch.ports import free_port

    script = tmp_path / "one_gpu_script.py"
    script.write_text(textwrap.dedent(source).replace("{port}", str(free_port())))
    env = {k: v for k, v in os.environ.items() if k not in ("ACCELKIT_REHEARSAL", "ACCELKIT_PROBES")}
    env.update({"CUDA_VISIBLE_DEVICES": "", "ACCELKIT_PROBES": "accelkit.ranks.watch",
                "ACCELKIT_WATCH_DIR": str(tmp_path / "watch")})
    if rehearsed:
        env["ACCELKIT_REHEARSAL"] = "one-gpu"
    return subprocess.run([sys.executable, "-m", "accelkit.ranks.bootstrap", str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_every_cuda_idiom_of_a_one_gpu_script_runs_on_the_cpu(tmp_path):
    done = run(tmp_path, EVERY_IDIOM, rehearsed=True)
    assert done.returncode == 0, done.stderr
    assert "peak 0 0 CPU (CUDA rehearsed)" in done.stdout and "trained on cpu loss True" in done.stdout
    # one line per kind of mapping, naming the script's line
    assert "init_process_group(backend='nccl') uses gloo at" in done.stderr
    assert "DataParallel on one GPU calls the module itself at" in done.stderr
    assert "one_gpu_script.py:20" in done.stderr  # torch.zeros(..., device="cuda")


@pytest.mark.slow
def test_without_the_rehearsal_the_same_script_stops_at_its_first_cuda_call(tmp_path):
    done = run(tmp_path, EVERY_IDIOM, rehearsed=False)
    assert done.returncode != 0 and "AssertionError" in done.stderr


@pytest.mark.slow
def test_what_only_cuda_has_still_fails_with_its_own_error(tmp_path):
    done = run(tmp_path, """
        import torch
        model = torch.nn.Linear(2, 2).cuda()
        side = torch.cuda.Stream()  # a CUDA stream has no CPU meaning
    """, rehearsed=True)
    assert done.returncode == 1
    assert "torch.cuda.Stream requires CUDA support" in done.stderr
    assert "module.cuda() keeps it on the CPU" in done.stderr
