"""`accelkit bench --grad-compression`: what compression buys (bytes per step) and costs (step time, loss), against
the uncompressed run of the same script, seed and steps, each launched the way `accelkit launch` launches it.

Every run carries the compression probe (accelkit.bench.compression_probe): the bytes of the collectives inside
backward per step (the last step's, once PowerSGD has started), the loss per step (mean over ranks), the median
step time, PowerSGD's own compression_stats(), and whether every rank ended with the same weights. The bytes
computed from the parameter shapes (accelkit.compression.sizes) sit beside the counted ones.
"""

from __future__ import annotations

import csv
import io
import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from accelkit.compression.sizes import ddp_bytes_per_step, fsdp_reduce_scatter_bytes
from accelkit.compression.spec import NONE, CompressionSpec
from accelkit.errors import AccelkitError

PROBE_MODULE = "accelkit.bench.compression_probe"
RESULT_NAMES = ("compression.json", "compression.csv", "compression.png")
FIELDS = ("method", "backend", "processes", "steps", "bytes_per_step", "expected_bytes_per_step", "bytes_vs_none",
          "collectives", "step_time_s", "final_loss", "loss_delta", "powersgd_rate", "weights_equal", "status")


@dataclass
class CompressionRow:
    method: str
    backend: str
    processes: int
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
              world: int) -> CompressionRow:
    """One run's row from its ranks' probe results."""
    row = CompressionRow(spec.label(), backend, processes)
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
    if backend == "fsdp":
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
    if backend != "fsdp":  # FSDP ranks hold different shards: nothing to compare
        row.weights_equal = len({r["parameters"]["digest"] for r in ranks}) == 1
    if "powersgd" in ranks[0]:
        row.powersgd = ranks[0]["powersgd"]
        row.powersgd_rate = row.powersgd["compression_rate"]
    return row


def compare(rows: list[CompressionRow]) -> list[CompressionRow]:
    """Each row against the uncompressed run of its backend: bytes ratio and loss difference."""
    baselines = {row.backend: row for row in rows if row.method == "none" and row.status == "ok"}
    for row in rows:
        base = baselines.get(row.backend)
        if base is None or row.status != "ok":
            continue
        if base.bytes_per_step and row.bytes_per_step is not None:
            row.bytes_vs_none = row.bytes_per_step / base.bytes_per_step
        if base.final_loss is not None and row.final_loss is not None:
            row.loss_delta = row.final_loss - base.final_loss
    return rows


def compression_table(rows: Sequence[CompressionRow]) -> list[str]:
    head = (f"{'compression':<18} {'backend':<8} {'bytes/step':>11} {'computed':>11} {'vs none':>8} "
            f"{'step ms':>8} {'loss':>8} {'Δ loss':>9} {'same weights':>12}")
    lines = [head, "-" * len(head)]
    for r in rows:
        if r.status != "ok":
            lines.append(f"{r.method:<18} {r.backend:<8} failed: {r.status}")
            continue
        ratio = f"{r.bytes_vs_none:.3f}x" if r.bytes_vs_none is not None else "-"
        delta = f"{r.loss_delta:+.5f}" if r.loss_delta is not None else "-"
        same = {True: "yes", False: "NO", None: "-"}[r.weights_equal]
        ms = f"{r.step_time_s * 1000:.1f}" if r.step_time_s is not None else "-"
        loss = f"{r.final_loss:.4f}" if r.final_loss is not None else "-"
        lines.append(f"{r.method:<18} {r.backend:<8} {r.bytes_per_step:>11,} {r.expected_bytes_per_step:>11,} "
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
    labels = [f"{r.method}\n{r.backend}" for r in ok]
    bars.bar(labels, [r.bytes_per_step or 0 for r in ok])
    bars.set_ylabel("gradient bytes per step (counted)")
    for r in ok:
        curves.plot(range(1, len(r.losses) + 1), r.losses, label=f"{r.method} ({r.backend})")
    curves.set_xlabel("optimizer step")
    curves.set_ylabel("training loss (mean over ranks)")
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
                          timeout: float | None = 900) -> list[CompressionRow]:
    """Run `script` once uncompressed and once per spec, per backend, `steps` optimizer steps each; write
    compression.json/.csv/.png into `output`; the rows."""
    from accelkit.bench.launching import launch_settings, request_for, run_launch

    if settings is None:  # no other config options: each run is `accelkit launch [--cpu] --backend B ...`
        from accelkit.configs import ConfigOptions

        settings = launch_settings(ConfigOptions(), None, cpu, command_line="accelkit bench --grad-compression")

    rows: list[CompressionRow] = []
    runs = output / "runs"
    for backend in backends:
        for spec in [NONE, *(s for s in specs if s.active)]:
            spec_options = {"grad_compression": spec.method if spec.active else None}
            if spec.method == "powersgd":
                spec_options.update(powersgd_rank=spec.powersgd_rank, powersgd_start_step=spec.powersgd_start_step)
            run_settings = replace(settings, options=replace(settings.options, **spec_options))
            request = request_for(run_settings, backend, num_processes, script, script_args, module=False,
                                  probes=(PROBE_MODULE,))
            folder = runs / f"{backend}-{spec.label().replace(' ', '_').replace('@', 'start')}"
            folder.mkdir(parents=True, exist_ok=True)
            for old in folder.glob("compression.rank*.json"):
                old.unlink()
            progress(f"{backend} {spec.label()}: {num_processes} processes, {steps} steps")
            outcome = run_launch(request, probe_dir=folder, max_steps=steps, env={}, log_path=folder / "output.log",
                                 timeout=timeout)
            from accelkit.ranks.probes import read_results

            row = summarize(spec, backend, num_processes, read_results(folder, "compression"), num_processes)
            if getattr(outcome, "exit_code", 0) not in (0, None) and row.status == "ok":
                row.status = f"exit {outcome.exit_code} (see {folder / 'output.log'})"
            rows.append(row)
    compare(rows)
    from accelkit.fsio import atomic_write

    atomic_write(output / "compression.json", json.dumps({"rows": [asdict(r) for r in rows]}, indent=2) + "\n")
    atomic_write(output / "compression.csv", to_csv(rows))
    draw(rows, output / "compression.png")
    failed = [r for r in rows if r.status != "ok"]
    if failed:
        raise AccelkitError(f"{len(failed)} of {len(rows)} compression run(s) failed, first {failed[0].method} "
                            f"({failed[0].backend}): {failed[0].status}", hint=f"see {output / 'runs'}")
    return rows
