"""Whether the installed libraries can run an N-D layout, found in their own source before any rank starts.

Each check reads the installed packages' files (never importing them: `config --check` and `launch` stay fast) for
the one thing a layout needs that a release removed or has not yet added, and says in one line which layout, which
packages, and which versions work. The version table (measured on torch 2.13 CPU, 2026-11-24; the workaround
2026-11-28):

    layout           needs                                                            works with
    FSDP2 x TP       accelerate 1.10 to 1.15's FSDP2+TP preparation imports           transformers 5.0.0 as released
                     transformers' `integrations.tensor_parallel.ReplicateParallel`:  (dp_shard 2 x tp 2 and HSDP x TP
                     added in 4.52, removed in 5.1.0. Without it, accelkit's          with accelerate 1.15, torch
                     workaround (accelkit.ranks.fsdp2_tp_compat) provides the class   2.13; constraints/nd-layouts.txt);
                     and applies the model's TP plan with transformers'               transformers 5.24 through the
                     `distributed.tensor_parallel.apply_tensor_parallelism`           workaround (the same runs, the
                                                                                      default install); 4.51.3 and
                                                                                      releases with neither: refused
    TP (any)         accelerate >= 1.10 (ParallelismConfig)
    CP               torch's `torch.distributed.tensor.experimental.context_parallel`  torch 2.13 (tested)
    SP               DeepSpeed's `runtime.sequence_parallel.ulysses_sp` (ALST)         deepspeed 0.19.8 (tested)
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from accelkit.envinfo import installed_version
from accelkit.package_files import (
    fsdp2_tp_workaround_needed,
    package_file,
    replicate_parallel_missing,
    tp_plan_applicable,
)

__all__ = ["FSDP2_TP_WORKS", "Gap", "fsdp2_tp_workaround_needed", "gaps", "installed_layout_gaps"]

# The transformers releases that define ReplicateParallel (checked in the released wheels: 4.51.3 no, 4.52.4 to
# 4.57.6 yes, 5.0.0 yes, 5.1.0 to 5.12.1 no). 5.0.0 is the one run here unpatched (tests/integration/
# test_nd_rehearsal.py in CI's second N-D leg, constraints/nd-layouts.txt): it needs tokenizers <0.23.1 and
# huggingface-hub <2. The newest (5.24) runs the same tests through the workaround in the default environment.
FSDP2_TP_WORKS = ("the newest transformers (5.24 tested, through accelkit's workaround: pip install -U transformers) "
                  "or transformers 5.0.0 with accelerate 1.15 and torch 2.13 (pip install 'transformers==5.0.0' "
                  "'tokenizers<0.23.1' 'huggingface-hub<2'; 4.52 to 4.57 also have the class)")


@dataclass(frozen=True)
class Gap:
    """One layout the installed packages cannot run."""

    layout: str
    message: str  # one line: layout, packages and versions installed, what is missing
    hint: str  # the versions that work


def _versions(*dists: str) -> str:
    return " + ".join(f"{dist} {installed_version(dist) or 'not installed'}" for dist in dists)


def fsdp2_tp_gap() -> Gap | None:
    """FSDP2 x TP cannot start: Accelerate imports the removed class and transformers has nothing to replace it."""
    if not replicate_parallel_missing() or tp_plan_applicable():
        return None
    return Gap("FSDP2 x TP", f"FSDP2 x TP cannot start with {_versions('accelerate', 'transformers')}: "
               "Accelerate's FSDP2+TP preparation imports transformers.integrations.tensor_parallel.ReplicateParallel, "
               "which this transformers no longer has (ImportError on every rank), and it lacks transformers."
               "distributed.tensor_parallel.apply_tensor_parallelism, which accelkit's workaround uses",
               f"works with {FSDP2_TP_WORKS}; or drop tensor parallelism (--tp-size 1) with these versions")


def parallelism_config_gap() -> Gap | None:
    if package_file("accelerate", "parallelism_config.py") is not None:
        return None
    return Gap("N-D", f"N-D parallelism needs Accelerate's ParallelismConfig, which {_versions('accelerate')} lacks",
               "pip install 'accelerate>=1.10'")


def context_parallel_gap() -> Gap | None:
    if package_file("torch", "distributed", "tensor", "experimental", "_attention.py") is not None or \
            package_file("torch", "distributed", "tensor", "experimental", "_context_parallel") is not None:
        return None
    return Gap("CP", f"context parallelism needs torch's context_parallel, which {_versions('torch')} lacks",
               "pip install 'torch>=2.13' (the version tested)")


def sequence_parallel_gap() -> Gap | None:
    if package_file("deepspeed", "runtime", "sequence_parallel", "ulysses_sp.py") is not None:
        return None
    return Gap("SP", f"sequence parallelism needs DeepSpeed's Ulysses/ALST (runtime.sequence_parallel.ulysses_sp), "
               f"which {_versions('deepspeed')} lacks", "pip install 'deepspeed>=0.19' (the version tested)")


def gaps(*, fsdp2: bool, tp: int, cp: int, sp: int) -> Iterator[Gap]:
    """What the installed packages lack for this layout (nothing: it can start)."""
    if max(tp, cp, sp) > 1 or fsdp2:
        found = parallelism_config_gap()
        if found:
            yield found
            return
    checks = ((fsdp2 and tp > 1, fsdp2_tp_gap), (cp > 1, context_parallel_gap), (sp > 1, sequence_parallel_gap))
    for wanted, gap in checks:
        found = gap() if wanted else None
        if found:
            yield found


def installed_layout_gaps() -> list[Gap]:
    """Every N-D layout the installed packages cannot run (for `accelkit env`)."""
    checks = (parallelism_config_gap, fsdp2_tp_gap, context_parallel_gap, sequence_parallel_gap)
    return [gap for gap in (check() for check in checks) if gap is not None]
