"""scaling.png: measured speedup against the ideal line, and efficiency per world size (one line per backend);
with a single world size per backend (--compare-backends, --layouts), throughput (tokens/s when every run counted
tokens, else samples/s; both from the median step) and peak memory per backend or layout instead.
matplotlib is the optional extra `accelkit[plot]`."""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

from accelkit.bench.sweep import RunRecord

INSTALL_HINT = "pip install 'accelkit[plot]' (or: pip install matplotlib)"
FIGURE_INCHES = (10.0, 4.0)
DPI = 100  # scaling.png is 1000 x 400 pixels


def matplotlib_available() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("matplotlib") is not None
    except (ImportError, ValueError):
        return False


def plot(records: list[RunRecord], path: Path | BinaryIO, title: str) -> bool:
    """Draw the figure to `path` (a file name or a binary file); False when no run succeeded."""
    done = [r for r in records if r.summary is not None]
    if not done:
        return False
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=FIGURE_INCHES, dpi=DPI)
    backends = list(dict.fromkeys(r.backend for r in done))
    swept = any(len({r.spec.num_processes for r in done if r.backend == b}) > 1 for b in backends)
    if swept:
        _scaling_axes(left, right, done, backends)
    else:
        _comparison_axes(left, right, done, backends)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI, format="png")
    plt.close(fig)
    return True


def _scaling_axes(left, right, done: list[RunRecord], backends: list[str]) -> None:
    sizes = sorted({r.spec.num_processes for r in done})
    base = min(sizes)
    left.plot(sizes, [n / base for n in sizes], "k--", linewidth=1, label="ideal")
    right.axhline(1.0, color="k", linestyle="--", linewidth=1, label="ideal")
    for backend in backends:
        points = sorted((r.spec.num_processes, r.scaling) for r in done if r.backend == backend
                        and r.scaling is not None and r.scaling.speedup is not None)
        if not points:
            continue
        xs = [n for n, _ in points]
        left.plot(xs, [s.speedup for _, s in points], "o-", label=backend)
        right.plot(xs, [s.efficiency for _, s in points], "o-", label=backend)
    for axis in (left, right):
        axis.set_xscale("log", base=2)
        axis.set_xticks(sizes, [str(n) for n in sizes])
        axis.set_xlabel("processes")
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=8)
    left.set_ylabel(f"speedup vs {base} process{'es' if base > 1 else ''}")
    left.set_title("measured speedup", fontsize=10)
    right.set_ylabel("efficiency")
    right.set_ylim(0, max(1.1, *(r.scaling.efficiency or 0 for r in done if r.scaling)) * 1.05)
    right.set_title("scaling efficiency", fontsize=10)


def _comparison_axes(left, right, done: list[RunRecord], backends: list[str]) -> None:
    labels = [f"{r.spec.layout.name.replace(',', chr(10))}\n({r.backend})" if r.spec.layout is not None
              else f"{r.backend}\nx{r.spec.num_processes}" for r in done]
    assert all(r.summary is not None for r in done)
    tokens = all(r.summary.tokens_per_s for r in done)  # type: ignore[union-attr]
    left.bar(labels, [(r.summary.tokens_per_s if tokens else r.summary.samples_per_s) or 0  # type: ignore[union-attr]
                      for r in done])
    left.set_ylabel("tokens/s" if tokens else "samples/s")
    left.set_title("throughput", fontsize=10)
    right.bar(labels, [r.summary.peak_memory_bytes / 2**20 for r in done])  # type: ignore[union-attr]
    right.set_ylabel("MiB")
    right.set_title("peak memory per rank", fontsize=10)
    for axis in (left, right):
        axis.grid(True, axis="y", alpha=0.3)
