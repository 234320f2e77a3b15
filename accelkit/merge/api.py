"""The merge as one pass: what it is asked and reports (MergeOptions, MergeReport), and `merge_checkpoint`.

detect -> open -> check -> plan the output -> write -> verify -> commit, each once: the request is checked
(check_merge_request) and the format recognised (detect); the input is opened by its format's one reader (dcp,
deepspeed; hf_sharded and torch_files with torch) with every check, then the manifest's, the training state's and
the step counters'; the output is planned (tied weights stored once, `--dtype` casts, `--max-shard-size`) and
written through the one writer loop (stream), staged and committed only once complete (and, with `--verify`,
re-read). Importing torch takes seconds, longer than copying a checkpoint of a few hundred million parameters: a DCP
or ZeRO merge whose tensors are byte ranges never imports it; torch is imported only for what it alone does (a cast,
a tensor no byte range covers, the model class that says which weights are tied, a training state's optimizer and
RNG files, torch and safetensors files), and a merge never starts again once it writes.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import json
import re
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from accelkit.command_result import CommandResult
from accelkit.errors import AccelkitError
from accelkit.fsio import StagedOutput, write_error
from accelkit.merge import counters, dcp, deepspeed, extras, manifest, per_rank, stream
from accelkit.merge.deepspeed_layout import is_deepspeed_tag_dir
from accelkit.merge.dtypes import CAST, TABLE
from accelkit.merge.nonfinite import NonFiniteScan, nonfinite_note, scan_line
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
from accelkit.merge.records import RecordReader
from accelkit.merge.source import CheckpointSource, Materialised, Tensor
from accelkit.merge.writer import SAFETENSORS_METADATA, safetensors_header
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


_FAST = "read without torch: every tensor is a sequence of byte ranges of the input, copied file to file"
_INSPECTED = "read without torch: the checkpoint's metadata and pickles, no tensor data"
# Only what a Checked: line then backs: which side files were compared is said there, file by file.
_SAVE_STATE = ("a training-state folder (Accelerate's save_state or the Trainer's): the files beside the weights are "
               "checked against each other (the Checked: lines say which)")


def run_merge(opts: MergeOptions) -> CommandResult:
    """`accelkit merge-ckpt` as one call: merge (or with no output, inspect) and the report's lines on stdout."""
    if opts.output is None:
        report = inspect_checkpoint(opts.input, opts.tag, opts.model_index)
    else:
        report = merge_checkpoint(opts)
    return CommandResult().out(format_report(report, inspect_only=opts.output is None))


def merge_checkpoint(opts: MergeOptions) -> MergeReport:
    """Merge `opts.input` into `opts.output` in one pass: the request checked and the format recognised once, the
    input opened by its reader with every check, then the output planned, written, verified and committed."""
    max_bytes = check_merge_request(opts)
    detected = detect(opts.input, opts.tag, opts.model_index)
    start = time.perf_counter()
    collecting = gc.isenabled()
    gc.disable()  # the merge makes no cycles; collections while unpickling metadata cost more than they find
    try:
        scan = NonFiniteScan()  # imports NumPy on a thread, beside the reading and the checks
        source, checks, how = open_checked(opts, detected, hash_manifest=True)
        try:
            cast, lean = None, contextlib.nullcontext()
            if "accelkit.merge.torch_files" in sys.modules or any(
                    t.dtype != _cast_dtype(t.dtype, opts.dtype) for t in source.tensors):
                with _importing_torch():  # one torch thread while torch materialises or casts
                    from accelkit.merge.torch_files import cast, lean_process
                lean = lean_process()
            with lean:
                report = _write(opts, source, checks, max_bytes, start, cast, scan)
        finally:
            source.close()
        report.notes.append(how)
        return report
    finally:
        if collecting:
            gc.enable()


def inspect_checkpoint(input_path: Path, tag: str | None = None, model_index: int | None = None) -> MergeReport:
    """`--inspect`: describe the input and make the checks that need no full read."""
    start = time.perf_counter()
    opts = MergeOptions(input=input_path, tag=tag, model_index=model_index)
    source, checks, how = open_checked(opts, detect(input_path, tag, model_index), hash_manifest=False)
    try:
        report = _planned_report(source, source.tensors, [*source.checks, *checks])
    finally:
        source.close()
    report.dropped_aliases = dict(source.aliases)
    if how.startswith("read without torch"):
        report.notes.append(_INSPECTED)
    report.seconds = time.perf_counter() - start
    report.peak_rss_bytes = peak_rss_bytes()
    return report


def check_merge_request(opts: MergeOptions) -> int | None:
    """The refusals of a merge request that need no look inside the input, in the order a user meets them; the
    `--max-shard-size` in bytes (None for one file)."""
    output = opts.output
    if output is None:
        raise AccelkitError("no output given", hint="pass -o OUTPUT (or --inspect to only look)")
    if output.suffix in TORCH_SUFFIXES:
        raise AccelkitError(f"merge-ckpt writes safetensors, not {output.suffix} pickles",
                            hint=f"use -o {output.with_suffix('.safetensors')} or a folder")
    if output.suffix == ".safetensors" and opts.max_shard_size:
        raise AccelkitError("--max-shard-size needs a folder output",
                            hint=f"use -o {output.with_suffix('')}/ to get shards and an index")
    max_bytes = parse_shard_size(opts.max_shard_size) if opts.max_shard_size else None
    check_paths(opts.input, output, opts.force)
    return max_bytes


SUPPORTED = (
    "a torch DCP folder (.metadata + __*_*.distcp; or an Accelerate save_state folder with pytorch_model_fsdp_0/), "
    "a DeepSpeed ZeRO checkpoint (folder with `latest`, or a tag folder with *_optim_states.pt), "
    "per-rank FSDP2 files (Accelerate's pytorch_model_fsdp_0_rank{r}.bin, model_world_size_N_rank_R.pt), "
    "HF sharded safetensors (*.safetensors.index.json), a .safetensors file, or a .bin/.pt/.pth state dict"
)
_ACCELERATE_FSDP = re.compile(r"^pytorch_model_fsdp_(\d+)$")


@dataclass(frozen=True)
class Detected:
    """What the input is, recognised once from its names: the format, the file or folder its reader opens (with the
    DeepSpeed tag asked for), and why."""

    kind: str  # "dcp", "deepspeed", "per_rank", "safetensors" (a file or an index) or "torch_file"
    path: Path
    why: str
    tag: str | None = None


def detect(path: Path, tag: str | None = None, model_index: int | None = None) -> Detected:
    """Recognise the input's format from its names, the most specific layouts first."""
    if not path.exists():
        raise AccelkitError(f"input {path} does not exist", hint="pass the checkpoint folder or file to merge")
    if path.is_file() and per_rank.is_rank_file(path):  # one rank's file: the save is the folder of all of them
        path = path.parent
    if path.is_file():
        if path.name.endswith(".safetensors.index.json"):
            return Detected("safetensors", path, f"{path.name} is a safetensors index")
        if path.suffix == ".safetensors":
            return Detected("safetensors", path, f"{path.name} is a safetensors file")
        if path.suffix in TORCH_SUFFIXES:
            return Detected("torch_file", path,
                            f"{path.name} is a torch state-dict file (loaded with weights_only=True)")
        raise AccelkitError(f"{path} is not a checkpoint file merge-ckpt reads", hint=f"supported: {SUPPORTED}")
    if _is_dcp_dir(path):
        return Detected("dcp", path, f"{path.name}/ holds {dcp.METADATA_FILE} and .distcp shards: a torch DCP "
                                     "checkpoint")
    models = {int(m.group(1)): p for p in path.iterdir()
              if (m := _ACCELERATE_FSDP.match(p.name)) and _is_dcp_dir(p)}
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
        return Detected("dcp", chosen, f"{path.name}/ is {kind}: merging {chosen.name}/ ({how}){extra}")
    ranks = per_rank.find_rank_files(path, model_index)
    if ranks is not None:
        return Detected("per_rank", path, ranks.why)
    if model_index is not None:
        raise AccelkitError("--model-index applies only to Accelerate save_state folders with FSDP models",
                            hint=f"{path} has no pytorch_model_fsdp_N/ folders")
    if (path / "latest").is_file() or tag is not None or is_deepspeed_tag_dir(path):
        return Detected("deepspeed", path, f"{path.name}/ is a DeepSpeed checkpoint (latest file / "
                                           "*_optim_states.pt)", tag)
    # Accelerate's DeepSpeed save_state: <ckpt>/pytorch_model/ holds `latest` or the tag folders.
    inner = path / "pytorch_model"
    if inner.is_dir() and ((inner / "latest").is_file() or is_deepspeed_tag_dir(inner)):
        return Detected("deepspeed", inner, f"{path.name}/ is an Accelerate save_state folder with a DeepSpeed "
                                            "checkpoint in pytorch_model/", tag)
    indexes = sorted(path.glob("*.safetensors.index.json"))
    if indexes:
        return Detected("safetensors", path, f"{path.name}/ holds {indexes[0].name}: HF sharded safetensors")
    singles = sorted(p for p in path.iterdir() if p.is_file() and p.suffix == ".safetensors")
    if len(singles) == 1:
        return Detected("safetensors", singles[0], f"{path.name}/ holds one safetensors file, {singles[0].name}")
    bins = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in TORCH_SUFFIXES)
    if len(bins) == 1:
        return Detected("torch_file", bins[0], f"{path.name}/ holds one torch state-dict file, {bins[0].name}")
    listing = ", ".join(sorted(p.name + ("/" if p.is_dir() else "") for p in path.iterdir())[:8]) or "nothing"
    raise AccelkitError(f"{path} is not a checkpoint layout merge-ckpt knows (found: {listing})",
                        hint=f"supported: {SUPPORTED}")


def _is_dcp_dir(path: Path) -> bool:
    return path.is_dir() and (path / dcp.METADATA_FILE).is_file()


@contextlib.contextmanager
def _importing_torch():
    """Import the torch path without collecting garbage. Importing torch creates a few hundred thousand long-lived
    objects; collecting cycles among them while importing, and once more when the interpreter exits, costs more CPU
    than merging a small model: import without collecting, then freeze what was imported (exempt from every later
    collection)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if collecting:
            gc.enable()


def open_checked(opts: MergeOptions, detected: Detected,
                 hash_manifest: bool) -> tuple[CheckpointSource, list[str], str]:
    """The input opened by its format's one reader, with every check its format and surroundings allow (the
    manifest's hashes when `hash_manifest`), the extra check lines, and the note saying how it was read."""
    reader = RecordReader()  # its files are closed when the merge ends or the input is refused
    try:
        if detected.kind == "dcp":
            source = dcp.open_dcp(detected.path, reader)
        elif detected.kind == "deepspeed":
            source = deepspeed.open_deepspeed(detected.path, detected.tag, reader)
        elif detected.kind == "per_rank":
            with _importing_torch():
                from accelkit.merge import torch_files  # noqa: F401  (the reader's torch adapter)
            source = per_rank.open_per_rank(detected.path, opts.model_index, reader)
        else:
            with _importing_torch():
                from accelkit.merge import torch_files
            source = torch_files.open_file_source(detected.path, reader, detected.kind == "safetensors")
        source.notes.insert(0, detected.why)
        checks = _checks(opts, source, hash_manifest)
    except BaseException:
        reader.close()
        raise
    if detected.kind not in ("dcp", "deepspeed"):
        how = "read with torch: " + ("only torch DCP folders and DeepSpeed ZeRO checkpoints are read without torch"
                                     if opts.input.is_dir() else "only checkpoint folders are read without torch")
    elif extras.find_save_state_dir(source.root) is not None:
        how = f"read with torch: {_SAVE_STATE}"
    elif any(isinstance(s, Materialised) for t in source.tensors for s in t.segments):
        how = "read with torch where no byte range covers a tensor; the others are byte ranges of the input"
    else:
        how = _FAST
    return source, checks, how


def _checks(opts: MergeOptions, source: CheckpointSource, hash_manifest: bool) -> list[str]:
    steps = source.step_counters

    def read_files() -> list[Path]:
        return [*source.files, *extras.find_side_files(opts.input, opts.config_from)[1]]

    # first: when there is a manifest, it says best what is wrong
    checks = manifest.signed_checks(source.root, read_files if hash_manifest else None, source.world_size, steps)
    folder = extras.find_save_state_dir(source.root)
    if folder is not None:
        from accelkit.merge import savestate  # torch: the optimizer's and RNG files

        checks += savestate.check_save_state(folder, source.world_size, source.reader, steps)
    agreed = counters.cross_check(steps)
    if agreed:
        checks.append(agreed)
    return checks


def _cast_dtype(dtype: str, choice: str) -> str:
    """What `--dtype` makes of a tensor of `dtype`: floating-point ones are cast, the others kept."""
    target = CAST[choice]
    return target if target is not None and dtype in TABLE and TABLE[dtype].floating else dtype


def _planned_report(source: CheckpointSource, tensors: list[Tensor], checks: list[str]) -> MergeReport:
    """What the input holds (as it is written) and what was checked, before anything is written."""
    files = [f for f in source.files if f.is_file()]
    return MergeReport(
        format_name=source.format_name, world_size=source.world_size, notes=list(source.notes),
        tensors=len(tensors), parameters=sum(t.numel for t in tensors), bytes=sum(t.nbytes for t in tensors),
        dtypes=dict(collections.Counter(t.dtype for t in tensors)), input_files=len(files),
        input_bytes=sum(f.stat().st_size for f in files), checks=checks)


def _plan(source: CheckpointSource, opts: MergeOptions, to_file: bool, max_bytes: int | None, windows: stream.Windows,
          side_files: list[Path], notes: list[str]) -> tuple[list[list[Tensor]], dict[str, str]]:
    """The output's files and what each holds: tied weights stored once, --dtype casts, --max-shard-size."""
    dropped = dict(source.aliases)
    by_name = source.by_name
    config = next((f for f in side_files if f.name == extras.CONFIG_FILE), None)
    if config is not None and source.ties_from_config:
        for alias, target in extras.tied_pairs_from_config(config, notes).items():
            if alias in by_name and target in by_name:
                if stream.same_values(windows, by_name[target], by_name[alias]):
                    dropped[alias] = target
                else:
                    notes.append(f"config ties {alias} to {target} but their values differ: both are kept")
    if config is None and not to_file:  # a folder, as save_pretrained writes: a head equal to the embedding is tied
        for alias, target in extras.tie_candidates(list(by_name)).items():
            if alias not in dropped and stream.same_values(windows, by_name[target], by_name[alias]):
                dropped[alias] = target
    if dropped:
        notes.append("tied weights stored once, as transformers does: "
                     + ", ".join(f"{a} -> {t}" for a, t in dropped.items()))
    tensors = []
    for t in source.tensors:
        if t.name not in dropped:
            dtype = _cast_dtype(t.dtype, opts.dtype)
            tensors.append(t if dtype == t.dtype else Tensor(t.name, dtype, t.shape, t.segments, cast_from=t.dtype))
    unsupported = [t for t in tensors if t.dtype not in TABLE]
    if unsupported:
        raise AccelkitError(f"tensor {unsupported[0].name!r} has dtype torch.{unsupported[0].dtype}, which "
                            "safetensors cannot store", hint="convert that tensor to a real dtype before merging")
    return (plan_shards(tensors, max_bytes) if max_bytes and not to_file else [tensors]), dropped


def _write(opts: MergeOptions, source: CheckpointSource, checks: list[str], max_bytes: int | None, start: float,
           cast: stream.Cast | None, scan: NonFiniteScan) -> MergeReport:
    output = opts.output
    assert output is not None  # check_merge_request refused a merge without one
    to_file = output.suffix == ".safetensors"
    notes = list(source.notes)
    windows = stream.Windows(source.reader, cast)
    side_folder, side_files = extras.find_side_files(opts.input, opts.config_from)
    plan, dropped = _plan(source, opts, to_file, max_bytes, windows, side_files, notes)
    names = [output.name] if to_file else shard_file_names(len(plan))
    report = _planned_report(source, [t for shard in plan for t in shard], [*source.checks, *checks])
    report.notes, report.dropped_aliases, report.output, report.output_files = notes, dropped, output, list(names)
    report.open_seconds = time.perf_counter() - start
    folder_files = [*names, *([INDEX_FILE] if len(plan) > 1 else []), *(f.name for f in side_files)]
    metadata = dict(SAFETENSORS_METADATA)
    if not to_file:
        metadata[FILES_KEY] = json.dumps(folder_files)
    headers = [safetensors_header(shard, metadata) for shard in plan]
    notify = opts.notify or (lambda message: None)
    staged = StagedOutput(output, is_dir=not to_file)
    with staged as temp:
        files = [temp] if to_file else [temp / n for n in names]
        start_writing(staged, temp if to_file else files[0], temp.parent if to_file else temp,
                      report.bytes + sum(map(len, headers)) + sum(f.stat().st_size for f in side_files), output,
                      notify, report.tensors, report.bytes)
        with progress_bar(report.bytes, "merge", opts.progress) as bar:
            for shard, file, header in zip(plan, files, headers, strict=True):
                stream.write_tensors(file, header, shard, windows, scan, opts.allow_nonfinite, output, bar.update)
        source.reader.finish()
        if opts.verify:
            with progress_bar(report.bytes, "verify", opts.progress) as bar:
                for shard, file, header in zip(plan, files, headers, strict=True):
                    stream.verify_tensors(file, len(header), shard, windows, bar.update)
            report.verified = True
        if not to_file:
            if len(plan) > 1:
                _write_index(temp, plan, names, output, folder_files)
                report.output_files.append(INDEX_FILE)
            copy_side_files(temp, side_files, output)
        staged.commit()
    return finish_report(report, [] if to_file else side_files, side_folder, source.reader, scan, start)


def _write_index(temp: Path, plan: list[list[Tensor]], names: list[str], output: Path, folder_files: list[str]) -> None:
    index = build_index(plan, names)
    index["metadata"][FILES_KEY] = folder_files
    try:
        (temp / INDEX_FILE).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    except OSError as exc:
        raise write_error(exc, output) from None


def finish_report(report: MergeReport, copied: list[Path], side_folder: Path | None, reader: RecordReader,
                  scan: NonFiniteScan, start: float) -> MergeReport:
    """What a merge's report ends with: the side files copied, the non-finite values accepted, the CRC-32s taken and
    the scan, the time and the memory."""
    report.copied = [f.name for f in copied]
    if copied:
        report.notes.append(f"copied {', '.join(report.copied)} from {side_folder}")
    report.nonfinite = dict(scan.tensors)
    if report.nonfinite:
        report.notes.append(nonfinite_note(report.nonfinite))
    report.checks += [reader.checksum_line(), scan_line(report.nonfinite, scan.seconds)]
    report.checksum_seconds, report.scan_seconds = reader.checksum_seconds, scan.seconds
    report.seconds = time.perf_counter() - start
    report.peak_rss_bytes = peak_rss_bytes()
    return report
