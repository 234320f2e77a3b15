"""The decision tree, with its reason in one sentence.

1. The model fits on one GPU with DDP's replicas -> DDP (no sharding traffic; the fastest and simplest); on one
   GPU, the single-device run.
2. Several machines and a machine's GPUs hold a full shard -> FSDP hybrid (shards within a machine, replicates
   across them: the slow inter-node links carry only an all-reduce of each shard).
3. Replicated parameters fit but not all of the states -> ZeRO-2 (shards gradients and optimizer states, about
   DDP's traffic); with --prefer fsdp, FSDP grad-op.
4. A full shard fits -> FSDP full shard (or ZeRO-3 with --prefer deepspeed).
5. Only offloading to CPU memory fits -> FSDP + CPU offload (or ZeRO-3 + CPU offload), the one that fits.
6. Nothing fits -> what to change: activation checkpointing when activations dominate, a smaller micro-batch,
   more GPUs.
Among strategies that fit, the earlier step wins (less communication). --strategy NAME skips the tree.
Before an offload recommendation (or none) stands, api.py tries the cheaper remedies in order: activation
checkpointing, then N-D and pipeline layouts (nd.py); the reasons say what does not fit (the model states only when
they alone exceed the GPU).
"""

from __future__ import annotations

from dataclasses import dataclass

from accelkit.plan.estimate import Estimate
from accelkit.sizes import format_bytes


@dataclass(frozen=True)
class Recommendation:
    strategy: str | None  # None: nothing fits
    reason: str


def _fits(rows: dict[str, Estimate], name: str) -> bool:
    row = rows.get(name)
    return row is not None and row.fits is True


def recommend(estimates: list[Estimate], gpus: int, nodes: int, prefer: str, checkpointing: bool,
              chosen: str | None = None) -> Recommendation:
    rows = {e.strategy.name: e for e in estimates}
    if chosen is not None:
        row = rows[chosen]
        if row.gpu_fits and row.cpu_fits is not True:  # an offload row: the CPU side is what is short or unknown
            cpu = "not known: give --cpu-memory" if row.cpu_fits is None else "more than the CPU memory given"
            return Recommendation(chosen, f"{row.strategy.label} was asked for (--strategy); it fits the GPUs "
                                          f"({format_bytes(row.total)} per GPU) but needs "
                                          f"{format_bytes(row.cpu_per_node)} of CPU memory per machine ({cpu}).")
        verdict = {True: "fits", False: "does not fit", None: "cannot be judged (no GPU memory given)"}[row.fits]
        return Recommendation(chosen, f"{row.strategy.label} was asked for (--strategy); it {verdict} "
                                      f"({format_bytes(row.total)} per GPU).")
    if any(e.fits is None and e.unavailable is None for e in estimates):
        return Recommendation(None, "no GPU memory size: give --gpu-memory to judge what fits")
    fsdp_first = prefer != "deepspeed"
    if gpus == 1:
        if _fits(rows, "single"):
            return Recommendation("single", "The model, its optimizer states and activations fit on the one GPU, "
                                            "so no sharding or offload is needed.")
    elif _fits(rows, "ddp"):
        return Recommendation("ddp", "Every GPU holds a full replica with room to spare, so plain data parallelism "
                                     "(no sharding traffic, the fastest and simplest) is the right choice.")
    else:
        if nodes > 1 and _fits(rows, "fsdp-hybrid"):
            return Recommendation("fsdp-hybrid", "A full replica does not fit, but one machine's GPUs hold a full "
                                                 "shard: sharding within each machine and replicating across them "
                                                 "keeps the slow inter-node links to one all-reduce of a shard.")
        second = ("fsdp-grad-op", "zero2") if prefer == "fsdp" else ("zero2", "fsdp-grad-op")
        for name in second:
            if _fits(rows, name):
                return Recommendation(name, f"A full replica does not fit, but the parameters do: "
                                            f"{rows[name].strategy.label} shards only the gradients and optimizer "
                                            "states, at about DDP's communication cost.")
        for name in (("fsdp-full", "zero3") if fsdp_first else ("zero3", "fsdp-full")):
            if _fits(rows, name):
                return Recommendation(name, f"Parameters, gradients and optimizer states must all be sharded: "
                                            f"{rows[name].strategy.label} fits "
                                            f"({format_bytes(rows[name].total)} per GPU).")
    offloads = [n for n in (("fsdp-offload", "zero3-offload") if fsdp_first else ("zero3-offload", "fsdp-offload"))
                if _fits(rows, n)]
    if offloads:
        name = offloads[0]
        row = rows[name]
        shard = "Even fully sharded" if gpus > 1 else "On one GPU"
        plain = [e for e in estimates if e.unavailable is None and not e.strategy.offload]
        smallest = min(plain, key=lambda e: e.total) if plain else None
        if smallest is not None and smallest.gpu_usable is not None and \
                smallest.states.total <= smallest.gpu_usable:  # the states fit: say what does not
            short = (f"the model states fit ({format_bytes(smallest.states.total)} with "
                     f"{smallest.strategy.label}) but not with the activations and buffers "
                     f"({format_bytes(smallest.total)} in all)")
        else:
            short = "the model states do not fit in GPU memory"
        return Recommendation(name, f"{shard}, {short}; {row.strategy.label} keeps the states in CPU memory "
                                    f"({format_bytes(row.cpu_per_node)} per node) and needs "
                                    f"{format_bytes(row.total)} per GPU.")
    return Recommendation(None, _nothing_fits(estimates, checkpointing))


def _nothing_fits(estimates: list[Estimate], checkpointing: bool) -> str:
    runnable = [e for e in estimates if e.unavailable is None]
    cpu_bound = [e for e in runnable if e.gpu_fits and e.cpu_fits is not True]
    if cpu_bound:  # the GPUs would hold it with offload: CPU memory is what is short, or not known
        row = min(cpu_bound, key=lambda e: e.cpu_per_node)
        needs = (f"Nothing fits in GPU memory without offload; {row.strategy.label} fits the GPUs "
                 f"({format_bytes(row.total)} per GPU) but needs {format_bytes(row.cpu_per_node)} of CPU memory "
                 "per machine")
        if row.cpu_fits is None:
            return f"{needs}, and the CPU memory is not known: give --cpu-memory (each machine's RAM) to check it."
        return (f"{needs}, more than the {format_bytes(row.cpu_usable)} usable of the CPU memory given: CPU memory "
                "is the limit; use machines with more memory, or more machines (--num-machines), which split the "
                "offloaded states.")
    best = min(runnable, key=lambda e: e.total)
    activations = best.activations or 0
    if not checkpointing and activations > best.total / 3:
        fix = "add --activation-checkpointing (activations are the largest part)"
    else:
        fix = "use more GPUs or GPUs with more memory, or a smaller --micro-batch with gradient accumulation"
    return f"Nothing fits: the smallest option, {best.strategy.label}, needs {format_bytes(best.total)} per GPU; {fix}."
