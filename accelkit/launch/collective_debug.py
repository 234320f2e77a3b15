"""Debug settings a GPU launch turns on so that a hung collective explains itself (no effect on CPU/gloo).

NCCL's flight recorder keeps the last collectives of every rank in a ring buffer; with it on, a collective that
times out (torch's NCCL watchdog, 10 minutes by default) makes every rank dump that buffer, and with desync
debugging the timeout message says which rank did not join. Read the dumps (`/tmp/nccl_trace_rank_<N>` by default;
TORCH_NCCL_DEBUG_INFO_TEMP_FILE moves them) with `torchfrtrace` (torch.distributed.flight_recorder). Values the user
already exported win. TORCH_DISTRIBUTED_DEBUG=DETAIL is not set: it wraps every collective in an extra check
(1.2-3.8x slower collectives on gloo, measured by benchmarks/distributed_debug.py) and, on torch 2.13, makes
DistributedDataParallel's constructor segfault on CPU.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

NCCL_DEBUG_ENV = {
    "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",  # flight recorder: the last 2000 collectives of each rank
    "TORCH_FR_BUFFER_SIZE": "2000",  # the same setting under its newer name
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",  # dump the recorder when a collective times out
    "TORCH_NCCL_DESYNC_DEBUG": "1",  # and say which rank is out of step
}


def gpu_debug_env(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The flight-recorder settings for a GPU launch's ranks, minus those already set in `environ`."""
    return {name: value for name, value in NCCL_DEBUG_ENV.items() if name not in environ}
