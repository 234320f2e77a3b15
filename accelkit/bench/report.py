"""What a sweep shows and keeps: the table, the diagnosis lines, bench.json and bench.csv.

bench.json keeps at least {"runs": [{"num_processes", "backend", "steps", "step_time_s": {"median", "p90"},
"samples_per_s", "speedup", "efficiency", "data_wait_share", "peak_memory_bytes"}]} (issue 12), plus the rest of
what was measured (tokens/s, per-rank figures, errors, the collectives of --comm).
"""

from __future__ import annotations

import csv
import io
from typing import Any

from accelkit import __version__
from accelkit.bench.spec import BenchSpec
from accelkit.bench.sweep import CommRecord, RunRecord, Sweep, human_bytes

DATA_BOUND_SHARE = 0.30  # a run that waits this much of its step for data is limited by its input pipeline
POOR_EFFICIENCY = 0.80
COMM_BOUND_SHARE = 0.30  # predicted communication this large a share of the step explains poor efficiency

CSV_COLUMNS = ("backend", "num_processes", "launched_backend", "status", "steps", "step_time_median_s",
               "step_time_p90_s", "samples_per_s", "tokens_per_s", "speedup", "efficiency", "baseline_num_processes",
               "data_wait_share", "peak_memory_bytes", "per_device_batch", "gradient_bytes",
               "predicted_comm_s", "wall_time_s", "error")


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
        "steps": s.steps if s else 0,
        "step_time_s": {"median": s.step_median_s, "p90": s.step_p90_s, "mean": s.step_mean_s} if s else None,
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
        "peak_memory_bytes": s.peak_memory_bytes if s else None,
        "peak_memory_per_rank": s.peak_memory_per_rank if s else [],
        "memory_kind": next((r.get("memory_kind") for r in record.ranks), None),
        "per_device_batch": record.spec.per_device_batch,
        "script_args": list(record.spec.script_args),
        "gradient_bytes": record.gradient_bytes,
        "predicted_comm_s": record.comm_predicted_s,
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
                         "step_time_median_s": step.get("median"), "step_time_p90_s": step.get("p90"),
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
    with_comm = any(r.comm_predicted_s is not None for r in sweep.records)
    with_tokens = any(r.summary and r.summary.tokens_per_s for r in sweep.records)
    headers = ["backend", "procs", "steps", "step median", "step p90", "samples/s"]
    headers += ["tokens/s"] if with_tokens else []
    headers += ["speedup", "efficiency", "data wait", "peak mem/rank"]
    headers += ["comm (pred.)"] if with_comm else []
    rows = []
    for r in sweep.records:
        s, sc = r.summary, r.scaling
        if s is None:
            row = [r.backend, str(r.spec.num_processes), r.status.upper(), r.error or ""]
            rows.append(row + [""] * (len(headers) - len(row)))
            continue
        speedup = "-" if sc is None or sc.speedup is None else f"{sc.speedup:.2f}x"
        if sc is not None and sc.speedup is not None and sc.baseline_num_processes != 1:
            speedup += f" vs {sc.baseline_num_processes}"
        row = [r.backend, str(r.spec.num_processes), str(s.steps), _ms(s.step_median_s), _ms(s.step_p90_s),
               _num(s.samples_per_s, ",.0f")]
        row += [_num(s.tokens_per_s, ",.0f")] if with_tokens else []
        row += [speedup, "-" if sc is None or sc.efficiency is None else f"{sc.efficiency:.0%}",
                f"{s.data_wait_share:.0%}", human_bytes(s.peak_memory_bytes)]
        if with_comm:
            row += [f"{_ms(r.comm_predicted_s)} ({r.comm_predicted_s / s.step_median_s:.0%})"
                    if r.comm_predicted_s is not None else "-"]
        rows.append(row)
    # Failed rows carry their message in one wide cell: print them after the aligned rows' widths are known.
    ok_rows = [row for row, r in zip(rows, sweep.records, strict=True) if r.summary is not None]
    lines = _table(headers, ok_rows)
    failed = [row for row, r in zip(rows, sweep.records, strict=True) if r.summary is None]
    lines += [f"{row[0]}  {row[1]} process(es): {row[2]}: {row[3]}" for row in failed]
    return lines


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


def diagnosis(sweep: Sweep) -> list[str]:
    """What the figures say, only where the measurement supports it."""
    lines = []
    for r in sweep.records:
        s, sc = r.summary, r.scaling
        if s is None:
            continue
        where = r.label
        if r.note:
            lines.append(f"{where}: {r.note}")
        if s.data_wait_share >= DATA_BOUND_SHARE:
            lines.append(f"{where}: {s.data_wait_share:.0%} of each step is spent waiting for data: the input "
                         "pipeline limits this run (more DataLoader workers, pin_memory, a faster __getitem__, "
                         "pre-tokenised data)")
        if sc is not None and sc.efficiency is not None and sc.efficiency < POOR_EFFICIENCY \
                and s.data_wait_share < DATA_BOUND_SHARE:
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
        lines += diagnosis(sweep)
    return lines
