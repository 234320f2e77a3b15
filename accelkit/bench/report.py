"""What a sweep shows and keeps: the table, the diagnosis lines, bench.json and bench.csv.

bench.json keeps at least {"runs": [{"num_processes", "backend", "steps", "step_time_s": {"median", "p90"},
"samples_per_s", "speedup", "efficiency", "data_wait_share", "peak_memory_bytes"}]} (issue 12), plus the rest of
what was measured (tokens/s, per-rank figures, errors, the collectives of --comm), the spread of the step times
(`step_time_s.iqr_share`), the window, why a result may be noise (`noise`), and with --layouts each run's layout and
the collectives one step issued (`comm_per_step`), each rank's mean seconds per step by phase (`phases_per_rank`:
data, compute, optimizer, sync wait; accelkit.bench.stragglers) and the straggler named from them (`straggler`).
"""

from __future__ import annotations

import csv
import io
from typing import Any

from accelkit import __version__
from accelkit.bench.comm_count import parse_key
from accelkit.bench.rerun import longer_command, longer_window
from accelkit.bench.spec import BenchSpec
from accelkit.bench.stats import NOISY_SPREAD
from accelkit.bench.sweep import CommRecord, RunRecord, Sweep, human_bytes

DATA_BOUND_SHARE = 0.30  # a run that waits this much of its step for data is limited by its input pipeline
POOR_EFFICIENCY = 0.80
COMM_BOUND_SHARE = 0.30  # predicted communication this large a share of the step explains poor efficiency

CSV_COLUMNS = ("backend", "num_processes", "layout", "launched_backend", "status", "steps", "measured_time_s",
               "step_time_median_s", "step_time_p90_s", "step_time_iqr_share", "samples_per_s", "tokens_per_s",
               "speedup", "efficiency", "baseline_num_processes", "noise", "data_wait_share", "peak_memory_bytes",
               "per_device_batch", "gradient_bytes", "comm_bytes_per_step", "predicted_comm_s", "wall_time_s",
               "error")


def run_json(record: RunRecord) -> dict[str, Any]:
    s, sc = record.summary, record.scaling
    return {
        "num_processes": record.spec.num_processes,
        "backend": record.backend,
        "launched_backend": record.launched,
        "status": record.status,
        "exit_code": record.exit_code,
        "error": record.error,
        "note": record.note,
        "layout": record.spec.layout.sizes if record.spec.layout else None,
        "steps": s.steps if s else 0,
        "step_time_s": {"median": s.step_median_s, "p25": s.step_p25_s, "p75": s.step_p75_s, "p90": s.step_p90_s,
                        "mean": s.step_mean_s, "iqr_share": s.spread} if s else None,
        "statistic": "median step time (samples/s, tokens/s, speedup and efficiency all derive from it)",
        "window": next((r.get("window") for r in record.ranks if r.get("window")), None),
        "noise": list(sc.noise) if sc else [],
        "step_times_s": s.step_times_s if s else [],
        "samples_per_s": s.samples_per_s if s else None,
        "tokens_per_s": s.tokens_per_s if s else None,
        "samples": s.samples if s else 0,
        "tokens": s.tokens if s else 0,
        "measured_time_s": s.measured_s if s else None,
        "speedup": sc.speedup if sc else None,
        "efficiency": sc.efficiency if sc else None,
        "baseline_num_processes": sc.baseline_num_processes if sc else None,
        "data_wait_share": s.data_wait_share if s else None,
        "data_wait_share_per_rank": s.data_wait_share_per_rank if s else [],
        "phases_per_rank": [phases.to_json() for phases in record.phases],
        "straggler": record.straggler.to_json() if record.straggler is not None else None,
        "straggler_note": record.straggler_note,
        "peak_memory_bytes": s.peak_memory_bytes if s else None,
        "peak_memory_per_rank": s.peak_memory_per_rank if s else [],
        "memory_kind": next((r.get("memory_kind") for r in record.ranks), None),
        "per_device_batch": record.spec.per_device_batch,
        "script_args": list(record.spec.script_args),
        "gradient_bytes": record.gradient_bytes,
        "predicted_comm_s": record.comm_predicted_s,
        "comm_per_step": record.comm_per_step,
        "comm_bytes_per_step": record.comm_bytes_per_step,
        "comm_per_dimension": comm_per_dimension(record),
        "pipeline": record.pipeline.to_json() if record.pipeline is not None else None,
        "comm_busbw_gbs": record.comm_busbw_gbs,
        "probe_overhead_s": max((r.get("probe_overhead_s", 0.0) for r in record.ranks), default=None),
        "wall_time_s": record.wall_s,
    }


def comm_json(record: CommRecord) -> dict[str, Any]:
    return {"num_processes": record.num_processes, "status": record.status, "exit_code": record.exit_code,
            "error": record.error, "results": [row.to_json() for row in record.rows]}


def bench_json(sweep: Sweep, hardware: dict[str, Any]) -> dict[str, Any]:
    spec = sweep.spec
    return {
        "accelkit_version": __version__,
        "script": spec.script,
        "script_args": list(spec.script_args),
        "scaling": spec.scaling,
        "warmup": spec.warmup,
        "steps": spec.steps,
        "min_time_s": spec.min_time,
        "layouts": [layout.name for layout in spec.layouts],
        "cpu_rehearsal": spec.cpu,
        "hardware": hardware,
        "stopped": sweep.stopped,
        "runs": [run_json(record) for record in sweep.records],
        "comm": [comm_json(record) for record in sweep.comm],
    }


def bench_csv(sweep: Sweep) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for record in sweep.records:
        row = run_json(record)
        step = row["step_time_s"] or {}
        writer.writerow({**{key: row.get(key) for key in CSV_COLUMNS}, "launched_backend": record.launched,
                         "layout": record.spec.layout.name if record.spec.layout else "",
                         "step_time_median_s": step.get("median"), "step_time_p90_s": step.get("p90"),
                         "step_time_iqr_share": step.get("iqr_share"), "noise": ";".join(row["noise"]),
                         "wall_time_s": round(record.wall_s, 3)})
    return out.getvalue()


# -- text ---------------------------------------------------------------------------------------------------------
def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in enumerate(zip(headers, widths, strict=True)))]
    lines += ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
              for r in rows]
    return lines


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f} ms"


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def run_table(sweep: Sweep) -> list[str]:
    """One row per run. Every rate, the speedup and the efficiency derive from the median step time; IQR is its
    spread (a share of the median); `noise` says why a row's comparison may not hold."""
    layouts = bool(sweep.spec.layouts)
    with_comm = any(r.comm_predicted_s is not None for r in sweep.records)
    with_tokens = any(r.summary and r.summary.tokens_per_s for r in sweep.records)
    headers = ["layout", "backend"] if layouts else ["backend", "procs"]
    headers += ["steps", "window", "step median", "IQR", "samples/s"]
    headers += ["tokens/s"] if with_tokens else []
    headers += ["vs first"] if layouts else ["speedup", "efficiency"]
    headers += ["data wait", "peak mem/rank"]
    headers += ["comm/step"] if layouts else []
    with_pp = any(r.pipeline is not None for r in sweep.records)
    headers += ["bubble/stage (plan)", "p2p/step (plan)"] if with_pp else []
    headers += ["comm (pred.)"] if with_comm else []
    headers += ["noise"]
    rows = []
    for r in sweep.records:
        s, sc = r.summary, r.scaling
        first = [r.spec.layout.name if r.spec.layout else r.backend,
                 r.backend if layouts else str(r.spec.num_processes)]
        if s is None:
            row = [*first, r.status.upper(), r.error or ""]
            rows.append(row + [""] * (len(headers) - len(row)))
            continue
        speedup = "-" if sc is None or sc.speedup is None else f"{sc.speedup:.2f}x"
        if not layouts and sc is not None and sc.speedup is not None and sc.baseline_num_processes != 1:
            speedup += f" vs {sc.baseline_num_processes}"
        row = [*first, str(s.steps), f"{s.measured_s:.1f} s", _ms(s.step_median_s), f"{s.spread:.0%}",
               _num(s.samples_per_s, ",.0f")]
        row += [_num(s.tokens_per_s, ",.0f")] if with_tokens else []
        row += [speedup] if layouts else [speedup, "-" if sc is None or sc.efficiency is None else
                                          f"{sc.efficiency:.0%}"]
        row += [f"{s.data_wait_share:.0%}", human_bytes(s.peak_memory_bytes)]
        if layouts:
            row += ["-" if r.comm_bytes_per_step is None else human_bytes(r.comm_bytes_per_step)]
        if with_pp:
            row += pipeline_cells(r)
        if with_comm:
            row += [f"{_ms(r.comm_predicted_s)} ({r.comm_predicted_s / s.step_median_s:.0%})"
                    if r.comm_predicted_s is not None else "-"]
        row += [", ".join(sc.noise) if sc and sc.noise else "-"]
        rows.append(row)
    # Failed rows carry their message in one wide cell: print them after the aligned rows' widths are known.
    ok_rows = [row for row, r in zip(rows, sweep.records, strict=True) if r.summary is not None]
    lines = _table(headers, ok_rows)
    failed = [(row, r) for row, r in zip(rows, sweep.records, strict=True) if r.summary is None]
    lines += [f"{r.label}: {row[2]}: {row[3]}" if layouts else f"{row[0]}  {row[1]} process(es): {row[2]}: {row[3]}"
              for row, r in failed]
    return lines


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _bytes(value: int | None) -> str:
    return "-" if value is None else human_bytes(value)


def pipeline_cells(r: RunRecord) -> list[str]:
    """A pipeline layout's bubble per stage (measured, then planned) and its busiest stage's point-to-point
    bytes per step (counted, then computed); `-` for a layout without a pipeline."""
    p = r.pipeline
    if p is None:
        return ["-", "-"]
    measured = " ".join(_share(stage.bubble) for stage in p.stages)
    return [f"{measured} ({_share(p.planned_bubble)})", f"{_bytes(p.p2p_bytes)} ({_bytes(p.p2p_computed)})"]


def pipeline_lines(sweep: Sweep) -> list[str]:
    """With a pp layout: per pipeline stage, the bubble measured in the ranks beside the plan's, and the
    point-to-point bytes it sent per step beside the plan's figure."""
    lines = []
    for r in sweep.records:
        p = r.pipeline
        if p is None:
            continue
        parts = [f"stage {'+'.join(map(str, s.stages))}: bubble {_share(s.bubble)}, sends {_bytes(s.p2p_bytes)} "
                 f"(computed {_bytes(s.p2p_computed)})" for s in p.stages]
        lines.append(f"{r.label}: pipeline {p.schedule or 'schedule not modelled'}, {p.microbatches} micro-batches, "
                     f"planned bubble {_share(p.planned_bubble)}; {'; '.join(parts)}")
    return lines


def comm_lines(sweep: Sweep) -> list[str]:
    """With --layouts: the collectives one step issued, per layout (on its busiest rank)."""
    lines = []
    for r in sweep.records:
        counted = r.comm_per_step
        if r.summary is None or not r.spec.layout:
            continue
        if counted is None:
            lines.append(f"{r.label}: communication not counted (it is counted on the last warmup step: that "
                         "needs --warmup 2 or more, and a script not using torch.compile)")
            continue
        parts = [f"{where(r, key)} x{value['calls']} {human_bytes(value['bytes'])}"
                 for key, value in sorted(counted.items(), key=lambda kv: -kv[1]["bytes"])]
        lines.append(f"{r.label}: one step's collectives per rank: {'; '.join(parts) or 'none'}")
    return lines


def where(record: RunRecord, key: str) -> str:
    """`all_reduce over tp (2 ranks)`: a counted collective with the mesh dimension its group spans."""
    op, size, stride = parse_key(key)
    if size is None:
        return op
    dim = record.spec.layout.dimension_of(size, stride) if record.spec.layout is not None else None
    return f"{op} over {dim} ({size} ranks)" if dim else f"{op} over {size} ranks"


def comm_per_dimension(record: RunRecord) -> dict[str, int] | None:
    """Bytes per step per mesh dimension (`tp`, `dp_shard`, `world`, ...; `other` for groups of no dimension)."""
    counted = record.comm_per_step
    if counted is None or record.spec.layout is None:
        return None
    out: dict[str, int] = {}
    for key, value in counted.items():
        _, size, stride = parse_key(key)
        dim = record.spec.layout.dimension_of(size, stride) or "other"
        out[dim] = out.get(dim, 0) + value["bytes"]
    return out


def noise_lines(sweep: Sweep) -> list[str]:
    """Why a result may be noise, and the exact command that measures it over a longer window."""
    flagged = [r for r in sweep.records if r.summary is not None and r.scaling is not None and r.scaling.noise]
    if not flagged:
        return []
    lines = []
    for r in flagged:
        s, sc = r.summary, r.scaling
        assert s is not None and sc is not None
        why = []
        if "superlinear" in sc.noise and sc.efficiency is not None:
            why.append(f"efficiency {sc.efficiency:.0%} is superlinear: with data parallelism that is almost always "
                       "a baseline slowed by something else, not a real gain")
        if "high variance" in sc.noise:
            spreads = [f"{rec.label} IQR {rec.summary.spread:.0%}" for rec in sweep.records
                       if rec.summary is not None and rec.summary.spread > NOISY_SPREAD
                       and (rec is r or _is_baseline_of(rec, r, sweep))]
            why.append(f"step times vary too much to compare ({', '.join(spreads)} of the median; over "
                       f"{NOISY_SPREAD:.0%} is noise: other load on the machine)")
        lines.append(f"{r.label}: NOISE? {'; '.join(why)}")
    spec = sweep.spec
    steps = [r.summary.measured_s / r.summary.steps for r in sweep.records if r.summary is not None
             and r.summary.steps > 0 and r.summary.measured_s > 0]
    command = longer_command(spec.command_words, spec.script_words, spec.min_time,
                             step_seconds=min(steps) if steps else None, warmup=spec.warmup)
    lines.append(f"measure longer ({longer_window(spec.min_time):g} s per run), on a machine as quiet as you can "
                 f"make it: {command}")
    return lines


def _is_baseline_of(candidate: RunRecord, record: RunRecord, sweep: Sweep) -> bool:
    sc = record.scaling
    if sc is None:
        return False
    if sweep.spec.layouts:
        return candidate is next(r for r in sweep.records if r.summary is not None)
    return candidate.backend == record.backend and candidate.spec.num_processes == sc.baseline_num_processes


def comm_table(records: list[CommRecord]) -> list[str]:
    lines: list[str] = []
    for record in records:
        if not record.rows:
            lines.append(f"{record.num_processes} processes: {record.status.upper()}: {record.error or ''}")
            continue
        lines.append(f"collectives on {record.num_processes} processes (float32; nccl-tests conventions):")
        rows = [[row.op, human_bytes(row.size_bytes), f"{row.count}", f"{row.time_us:,.1f}",
                 f"{row.algbw_gbs:.3f}", f"{row.busbw_gbs:.3f}"] for row in record.rows]
        lines += ["  " + line for line in _table(["op", "size", "count", "time (us)", "algbw (GB/s)",
                                                  "busbw (GB/s)"], rows)]
    return lines


def scaling_diagnosis(sweep: Sweep) -> list[str]:
    """What the figures say, only where the measurement supports it."""
    lines = []
    for r in sweep.records:
        s, sc = r.summary, r.scaling
        if s is None:
            continue
        where = r.label
        if r.note:
            lines.append(f"{where}: {r.note}")
        if r.straggler is not None:
            lines.append(f"{where}: {r.straggler.line()}")
        elif r.straggler_note:
            lines.append(f"{where}: {r.straggler_note}")
        if s.data_wait_share >= DATA_BOUND_SHARE:
            on_rank = ""
            if len(s.data_wait_share_per_rank) > 1 and len(r.phases) == len(s.data_wait_share_per_rank):
                worst = max(range(len(r.phases)), key=lambda i: s.data_wait_share_per_rank[i])
                on_rank = f" on rank {r.phases[worst].rank}"
            lines.append(f"{where}: {s.data_wait_share:.0%} of each step{on_rank} is spent waiting for data: the "
                         "input pipeline limits this run (more DataLoader workers, pin_memory, a faster __getitem__, "
                         "pre-tokenised data)")
        if sc is not None and sc.efficiency is not None and sc.efficiency < POOR_EFFICIENCY \
                and s.data_wait_share < DATA_BOUND_SHARE and "high variance" not in sc.noise:
            cause = "communication, stragglers or a per-device batch too small to hide gradient sync"
            if r.comm_predicted_s is not None:
                share = r.comm_predicted_s / s.step_median_s
                cause = (f"predicted communication is {share:.0%} of the step ({_ms(r.comm_predicted_s)} of "
                         f"{_ms(s.step_median_s)})")
                cause += (": communication-bound (a larger per-device batch, gradient accumulation, a faster link)"
                          if share >= COMM_BOUND_SHARE else
                          ": not the interconnect; look at stragglers (p90 vs median), other load on the machines, "
                          "and per-rank work that does not shrink with more ranks")
            lines.append(f"{where}: efficiency {sc.efficiency:.0%}, not data-bound: {cause}")
    return lines


def summary_text(sweep: Sweep, spec: BenchSpec) -> list[str]:
    lines = []
    if spec.cpu:
        lines.append("CPU rehearsal figures (gloo ranks on this machine's cores): they show the method and the "
                     "script's own overheads, not GPU speed.")
    if sweep.comm:
        lines += comm_table(sweep.comm)
    if sweep.records:
        lines += run_table(sweep)
        lines += comm_lines(sweep)
        lines += pipeline_lines(sweep)
        lines += scaling_diagnosis(sweep)
        lines += noise_lines(sweep)
    return lines
