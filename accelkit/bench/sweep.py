"""Run a benchmark sweep: one supervised launch per (backend, world size), the probe's results read back, a progress
line per run, results rewritten after every run (an interrupted sweep keeps what it measured).

Failure policy (what someone deciding between 8 and 64 GPUs expects):
- a run that fails with an error of the script itself before any run has succeeded stops the sweep: the same
  error would repeat at every size (the log's last lines are shown);
- out of memory (a CUDA OOM in a rank, or a rank killed by SIGKILL, which is what the kernel's OOM killer sends),
  a time-out, or any failure after a run has succeeded is recorded, and the sweep goes on: a bigger world size
  may fit, and a failure at 8 processes says something about 8 processes;
- Ctrl-C / SIGTERM stops the current run (every rank, through the launch supervisor) and the sweep.
"""

from __future__ import annotations

import math
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accelkit.bench import COMM_NAME, MIN_TIME_ENV, PROBE_NAME, WARMUP_ENV
from accelkit.bench.comm import CommRow, comm_volume_factor, nearest_all_reduce, predicted_comm_seconds, rows_from_ranks
from accelkit.bench.launching import (
    LaunchSettings,
    comm_request,
    launched_backend,
    run_bench_launch,
    script_request,
)
from accelkit.bench.layouts import batch_replicas
from accelkit.bench.pipeline_stats import PipelineFigures, pipeline_figures
from accelkit.bench.spec import BenchSpec, RunSpec
from accelkit.bench.stats import RunSummary, Scaling, TooFewSteps, noise_reasons, scaling, summarize
from accelkit.bench.stragglers import RankPhases, Straggler, rank_phases, straggler_of
from accelkit.launch import RunOutcome
from accelkit.ranks.probes import read_results

OOM_MARKERS = ("OutOfMemoryError", "out of memory", "MemoryError")


@dataclass
class RunRecord:
    """One run's outcome: what bench.json and the table show."""

    spec: RunSpec
    backend: str  # the backend benched (ddp, fsdp, ...)
    launched: str  # what was launched (one process of a DDP sweep is `single`)
    status: str = "ok"  # ok | failed | interrupted | timed out | stalled
    exit_code: int = 0
    wall_s: float = 0.0
    summary: RunSummary | None = None
    error: str | None = None
    ranks: list[dict[str, Any]] = field(default_factory=list)
    scaling: Scaling | None = None
    comm_predicted_s: float | None = None  # communication time per step predicted from --comm's bandwidth
    comm_busbw_gbs: float | None = None
    note: str | None = None  # something the figures alone do not say (e.g. the script ended before the limit)
    pipeline: PipelineFigures | None = None  # a layout with pp: measured bubble and point-to-point bytes per stage
    phases: list[RankPhases] = field(default_factory=list)  # per rank: data, compute, optimizer, sync wait per step
    straggler: Straggler | None = None
    straggler_note: str | None = None  # why no straggler could be named from the phases (GPU runs)

    @property
    def label(self) -> str:
        if self.spec.layout is not None:
            return f"{self.spec.layout.name} ({self.backend})"
        return f"{self.backend} x{self.spec.num_processes}"

    @property
    def folder_name(self) -> str:
        if self.spec.layout is not None:
            return f"{self.backend}-{self.spec.layout.slug}"
        return f"{self.backend}-np{self.spec.num_processes}"

    @property
    def comm_per_step(self) -> dict[str, dict[str, int]] | None:
        """The collectives of one (warmup) step on the rank that moved the most bytes: {"op@group": {calls, bytes}}."""
        counted = [rank["comm_per_step"] for rank in self.ranks if rank.get("comm_per_step") is not None]
        return max(counted, key=lambda c: sum(v["bytes"] for v in c.values()), default=None)

    @property
    def comm_bytes_per_step(self) -> int | None:
        counted = self.comm_per_step
        return None if counted is None else sum(v["bytes"] for v in counted.values())

    @property
    def gradient_bytes(self) -> int | None:
        return next((rank["gradient_bytes"] for rank in self.ranks if rank.get("gradient_bytes")), None)

    @property
    def zero_stage(self) -> int | None:
        return next((rank["zero_stage"] for rank in self.ranks if rank.get("zero_stage") is not None), None)


@dataclass
class CommRecord:
    num_processes: int
    status: str = "ok"
    exit_code: int = 0
    error: str | None = None
    rows: list[CommRow] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"comm x{self.num_processes}"

    @property
    def folder_name(self) -> str:
        return f"comm-np{self.num_processes}"


def run_failure_line(outcome: RunOutcome, ranks: list[dict[str, Any]], expected_ranks: int) -> str:
    """One line saying why a run failed, from the launch's outcome and what the ranks recorded."""
    if outcome.timed_out:
        return "timed out (--timeout); every rank was stopped"
    if outcome.stalled:  # the supervisor's watchdog stopped it; its error says where the ranks wait
        return f"stalled (--stall-timeout): {outcome.error}"
    # A killed rank is the cause; the others' errors (connection reset by the dead peer) are consequences.
    if outcome.exit_code == 128 + signal.SIGKILL:
        return "a rank was killed by SIGKILL (the kernel's out-of-memory killer sends it when RAM runs out)"
    if outcome.exit_code > 128:
        return f"a rank was killed by signal {outcome.exit_code - 128}"
    # The rank that failed first, with its own error (an exception, a usage error), not a peer's consequence.
    if outcome.failed_rank is not None and outcome.error:
        return f"rank {outcome.failed_rank}: {outcome.error}"
    errors = [f"rank {rank['rank']}: {rank['error']}" for rank in ranks if rank.get("error")]
    if errors:
        return errors[0]
    missing = expected_ranks - len(ranks)
    if missing > 0:
        return f"exit code {outcome.exit_code}; {missing} rank(s) wrote no result (see the run's output)"
    return f"exit code {outcome.exit_code}"


def run_status(outcome: RunOutcome) -> str:
    """A failed run's status in bench.json: "timed out" (--timeout), "stalled" (--stall-timeout) or "failed"."""
    return {"timed out": "timed out", "stalled": "stalled"}.get(outcome.status, "failed")


NO_OPTIMIZER_STEP = ("the script ended without an optimizer step: bench times optimizer steps (torch.optim, "
                     "Accelerate or DeepSpeed); bench a script that trains")


def is_resource_failure(record: RunRecord) -> bool:
    return record.status == "timed out" or record.exit_code == 128 + signal.SIGKILL or any(
        marker in (record.error or "") for marker in OOM_MARKERS)


class Sweep:
    """Runs every point of a BenchSpec and keeps the records."""

    def __init__(self, spec: BenchSpec, settings: LaunchSettings, backends: dict[str | None, str],
                 env: dict[str, str], progress: Callable[[str], None], save: Callable[[Sweep], None]) -> None:
        self.spec = spec
        self.settings = settings
        self.backends = backends  # as asked -> resolved name
        self.env = env
        self.progress = progress
        self.save = save
        self.records: list[RunRecord] = []
        self.comm: list[CommRecord] = []
        self.stopped: str | None = None  # why the sweep stopped early
        self.interrupted_by: int | None = None

    @property
    def runs_dir(self) -> Path:
        return self.spec.output / "runs"

    def _prepare_dir(self, name: str) -> Path:
        folder = self.runs_dir / name
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob("*.json"):  # results of an earlier sweep (--force) must not mix with this one
            old.unlink()
        return folder

    # -- the collective benchmark ----------------------------------------------------------------------------
    def run_comm(self) -> None:
        comm = self.spec.comm
        if comm is None:
            return
        backend = self.backends[self.spec.backends[0]]
        sizes = [n for n in self.spec.world_sizes if n >= 2]
        if not sizes:
            self.progress("comm: skipped (collectives need 2 or more processes; pass --num-processes 2 or more)")
        for n in sizes:
            record = CommRecord(num_processes=n)
            folder = self._prepare_dir(record.folder_name)
            args = ("--sizes", ",".join(map(str, comm.sizes)), "--iters", str(comm.iters), "--warmup",
                    str(comm.warmup))
            self.progress(f"comm: {n} processes: all-reduce, all-gather, reduce-scatter over {len(comm.sizes)} "
                          "sizes ...")
            request = comm_request(self.settings, launched_backend(backend, n), n, args)
            outcome = run_bench_launch(request, probe_dir=folder, max_steps=None, env=self.env,
                                 log_path=None if self.spec.show_output else folder / "output.log",
                                 timeout=self.spec.timeout, stall_timeout=self.spec.stall_timeout)
            ranks = read_results(folder, COMM_NAME)
            record.exit_code = outcome.exit_code
            local = n // self.spec.machines
            if outcome.signal is not None:
                record.status, self.interrupted_by = "interrupted", outcome.signal
            elif outcome.exit_code != 0 or len(ranks) != local:
                record.status = run_status(outcome)
                record.error = run_failure_line(outcome, ranks, local)
            else:
                record.rows = rows_from_ranks(ranks)
            self.comm.append(record)
            self.save(self)
            if record.status == "ok":
                largest = max((row for row in record.rows if row.op == "all_reduce"), key=lambda r: r.size_bytes)
                self.progress(f"comm: {n} processes: all-reduce busbw {largest.busbw_gbs:.3g} GB/s at "
                              f"{human_bytes(largest.size_bytes)} ({outcome.seconds:.1f} s)")
            else:
                self.progress(f"comm: {n} processes: {record.status.upper()}: {record.error or 'stopped'}")
            if self.interrupted_by is not None:
                self.stopped = "interrupted"
                return

    # -- the script's runs -----------------------------------------------------------------------------------
    def run_script(self) -> None:
        for run in self.spec.runs():
            record = self._run_one(run)
            self.records.append(record)
            self._attach_comm(record)
            self.save(self)
            self.progress(progress_line(record))
            if record.status in ("failed", "timed out", "stalled") and not self.spec.show_output:
                for line in log_tail(self.runs_dir / record.folder_name / "output.log"):
                    self.progress(f"  | {line}")
            if record.status == "interrupted":
                self.stopped = "interrupted"
                return
            if record.status != "ok" and not is_resource_failure(record) and not any(
                    r.status == "ok" for r in self.records):
                self.stopped = ("the sweep stopped: the script failed before any run succeeded, and the same "
                                "error would repeat at every size")
                return

    def _run_one(self, run: RunSpec) -> RunRecord:
        backend = self.backends[run.backend]
        launched = launched_backend(backend, run.num_processes)
        record = RunRecord(spec=run, backend=backend, launched=launched)
        folder = self._prepare_dir(record.folder_name)
        note = f" (as {launched})" if launched != backend else ""
        batch = f", per-device batch {run.per_device_batch}" if run.per_device_batch else ""
        window = f"at least {self.spec.steps} steps and {self.spec.min_time:g} s" if self.spec.min_time > 0 else \
            f"{self.spec.steps} steps"
        self.progress(f"[{run.index}/{run.total}] {run_title(record)}{note}{batch}: warmup {self.spec.warmup} + "
                      f"{window} ...")
        request = script_request(self.settings, launched, run.num_processes, self.spec.script or "",
                                 run.script_args, self.spec.module, run.layout)
        outcome = run_bench_launch(request, probe_dir=folder, max_steps=self.spec.warmup + self.spec.steps,
                             env={**self.env, WARMUP_ENV: str(self.spec.warmup),
                                  MIN_TIME_ENV: str(self.spec.min_time)},
                             log_path=None if self.spec.show_output else folder / "output.log",
                             timeout=self.spec.timeout, stall_timeout=self.spec.stall_timeout)
        record.exit_code, record.wall_s = outcome.exit_code, outcome.seconds
        record.ranks = read_results(folder, PROBE_NAME)
        if outcome.signal is not None:
            record.status, record.error = "interrupted", f"stopped by signal {outcome.signal}"
            self.interrupted_by = outcome.signal
            return record
        if outcome.exit_code != 0:
            record.status = run_status(outcome)
            record.error = run_failure_line(outcome, record.ranks, run.num_processes // self.spec.machines)
            return record
        if record.ranks and not any(rank.get("steps") for rank in record.ranks):
            record.status, record.error = "failed", NO_OPTIMIZER_STEP
            return record
        replicas = batch_replicas(run.layout) if run.layout is not None else 1
        try:
            record.summary = summarize(record.ranks, self.spec.warmup, self.spec.machines, replicas)
        except TooFewSteps as exc:
            record.status, record.error = "failed", f"{exc}; lower --warmup/--steps or let the script run longer"
            return record
        record.note = short_window_note(record.summary, self.spec, record.ranks)
        record.phases = rank_phases(record.ranks, self.spec.warmup)
        if run.layout is not None and run.layout.pp > 1:
            record.pipeline = pipeline_figures(record.ranks, self.spec.warmup, run.layout.pp)
        else:  # pipeline stages differ in their work by design: no rank of them is a straggler for that
            record.straggler, record.straggler_note = straggler_of(record.ranks, record.phases)
        return record

    def _attach_comm(self, record: RunRecord) -> None:
        comm = next((c for c in self.comm if c.num_processes == record.spec.num_processes and c.rows), None)
        grad = record.gradient_bytes
        if comm is None or grad is None or record.summary is None:
            return
        row = nearest_all_reduce(comm.rows, grad)
        if row is None:
            return
        factor = comm_volume_factor(record.launched, record.spec.num_processes, record.zero_stage)
        record.comm_busbw_gbs = row.busbw_gbs
        record.comm_predicted_s = predicted_comm_seconds(grad, row.busbw_gbs, factor)

    def finish(self) -> None:
        """Speedup and efficiency of every successful run against its backend's smallest successful world size;
        with --layouts, each layout's throughput against the first layout that succeeded (same world size: a
        ratio, not an efficiency, so a faster layout is no superlinear noise)."""
        if self.spec.layouts:
            done = [r for r in self.records if r.summary is not None]
            for r in done:
                base = done[0]
                assert r.summary is not None and base.summary is not None
                ratio = scaling(r.spec.num_processes, r.summary, base.spec.num_processes, base.summary,
                                self.spec.scaling).speedup if r is not base else 1.0
                r.scaling = Scaling(base.spec.num_processes, ratio, None,
                                    noise_reasons(None, r.summary, base.summary))
            return
        for backend in dict.fromkeys(r.backend for r in self.records):
            done = [r for r in self.records if r.backend == backend and r.summary is not None]
            if not done:
                continue
            base = min(done, key=lambda r: r.spec.num_processes)
            assert base.summary is not None
            for r in done:
                assert r.summary is not None
                r.scaling = scaling(r.spec.num_processes, r.summary, base.spec.num_processes, base.summary,
                                    self.spec.scaling)


def run_title(record: RunRecord) -> str:
    if record.spec.layout is not None:
        return f"{record.spec.layout.name} ({record.backend}, {record.spec.num_processes} processes)"
    return f"{record.backend}, {record.spec.num_processes} process(es)"


def short_window_note(summary: RunSummary, spec: BenchSpec, ranks: list[dict[str, Any]]) -> str | None:
    """What to say when a run measured less than asked: the script ended first, or the ranks could not agree."""
    short_steps = summary.steps < spec.steps
    short_time = spec.min_time > 0 and summary.measured_s < spec.min_time * 0.95
    if short_steps or short_time:
        done = spec.warmup + summary.steps
        per_step = summary.measured_s / summary.steps  # the window is wall time: project with the mean step
        projected = math.ceil(round(spec.min_time * 1.1 / per_step, 6)) if per_step > 0 else 0
        wanted = spec.warmup + max(spec.steps, projected)
        return (f"the script ended after {done} steps: {summary.steps} measured over {summary.measured_s:.2f} s, "
                f"less than the {spec.steps} steps / {spec.min_time:g} s window asked (give it more steps or "
                f"epochs: about {wanted} steps in all)")
    fixed = next((r["window"] for r in ranks if str(r.get("window", "")).startswith("steps (")), None)
    return f"measured --steps alone: {fixed[7:-1]}" if fixed and spec.min_time > 0 else None


def log_tail(path: Path, lines: int = 12) -> list[str]:
    """The last lines of a run's output (what usually names the error), progress bars and blank lines left out."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    kept = [line.rstrip() for line in text.replace("\r", "\n").splitlines() if line.strip() and "it/s]" not in line]
    return kept[-lines:]


def human_bytes(value: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def progress_line(record: RunRecord) -> str:
    head = f"[{record.spec.index}/{record.spec.total}] {run_title(record)}"
    if record.summary is None:
        return f"{head}: {record.status.upper()}: {record.error} ({record.wall_s:.1f} s)"
    s = record.summary
    rate = f"{s.samples_per_s:,.0f} samples/s" if s.samples_per_s else "samples unknown"
    note = f"; {record.note}" if record.note else ""
    return (f"{head}: {s.step_median_s * 1000:.1f} ms/step (IQR {s.spread:.0%}, {s.steps} steps over "
            f"{s.measured_s:.1f} s), {rate}, data wait {s.data_wait_share:.0%}, peak "
            f"{human_bytes(s.peak_memory_bytes)}/rank ({record.wall_s:.1f} s){note}")
