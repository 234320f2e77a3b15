"""The strategies the plan compares, one row each, in the order the table shows them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Strategy:
    name: str  # what --strategy and the JSON call it
    label: str  # what the table calls it
    family: str  # torch (one device / DDP) | fsdp (FSDP2) | deepspeed
    sharding: str | None = None  # FSDP: full | grad-op | hybrid
    zero_stage: int | None = None
    offload: bool = False
    distributed: bool = True  # False: one device

    def not_applicable(self, gpus: int, nodes: int) -> str | None:
        """Why this strategy cannot run on this hardware (None when it can)."""
        if not self.distributed and gpus > 1:
            return None  # one GPU of many: still a reference row
        if self.distributed and gpus == 1 and not self.offload:
            if self.family == "deepspeed":
                return (f"ZeRO-{self.zero_stage} on 1 GPU shards nothing (every partition is the whole model): "
                        "no memory saved; ZeRO's benefit on one GPU is CPU offload (zero3-offload)")
            if self.family == "fsdp":
                return "FSDP on 1 GPU shards nothing; its benefit on one GPU is CPU offload (fsdp-offload)"
            return "DDP needs 2+ GPUs"
        if self.sharding == "hybrid" and nodes < 2:
            return ("hybrid sharding replicates across machines and shards within one: it needs --num-machines 2 "
                    "or more")
        return None


STRATEGIES: tuple[Strategy, ...] = (
    Strategy("single", "single GPU", "torch", distributed=False),
    Strategy("ddp", "DDP", "torch"),
    Strategy("fsdp-full", "FSDP full shard", "fsdp", sharding="full"),
    Strategy("fsdp-grad-op", "FSDP grad-op", "fsdp", sharding="grad-op"),
    Strategy("fsdp-hybrid", "FSDP hybrid", "fsdp", sharding="hybrid"),
    Strategy("zero1", "ZeRO-1", "deepspeed", zero_stage=1),
    Strategy("zero2", "ZeRO-2", "deepspeed", zero_stage=2),
    Strategy("zero3", "ZeRO-3", "deepspeed", zero_stage=3),
    Strategy("fsdp-offload", "FSDP + CPU offload", "fsdp", sharding="full", offload=True),
    Strategy("zero3-offload", "ZeRO-3 + CPU offload", "deepspeed", zero_stage=3, offload=True),
)
BY_NAME = {s.name: s for s in STRATEGIES}
