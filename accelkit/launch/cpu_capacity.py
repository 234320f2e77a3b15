"""How many CPU ranks this machine can hold: a rehearsal of N ranks really starts N Python processes here.

Each rank imports torch and Accelerate before its first step: measured on the build machine (torch 2.13 CPU,
accelerate 1.15, 2026-11-24) a rank holds about 225 MiB resident before its model exists. A rehearsal whose ranks
cannot all hold that much is refused before any starts; one with many more ranks than cores runs, with a warning
(every collective waits for the slowest rank, and ranks that share a core make each step slower, not faster).
"""

from __future__ import annotations

from dataclasses import dataclass

from accelkit.errors import AccelkitError

RANK_BYTES = 225 * 2**20  # resident memory of one rank after `import torch, accelerate` (measured, see above)
RANKS_PER_CORE_WARNING = 4  # above this, the rehearsal is mostly waiting for a core


@dataclass(frozen=True)
class Machine:
    cores: int
    available_bytes: int


def this_machine() -> Machine:
    import psutil

    from accelkit.hardware import cpu_cores

    return Machine(cores=cpu_cores(), available_bytes=psutil.virtual_memory().available)


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def check_cpu_ranks(ranks: int, machine: Machine | None = None) -> list[str]:
    """Refuse `ranks` CPU processes this machine cannot hold; return a warning line when they far exceed its
    cores. `ranks` counts the processes that start on this machine (per machine, not the world size)."""
    machine = machine or this_machine()
    need = ranks * RANK_BYTES
    if need > machine.available_bytes:
        fit = max(machine.available_bytes // RANK_BYTES, 1)
        raise AccelkitError(f"{ranks} CPU processes need at least {_gib(need)} (about {RANK_BYTES // 2**20} MiB "
                            f"each before the model), and this machine has {_gib(machine.available_bytes)} free",
                            hint=f"rehearse on at most {fit} processes (--num-processes {min(fit, 8)} shows the "
                                 "same sharding logic on a small scale)")
    if ranks > RANKS_PER_CORE_WARNING * machine.cores:
        return [f"{ranks} CPU processes on {machine.cores} cores: every rank waits for a core, so steps will be "
                f"slow and long collectives may time out; {machine.cores * 2} processes or fewer rehearse faster"]
    return []
