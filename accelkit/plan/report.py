"""A plan for people (one table, the recommendation, where the figures come from) and for machines (JSON)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from accelkit.plan import spine
from accelkit.plan.estimate import CPU_RESERVE, CUDA_RESERVE, FRAGMENTATION, Estimate
from accelkit.plan.planner import FAMILY_LABEL, Plan
from accelkit.sizes import format_bytes, format_count

COLUMNS = ("strategy", "params", "grads", "optim", "activ", "buffers", "total/GPU", "CPU/node", "fits (headroom)",
           "comm/step")


@dataclass(frozen=True)
class Commands:
    config: str
    launch: str
    config_path: str


def commands(plan: Plan, config_path: str | None = None, script: str | None = None) -> Commands | None:
    chosen = plan.chosen
    if chosen is None:
        return None
    path = config_path or f"plan-{chosen.strategy.name}.yaml"
    options = spine.config_options_for(chosen.strategy, plan.hardware, plan.training, chosen.accumulation)
    if plan.compression is not None:  # the config command carries --grad-compression where the strategy takes it
        from contextlib import suppress
        from pathlib import Path

        from accelkit.compression.plan_config import options_with_compression
        from accelkit.errors import AccelkitError

        with suppress(AccelkitError):  # not applicable: the notes say so, and --write-config refuses it
            options = options_with_compression(options, chosen.strategy, plan.compression, Path(path))
    return Commands(spine.config_command(options, path),
                    spine.launch_command(path, script or str(plan.spec.script or "your_script.py"),
                                         chosen.strategy, chosen.accumulation, plan.hardware.nodes), path)


def unit(plan: Plan) -> tuple[str, int]:
    """The table's unit: GiB for real models, MiB or KiB for the tiny ones (so they do not read as all zeros)."""
    largest = max((r.total for r in plan.rows if r.unavailable is None), default=0)
    for name, size in (("GiB", 2**30), ("MiB", 2**20)):
        if largest >= size:
            return name, size
    return "KiB", 2**10


def _fits(row: Estimate, size: int) -> str:
    if row.unavailable is not None:
        return "n/a"
    if row.headroom is None:
        return "?"
    sign = "+" if row.headroom >= 0 else "-"
    verdict = "yes" if row.fits else "no"
    if row.cpu_fits is False:
        verdict = "no (CPU)"
    elif row.cpu_fits is None:
        verdict = "no (CPU?)"
    return f"{verdict} ({sign}{abs(row.headroom) / size:.1f})"


def table(plan: Plan) -> list[str]:
    _, size = unit(plan)

    def fmt(n: int | None) -> str:
        return "-" if n is None else f"{n / size:.2f}"

    cells = [COLUMNS]
    for row in plan.rows:
        s = row.states
        if row.unavailable is not None:
            cells.append((row.strategy.label, *["-"] * 7, "n/a", "-"))
            continue
        cells.append((
            row.strategy.label + (" *" if plan.recommendation.strategy == row.strategy.name else ""),
            fmt(s.parameters), fmt(s.gradients), fmt(s.optimizer), fmt(row.activations), fmt(row.buffers),
            fmt(row.total), fmt(row.cpu_per_node) if row.cpu_per_node else "-", _fits(row, size),
            fmt(row.traffic.network)))
    widths = [max(len(r[i]) for r in cells) for i in range(len(COLUMNS))]
    lines = []
    for index, r in enumerate(cells):
        lines.append("  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r)))
        if index == 0:
            lines.append("  ".join("-" * w for w in widths))
    return lines


def _why_no_plain_sharding(plan: Plan) -> str | None:
    """For an offload recommendation: the best plain sharding and what makes it too big."""
    chosen = plan.chosen
    if chosen is None or not chosen.strategy.offload or plan.hardware.gpus == 1:
        return None
    plain = [r for r in plan.rows if r.unavailable is None and not r.strategy.offload and r.strategy.distributed]
    best = min(plain, key=lambda r: r.total)
    usable = best.gpu_usable or 0
    states = best.states.total
    what = f"its model states alone ({format_bytes(states)})" if states > usable else \
        f"model states {format_bytes(states)} + activations {format_bytes(best.activations or 0)} + buffers " \
        f"{format_bytes(best.buffers)}"
    return (f"Without offload the smallest option, {best.strategy.label}, needs {format_bytes(best.total)} per GPU: "
            f"{what} exceed the {format_bytes(usable)} usable of each GPU.")


def text(plan: Plan, config_path: str | None = None, script: str | None = None,
         layout_lines: list[str] | None = None) -> list[str]:
    shape, hw, tr = plan.shape, plan.hardware, plan.training
    src = hw.sources
    lines = [f"Model:     {plan.spec.label}",
             f"           {shape.name}, {format_count(shape.parameters)} parameters ({shape.parameters:,}; "
             f"{'built on the meta device' if shape.exact else 'count given'})"]
    gpu = format_bytes(hw.gpu_memory) if hw.gpu_memory else "unknown"
    cpu = format_bytes(hw.cpu_memory) if hw.cpu_memory else "not checked (give --cpu-memory)"
    lines.append(f"Hardware:  {hw.gpus} GPU(s) x {gpu} ({src.get('gpu_memory', '')}) on {hw.nodes} machine(s); "
                 f"CPU memory per machine: {cpu}" + (f" ({src.get('cpu_memory', '')})" if hw.cpu_memory else ""))
    ckpt = "activation checkpointing" if tr.activation_checkpointing else "no activation checkpointing"
    per_sample = f" x sequence {tr.seq_len}" if plan.spec.sequence_input else ""
    lines.append(f"Training:  {tr.precision}, {tr.optimizer}, micro-batch {tr.micro_batch}{per_sample} per GPU, "
                 f"{ckpt}")
    lines += ["", *table(plan), ""]
    name, _ = unit(plan)
    lines.append(f"{name} per GPU (the worst rank; CPU/node: per machine); fits: after keeping 1 GiB + 10% of "
                 f"each GPU for what is not modelled; comm: {name} sent per GPU per optimizer step; * recommended.")
    cpu_rows = [r for r in plan.rows if r.unavailable is None and r.cpu_per_node]
    if any(r.cpu_fits is None for r in cpu_rows):
        lines.append("  no (CPU?): CPU memory not known, so offload is not judged to fit: give --cpu-memory "
                     "(each machine's RAM).")
    if any(r.cpu_fits is False for r in cpu_rows):
        lines.append("  no (CPU): the offloaded states need more than the usable CPU memory per machine (90% of "
                     "it).")
    for row in plan.rows:
        if row.unavailable is not None and row.strategy.name != "single":
            lines.append(f"  n/a {row.strategy.label}: {row.unavailable}")
    lines += layout_lines or []
    lines.append("")
    rec = plan.recommendation
    choice = plan.layout_choice
    if choice is not None:
        layout = (choice.best or choice.rows[0]).layout
        reason = choice.reason[:1].upper() + choice.reason[1:]
        lines.append(f"Recommendation: {layout.describe()} ({layout.name}). {reason}.")
        lines += [f"  {command}" for command in choice.commands]
        if plan.hardware.nodes > 1:
            lines.append(f"  {spine.MACHINES_NOTE}")
    elif rec.strategy is None:
        lines.append(f"Recommendation: none. {rec.reason}")
    else:
        lines.append(f"Recommendation: {plan.chosen.strategy.label} ({rec.strategy}). {rec.reason}")
        why = _why_no_plain_sharding(plan)
        if why:
            lines.append(f"  {why}")
        cmd = commands(plan, config_path, script)
        lines += [f"  {cmd.config}", f"  {cmd.launch}"]
        if hw.nodes > 1:
            lines.append(f"  {spine.MACHINES_NOTE}")
        if tr.activation_checkpointing and plan.chosen.strategy.family != "fsdp":
            lines.append("  Activation checkpointing: call model.gradient_checkpointing_enable() in the script "
                         "(only FSDP configs switch it on).")
    lines += _batch_lines(plan)
    lines += ["", "Where the figures come from:"]
    lines.append("  params/grads/optim: each backend's layout computed per rank from the parameter shapes "
                 "(padding included; measured exact in CPU rehearsals).")
    for family, acts in plan.activations.items():
        lines.append(f"  activations ({FAMILY_LABEL[family]}): {acts.source}")
    if plan.chosen is not None:
        for part in plan.chosen.parts:
            lines.append(f"  buffers: {part.what} {format_bytes(part.bytes)}: {part.source}")
    lines.append(f"  not modelled: CUDA context, kernels' workspaces, allocator fragmentation (headroom kept: "
                 f"{format_bytes(CUDA_RESERVE)} + {FRAGMENTATION:.0%} per GPU; {CPU_RESERVE:.0%} of CPU memory).")
    for note in plan.notes:
        lines.append(f"Note: {note}")
    return lines


def _batch_lines(plan: Plan) -> list[str]:
    tr = plan.training
    effective, micro, world, steps, what = plan.batch()
    unplanned = " (if it ran as data parallelism over every GPU: nothing above fits)" \
        if plan.chosen is None and plan.layout_choice is None else ""
    lines = [f"Batch:     effective batch {effective} = micro-batch {micro} x {world} data-parallel rank(s) x "
             f"{steps} {what}{unplanned}"]
    lr = plan.learning_rate()
    if lr is not None:
        lines.append(f"Learning rate: {lr.linear:.3g} = {lr.base_lr:g} x {effective}/{lr.base_batch} (linear "
                     f"scaling, x{lr.factor:g}); warm it up linearly over the first ~5% of steps (Goyal et al. "
                     f"2017)." + (f" With Adam-type optimizers square-root scaling ({lr.sqrt:.3g}) is the safer "
                                  f"start when the factor is large." if lr.factor > 4 and "adam" in tr.optimizer
                                  else ""))
    return lines


def to_json(plan: Plan, config_path: str | None = None, script: str | None = None) -> dict[str, Any]:
    shape, hw, tr = plan.shape, plan.hardware, plan.training
    cmd = commands(plan, config_path, script)
    lr = plan.learning_rate()
    return {
        "model": {"name": shape.name, "source": plan.spec.label, "parameters": shape.parameters,
                  "trainable": shape.trainable, "tensors": len(shape.tensors or ()), "dims": shape.dims,
                  "exact": shape.exact},
        "hardware": {"gpus": hw.gpus, "nodes": hw.nodes, "gpu_memory_bytes": hw.gpu_memory,
                     "cpu_memory_bytes": hw.cpu_memory, "sources": hw.sources},
        "training": {"precision": tr.precision, "optimizer": tr.optimizer, "seq_len": tr.seq_len,
                     "micro_batch": tr.micro_batch, "activation_checkpointing": tr.activation_checkpointing,
                     "global_batch": tr.global_batch, "sources": tr.sources},
        "activations": {family: {"bytes": a.bytes, "weight_copies": a.weight_copies, "source": a.source}
                        for family, a in plan.activations.items()},
        "strategies": [_row_json(row) for row in plan.rows],
        "recommendation": _recommendation_json(plan, cmd),
        "learning_rate": None if lr is None else {"effective_batch": lr.effective_batch, "base_lr": lr.base_lr,
                                                  "base_batch": lr.base_batch, "linear": lr.linear, "sqrt": lr.sqrt},
        "headroom": {"cuda_reserve_bytes": CUDA_RESERVE, "fragmentation": FRAGMENTATION, "cpu_reserve": CPU_RESERVE},
        "device": plan.device,
        "notes": plan.notes,
    }


def _recommendation_json(plan: Plan, cmd: Commands | None) -> dict[str, Any]:
    choice = plan.layout_choice
    if choice is not None:
        row = choice.best or choice.rows[0]
        return {"strategy": None, "layout": row.layout.name, "backend": row.layout.backend, "kind": "layout",
                "fits": row.fits, "total_bytes": row.total, "reason": choice.reason,
                "command": " && ".join(choice.commands), "config_command": choice.commands[0],
                "launch_command": choice.commands[1]}
    return {"strategy": plan.recommendation.strategy, "layout": None, "kind": "strategy" if cmd else None,
            "reason": plan.recommendation.reason, "command": f"{cmd.config} && {cmd.launch}" if cmd else None,
            "config_command": cmd.config if cmd else None, "launch_command": cmd.launch if cmd else None}


def _row_json(row: Estimate) -> dict[str, Any]:
    s = row.states
    return {
        "name": row.strategy.name, "label": row.strategy.label, "applicable": row.unavailable is None,
        "unavailable": row.unavailable,
        "per_gpu_bytes": {"parameters": s.parameters, "gradients": s.gradients, "optimizer": s.optimizer,
                          "activations": row.activations or 0, "buffers": row.buffers, "total": row.total},
        "buffers": [{"what": p.what, "bytes": p.bytes, "source": p.source} for p in row.parts],
        "cpu_bytes_per_node": row.cpu_per_node, "fits": row.fits, "cpu_fits": row.cpu_fits,
        "headroom_bytes": row.headroom, "usable_gpu_bytes": row.gpu_usable,
        "comm_bytes_per_step": row.traffic.network, "host_bytes_per_step": row.traffic.host,
        "accumulation": row.accumulation, "worst_rank": row.worst_rank,
    }
