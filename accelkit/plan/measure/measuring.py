"""`accelkit plan --measure SCRIPT`: run the user's own script for one optimizer step under the planned launch
(a CPU rehearsal without GPUs), with the plan's probe in every rank, and put planned and measured side by side.

The plan side is recomputed for exactly what each rank ran: the script's model (its parameter shapes, read by the
probe), its optimizer's groups, the backend and world size of the launch, and for activations the batch shape the
script fed (traced with the kernels of the device that ran it).
"""

from __future__ import annotations

import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accelkit.errors import AccelkitError, Terminated
from accelkit.plan.measure.compare import Figure, state_figures

PROBE_MODULE = "accelkit.plan.measure.probe"


@dataclass(frozen=True)
class RankComparison:
    rank: int
    model: str
    figures: list[Figure]
    peak: int | None  # GPUs: torch.cuda.max_memory_allocated


def measure(options, script: str, args: tuple[str, ...], *, cpu: bool, precision: str, optimizer: str,
            activations_planner=None, planned_peak: int | None = None,
            command_line: str = "accelkit plan --measure", stall_timeout: float | None = None) -> list[RankComparison]:
    """Launch, read every rank's record, compare. `activations_planner(record) -> int | None` plans a rank's
    activations for the batch it saw (None: not planned); `planned_peak` is the plan's total per GPU, compared
    with the allocator's peak on GPUs."""
    from accelkit.plan import spine
    from accelkit.ranks.probes import read_results

    with tempfile.TemporaryDirectory(prefix="accelkit-plan-measure-") as folder:
        outcome = spine.run_measurement(options, script, args, cpu=cpu, probe_dir=Path(folder),
                                        probe=PROBE_MODULE, max_steps=1, command_line=command_line,
                                        stall_timeout=stall_timeout)
        results = read_results(Path(folder), "plan")
    if outcome.signal is not None:  # stopped by Ctrl-C / SIGTERM: the launch stopped every rank; exit like it
        raise KeyboardInterrupt if outcome.signal == signal.SIGINT else Terminated(outcome.signal)
    if outcome.stalled:  # the watchdog printed the ranks' stacks above
        raise AccelkitError(f"the measured run of {script} stalled and was stopped: {outcome.error}",
                            hint=outcome.hint, exit_code=outcome.exit_code)
    records = [r for result in results for r in result.get("records", [])]
    if outcome.exit_code != 0 and not records:
        own = f": {_who(outcome)}{outcome.error}" if outcome.error else ""
        raise AccelkitError(f"the measured run of {script} failed (exit status {outcome.exit_code}) before its first "
                            f"optimizer step{own}",
                            hint="run the same launch without --measure to see the script's error")
    if not records:
        raise AccelkitError(f"{script} ran, but no optimizer step of a model prepared by Accelerate was seen",
                            hint="--measure needs a script that calls accelerator.prepare(model, optimizer, ...) "
                                 "and steps the optimizer")
    return [compare_record(r, precision, optimizer, activations_planner, planned_peak) for r in records]


def _who(outcome) -> str:
    return "" if outcome.failed_rank is None else f"rank {outcome.failed_rank}: "


def compare_record(record: dict[str, Any], precision: str, optimizer: str, activations_planner=None,
                   planned_peak: int | None = None) -> RankComparison:
    figures = state_figures(record, precision, optimizer)
    measured = record.get("activations") or {}
    planned = activations_planner(record) if activations_planner is not None else None
    if planned is not None:
        figures.append(Figure("activations", planned, measured.get("total") if measured else None))
    peak = record.get("cuda_max_allocated")
    if peak is not None and planned_peak is not None:  # GPUs: the allocator's peak against the plan's total
        figures.append(Figure("GPU peak", planned_peak, peak))
    return RankComparison(record["rank"], record["model"], figures, peak)


def table(comparisons: list[RankComparison]) -> list[str]:
    lines = [f"{'rank':>4}  {'model':24}  {'figure':11}  {'planned':>14}  {'measured':>14}  {'error':>8}"]
    for comparison in sorted(comparisons, key=lambda c: (c.model, c.rank)):
        for figure in comparison.figures:
            measured = "-" if figure.measured is None else f"{figure.measured:,}"
            error = "-" if figure.error is None else f"{figure.error * 100:+.2f}%"
            lines.append(f"{comparison.rank:>4}  {comparison.model[:24]:24}  {figure.name:11}  "
                         f"{figure.planned:>14,}  {measured:>14}  {error:>8}")
    return lines


def worst(comparisons: list[RankComparison], names: tuple[str, ...]) -> float:
    errors = [abs(f.error) for c in comparisons for f in c.figures if f.name in names and f.error is not None]
    return max(errors, default=0.0)
