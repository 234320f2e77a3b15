"""The per-rank side of the stall watchdog: a probe (see bootstrap) the supervisor adds to every watched launch.

`install()` runs in each rank before the script, on CPU rehearsals and GPUs alike, and makes the rank observable
without changing what the script does:
- faulthandler dumps every thread's Python stack to the rank's `.stack` file on STACK_SIGNAL (the supervisor
  asks for it when the job stalls) and to its `.crash` file if the rank dies of SIGSEGV/SIGABRT/... (the launcher
  then names the signal and the line);
- a global optimizer step hook (torch's `register_optimizer_step_post_hook`, installed when the script imports
  torch.optim) counts optimizer steps in a memory-mapped counter;
- in a group torchrun restarted, the ranks rendezvous under the attempt's own keys (accelkit.ranks.restart_store);
- `Accelerator.load_state` records the checkpoint the rank resumed from (accelkit.ranks.resume_record);
- stdout and stderr become line-buffered, so each printed line reaches the console (and the supervisor's view of
  the rank's writes) when it is printed, as on a terminal, not 8 KB later;
- last, the rank registers itself (`<pid>.json`): from then on the supervisor may signal it.
Without $ACCELKIT_WATCH_DIR (a `--dry-run` command pasted into a shell) it does nothing.
"""

from __future__ import annotations

import faulthandler
import io
import os
import signal
import sys
import threading
from pathlib import Path

from accelkit.ranks import restart_store
from accelkit.ranks.probes import after_import
from accelkit.ranks.rank_files import STACK_SIGNAL, WATCH_DIR_ENV, RankFiles, RankInfo, StepCounter, write_info
from accelkit.ranks.resume_record import hook_load_state
from accelkit.rehearsal import REHEARSAL_ENV

_open_files: list[io.TextIOBase] = []  # faulthandler writes to their descriptors for the life of the process


def _cpu_job() -> bool:
    use_cpu = os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes")
    return bool(os.environ.get(REHEARSAL_ENV)) or use_cpu or os.environ.get("CUDA_VISIBLE_DEVICES") == ""


def _count_optimizer_steps(counter: StepCounter) -> None:
    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_optimizer_step_post_hook(lambda optimizer, args, kwargs: counter.increment())


def _line_buffered(stream) -> None:
    if isinstance(stream, io.TextIOWrapper) and not stream.line_buffering:
        stream.reconfigure(line_buffering=True)


def install() -> None:
    folder = os.environ.get(WATCH_DIR_ENV)
    if not folder:
        return
    files = RankFiles.of(Path(folder), os.getpid())
    files.folder.mkdir(parents=True, exist_ok=True)
    stack = open(files.stack, "w", encoding="utf-8")  # noqa: SIM115 (kept open: faulthandler writes to it)
    crash = open(files.crash, "w", encoding="utf-8")  # noqa: SIM115
    _open_files.extend([stack, crash])
    faulthandler.register(STACK_SIGNAL, file=stack, all_threads=True, chain=False)
    faulthandler.enable(file=crash, all_threads=True)
    counter = StepCounter(files.steps)
    after_import("torch.optim.optimizer", lambda: _count_optimizer_steps(counter))
    after_import("accelerate.accelerator", lambda: hook_load_state(files))  # which checkpoint a restart resumed
    restart_store.install()
    _line_buffered(sys.stdout)
    _line_buffered(sys.stderr)
    if os.environ.get("ACCELKIT_JOB_BOARD") and signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL:
        # In a cluster job SIGUSR1 asks the ranks to save and stop (accelkit.launch.cluster.node repeats it until
        # they end);
        # one that comes before the script installed its handler is ignored rather than fatal.
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    write_info(files, RankInfo(pid=os.getpid(), rank=int(os.environ.get("RANK", "0")),
                               local_rank=int(os.environ.get("LOCAL_RANK", "0")),
                               main_thread=threading.main_thread().ident or 0, cpu_job=_cpu_job()))
