"""The merge's report for people: what was read, checked and written, one labelled line each (light: no torch)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from accelkit.merge.output import format_bytes

if TYPE_CHECKING:
    from accelkit.merge.pipeline import MergeReport


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
