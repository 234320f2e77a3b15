"""What a merge is asked to do, what it reports, and that report for people (light: no torch)."""

from __future__ import annotations

import resource
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from accelkit.sizes import format_bytes


@dataclass
class MergeOptions:
    input: Path
    output: Path | None = None  # None: inspect only
    dtype: str = "keep"
    max_shard_size: str | None = None
    verify: bool = False
    force: bool = False
    tag: str | None = None
    model_index: int | None = None
    config_from: Path | None = None
    allow_nonfinite: bool = False
    progress: bool = True
    notify: Callable[[str], None] | None = None  # one-line notices while merging (the CLI prints them on stderr)


@dataclass
class MergeReport:
    format_name: str
    world_size: int | None
    notes: list[str]
    tensors: int
    parameters: int
    bytes: int
    dtypes: dict[str, int]
    input_files: int
    input_bytes: int
    checks: list[str] = field(default_factory=list)
    output: Path | None = None
    output_files: list[str] = field(default_factory=list)
    copied: list[str] = field(default_factory=list)
    dropped_aliases: dict[str, str] = field(default_factory=dict)
    nonfinite: dict[str, int] = field(default_factory=dict)  # accepted with --allow-nonfinite
    verified: bool = False
    seconds: float = 0.0
    open_seconds: float = 0.0  # opening and checking the input before any byte is written
    checksum_seconds: float = 0.0  # CRC-32 of the records read
    scan_seconds: float = 0.0  # the non-finite scan (on the writer thread, beside the reads)
    peak_rss_bytes: int = 0


def peak_rss_bytes() -> int:
    """Peak resident memory of this process (ru_maxrss is KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def format_report(report: MergeReport, inspect_only: bool) -> str:
    """What `accelkit merge-ckpt` prints: the format, the input, the tensors, every check, and the output (or, for
    --inspect, the tied weights and that nothing was written)."""
    lines = [f"Format:      {report.format_name}" + (f", world size {report.world_size}" if report.world_size else "")]
    lines += [f"  - {note}" for note in report.notes]
    lines.append(f"Input:       {report.input_files} files, {format_bytes(report.input_bytes)}")
    dtypes = ", ".join(f"{n} x {d}" for d, n in sorted(report.dtypes.items()))
    lines.append(f"Tensors:     {report.tensors} ({dtypes})")
    lines.append(f"Parameters:  {report.parameters:,}")
    lines.append(f"Bytes:       {format_bytes(report.bytes)}" + (" (tensor data)" if inspect_only else " written"))
    lines += [("Checked:     " if i == 0 else "             ") + check for i, check in enumerate(report.checks)]
    if inspect_only:
        if report.dropped_aliases:
            lines.append("Tied:        " + ", ".join(f"{a} -> {t}" for a, t in report.dropped_aliases.items()))
        lines.append("Nothing was written (--inspect).")
        return "\n".join(lines)
    lines.append(f"Output:      {report.output} ({', '.join(report.output_files)})")
    if report.output is not None and report.output.suffix != ".safetensors" and "config.json" not in report.copied:
        lines.append("Warning:     no config.json was found beside the checkpoint, so the folder holds weights only: "
                     "from_pretrained cannot load it; pass --config-from FOLDER (the model's config.json) to copy "
                     "one in")
    if report.verified:
        lines.append("Verified:    the output, re-read, equals the input as read (input checksums checked)")
    lines.append(f"Time:        {report.seconds:.1f} s, peak memory {format_bytes(report.peak_rss_bytes)}")
    return "\n".join(lines)
