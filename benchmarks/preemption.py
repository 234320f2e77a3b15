"""Preemption: what a SIGTERM between checkpoints costs, with accelkit's save request and without.

The job: the minimal template on 2 CPU ranks (DDP over gloo), checkpoints every 50 steps, SIGTERM sent when the
run logs step 70 (20 steps after its last checkpoint), as Kubernetes or a spot instance would send it. Side by side:
- `accelerate launch` (torchrun under it): SIGTERM stops the ranks at once; the run restarts from checkpoint-50;
- `accelkit launch --preemption-grace 0`: the same (SIGTERM forwarded, no save);
- `accelkit launch` (default): the ranks agree on a step, save there, exit 143.
Printed per tool: seconds from the SIGTERM to the job's exit, the checkpoint a restart resumes from, and the
optimizer steps lost (trained but not in any checkpoint). Medians over --runs.

    python benchmarks/preemption.py [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ARGS = ["--max-steps", "400", "--num-samples", "8192", "--per-device-batch-size", "8", "--checkpoint-every", "50",
        "--log-every", "10"]
SIGNAL_AT = "step 70 |"


def accelerate_command(project: Path) -> list[str]:
    config = project / "ddp.yaml"
    subprocess.run([sys.executable, "-m", "accelkit", "config", "--backend", "ddp", "--num-processes", "2", "-o",
                    str(config)], check=True, capture_output=True)
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config), "train.py"]


def run_once(command: list[str], project: Path, env: dict[str, str], output: str) -> dict:
    proc = subprocess.Popen([*command, *ARGS, "--output-dir", output], cwd=project, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    last_logged, sent = 0, None
    for line in proc.stdout:
        found = re.search(r"step (\d+) \|", line)
        if found:
            last_logged = int(found.group(1))
        if SIGNAL_AT in line and sent is None:
            proc.send_signal(signal.SIGTERM)
            sent = time.monotonic()
    proc.wait()
    seconds = time.monotonic() - sent if sent else float("nan")
    saved = [int(p.name.split("-")[1]) for p in (project / output).glob("checkpoint-*")
             if (p / "accelkit-manifest.json").is_file()]
    resume = max(saved, default=0)
    return {"seconds": seconds, "resume": resume, "lost": max(last_logged, resume) - resume,
            "status": proc.returncode}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    runs = parser.parse_args().runs
    from accelkit.scaffold import init_project

    with tempfile.TemporaryDirectory(prefix="preemption-bench-") as folder:
        project = init_project(Path(folder) / "proj", "minimal", backend="ddp").directory
        env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}
        accelkit = [sys.executable, "-m", "accelkit", "launch", "--cpu", "--backend", "ddp", "--num-processes", "2"]
        tools = {"accelerate launch": accelerate_command(project),
                 "accelkit --preemption-grace 0": [*accelkit, "--preemption-grace", "0", "train.py"],
                 "accelkit (save on SIGTERM)": [*accelkit, "train.py"]}
        results: dict[str, list[dict]] = {name: [] for name in tools}
        for index in range(runs):
            for name, command in tools.items():  # alternate, so machine load hits every tool alike
                results[name].append(run_once(command, project, env, f"out-{index}-{len(results[name])}-"
                                                                     f"{abs(hash(name)) % 1000}"))
        print(f"SIGTERM at step ~70 of the minimal template, 2 CPU ranks, checkpoints every 50 steps ({runs} runs)")
        print(f"{'tool':32} {'SIGTERM->exit s':>16} {'resumes from':>13} {'steps lost':>11} {'exit':>5}")
        for name, rows in results.items():
            print(f"{name:32} {statistics.median(r['seconds'] for r in rows):16.2f} "
                  f"{statistics.median(r['resume'] for r in rows):13.0f} "
                  f"{statistics.median(r['lost'] for r in rows):11.0f} {rows[-1]['status']:5d}")


if __name__ == "__main__":
    main()
