"""Shared helpers for the merge-ckpt tests: run the real checkpoint producers (in parallel, once per session)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parent
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]


def start(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, Path]:
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    handle = log.open("w")
    return subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, env=full_env), log


def wait_all(jobs: list[tuple[subprocess.Popen, Path]], timeout: float = 600) -> None:
    for proc, log in jobs:
        rc = proc.wait(timeout=timeout)
        if rc != 0:
            raise AssertionError(f"producer failed (exit {rc}):\n{log.read_text()[-4000:]}")


def produce_all(root: Path) -> Path:
    """DeepSpeed ZeRO-1/2/3, FSDP2+DCP and save_pretrained/torch.save checkpoints of the tiny model, under root.

    Made once: both merge test modules call this with the same root; the second call finds ALL_DONE.
    """
    if (root / "ALL_DONE").is_file():
        return root
    root.mkdir(parents=True, exist_ok=True)
    # DeepSpeed runs here without accelkit launch, which would clear a lock a killed op build left (it would hang).
    from accelkit.launch.build_locks import clear_stale_build_locks

    for line in clear_stale_build_locks(os.environ):
        print(line, file=sys.stderr)
    jobs = [
        start([*TORCHRUN, str(DATA / "make_deepspeed.py"), str(root / "ds")], root / "ds.log",
              {"DS_ACCELERATOR": "cpu"}),
        start([*TORCHRUN, str(DATA / "make_fsdp2_dcp.py"), str(root / "fsdp")], root / "fsdp.log"),
        start([sys.executable, str(DATA / "make_hf.py"), str(root / "hf")], root / "hf.log"),
    ]
    # Accelerate's own save_state under accelkit's CPU rehearsal; its failure only fails the test that uses it.
    accelerate_job = start([sys.executable, "-m", "accelkit", "launch", "--backend", "fsdp", "--cpu",
                            "--num-processes", "2", str(DATA / "accelerate_save_state.py"), str(root / "accelerate")],
                           root / "accelerate.log")
    # transformers' own Trainer with FSDP under the same rehearsal: checkpoint-2/ and checkpoint-4/ (issue 32).
    trainer_job = start([sys.executable, "-m", "accelkit", "launch", "--backend", "fsdp", "--cpu",
                         "--num-processes", "2", str(DATA / "make_trainer.py"), str(root / "trainer")],
                        root / "trainer.log")
    wait_all(jobs)
    (root / "accelerate.rc").write_text(str(accelerate_job[0].wait(timeout=600)))
    (root / "trainer.rc").write_text(str(trainer_job[0].wait(timeout=600)))
    (root / "ALL_DONE").write_text("ok\n")
    return root


def tree_hash(path: Path) -> dict[str, str]:
    """sha256 of every file under path (or of path itself), to prove the input was not modified."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p.relative_to(path.parent)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
