"""A per-rank probe for benchmarks/plan_accuracy.py's pipeline rows: after each optimizer's first step, the bytes
this rank holds of its parameters, their gradients and the optimizer's states (a DTensor's local shard), written
to $ACCELKIT_PROBE_DIR/pp_states.rank<R>.json with the pipeline stages the rank runs (from $ACCELKIT_PIPELINE).

The causal-lm template's pipeline keeps one plain torch optimizer per stage module, so the global optimizer step
hook sees each of them; gradients are still held then (the template zeroes them after the step).
"""

from __future__ import annotations

import os


def _local_bytes(tensor) -> int:
    if tensor is None:
        return 0
    tensor = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return tensor.numel() * tensor.element_size()


def install() -> None:
    from accelkit.ranks.probes import after_import, write_rank_result

    seen: dict[int, dict[str, int]] = {}

    def measure(optimizer, args, kwargs) -> None:
        if id(optimizer) in seen:
            return
        params = [p for group in optimizer.param_groups for p in group["params"]]
        moments = [value for state in optimizer.state.values() for key, value in state.items() if key != "step"]
        seen[id(optimizer)] = {"parameters": sum(_local_bytes(p) for p in params),
                               "gradients": sum(_local_bytes(p.grad) for p in params),
                               "optimizer": sum(_local_bytes(m) for m in moments)}
        totals = {key: sum(s[key] for s in seen.values()) for key in ("parameters", "gradients", "optimizer")}
        write_rank_result("pp_states", {"rank": int(os.environ.get("RANK", "0")),
                                        "pipeline": os.environ.get("ACCELKIT_PIPELINE", ""), "states": totals})

    def hook() -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        register_optimizer_step_post_hook(measure)

    after_import("torch.optim.optimizer", hook)
