"""Helpers for the rehearsal tests: a rehearsal plan for an Accelerate config dict as a file holds it."""

from __future__ import annotations

from typing import Any

from accelkit.configs.reader import read_config
from accelkit.errors import AccelkitError
from accelkit.rehearsal import rehearse
from accelkit.rehearsal.cpu_config import RehearsalPlan


def rehearse_dict(config: dict[str, Any]) -> RehearsalPlan:
    """`rehearse` for an Accelerate config dict taken as it is (nothing filled in): read it with the typed reader,
    refuse what it cannot model, then rehearse the typed config (what `accelkit launch --cpu --config FILE` does)."""
    resolved, found = read_config(config)
    if resolved is None and not any(f.is_error for f in found):
        raise AccelkitError(f"distributed_type {config.get('distributed_type')} cannot be rehearsed on CPU.",
                            hint="CPU rehearsal covers single, cpu, ddp (MULTI_GPU), fsdp and deepspeed")
    refused = [f for f in found if f.is_error or f.code == "unmodeled-value"]
    if refused:
        raise refused[0].to_error()
    assert resolved is not None
    return rehearse(resolved)
