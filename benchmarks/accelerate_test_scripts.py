"""CPU rehearsal measured against the multi-process test scripts Accelerate's own CI runs on GPUs.

Finds the scripts shipped in the installed Accelerate (`accelerate/test_utils/scripts/`), runs each (script,
backend) pair Accelerate's CI uses through

    accelkit launch --cpu --backend B --num-processes 2 SCRIPT

and prints one row per script: for each backend `pass` (exit 0), `explained` (stopped with one `Error:` line and a
`Hint:`, no traceback: something that cannot work on CPU, named with the way out) or `FAIL` (anything else: a
traceback, a stall the watchdog had to stop, a crash), with the wall time, and what happened.

    python benchmarks/accelerate_test_scripts.py                     # every pair (about 10 minutes on 2 cores)
    python benchmarks/accelerate_test_scripts.py --only test_ops.py  # some scripts only
    python benchmarks/accelerate_test_scripts.py --markdown          # the table in docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

# (script, backend, extra accelkit options): the pairs Accelerate's CI runs on multi-GPU machines, plus the
# variants the outcome of one of them points to.
PAIRS: list[tuple[str, str, tuple[str, ...]]] = [
    ("test_script.py", "ddp", ()),
    ("test_script.py", "fsdp", ()),
    ("test_script.py", "deepspeed", ()),
    ("test_ops.py", "ddp", ()),
    ("test_ops.py", "fsdp", ()),
    ("test_ops.py", "deepspeed", ()),
    ("test_sync.py", "ddp", ()),
    ("test_sync.py", "fsdp", ()),
    ("test_sync.py", "deepspeed", ()),
    ("test_distributed_data_loop.py", "ddp", ()),
    ("test_merge_weights.py", "fsdp", ()),
    ("test_merge_weights.py", "fsdp", ("--fsdp-version", "1")),
    ("test_ddp_comm_hook.py", "ddp", ()),
]
STALL_TIMEOUT = "120"  # seconds: a rehearsal of these tiny models never sits idle that long unless it hangs
# DeepSpeed JIT-builds its shared-memory comm op into ~/.cache/torch_extensions on first use (a minute or two); one
# cache per virtualenv keeps other venvs on the machine from invalidating it, so DeepSpeed rows time the rehearsal,
# not the compiler (the first DeepSpeed row after a fresh install includes the build).
EXTENSIONS = Path.home() / ".cache" / "torch_extensions" / f"accelkit-bench-{Path(sys.prefix).name}"


@dataclass
class Outcome:
    script: str
    backend: str
    extra: tuple[str, ...]
    verdict: str  # pass / explained / FAIL
    seconds: float
    detail: str  # the Error line (explained), the last line of stderr (FAIL), or ""

    @property
    def column(self) -> str:
        return self.backend + (" " + " ".join(self.extra) if self.extra else "")


def scripts_dir() -> Path:
    import accelerate

    return Path(accelerate.__file__).resolve().parent / "test_utils" / "scripts"


def classify(returncode: int, stderr: str) -> tuple[str, str]:
    errors = [line for line in stderr.splitlines() if line.startswith("Error:")]
    traceback = "Traceback (most recent call last)" in stderr
    if returncode == 0:
        return "pass", ""
    if len(errors) == 1 and "  Hint:" in stderr and not traceback and "stalled" not in errors[0]:
        return "explained", errors[0].removeprefix("Error: ")
    last = errors[-1] if errors else next((line for line in reversed(stderr.splitlines()) if line.strip()), "")
    return "FAIL", f"exit {returncode}: {last.strip()[:300]}"


def run_pair(script: Path, backend: str, extra: tuple[str, ...], timeout: float = 1500) -> Outcome:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_EXTENSIONS_DIR": str(EXTENSIONS)}
    command = [sys.executable, "-m", "accelkit", "launch", "--cpu", "--backend", backend, "--num-processes", "2",
               "--stall-timeout", STALL_TIMEOUT, *extra, str(script)]
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as cwd:  # some scripts write checkpoints into the current directory
        try:
            proc = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
            verdict, detail = classify(proc.returncode, proc.stderr)
        except subprocess.TimeoutExpired:
            verdict, detail = "FAIL", f"still running after {timeout:.0f} s"
    detail = detail.replace(f"{script.parent}/", "")  # name the script as the table does
    return Outcome(script.name, backend, extra, verdict, time.monotonic() - start, detail)


def markdown(outcomes: list[Outcome]) -> str:
    columns = list(dict.fromkeys(o.column for o in outcomes))
    rows = ["| script | " + " | ".join(columns) + " | what happened |",
            "|---|" + "---|" * len(columns) + "---|"]
    for script in dict.fromkeys(o.script for o in outcomes):
        cells, notes = [], []
        for column in columns:
            found = [o for o in outcomes if o.script == script and o.column == column]
            cells.append(f"{found[0].verdict} ({found[0].seconds:.0f} s)" if found else "–")
            notes += [f"{o.column}: {o.detail}" for o in found if o.detail]
        rows.append(f"| {script} | " + " | ".join(cells) + " | " + "; ".join(notes).replace("|", "\\|") + " |")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", action="append", default=[], metavar="SCRIPT[:BACKEND]",
                        help="run only these scripts (or script:backend pairs); repeatable")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown (docs/benchmarks.md)")
    args = parser.parse_args()
    folder = scripts_dir()
    wanted = [(s, b, e) for s, b, e in PAIRS if not args.only or s in args.only or f"{s}:{b}" in args.only]
    import accelerate
    import torch

    print(f"accelerate {accelerate.__version__}, torch {torch.__version__}, scripts from {folder}; "
          f"2 CPU ranks each, load average {os.getloadavg()[0]:.1f} at the start", flush=True)
    outcomes = []
    for script, backend, extra in wanted:
        outcome = run_pair(folder / script, backend, extra)
        outcomes.append(outcome)
        print(f"{outcome.verdict:<10} {outcome.seconds:6.1f} s  {script} --backend {outcome.column}"
              + (f"\n           {outcome.detail}" if outcome.detail else ""), flush=True)
    if args.markdown:
        print()
        print(markdown(outcomes))
    print(f"\n{sum(o.verdict == 'pass' for o in outcomes)} pass, {sum(o.verdict == 'explained' for o in outcomes)} "
          f"explained, {sum(o.verdict == 'FAIL' for o in outcomes)} fail; load average {os.getloadavg()[0]:.1f} "
          "at the end")
    return 0 if all(o.verdict != "FAIL" for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
