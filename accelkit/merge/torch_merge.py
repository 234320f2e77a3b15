"""The torch path of the merge: recognise the format, open it with its reader, check, stream into safetensors.

Called by light_run (merge_with_torch, inspect_with_torch) for what the torch-free merge does not read, decided
before anything is written. Recognising a layout explains the decision (each branch adds a sentence; the most
specific layouts first), so the user sees what was merged and why. Order matters for trust: everything that can be
checked before writing is (layout, consistency of the rank files and of the save_state files, the manifest's
hashes); then the output is staged under a temporary name, written piece by piece with every record's CRC-32 and a
non-finite scan on the way (see stream), the records read only in part are checked to their end, and only then is
the output renamed into place.
"""

from __future__ import annotations

import contextlib
import gc
import json
import re
import time
from collections import Counter
from pathlib import Path

import torch

from accelkit.errors import AccelkitError
from accelkit.fsio import StagedOutput, write_error
from accelkit.merge import counters, dcp, deepspeed, extras, hf_sharded, manifest, savestate, torch_files
from accelkit.merge.dtypes import CAST, TABLE, name_of
from accelkit.merge.light_run import MergeOptions, MergeReport, peak_rss_bytes
from accelkit.merge.nonfinite import nonfinite_note, scan_line
from accelkit.merge.output import (
    FILES_KEY,
    INDEX_FILE,
    TORCH_SUFFIXES,
    build_index,
    check_paths,
    copy_side_files,
    parse_shard_size,
    plan_shards,
    progress_bar,
    shard_file_names,
    start_writing,
)
from accelkit.merge.source import CheckpointSource, TensorEntry
from accelkit.merge.stream import TensorStream
from accelkit.merge.writer import SAFETENSORS_METADATA, safetensors_header

_ACCELERATE_FSDP = re.compile(r"^pytorch_model_fsdp_(\d+)$")

SUPPORTED = (
    "a torch DCP folder (.metadata + __*_*.distcp; or an Accelerate save_state folder with pytorch_model_fsdp_0/), "
    "a DeepSpeed ZeRO checkpoint (folder with `latest`, or a tag folder with *_optim_states.pt), "
    "HF sharded safetensors (*.safetensors.index.json), a .safetensors file, or a .bin/.pt/.pth state dict"
)


def _accelerate_model_dirs(path: Path) -> dict[int, Path]:
    found = {}
    for p in path.iterdir():
        m = _ACCELERATE_FSDP.match(p.name)
        if m and dcp.is_dcp_dir(p):
            found[int(m.group(1))] = p
    return found


def open_source(path: Path, tag: str | None = None, model_index: int | None = None) -> CheckpointSource:
    if not path.exists():
        raise AccelkitError(f"input {path} does not exist", hint="pass the checkpoint folder or file to merge")
    why: list[str] = []
    source = _detect(path, tag, model_index, why)
    source.notes[:0] = why
    return source


def _detect(path: Path, tag: str | None, model_index: int | None, why: list[str]) -> CheckpointSource:
    if path.is_file():
        if path.name.endswith(".safetensors.index.json"):
            why.append(f"{path.name} is a safetensors index")
            return hf_sharded.SafetensorsSource(path)
        if path.suffix == ".safetensors":
            why.append(f"{path.name} is a safetensors file")
            return hf_sharded.SafetensorsSource(path)
        if path.suffix in TORCH_SUFFIXES:
            why.append(f"{path.name} is a torch state-dict file (loaded with weights_only=True)")
            return torch_files.TorchFileSource(path)
        raise AccelkitError(f"{path} is not a checkpoint file merge-ckpt reads", hint=f"supported: {SUPPORTED}")
    if dcp.is_dcp_dir(path):
        why.append(f"{path.name}/ holds {dcp.METADATA_FILE} and .distcp shards: a torch DCP checkpoint")
        return dcp.DCPSource(path)
    models = _accelerate_model_dirs(path)
    if models:
        index = model_index if model_index is not None else 0
        if index not in models:
            raise AccelkitError(f"no pytorch_model_fsdp_{index}/ in {path}",
                                hint=f"--model-index takes one of {sorted(models)}")
        chosen = models[index]
        how = "--model-index" if model_index is not None else "the first model"
        extra = f" ({len(models)} models saved; pick another with --model-index)" if len(models) > 1 else ""
        kind = "a Trainer checkpoint folder" if (path / "trainer_state.json").is_file() else \
            "an Accelerate save_state folder"
        why.append(f"{path.name}/ is {kind}: merging {chosen.name}/ ({how}){extra}")
        return dcp.DCPSource(chosen)
    if model_index is not None:
        raise AccelkitError("--model-index applies only to Accelerate save_state folders with FSDP models",
                            hint=f"{path} has no pytorch_model_fsdp_N/ folders")
    if (path / "latest").is_file() or tag is not None or deepspeed.is_deepspeed_tag_dir(path):
        why.append(f"{path.name}/ is a DeepSpeed checkpoint (latest file / *_optim_states.pt)")
        return deepspeed.DeepSpeedSource(path, tag)
    # Accelerate's DeepSpeed save_state: <ckpt>/pytorch_model/ holds `latest` or the tag folders.
    if (path / "pytorch_model").is_dir() and ((path / "pytorch_model" / "latest").is_file()
                                              or deepspeed.is_deepspeed_tag_dir(path / "pytorch_model")):
        why.append(f"{path.name}/ is an Accelerate save_state folder with a DeepSpeed checkpoint in pytorch_model/")
        return deepspeed.DeepSpeedSource(path / "pytorch_model", tag)
    if (index := hf_sharded.find_index(path)) is not None:
        why.append(f"{path.name}/ holds {index.name}: HF sharded safetensors")
        return hf_sharded.SafetensorsSource(path)
    singles = sorted(p for p in path.iterdir() if p.is_file() and p.suffix == ".safetensors")
    if len(singles) == 1:
        why.append(f"{path.name}/ holds one safetensors file, {singles[0].name}")
        return hf_sharded.SafetensorsSource(singles[0])
    bins = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in TORCH_SUFFIXES)
    if len(bins) == 1:
        why.append(f"{path.name}/ holds one torch state-dict file, {bins[0].name}")
        return torch_files.TorchFileSource(bins[0])
    listing = ", ".join(sorted(p.name + ("/" if p.is_dir() else "") for p in path.iterdir())[:8]) or "nothing"
    raise AccelkitError(f"{path} is not a checkpoint layout merge-ckpt knows (found: {listing})",
                        hint=f"supported: {SUPPORTED}")


_CASTS: dict[str, torch.dtype | None] = {choice: getattr(torch, name) if name else None
                                        for choice, name in CAST.items()}


def _report(source: CheckpointSource, entries: list[TensorEntry]) -> MergeReport:
    files = [f for f in source.files if f.is_file()]
    return MergeReport(
        format_name=source.format_name, world_size=source.world_size, notes=list(source.notes),
        tensors=len(entries), parameters=sum(e.numel for e in entries), bytes=sum(e.nbytes for e in entries),
        dtypes=dict(Counter(name_of(e.dtype) for e in entries)), input_files=len(files),
        input_bytes=sum(f.stat().st_size for f in files), checks=list(source.checks))


def _open_and_check(opts: MergeOptions, hash_manifest: bool) -> tuple[CheckpointSource, list[str]]:
    """Open the input with every check its format and surroundings allow; the extra check lines."""
    source = open_source(opts.input, opts.tag, opts.model_index)
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


def inspect_with_torch(input_path: Path, tag: str | None = None, model_index: int | None = None) -> MergeReport:
    """Describe a checkpoint (and check what can be checked without reading every byte); write nothing."""
    start = time.perf_counter()
    source, checks = _open_and_check(MergeOptions(input=input_path, tag=tag, model_index=model_index),
                                     hash_manifest=False)
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


def merge_with_torch(opts: MergeOptions) -> MergeReport:
    start = time.perf_counter()
    if opts.output is None:
        raise AccelkitError("no output given", hint="pass -o OUTPUT (or --inspect to only look)")
    dtype = _CASTS[opts.dtype]
    to_file = opts.output.suffix == ".safetensors"
    if opts.output.suffix in TORCH_SUFFIXES:
        raise AccelkitError(f"merge-ckpt writes safetensors, not {opts.output.suffix} pickles",
                            hint=f"use -o {opts.output.with_suffix('.safetensors')} or a folder")
    if to_file and opts.max_shard_size:
        raise AccelkitError("--max-shard-size needs a folder output",
                            hint=f"use -o {opts.output.with_suffix('')}/ to get shards and an index")
    max_bytes = parse_shard_size(opts.max_shard_size) if opts.max_shard_size else None
    check_paths(opts.input, opts.output, opts.force)
    with lean_process():
        source, checks = _open_and_check(opts, hash_manifest=True)
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
            report.copied = [f.name for f in side_files]
            if side_files:
                notes.append(f"copied {', '.join(report.copied)} from {side_folder}")
            if len(plan) > 1:
                report.output_files.append(INDEX_FILE)
        if opts.verify:
            with progress_bar(report.bytes, "verify", opts.progress) as bar:
                stream.on_bytes = bar.update
                for shard_entries, file in zip(plan, files, strict=True):
                    stream.verify_file(shard_entries, file, len(safetensors_header(shard_entries, metadata)))
            report.verified = True
        staged.commit()
    report.nonfinite = dict(stream.scan.tensors)
    if report.nonfinite:
        notes.append(nonfinite_note(report.nonfinite))
    report.checksum_seconds, report.scan_seconds = source.reader.checksum_seconds, stream.scan.seconds
    report.checks.append(source.reader.checksum_line())
    report.checks.append(scan_line(report.nonfinite, report.scan_seconds))
    report.seconds = time.perf_counter() - start
    report.peak_rss_bytes = peak_rss_bytes()
    return report


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
