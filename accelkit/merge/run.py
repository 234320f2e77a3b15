"""The merge itself: detect the input, plan the output, stream tensors from reader to writer, verify, rename.

Memory: a reader yields one tensor, it is cast and appended to the open output file (on a helper thread, while the
next one is read), then dropped; every output file's header is written before its first tensor, so neither the
model nor a whole shard is ever held.
"""

from __future__ import annotations

import contextlib
import json
import resource
import shutil
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch

from accelkit.errors import AccelkitError
from accelkit.fsio import DISK_FULL_ERRNOS, StagedOutput, write_error
from accelkit.merge import extras, shards, single_file
from accelkit.merge.detect import open_source
from accelkit.merge.output import check_free_space, check_paths
from accelkit.merge.source import CheckpointSource, TensorEntry
from accelkit.merge.torch_files import MAP_WINDOW_BYTES
from accelkit.merge.writer import SAFETENSORS_DTYPES, SafetensorsWriter

DTYPES: dict[str, torch.dtype | None] = {"keep": None, "fp32": torch.float32, "bf16": torch.bfloat16,
                                         "fp16": torch.float16}
SAFETENSORS_METADATA = {"format": "pt"}  # transformers refuses safetensors files without it


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
    progress: bool = True


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
    output: Path | None = None
    output_files: list[str] = field(default_factory=list)
    copied: list[str] = field(default_factory=list)
    dropped_aliases: dict[str, str] = field(default_factory=dict)
    verified: bool = False
    seconds: float = 0.0
    peak_rss_bytes: int = 0


def peak_rss_bytes() -> int:
    """Peak resident memory of this process (ru_maxrss is KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def release_large_frees_to_os() -> None:
    """Make glibc serve (and free) every allocation above 1 MiB with its own mmap.

    Tensors come and go one at a time; by default glibc raises its mmap threshold after the first large free and
    then recycles tensor-sized blocks through its heap, which fragments and grows RSS by several tensors' worth.
    With a fixed threshold each freed tensor goes straight back to the OS (costs ~1 s/GB in page faults).
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass  # not glibc (e.g. musl): nothing to tune


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _report(source: CheckpointSource, entries: list[TensorEntry]) -> MergeReport:
    files = [f for f in source.files if f.is_file()]
    return MergeReport(
        format_name=source.format_name, world_size=source.world_size, notes=list(source.notes),
        tensors=len(entries), parameters=sum(e.numel for e in entries), bytes=sum(e.nbytes for e in entries),
        dtypes=dict(Counter(_dtype_name(e.dtype) for e in entries)), input_files=len(files),
        input_bytes=sum(f.stat().st_size for f in files))


def inspect_checkpoint(input_path: Path, tag: str | None = None, model_index: int | None = None) -> MergeReport:
    """Describe a checkpoint without writing anything."""
    start = time.perf_counter()
    source = open_source(input_path, tag, model_index)
    try:
        report = _report(source, source.entries)
        report.dropped_aliases = dict(source.aliases)
    finally:
        source.close()
    report.seconds = time.perf_counter() - start
    report.peak_rss_bytes = peak_rss_bytes()
    return report


def _cast(entry: TensorEntry, dtype: torch.dtype | None) -> TensorEntry:
    if dtype is None or not entry.dtype.is_floating_point or entry.dtype == dtype:
        return entry
    return TensorEntry(entry.name, entry.shape, dtype)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(
        a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


def _untie(source: CheckpointSource, pairs: dict[str, str], notes: list[str]) -> dict[str, str]:
    """Which config-tied pairs present in the checkpoint hold identical values (so one copy can go)."""
    present = source.entry_by_name
    dropped = {}
    for alias, target in pairs.items():
        if alias in present and target in present:
            values = dict(source.read([target, alias]))
            if _same_bits(values[target], values[alias]):
                dropped[alias] = target
            else:
                notes.append(f"config ties {alias} to {target} but their values differ: both are kept")
    return dropped


def _progress(total: int, desc: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc, file=sys.stderr,
                disable=not enabled, dynamic_ncols=True)


def merge_checkpoint(opts: MergeOptions) -> MergeReport:
    start = time.perf_counter()
    if opts.output is None:
        raise AccelkitError("no output given", hint="pass -o OUTPUT (or --inspect to only look)")
    dtype = DTYPES[opts.dtype]
    to_file = opts.output.suffix == ".safetensors"
    if opts.output.suffix in single_file.SUFFIXES:
        raise AccelkitError(f"merge-ckpt writes safetensors, not {opts.output.suffix} pickles",
                            hint=f"use -o {opts.output.with_suffix('.safetensors')} or a folder")
    if to_file and opts.max_shard_size:
        raise AccelkitError("--max-shard-size needs a folder output",
                            hint=f"use -o {opts.output.with_suffix('')}/ to get shards and an index")
    max_bytes = shards.parse_size(opts.max_shard_size) if opts.max_shard_size else None
    check_paths(opts.input, opts.output, opts.force)
    release_large_frees_to_os()
    source = open_source(opts.input, opts.tag, opts.model_index)
    try:
        with torch.no_grad():  # tensors loaded with requires_grad must not build autograd graphs
            return _merge(source, opts, dtype, to_file, max_bytes, start)
    finally:
        source.close()


def _merge(source: CheckpointSource, opts: MergeOptions, dtype: torch.dtype | None, to_file: bool,
           max_bytes: int | None, start: float) -> MergeReport:
    assert opts.output is not None
    notes = list(source.notes)
    side_folder, side_files = extras.find_side_files(opts.input, opts.config_from)
    dropped = dict(source.aliases)
    config = next((f for f in side_files if f.name == extras.CONFIG_FILE), None)
    if config is not None and source.ties_from_config:
        dropped.update(_untie(source, extras.tied_pairs_from_config(config), notes))
    if dropped:
        notes.append("tied weights stored once, as transformers does: "
                     + ", ".join(f"{a} -> {t}" for a, t in dropped.items()))
    entries = [_cast(e, dtype) for e in source.entries if e.name not in dropped]
    unsupported = [e for e in entries if e.dtype not in SAFETENSORS_DTYPES]
    if unsupported:
        raise AccelkitError(f"tensor {unsupported[0].name!r} has dtype {unsupported[0].dtype}, which safetensors "
                            "cannot store", hint="convert that tensor to a real dtype before merging")
    if to_file:
        plan, names = [entries], [opts.output.name]
    else:
        plan = shards.plan_shards(entries, max_bytes) if max_bytes else [entries]
        names = shards.shard_file_names(len(plan))
    report = _report(source, entries)
    report.notes, report.dropped_aliases, report.output = notes, dropped, opts.output
    report.output_files = names
    parent = opts.output.parent
    existing = parent
    while not existing.exists():
        existing = existing.parent
    check_free_space(existing, report.bytes + 1024 * 1024)

    staged = StagedOutput(opts.output, is_dir=not to_file)
    try:
        with staged as temp:
            files = [temp] if to_file else [temp / n for n in names]
            with _progress(report.bytes, "merge", opts.progress) as bar:
                for shard_entries, file in zip(plan, files, strict=True):
                    _write_file(source, shard_entries, file, bar)
            if not to_file:
                if len(plan) > 1:
                    index = shards.build_index(plan, names)
                    (temp / shards.INDEX_FILE).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
                    report.output_files.append(shards.INDEX_FILE)
                for f in side_files:
                    shutil.copyfile(f, temp / f.name)
                report.copied = [f.name for f in side_files]
                if side_files:
                    notes.append(f"copied {', '.join(report.copied)} from {side_folder}")
            if opts.verify:
                _verify(source, plan, files, dtype, opts.progress)
                report.verified = True
            staged.commit()
    except OSError as exc:
        if exc.errno in DISK_FULL_ERRNOS:
            raise write_error(exc, opts.output) from None
        raise
    report.seconds = time.perf_counter() - start
    report.peak_rss_bytes = peak_rss_bytes()
    return report


def _write_file(source: CheckpointSource, entries: list[TensorEntry], file: Path, bar) -> None:
    """Stream `entries` into `file`: tensor i is written on a helper thread while tensor i+1 is read.

    Reading and writing are both mostly I/O (and release the GIL), so overlapping them saves up to half the time;
    at most two tensors are alive at once.
    """
    from concurrent.futures import Future, ThreadPoolExecutor

    writer = SafetensorsWriter(file, entries, SAFETENSORS_METADATA)
    by_name = {e.name: e for e in entries}
    pending: Future | None = None
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="accelkit-write") as pool:
        try:
            for name, tensor in source.read([e.name for e in entries]):
                tensor = tensor.to(by_name[name].dtype)
                if pending is not None:
                    bar.update(pending.result())
                pending = pool.submit(writer.write, name, tensor)
                del tensor
            if pending is not None:
                bar.update(pending.result())
                pending = None
            writer.close()
        except BaseException:
            if pending is not None:
                with contextlib.suppress(BaseException):  # the first error is the one being raised already
                    pending.result()  # never close the file under a write in flight
            writer.abort()
            raise


def _verify(source: CheckpointSource, plan: list[list[TensorEntry]], files: list[Path], dtype: torch.dtype | None,
            progress: bool) -> None:
    """Re-read every output tensor and compare its bits with the source tensor (cast the same way)."""
    from safetensors import safe_open

    total = sum(e.nbytes for shard in plan for e in shard)
    with _progress(total, "verify", progress) as bar:
        for entries, file in zip(plan, files, strict=True):
            out, read_since_open = safe_open(str(file), framework="pt"), 0
            if set(out.keys()) != {e.name for e in entries}:
                raise AccelkitError(f"verification failed: {file.name} does not hold the planned tensors",
                                    hint="report this as a bug; no output was written")
            for entry, (name, tensor) in zip(entries, source.read([e.name for e in entries]), strict=True):
                if not _same_bits(out.get_tensor(name), tensor.to(entry.dtype)):
                    raise AccelkitError(f"verification failed: {name} in the output differs from the source",
                                        hint="report this as a bug; no output was written")
                bar.update(entry.nbytes)
                read_since_open += entry.nbytes
                if read_since_open >= MAP_WINDOW_BYTES:  # drop the map's pages from RSS
                    out, read_since_open = safe_open(str(file), framework="pt"), 0
            del out
