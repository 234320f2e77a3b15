"""How fast a job notices a lost machine, and how fast a restart trains again: accelkit side by side with bare
torchrun under the same faults, on this machine's loopback (two "machines" = two node launchers / two torchrun
agents, 1 CPU rank each, training accelkit's minimal template).

- loss to end: machine 1 is lost mid-run, by SIGKILL of every one of its processes at once (a crash) or by SIGSTOP
  of all of them (it stops answering, its sockets stay open: what a partition looks like to the peers); the figure
  is the time from the loss until machine 0's launcher has exited. Bare torchrun waits in gloo's collective until
  the process group's timeout (30 min) after a freeze; the run is cut at --cap seconds and reported as "> cap".
- restart to first resumed step: one machine, 2 ranks, `--max-restarts 1`, rank 1 SIGKILLed at step 25 (checkpoints
  every 10): the time from the kill until the restarted group logs its first step after the checkpoint.

    python benchmarks/lost_machine.py [--lost-timeout 10] [--cap 120]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
KILL_AT_STEP = ROOT / "tests" / "data" / "restarts" / "kill_at_step.py"
TRAIN = ["--num-samples", "4096", "--per-device-batch-size", "8", "--log-every", "10", "--lr-scheduler", "constant",
         "--warmup-steps", "0"]


class Proc:
    """A process in its own session, its output read live with the time each line arrived."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True)
        self.lines: list[tuple[float, str]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            for part in line.replace("\r", "\n").splitlines():
                self.lines.append((time.monotonic(), part))

    def first(self, pattern: str, after: float = 0.0) -> float | None:
        return next((at for at, line in list(self.lines) if at >= after and re.search(pattern, line)), None)

    def wait_line(self, pattern: str, timeout: float) -> float:
        deadline = time.monotonic() + timeout
        while (at := self.first(pattern)) is None:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"no line {pattern!r}:\n" + "\n".join(line for _, line in self.lines[-30:]))
            time.sleep(0.05)
        return at

    def tree(self) -> list[psutil.Process]:
        root = psutil.Process(self.proc.pid)
        return [root, *root.children(recursive=True)]

    def kill(self) -> None:
        for proc in self.tree() if self.proc.poll() is None else []:
            try:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
            except psutil.Error:
                pass
        self.proc.wait(timeout=30)


def free_port_pair() -> int:
    from accelkit.launch.ports import free_port, port_free

    while True:
        port = free_port("")
        if port < 65535 and port_free(port + 1):
            return port


def accelkit_nodes(project: Path, lost_timeout: float) -> list[Proc]:
    """The two node launchers a SkyPilot task written by `accelkit launch --skypilot` runs (its request and key)."""
    import yaml

    subprocess.run([sys.executable, "-m", "accelkit", "launch", "--cpu", "--skypilot", "task.yaml", "--nodes", "2",
                    "--gpus-per-node", "1", "--force", "--lost-timeout", f"{lost_timeout:g}", "train.py",
                    "--max-steps", "100000", *TRAIN, "--output-dir", "out"], cwd=project, check=True,
                   capture_output=True)
    task_env = yaml.safe_load((project / "task.yaml").read_text())["envs"]
    port = free_port_pair()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELKIT_")}
    env.update(task_env)
    return [Proc([sys.executable, "-m", "accelkit.launch.cluster.node", "--machine-rank", str(rank),
                  "--main-process-ip", "127.0.0.1", "--main-process-port", str(port), "--job-board-port", str(port + 1),
                  "--node-name",
                  f"node{rank}"], project, env) for rank in (0, 1)]


def torchrun_nodes(project: Path) -> list[Proc]:
    port = free_port_pair()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("ACCELKIT_")}, "ACCELERATE_USE_CPU": "true"}
    return [Proc([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(rank),
                  "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port), "train.py",
                  "--max-steps", "100000", *TRAIN, "--output-dir", "out"], project, env) for rank in (0, 1)]


def loss_to_end(nodes: list[Proc], fault: str, cap: float) -> float | None:
    try:
        nodes[0].wait_line(r"step 40 \| loss", 300)
        lost_at = time.monotonic()
        for proc in nodes[1].tree():
            proc.send_signal(signal.SIGKILL if fault == "crash" else signal.SIGSTOP)
        try:
            nodes[0].proc.wait(timeout=cap)
        except subprocess.TimeoutExpired:
            return None
        return time.monotonic() - lost_at
    finally:
        for node in nodes:
            node.kill()


def restart_to_resumed_step(project: Path, bare: bool) -> float | str:
    shutil.rmtree(project / "out", ignore_errors=True)
    args = [str(KILL_AT_STEP), "train.py", "--max-steps", "60", *TRAIN, "--checkpoint-every", "10", "--output-dir",
            "out", "--resume-from-checkpoint", "latest"]
    env = {**os.environ, "KILL_RANK": "1", "KILL_STEP": "25"}
    if bare:
        argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--max-restarts", "1",
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port_pair()}", *args]
        env["ACCELERATE_USE_CPU"] = "true"
    else:
        argv = [sys.executable, "-m", "accelkit", "launch", "--cpu", "--backend", "ddp", "--num-processes", "2",
                "--max-restarts", "1", *args]
    run = Proc(argv, project, env)
    try:
        run.proc.wait(timeout=300)
    finally:
        if run.proc.poll() is None:
            run.kill()
    killed = run.first(r"failed \(exitcode: -9\)|was killed by SIGKILL|Connection (reset|closed) by peer")
    resumed = run.first(r"resumed from \S*checkpoint-20 at step 20")
    first_step = run.first(r"step 30 \| loss", after=resumed or 0.0)
    if killed is None or first_step is None:  # the restarted group never trained (e.g. its ranks never connected)
        why = next((line for _, line in reversed(run.lines) if "connectFullMesh" in line or "Error" in line), "")
        return f"failed ({why.strip()[:70]})"
    return first_step - killed


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lost-timeout", type=float, default=10.0)
    parser.add_argument("--cap", type=float, default=120.0)
    args = parser.parse_args()
    from accelkit.scaffold import init_project

    with tempfile.TemporaryDirectory(prefix="accelkit-bench-lost-") as temp:
        project = init_project(Path(temp) / "proj", "minimal", backend="ddp").directory
        shutil.copy(KILL_AT_STEP, project / KILL_AT_STEP.name)

        def show(value: float | None) -> str:
            return f"> {args.cap:.0f} s" if value is None else f"{value:.1f} s"

        print(f"loss of machine 1 -> machine 0's launcher exited (accelkit --lost-timeout {args.lost_timeout:g})")
        print(f"{'fault':<24}{'accelkit':>14}{'bare torchrun':>16}")
        for fault, label in (("crash", "crash (SIGKILL all)"), ("freeze", "unreachable (SIGSTOP)")):
            ours = loss_to_end(accelkit_nodes(project, args.lost_timeout), fault, args.cap)
            theirs = loss_to_end(torchrun_nodes(project), fault, args.cap)
            print(f"{label:<24}{show(ours):>14}{show(theirs):>16}", flush=True)
        print("\nrank 1 SIGKILLed at step 25 -> first step logged after resuming from checkpoint-20 (--max-restarts 1)")
        ours = restart_to_resumed_step(project, bare=False)
        theirs = restart_to_resumed_step(project, bare=True)
        cells = [f"{value:.1f} s" if isinstance(value, float) else value for value in (ours, theirs)]
        print(f"{'restart to step 30':<24}{cells[0]:>14}   {cells[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
