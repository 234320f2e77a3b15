"""`accelkit bench --grad-compression`: what compression buys (bytes per step) and costs (step time, loss), against
the uncompressed run of the same script, seed and steps, each launched the way `accelkit launch` launches it.

With --layouts, the same per N-D layout (accelkit.bench.compression_runs): the gradient bytes of a layout are the
all-reduces and reduce-scatters inside backward over its data-parallel mesh dimensions (dp_replicate, dp_shard and
their flattenings: tensor- or sequence-parallel collectives carry activations, which no method compresses), and a
compression the layout's backend cannot take is a row that says why, not a crash.

Every run carries the compression probe (accelkit.bench.compression_probe): the bytes of the collectives inside
backward per step (the last step's, once PowerSGD has started), the loss per step (mean over ranks), the median
step time, PowerSGD's own compression_stats(), and whether every rank ended with the same weights. The bytes
computed from the parameter shapes (accelkit.compression.grad_bytes) sit beside the counted ones.
"""

from __future__ import annotations

import csv
import io
import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from accelkit.bench.comm_count import parse_key
from accelkit.bench.compression_runs import NOT_APPLICABLE, CompressionRun, plan_runs, spec_settings
from accelkit.compression.compression_spec import CompressionSpec
from accelkit.compression.grad_bytes import ddp_bytes_per_step, fsdp_reduce_scatter_bytes
from accelkit.configs import Mesh
from accelkit.errors import AccelkitError

PROBE_MODULE = "accelkit.bench.compression_probe"
RESULT_NAMES = ("compression.json", "compression.csv", "compression.png")
FIELDS = ("method", "layout", "backend", "processes", "steps", "bytes_per_step", "expected_bytes_per_step",
          "bytes_vs_none", "collectives", "step_time_s", "final_loss", "loss_delta", "powersgd_rate",
          "weights_equal", "status")


@dataclass
class CompressionRow:
    method: str
    backend: str
    processes: int
    layout: str = ""  # the --layouts layout (dp_shard=2,...), "" without --layouts
    steps: int = 0
    bytes_per_step: int | None = None
    expected_bytes_per_step: int | None = None
    bytes_vs_none: float | None = None  # this run's bytes / the uncompressed run's
    collectives: dict[str, int] = field(default_factory=dict)  # op@group -> bytes in the counted step
    step_time_s: float | None = None
    losses: list[float] = field(default_factory=list)
    final_loss: float | None = None
    loss_delta: float | None = None  # final loss minus the uncompressed run's
    powersgd_rate: float | None = None
    powersgd: dict[str, Any] | None = None
    weights_equal: bool | None = None
    status: str = "ok"


def summarize(spec: CompressionSpec, backend: str, processes: int, ranks: list[dict[str, Any]],
              world: int, layout: Mesh | None = None) -> CompressionRow:
    """One run's row from its ranks' probe results."""
    row = CompressionRow(spec.label(), backend, processes, layout.name if layout is not None else "")
    if len(ranks) < processes:
        row.status = f"{len(ranks)} of {processes} rank result(s)"
        return row
    steps = ranks[0]["steps"]
    row.steps = len(steps)
    if not steps:
        row.status = "no optimizer step"
        return row
    last = steps[-1]  # after PowerSGD's start step when the run reaches it
    row.collectives = {key: entry["bytes"] for key, entry in sorted(last["comm"].items())}
    row.bytes_per_step = sum(row.collectives.values())
    shapes = ranks[0]["parameters"]["shapes"]
    if layout is not None:
        row.bytes_per_step, row.expected_bytes_per_step = layout_bytes(row.collectives, layout, backend, spec,
                                                                        shapes, last["step"])
    elif backend == "fsdp":
        reduce_bytes = 2 if spec.method in ("fp16", "bf16") else 4
        row.expected_bytes_per_step = fsdp_reduce_scatter_bytes(shapes, world, reduce_bytes)
        row.bytes_per_step = sum(b for key, b in row.collectives.items() if key.startswith("reduce_scatter"))
    else:
        row.expected_bytes_per_step = ddp_bytes_per_step(shapes, spec, last["step"])
    finished = [s["finished"] for s in steps]
    times = [b - a for a, b in zip(finished, finished[1:], strict=False)]
    row.step_time_s = statistics.median(times) if times else None
    per_step = [[r["steps"][i]["loss"] for r in ranks] for i in range(row.steps)]
    row.losses = [sum(values) / len(values) for values in per_step if None not in values]
    row.final_loss = row.losses[-1] if row.losses else None
    if backend != "fsdp" and (layout is None or layout.world == layout.dp_replicate):  # replicas only
        row.weights_equal = len({r["parameters"]["digest"] for r in ranks}) == 1
    if "powersgd" in ranks[0]:
        row.powersgd = ranks[0]["powersgd"]
        row.powersgd_rate = row.powersgd["compression_rate"]
    return row


def layout_bytes(collectives: dict[str, int], layout: Mesh, backend: str, spec: CompressionSpec,
                  shapes: list[list[int]], step: int) -> tuple[int, int | None]:
    """A layout's gradient bytes (counted), and computed from the shapes where the layout is plain data parallelism
    (dp_replicate alone under DDP, dp_shard alone under FSDP2); None for the others."""
    counted = 0
    for key, size in collectives.items():
        op, group_size, stride = parse_key(key)
        if op in ("all_reduce", "reduce_scatter") and gradient_dimension(layout, layout.dimension_of(group_size,
                                                                                                      stride)):
            counted += size
    if layout.world == layout.dp_replicate and backend in ("ddp", "cpu"):
        return counted, ddp_bytes_per_step(shapes, spec, step)
    if layout.world == layout.dp_shard and backend == "fsdp":
        reduce_bytes = 2 if spec.method in ("fp16", "bf16") else 4
        return counted, fsdp_reduce_scatter_bytes(shapes, layout.world, reduce_bytes)
    return counted, None


def gradient_dimension(layout: Mesh, dimension: str | None) -> bool:
    """Whether a collective over `dimension` (Mesh.dimension_of) reduces gradients: the data-parallel dimensions
    and their flattenings (dp_shard_cp: FSDP shards over context-parallel ranks too), not tp or sp."""
    if dimension is None:
        return False
    if dimension == "world":
        return layout.tp == layout.sp == 1 and (layout.cp == 1 or layout.dp_shard > 1)
    return dimension != "cp" and "tp" not in dimension.split("_") and "sp" not in dimension.split("_")


def compare(rows: list[CompressionRow]) -> list[CompressionRow]:
    """Each row against the uncompressed run of its backend and layout: bytes ratio and loss difference."""
    baselines = {(row.backend, row.layout): row for row in rows if row.method == "none" and row.status == "ok"}
    for row in rows:
        base = baselines.get((row.backend, row.layout))
        if base is None or row.status != "ok":
            continue
        if base.bytes_per_step and row.bytes_per_step is not None:
            row.bytes_vs_none = row.bytes_per_step / base.bytes_per_step
        if base.final_loss is not None and row.final_loss is not None:
            row.loss_delta = row.final_loss - base.final_loss
    return rows


def compression_table(rows: Sequence[CompressionRow]) -> list[str]:
    width = max((len(r.layout) for r in rows), default=0)
    where = (lambda r: f"{r.layout:<{width}} {r.backend:<8}") if width else (lambda r: f"{r.backend:<8}")
    place = f"{'layout':<{width}} {'backend':<8}" if width else f"{'backend':<8}"
    head = (f"{'compression':<18} {place} {'bytes/step':>11} {'computed':>11} {'vs none':>8} "
            f"{'step ms':>8} {'loss':>8} {'Δ loss':>9} {'same weights':>12}")
    lines = [head, "-" * len(head)]
    for r in rows:
        if r.status.startswith(NOT_APPLICABLE):
            lines.append(f"{r.method:<18} {where(r)} {r.status}")
            continue
        if r.status != "ok":
            lines.append(f"{r.method:<18} {where(r)} failed: {r.status}")
            continue
        ratio = f"{r.bytes_vs_none:.3f}x" if r.bytes_vs_none is not None else "-"
        delta = f"{r.loss_delta:+.5f}" if r.loss_delta is not None else "-"
        same = {True: "yes", False: "NO", None: "-"}[r.weights_equal]
        ms = f"{r.step_time_s * 1000:.1f}" if r.step_time_s is not None else "-"
        loss = f"{r.final_loss:.4f}" if r.final_loss is not None else "-"
        computed = f"{r.expected_bytes_per_step:,}" if r.expected_bytes_per_step is not None else "-"
        lines.append(f"{r.method:<18} {where(r)} {r.bytes_per_step:>11,} {computed:>11} "
                     f"{ratio:>8} {ms:>8} {loss:>8} {delta:>9} {same:>12}")
        if r.powersgd:
            p = r.powersgd
            lines.append(f"{'':<18} PowerSGD compression_stats(): {p['compression_rate']:.1f}x "
                         f"({p['numel_before']:,} -> {p['numel_after']:,} elements, cumulative)")
    return lines


def to_csv(rows: Sequence[CompressionRow]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=FIELDS, extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow(asdict(row))
    return buffer.getvalue()


def draw(rows: Sequence[CompressionRow], path: Path) -> bool:
    """Bytes per step (bars) and loss curves, compression vs none; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    ok = [r for r in rows if r.status == "ok"]
    fig, (bars, curves) = plt.subplots(1, 2, figsize=(11, 4))
    labels = [f"{r.method} ({r.layout or r.backend})" for r in ok]
    bars.bar(labels, [r.bytes_per_step or 0 for r in ok])
    bars.set_ylabel("gradient bytes per step (counted)")
    bars.tick_params(axis="x", labelrotation=30, labelsize=8)
    for r in ok:
        curves.plot(range(1, len(r.losses) + 1), r.losses, label=f"{r.method} ({r.layout or r.backend})")
    curves.set_xlabel("optimizer step")
    curves.set_ylabel("training loss (mean over ranks)")
    if ok:
        curves.legend(fontsize=8)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    from accelkit.fsio import atomic_write

    atomic_write(path, buffer.getvalue())
    return True


def run_compression_bench(*, script: str, script_args: tuple[str, ...], specs: Sequence[CompressionSpec],
                          backends: Sequence[str], num_processes: int, cpu: bool, output: Path, steps: int,
                          settings: Any = None, progress: Callable[[str], None] = print,
                          timeout: float | None = 900,
                          runs: Sequence[CompressionRun] | None = None) -> list[CompressionRow]:
    """Run `script` once uncompressed and once per spec, per backend (or the given `runs`: per layout, checked by
    compression_runs.plan_runs), `steps` optimizer steps each; write compression.json/.csv/.png into `output`; the
    rows. A run whose compression does not apply is a row saying why, not a launch."""
    from accelkit.bench.launching import launch_settings, request_for, run_bench_launch
    from accelkit.ranks.probes import read_results

    if settings is None:  # no other config options: each run is `accelkit launch [--cpu] --backend B ...`
        from accelkit.configs import ConfigOptions

        settings = launch_settings(ConfigOptions(), None, cpu, command_line="accelkit bench --grad-compression")
    if runs is None:
        runs = plan_runs(settings, specs, [(backend, None) for backend in backends], num_processes, script,
                         script_args, check=False)
    rows: list[CompressionRow] = []
    for run in runs:
        where = f"{run.layout_name} ({run.backend})" if run.layout is not None else run.backend
        if run.not_applicable is not None:
            rows.append(CompressionRow(run.spec.label(), run.backend, num_processes, run.layout_name,
                                       status=NOT_APPLICABLE + run.not_applicable))
            progress(f"{where} {run.spec.label()}: {NOT_APPLICABLE}{run.not_applicable}")
            continue
        request = request_for(spec_settings(settings, run.spec), run.backend, num_processes, script, script_args,
                              module=False, probes=(PROBE_MODULE,), layout=run.layout)
        folder = output / "runs" / run.folder
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob("compression.rank*.json"):
            old.unlink()
        progress(f"{where} {run.spec.label()}: {num_processes} processes, {steps} steps")
        outcome = run_bench_launch(request, probe_dir=folder, max_steps=steps, env={}, log_path=folder / "output.log",
                             timeout=timeout)
        row = summarize(run.spec, run.backend, num_processes, read_results(folder, "compression"), num_processes,
                        run.layout)
        if getattr(outcome, "exit_code", 0) not in (0, None) and row.status == "ok":
            row.status = f"exit {outcome.exit_code} (see {folder / 'output.log'})"
        rows.append(row)
    compare(rows)
    from accelkit.fsio import atomic_write

    atomic_write(output / "compression.json", json.dumps({"rows": [asdict(r) for r in rows]}, indent=2) + "\n")
    atomic_write(output / "compression.csv", to_csv(rows))
    draw(rows, output / "compression.png")
    failed = [r for r in rows if r.status != "ok" and not r.status.startswith(NOT_APPLICABLE)]
    if failed:
        first = failed[0]
        raise AccelkitError(f"{len(failed)} of {len(rows)} compression run(s) failed, first {first.method} "
                            f"({first.layout or first.backend}): {first.status}", hint=f"see {output / 'runs'}")
    return rows
