"""The torch path of the merge: open the recognised format with its reader, check, stream into safetensors.

Called by api.py (merge_with_torch, inspect_with_torch) for what the torch-free merge does not read, decided
before anything is written, with what it found: the format (detect: its note says why, so the user sees what
was merged), and the proven byte ranges when the torch-free proof was made (ProvenSource: nothing is opened or checked
again). Order matters for trust: everything that can be checked before writing is (layout, consistency of the rank
files and of the save_state files, the manifest's hashes); then the output is staged under a temporary name, written
piece by piece with every record's CRC-32 and a non-finite scan on the way (see stream), the records read only in
part are checked to their end, and only then is the output renamed into place.
"""

from __future__ import annotations

import contextlib
import gc
import json
import time
from collections import Counter
from pathlib import Path

import torch

from accelkit.errors import AccelkitError
from accelkit.fsio import StagedOutput, write_error
from accelkit.merge import counters, dcp, deepspeed, extras, hf_sharded, manifest, savestate, torch_files
from accelkit.merge.api import (
    Detected,
    MergeOptions,
    MergeReport,
    check_merge_request,
    detect,
    finish_report,
    peak_rss_bytes,
)
from accelkit.merge.dtypes import CAST, TABLE, name_of
from accelkit.merge.output import (
    FILES_KEY,
    INDEX_FILE,
    build_index,
    copy_side_files,
    plan_shards,
    progress_bar,
    shard_file_names,
    start_writing,
)
from accelkit.merge.source import CheckpointSource, ProvenSource, TensorEntry
from accelkit.merge.stream import TensorStream
from accelkit.merge.writer import SAFETENSORS_METADATA, safetensors_header


def open_source(detected: Detected) -> CheckpointSource:
    """The reader of the format recognised (api.detect), with why it was recognised as its first note."""
    if detected.kind == "dcp":
        source: CheckpointSource = dcp.DCPSource(detected.path)
    elif detected.kind == "deepspeed":
        source = deepspeed.DeepSpeedSource(detected.path, detected.tag)
    elif detected.kind == "safetensors":
        source = hf_sharded.SafetensorsSource(detected.path)
    else:
        source = torch_files.TorchFileSource(detected.path)
    source.notes.insert(0, detected.why)
    return source


_CASTS: dict[str, torch.dtype | None] = {choice: getattr(torch, name) if name else None
                                        for choice, name in CAST.items()}


def _report(source: CheckpointSource, entries: list[TensorEntry]) -> MergeReport:
    files = [f for f in source.files if f.is_file()]
    return MergeReport(
        format_name=source.format_name, world_size=source.world_size, notes=list(source.notes),
        tensors=len(entries), parameters=sum(e.numel for e in entries), bytes=sum(e.nbytes for e in entries),
        dtypes=dict(Counter(name_of(e.dtype) for e in entries)), input_files=len(files),
        input_bytes=sum(f.stat().st_size for f in files), checks=list(source.checks))


def _open_and_check(opts: MergeOptions, detected: Detected, hash_manifest: bool,
                    proven: tuple | None = None) -> tuple[CheckpointSource, list[str]]:
    """Open the input with every check its format and surroundings allow (or go on from what the torch-free proof
    found and checked); the extra check lines."""
    source = ProvenSource(*proven) if proven else open_source(detected)
    try:
        steps = source.step_counters

        def read_files() -> list[Path]:
            return [*source.files, *extras.find_side_files(opts.input, opts.config_from)[1]]

        # first: when there is a manifest, it says best what is wrong
        checks = manifest.signed_checks(source.root, read_files if hash_manifest else None, source.world_size, steps)
        folder = extras.find_save_state_dir(source.root)
        if folder is not None:
            checks += savestate.check_save_state(folder, source.world_size, source.reader, steps)
        agreed = counters.cross_check(steps)
        if agreed:
            checks.append(agreed)
        return source, checks
    except BaseException:
        source.close()
        raise


def inspect_with_torch(input_path: Path, tag: str | None = None, model_index: int | None = None,
                       detected: Detected | None = None, proven: tuple | None = None) -> MergeReport:
    """Describe a checkpoint (and check what can be checked without reading every byte); write nothing."""
    start = time.perf_counter()
    detected = detected or detect(input_path, tag, model_index)
    source, checks = _open_and_check(MergeOptions(input=input_path, tag=tag, model_index=model_index), detected,
                                     hash_manifest=False, proven=proven)
    try:
        report = _report(source, source.entries)
        report.checks += checks
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


def merge_with_torch(opts: MergeOptions, detected: Detected | None = None, max_bytes: int | None = None,
                     proven: tuple | None = None) -> MergeReport:
    """The merge with torch, going on from the request checked, the format recognised and what the torch-free proof
    found, if it was made (merge_checkpoint); or, called alone, checking, recognising and opening them first."""
    start = time.perf_counter()
    if detected is None:
        max_bytes = check_merge_request(opts)
        detected = detect(opts.input, opts.tag, opts.model_index)
    assert opts.output is not None
    dtype = _CASTS[opts.dtype]
    to_file = opts.output.suffix == ".safetensors"
    with lean_process():
        source, checks = _open_and_check(opts, detected, hash_manifest=True, proven=proven)
        try:
            report = _merge(source, opts, dtype, to_file, max_bytes, start)
        finally:
            source.close()
    report.checks[len(source.checks):len(source.checks)] = checks
    return report


@contextlib.contextmanager
def lean_process():
    """What a streaming copy needs from the process, restored afterwards (for in-process callers).

    One torch thread: every operation here (a sum, a cast) runs at memory speed, and idle OpenMP workers spin on the
    second core the writer thread needs. No cyclic garbage collection: the merge makes no cycles, and collections
    triggered by unpickling thousands of small metadata objects cost more than the merge of a small model."""
    threads, collecting = torch.get_num_threads(), gc.isenabled()
    torch.set_num_threads(1)
    gc.disable()
    try:
        with torch.no_grad():
            yield
    finally:
        torch.set_num_threads(threads)
        if collecting:
            gc.enable()


def _plan(source: CheckpointSource, opts: MergeOptions, dtype: torch.dtype | None, to_file: bool,
          max_bytes: int | None, stream: TensorStream, notes: list[str]):
    side_folder, side_files = extras.find_side_files(opts.input, opts.config_from)
    dropped = dict(source.aliases)
    config = next((f for f in side_files if f.name == extras.CONFIG_FILE), None)
    if config is not None and source.ties_from_config:
        for alias, target in extras.tied_pairs_from_config(config, notes).items():
            if alias in source.entry_by_name and target in source.entry_by_name:
                if stream.same_values(target, alias):
                    dropped[alias] = target
                else:
                    notes.append(f"config ties {alias} to {target} but their values differ: both are kept")
    if config is None and not to_file:  # a folder, as save_pretrained writes: a head equal to the embedding is tied
        for alias, target in extras.tie_candidates(list(source.entry_by_name)).items():
            if alias not in dropped and stream.same_values(target, alias):
                dropped[alias] = target
    if dropped:
        notes.append("tied weights stored once, as transformers does: "
                     + ", ".join(f"{a} -> {t}" for a, t in dropped.items()))
    entries = [_cast(e, dtype) for e in source.entries if e.name not in dropped]
    unsupported = [e for e in entries if name_of(e.dtype) not in TABLE]
    if unsupported:
        raise AccelkitError(f"tensor {unsupported[0].name!r} has dtype {unsupported[0].dtype}, which safetensors "
                            "cannot store", hint="convert that tensor to a real dtype before merging")
    if to_file:
        return [entries], [opts.output.name], dropped, side_folder, side_files
    plan = plan_shards(entries, max_bytes) if max_bytes else [entries]
    return plan, shard_file_names(len(plan)), dropped, side_folder, side_files


def _merge(source: CheckpointSource, opts: MergeOptions, dtype: torch.dtype | None, to_file: bool,
           max_bytes: int | None, start: float) -> MergeReport:
    assert opts.output is not None
    notes = list(source.notes)
    notify = opts.notify or (lambda message: None)
    stream = TensorStream(source, opts.allow_nonfinite, on_bytes=lambda n: None)
    plan, names, dropped, side_folder, side_files = _plan(source, opts, dtype, to_file, max_bytes, stream, notes)
    entries = [e for shard in plan for e in shard]
    report = _report(source, entries)
    report.notes, report.dropped_aliases, report.output = notes, dropped, opts.output
    report.output_files = list(names)
    report.open_seconds = time.perf_counter() - start
    folder_files = [*names, *([INDEX_FILE] if len(plan) > 1 else []), *(f.name for f in side_files)]
    metadata = dict(SAFETENSORS_METADATA)
    if not to_file:
        metadata[FILES_KEY] = json.dumps(folder_files)

    staged = StagedOutput(opts.output, is_dir=not to_file)
    with staged as temp:
        files = [temp] if to_file else [temp / n for n in names]
        needed = report.bytes + sum(len(safetensors_header(shard, metadata)) for shard in plan) + sum(
            f.stat().st_size for f in side_files)
        start_writing(staged, temp if to_file else None, temp.parent if to_file else temp, needed, opts.output,
                      notify, report.tensors, report.bytes)
        with progress_bar(report.bytes, "merge", opts.progress) as bar:
            stream.on_bytes = bar.update
            for shard_entries, file in zip(plan, files, strict=True):
                stream.write_file(shard_entries, file, metadata, label=opts.output)
        source.finish()
        if not to_file:
            _write_folder_extras(temp, plan, names, side_files, opts.output, folder_files)
            if len(plan) > 1:
                report.output_files.append(INDEX_FILE)
        if opts.verify:
            with progress_bar(report.bytes, "verify", opts.progress) as bar:
                stream.on_bytes = bar.update
                for shard_entries, file in zip(plan, files, strict=True):
                    stream.verify_file(shard_entries, file, len(safetensors_header(shard_entries, metadata)))
            report.verified = True
        staged.commit()
    return finish_report(report, [] if to_file else side_files, side_folder, source.reader, stream.scan, start)


def _write_folder_extras(temp: Path, plan: list[list[TensorEntry]], names: list[str], side_files: list[Path],
                         output: Path, folder_files: list[str]) -> None:
    if len(plan) > 1:
        index = build_index(plan, names)
        index["metadata"][FILES_KEY] = folder_files
        try:
            (temp / INDEX_FILE).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
        except OSError as exc:
            raise write_error(exc, output) from None
    copy_side_files(temp, side_files, output)
