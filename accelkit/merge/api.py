"""The merge's entry: what it is asked and reports (MergeOptions, MergeReport), the input recognised once, no torch.

Importing torch takes seconds, several times longer than copying the bytes of a checkpoint of a few hundred
million parameters. When the input is a torch DCP folder whose every tensor is stored as row blocks (what FSDP
writes; proven by light_dcp, with its checks of `.metadata`) or a DeepSpeed ZeRO-1/2/3 checkpoint whose every check
light_deepspeed can make (the fp32 weights are byte ranges of the ranks' flat partitions), the merge is a sequence
of range copies, and this module makes it with the standard library, ISA-L's CRC-32 and NumPy (for the non-finite
scan), in one pass: each window of a data record is mapped from the page cache, its CRC-32 and the scan read it
there, and the same memory is written to the output. The output is the same file the torch path writes, byte for
byte.

The request is checked (check_merge_request) and the input's format recognised (detect) once, here, before either path
runs. Everything else goes on in the torch path (torch_merge, a plain call) from what was found, and says why in the
report's notes; when the byte ranges were proven and only the output needs torch (a cast, shards, tied weights), it
copies those ranges as they are, without opening or checking the input again. What goes to torch: other
formats, layouts it cannot prove, a `--dtype` cast, `--max-shard-size`, an Accelerate save_state folder (its
optimizer and RNG files are checked with torch), a DCP folder's config.json that may tie weights (asking the model
class needs transformers) and a DeepSpeed checkpoint that fails a check (the torch path then refuses it with its own
message). Each of those is decided before anything is written. A non-finite value or a corrupt record found while
copying fails here with the torch path's own message (or, for non-finite values with --allow-nonfinite, is written
as it is); the staged output is then removed: a merge never starts again in the torch path once it writes."""

from __future__ import annotations

import collections
import contextlib
import gc
import json
import math
import re
import resource
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from accelkit.command_result import CommandResult
from accelkit.errors import AccelkitError
from accelkit.fsio import StagedOutput
from accelkit.merge import counters, extras, light_dcp, light_deepspeed, manifest, records
from accelkit.merge.deepspeed_layout import is_deepspeed_tag_dir
from accelkit.merge.dtypes import CAST, SCANNED
from accelkit.merge.light_pickle import Refused
from accelkit.merge.nonfinite import COUNTED_BYTES, NonFiniteScan, nonfinite_note, refusal, scan_line
from accelkit.merge.output import (
    FILES_KEY,
    TORCH_SUFFIXES,
    check_paths,
    copy_side_files,
    parse_shard_size,
    progress_bar,
    start_writing,
)
from accelkit.merge.records import RecordReader
from accelkit.merge.writer import SAFETENSORS_METADATA, SafetensorsWriter, safetensors_header, verify_output
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


READ_BYTES = 2 * 1024 * 1024  # read, checked and scanned while in the CPU's caches
_FAST = "read without torch: every tensor is a sequence of byte ranges of the input, copied file to file"


# Only what a Checked: line then backs: which side files were compared is said there, file by file.
_SAVE_STATE = ("a training-state folder (Accelerate's save_state or the Trainer's): the files beside the weights are "
               "checked against each other (the Checked: lines say which)")


class _TorchPath(Exception):
    """Why this merge goes to the torch path; with what the proof found when it was made (the torch path then goes
    on from it: the proven byte ranges and checks, the step counters, whether the model's config may tie weights)."""

    def __init__(self, why: str, proven: tuple | None = None) -> None:
        super().__init__(why)
        self.proven = proven


def run_merge(opts: MergeOptions) -> CommandResult:
    """`accelkit merge-ckpt` as one call: merge (or with no output, inspect) and the report's lines on stdout."""
    if opts.output is None:
        report = inspect_checkpoint(opts.input, opts.tag, opts.model_index)
    else:
        report = merge_checkpoint(opts)
    return CommandResult().out(format_report(report, inspect_only=opts.output is None))


def merge_checkpoint(opts: MergeOptions) -> MergeReport:
    """Merge `opts.input` into `opts.output`, in one pass: the request is checked and the format recognised once, then
    the merge is made without torch when the layout allows it, else it goes on with torch from what was found."""
    max_bytes = check_merge_request(opts)
    detected = detect(opts.input, opts.tag, opts.model_index)
    collecting = gc.isenabled()
    gc.disable()  # the merge makes no cycles; collections while unpickling metadata cost more than they find
    try:
        return _light_merge(opts, detected)
    except _TorchPath as why:
        with _importing_torch():
            from accelkit.merge import torch_merge
        report = torch_merge.merge_with_torch(opts, detected, max_bytes, why.proven)
        report.notes.append(f"read with torch: {why}")
        return report
    finally:
        if collecting:
            gc.enable()


def inspect_checkpoint(input_path: Path, tag: str | None = None, model_index: int | None = None) -> MergeReport:
    """`--inspect`: describe the input and make the checks that need no full read, without torch when the light
    merge could read it (the same report as the torch path's, with a note saying so), else with the torch path."""
    opts = MergeOptions(input=input_path, tag=tag, model_index=model_index)
    detected = detect(input_path, tag, model_index)
    try:
        return _light_inspect(opts, detected)
    except _TorchPath as why:
        with _importing_torch():
            from accelkit.merge import torch_merge
        return torch_merge.inspect_with_torch(input_path, tag, model_index, detected, why.proven)


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
    "HF sharded safetensors (*.safetensors.index.json), a .safetensors file, or a .bin/.pt/.pth state dict"
)
_ACCELERATE_FSDP = re.compile(r"^pytorch_model_fsdp_(\d+)$")


@dataclass(frozen=True)
class Detected:
    """What the input is, recognised once from its names: the format, the file or folder its reader opens (with the
    DeepSpeed tag asked for), why, and whether a save_state or Trainer folder holds it."""

    kind: str  # "dcp", "deepspeed", "safetensors" (a file or an index) or "torch_file"
    path: Path
    why: str
    tag: str | None = None
    wrapped: bool = False


def detect(path: Path, tag: str | None = None, model_index: int | None = None) -> Detected:
    """Recognise the input's format from its names, the most specific layouts first."""
    if not path.exists():
        raise AccelkitError(f"input {path} does not exist", hint="pass the checkpoint folder or file to merge")
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
        return Detected("dcp", path, f"{path.name}/ holds {light_dcp.METADATA_FILE} and .distcp shards: a torch DCP "
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
        return Detected("dcp", chosen, f"{path.name}/ is {kind}: merging {chosen.name}/ ({how}){extra}", wrapped=True)
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
    return path.is_dir() and (path / light_dcp.METADATA_FILE).is_file()


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


def _light_inspect(opts: MergeOptions, detected: Detected) -> MergeReport:
    start = time.perf_counter()
    _light_input(opts, detected)
    reader = RecordReader()
    try:
        found, steps = _light_plan(opts, detected, reader)
        checks = [*found.checks, *manifest.signed_checks(found.root, None, found.world_size, steps)]
        agreed = counters.cross_check(steps)
        if agreed:
            checks.append(agreed)
    finally:
        reader.close()
    report = _planned_report(found, checks)
    report.notes.append("read without torch: the checkpoint's metadata and pickles, no tensor data")
    report.seconds = time.perf_counter() - start
    report.peak_rss_bytes = peak_rss_bytes()
    return report


def _light_merge(opts: MergeOptions, detected: Detected) -> MergeReport:
    start = time.perf_counter()
    output = opts.output
    assert output is not None  # check_merge_request refused a merge without one
    shards = "--max-shard-size was given" if opts.max_shard_size else None
    try:
        _light_input(opts, detected)
    except _TorchPath as why:
        raise _TorchPath(shards or str(why)) from None
    scan = NonFiniteScan()  # imports NumPy beside the checks
    reader = RecordReader()
    try:
        try:
            found, steps = _light_plan(opts, detected, reader)
        except _TorchPath as why:
            raise _TorchPath(shards or str(why), why.proven) from None
        proven = (found, steps, detected.kind == "dcp")
        if shards:
            raise _TorchPath(shards, proven)
        if opts.dtype != "keep" and any(t.dtype in SCANNED and t.dtype != CAST[opts.dtype]
                                        for t in found.tensors):
            raise _TorchPath(f"--dtype {opts.dtype} casts", proven)
        side_folder, side_files = extras.find_side_files(opts.input, opts.config_from)
        try:
            checks = _manifest_checks(found, side_files, steps)
        except AccelkitError as exc:
            if detected.kind != "deepspeed":
                raise
            raise _TorchPath(f"a check failed ({exc.message})") from None
        to_file = output.suffix == ".safetensors"
        configless = not any(f.name == extras.CONFIG_FILE for f in side_files)
        if not to_file and configless and extras.tie_candidates([t.name for t in found.tensors]):
            raise _TorchPath("a folder output without config.json: whether the output embedding is tied is read "
                             "from the values", proven)
        return _write(opts, found, checks, to_file, side_folder, side_files, scan, reader, start)
    finally:
        reader.close()


def _light_input(opts: MergeOptions, detected: Detected) -> None:
    """Whether the light path reads this input: a DCP folder of its own or a DeepSpeed checkpoint; else _TorchPath."""
    if opts.model_index is not None:
        raise _TorchPath("--model-index was given")
    if not opts.input.is_dir():
        raise _TorchPath("only checkpoint folders are read without torch")
    if detected.kind != "dcp" and any(name.startswith("pytorch_model_fsdp_") for name in _names(opts.input)):
        raise _TorchPath(_SAVE_STATE)
    if detected.wrapped:
        raise _TorchPath(_SAVE_STATE)
    if detected.kind not in ("dcp", "deepspeed"):
        raise _TorchPath("only torch DCP folders and DeepSpeed ZeRO checkpoints are read without torch")
    if opts.tag and detected.kind == "dcp":
        raise _TorchPath("--tag was given")


def _light_plan(opts: MergeOptions, detected: Detected,
                reader: RecordReader) -> tuple[light_dcp.DcpContents, counters.FolderCounters]:
    """Every tensor as byte ranges of the input, with the format's own checks made, and the folder's step counters."""
    if detected.kind == "deepspeed":
        return _deepspeed_plan(detected, reader)
    root = detected.path
    if extras.find_save_state_dir(root) is not None:
        raise _TorchPath(_SAVE_STATE)
    try:
        found = light_dcp.plan(root)
    except (Refused, light_dcp.Unproven) as exc:
        raise _TorchPath(f"the layout is not plain row blocks ({exc})") from None
    found.notes.insert(0, detected.why)
    _, side_files = extras.find_side_files(opts.input, opts.config_from)
    config = next((f for f in side_files if f.name == extras.CONFIG_FILE), None)
    if config is not None and _may_tie(config):
        raise _TorchPath(f"{config} may tie weights (the model class says which)",
                         (found, counters.FolderCounters(), True))
    return found, counters.FolderCounters()


def _deepspeed_plan(detected: Detected, reader: RecordReader):
    try:
        found, steps = light_deepspeed.plan(detected.path, detected.tag, reader)
    except (Refused, light_dcp.Unproven) as exc:
        raise _TorchPath(f"the DeepSpeed checkpoint was not proven without torch ({exc})") from None
    if extras.find_save_state_dir(found.root) is not None:
        raise _TorchPath(_SAVE_STATE)
    found.notes.insert(0, detected.why)
    return found, steps


def _names(folder: Path) -> list[str]:
    """What a folder holds; nothing when it is not a readable folder (the torch path then says what is wrong)."""
    try:
        return [p.name for p in folder.iterdir()]
    except OSError:
        return []


def _may_tie(config: Path) -> bool:
    """Whether transformers could tie weights for this config (as extras.tied_pairs_from_config decides first)."""
    from accelkit import hfmodel

    try:
        raw = hfmodel.read_raw(config)
    except AccelkitError:
        return False
    return "model_type" in raw and raw.get("tie_word_embeddings") is not False


def _manifest_checks(found: light_dcp.DcpContents, side_files: list[Path], steps: counters.FolderCounters) -> list[str]:
    """The manifest's checks and the step counters' cross-check, as the torch path makes them (a DCP folder has no
    step counters of its own; a DeepSpeed checkpoint's come from light_deepspeed)."""
    checks = manifest.signed_checks(found.root, lambda: [*found.files, *side_files], found.world_size, steps)
    agreed = counters.cross_check(steps)
    if agreed:
        checks.append(agreed)
    return checks


def _planned_report(found: light_dcp.DcpContents, checks: list[str]) -> MergeReport:
    """What the input holds and what was checked, before anything is written."""
    files = [f for f in found.files if f.is_file()]
    dtypes: dict[str, int] = {}
    for t in found.tensors:
        dtypes[t.dtype] = dtypes.get(t.dtype, 0) + 1
    return MergeReport(
        format_name=found.format_name, world_size=found.world_size, notes=list(found.notes),
        tensors=len(found.tensors), parameters=sum(math.prod(t.shape) for t in found.tensors),
        bytes=sum(t.nbytes for t in found.tensors), dtypes=dtypes, input_files=len(files),
        input_bytes=sum(f.stat().st_size for f in files), checks=checks, dropped_aliases=dict(found.aliases))


def _write(opts: MergeOptions, found: light_dcp.DcpContents, checks: list[str], to_file: bool, side_folder: Path | None,
           side_files: list[Path], scan: NonFiniteScan, reader: RecordReader, start: float) -> MergeReport:
    output = opts.output
    assert output is not None
    names = [output.name] if to_file else ["model.safetensors"]
    folder_files = [*names, *(f.name for f in side_files)]
    metadata = dict(SAFETENSORS_METADATA)
    if not to_file:
        metadata[FILES_KEY] = json.dumps(folder_files)
    header = safetensors_header(found.tensors, metadata)
    data_bytes = sum(t.nbytes for t in found.tensors)
    report = _planned_report(found, [*found.checks, *checks])
    report.output, report.output_files = output, list(names)
    report.open_seconds = time.perf_counter() - start
    notify = opts.notify or (lambda message: None)
    staged = StagedOutput(output, is_dir=not to_file)
    with staged as temp:
        target = temp if to_file else temp / names[0]
        start_writing(staged, target, target.parent, len(header) + data_bytes
                      + sum(f.stat().st_size for f in side_files), output, notify, report.tensors, report.bytes)
        with progress_bar(data_bytes, "merge", opts.progress) as bar:
            _copy_tensors(found, target, header, reader, scan, opts.allow_nonfinite, output, bar.update)
        reader.finish()
        if opts.verify:
            with progress_bar(data_bytes, "verify", opts.progress) as bar:
                _verify(found, target, len(header), reader, bar.update)
            report.verified = True
        if not to_file:
            copy_side_files(temp, side_files, output)
        staged.commit()
    return finish_report(report, [] if to_file else side_files, side_folder, reader, scan, start, _FAST)


def finish_report(report: MergeReport, copied: list[Path], side_folder: Path | None, reader: RecordReader,
                  scan: NonFiniteScan, start: float, *last_notes: str) -> MergeReport:
    """What both paths end a merge's report with: the side files copied, the non-finite values accepted, the CRC-32s
    taken and the scan, the time and the memory."""
    report.copied = [f.name for f in copied]
    if copied:
        report.notes.append(f"copied {', '.join(report.copied)} from {side_folder}")
    report.nonfinite = dict(scan.tensors)
    if report.nonfinite:
        report.notes.append(nonfinite_note(report.nonfinite))
    report.notes += last_notes
    report.checks += [reader.checksum_line(), scan_line(report.nonfinite, scan.seconds)]
    report.checksum_seconds, report.scan_seconds = reader.checksum_seconds, scan.seconds
    report.seconds = time.perf_counter() - start
    report.peak_rss_bytes = peak_rss_bytes()
    return report


def _verify(found: light_dcp.DcpContents, target: Path, data_start: int, reader: RecordReader,
            on_bytes: Callable[[int], None]) -> None:
    """Re-read the output and compare every byte with the input read again (what --verify promises)."""
    window = memoryview(bytearray(READ_BYTES))

    def expected():
        for tensor in found.tensors:
            for piece in tensor.pieces:
                for begin in range(0, piece.nbytes, READ_BYTES):
                    length = min(READ_BYTES, piece.nbytes - begin)
                    reader.peek(piece.record, piece.start + begin, window[:length])
                    yield tensor.name, window[:length]

    verify_output(target, data_start, expected(), on_bytes, memoryview(bytearray(READ_BYTES)))


def _copy_tensors(found: light_dcp.DcpContents, target: Path, header: bytes, reader: RecordReader, scan: NonFiniteScan,
                  allow_nonfinite: bool, label: Path, on_bytes: Callable[[int], None]) -> None:
    """Header, then every chunk of every tensor, in one pass over its bytes: each window of a chunk is mapped from the
    page cache (no copy into this process), its record's CRC-32 advances and the scan runs over it while it is in the
    CPU's caches, and the same memory is written to the output (`_write_window`, through the torch path's writer) by
    a writer thread while this one maps and checks the next window (both release the GIL: ISA-L, NumPy and os.write).

    Measured on the 2-core machine (a 435 MB item, medians of 9): the earlier two passes (read into a buffer for the
    checks, then `os.copy_file_range`) took 0.24 s, this one pass 0.18-0.19 s on one thread; the kernel copy alone
    0.15-0.28 s. At most WINDOWS_IN_FLIGHT windows of READ_BYTES are mapped at a time (the mapped pages count as
    resident memory), so the memory stays what it was with one buffer plus a few MB."""
    pending: collections.deque = collections.deque()
    writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="accelkit-write")

    def settle(future) -> None:
        try:
            future.result()
        finally:
            future.view.release()

    out = SafetensorsWriter(target, header, sum(t.nbytes for t in found.tensors), label)
    try:
        for tensor in found.tensors:
            floating = tensor.dtype in SCANNED and records.SCAN_NONFINITE
            for piece in tensor.pieces:
                bad = 0  # in the COUNTED_BYTES of the piece read so far, what a refusal counts in both paths
                for begin in range(0, piece.nbytes, READ_BYTES):
                    view = reader.map(piece.record, piece.start + begin, min(READ_BYTES, piece.nbytes - begin))
                    counted = scan.count(view, tensor.dtype) if floating else 0
                    if counted:
                        scan.found(tensor.name, counted)
                        bad += counted
                    end = min(begin + READ_BYTES, piece.nbytes)
                    if bad and not allow_nonfinite and (end % COUNTED_BYTES == 0 or end == piece.nbytes):
                        view.release()
                        raise refusal(tensor.name, bad, overflow=False)
                    if end % COUNTED_BYTES == 0:
                        bad = 0
                    future = writer.submit(_write_window, out, view)
                    future.view = view
                    pending.append(future)
                    while len(pending) >= WINDOWS_IN_FLIGHT:
                        settle(pending.popleft())
                on_bytes(piece.nbytes)
            while pending:
                settle(pending.popleft())
        out.close()
    finally:
        for future in pending:
            future.cancel()
        writer.shutdown(wait=True)  # never close the file under a write in flight
        for future in pending:  # release() may be repeated; a view still exported elsewhere is left to the GC
            with contextlib.suppress(BufferError):
                future.view.release()
        with contextlib.suppress(AccelkitError):  # after close, nothing; after a failure, that error is the one told
            out.abort()


WINDOWS_IN_FLIGHT = 2  # measured as fast as 3 (CLI, medians of 7: 0.62 s both), 2 MB less resident


def _write_window(out: SafetensorsWriter, view: memoryview) -> None:
    """Write checked bytes to the output (a seam for the tests that make writes go wrong)."""
    out.write(view)
