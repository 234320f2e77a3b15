"""Whether the original stopped for want of a GPU, and the environment that runs it again with its CUDA calls
rehearsed on the CPU (accelkit.rehearsal's one-GPU mode).

`--check` hides GPUs from both runs, so an original written for one GPU (`.cuda()`, `.to(0)`, nccl, DataParallel,
`assert torch.cuda.is_available()`) stops at its first CUDA call. The original is first run as it is; only when
its failure names CUDA (the error or the failing lines of its traceback: "Torch not compiled with CUDA enabled",
"Cannot access accelerator device", `torch.cuda.set_device`, "nccl") is it run again, in a fresh sandbox, with
the rehearsal. If that run stops with the same error, CUDA was not what stopped it: the first run is the one
reported. A script that runs on the CPU by itself is never rehearsed, and the conversion never is.
"""

from __future__ import annotations

import re

REHEARSAL_MODE = "one-gpu"  # the value of accelkit.rehearsal.REHEARSAL_ENV for one process whose CUDA runs on CPU
# what a failure for want of a GPU names (a CPU-only run has no other reason to name a GPU: `sys.exit("needs a GPU")`)
CUDA_WORDS = re.compile(r"cuda|nccl|nvidia|accelerator device|\bgpus?\b", re.IGNORECASE)
TRACEBACK = "Traceback (most recent call last):"


def failed_for_cuda(status: int | None, stderr: str) -> bool:
    """True when a run that failed (not stopped) failed at a CUDA call: its last traceback names CUDA."""
    if status in (0, None):
        return False
    start = stderr.rfind(TRACEBACK)
    tail = stderr[start:] if start >= 0 else "\n".join(stderr.splitlines()[-5:])
    return bool(CUDA_WORDS.search(tail))


def rehearsal_env() -> dict[str, str]:
    from accelkit.rehearsal import REHEARSAL_ENV

    return {REHEARSAL_ENV: REHEARSAL_MODE}
