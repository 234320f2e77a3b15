"""What a merge is asked to do and what it reports (light: no torch; shared by the torch and torch-free paths)."""

from __future__ import annotations

import resource
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


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
