"""The output: where it may go and what `--force` may replace (never lose data), and its layout.

The output is built under a temporary name beside it (fsio.StagedOutput) and renamed into place at the end, so a
failure leaves nothing. The input is only read and may not contain, or be contained in, the output. `--force`
replaces a file, or a folder holding only what an earlier merge wrote there: every safetensors file and index that
merge-ckpt writes names, in its metadata, all the files of its output folder. Anything else in an existing folder
is refused, with the list of what is there: merge-ckpt never deletes a file it did not write.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from accelkit.errors import AccelkitError
from accelkit.fsio import StagedOutput, refuse_overwrite, write_error
from accelkit.sizes import format_bytes, parse_bytes

if TYPE_CHECKING:
    from accelkit.merge.source import TensorEntry

# safetensors metadata / index metadata key listing every file of a folder output (relative names)
FILES_KEY = "accelkit_merge_files"
# torch pickles: read as an input (loaded with weights_only), refused as an output
TORCH_SUFFIXES = (".bin", ".pt", ".pth")


def _inside(child: Path, parent: Path) -> bool:
    return child == parent or parent in child.parents


def check_paths(input_path: Path, output: Path, force: bool) -> None:
    src, dst = input_path.resolve(), output.resolve()
    if _inside(dst, src) if input_path.is_dir() else dst == src:
        raise AccelkitError(f"output {output} is inside the input {input_path}",
                            hint="write the merged checkpoint somewhere outside the checkpoint folder")
    if _inside(src, dst):
        raise AccelkitError(f"the input {input_path} is inside the output {output}",
                            hint="choose an output path that does not contain the checkpoint")
    if not (output.exists() or output.is_symlink()):
        return
    refuse_overwrite(output, force, is_dir=output.is_dir())  # and never a device, FIFO or socket, nor a dead link
    if output.is_dir() != (output.suffix != ".safetensors"):
        raise AccelkitError(f"output {output} exists and is a {'folder' if output.is_dir() else 'file'}",
                            hint="remove it or pick another output path")
    if output.is_dir():
        foreign = foreign_files(output)
        if foreign:
            listing = ", ".join(foreign[:6]) + (f" and {len(foreign) - 6} more" if len(foreign) > 6 else "")
            raise AccelkitError(f"--force replaces a folder only when it holds nothing but an earlier merge's output, "
                                f"and {output} also holds: {listing}",
                                hint="move those files away, or pick another output folder")


def foreign_files(folder: Path) -> list[str]:
    """What in `folder` an earlier merge did not write (relative paths, folders marked with a trailing /)."""
    ours = set(merged_files(folder))
    found = []
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if path.is_dir() and not path.is_symlink():
            if not any(o.startswith(rel + "/") for o in ours):
                found.append(rel + "/")
        elif rel not in ours:
            found.append(rel)
    return [f for f in found if not any(f.startswith(d) and f != d for d in found if d.endswith("/"))]


def merged_files(folder: Path) -> list[str]:
    """The files an earlier merge wrote in `folder`, from its index or its single safetensors file."""
    index = folder / INDEX_FILE
    if index.is_file():
        try:
            listed = json.loads(index.read_text()).get("metadata", {}).get(FILES_KEY)
        except (OSError, ValueError, AttributeError):
            listed = None
        return [str(f) for f in listed] if isinstance(listed, list) else []
    single = folder / SINGLE_FILE
    if single.is_file():
        from accelkit.merge.hf_sharded import read_header

        try:
            listed = json.loads(read_header(single)[0].get("__metadata__", {}).get(FILES_KEY, "null"))
        except (AccelkitError, ValueError, AttributeError):
            listed = None
        return [str(f) for f in listed] if isinstance(listed, list) else []
    return []


def check_free_space(measured_at: Path, needed: int, output: Path) -> None:
    """Refuse before writing when the file system holding `measured_at` (the staged output) lacks `needed` bytes;
    the message names the folder the user chose."""
    free = shutil.disk_usage(measured_at).free
    if free < needed:
        raise AccelkitError(f"not enough disk space for {output}: the output needs {format_bytes(needed)}, "
                            f"{format_bytes(free)} are free in {output.parent}",
                            hint="free some space or write the output elsewhere")


def start_writing(staged: StagedOutput, first_file: Path | None, measured_at: Path, needed: int, output: Path,
                  notify: Callable[[str], None], tensors: int, nbytes: int) -> None:
    """What a merge does once its output is staged, before its first byte: say which partial outputs of interrupted
    merges were removed, prove the first file writable (before judging the free space), refuse without room."""
    for stale in staged.stale_removed:
        notify(f"removed {stale}: the partial output of an interrupted earlier merge (its process is gone)")
    if first_file is not None:
        try:
            first_file.touch(exist_ok=False)
        except OSError as exc:
            raise write_error(exc, output) from None
    check_free_space(measured_at, needed, output)
    notify(f"merging {tensors} tensors ({nbytes / 1e9:.2f} GB) into {output}")


class _NoBar:
    def update(self, n: int) -> None:
        pass


def progress_bar(total: int, desc: str, enabled: bool):
    """A byte progress bar on stderr for the merge and its verification (no tqdm import when it is off)."""
    if not enabled:
        return contextlib.nullcontext(_NoBar())
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc, file=sys.stderr,
                dynamic_ncols=True)


def copy_side_files(temp: Path, side_files: list[Path], output: Path) -> None:
    """Copy config/tokenizer files into the staged output folder; a file that cannot be read is named as the input."""
    try:
        for f in side_files:
            shutil.copyfile(f, temp / f.name)
    except OSError as exc:
        if exc.filename and Path(exc.filename) in side_files:
            raise AccelkitError(f"cannot read {exc.filename}: {exc.strerror}",
                                hint="make the config/tokenizer files readable, or pass --config-from") from None
        raise write_error(exc, output) from None


# -- layout: one file, or HF-named shards (`model-00001-of-00003.safetensors`) plus the index transformers reads.
# Shards are planned the way `save_pretrained` does it: tensors in order, a new shard when the next tensor would
# overflow the limit, a tensor larger than the limit alone in its own shard.
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def parse_shard_size(text: str) -> int:
    """'5GB' -> 5_000_000_000, '500MiB' -> 524288000, '4096' -> 4096 (what transformers' max_shard_size accepts)."""
    return parse_bytes(text, "--max-shard-size", bare_number=True)


def plan_shards(entries: list[TensorEntry], max_bytes: int) -> list[list[TensorEntry]]:
    shards: list[list[TensorEntry]] = [[]]
    size = 0
    for e in entries:
        if shards[-1] and size + e.nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(e)
        size += e.nbytes
    return shards


def shard_file_names(count: int) -> list[str]:
    if count == 1:
        return [SINGLE_FILE]
    return [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]


def build_index(shards: list[list[TensorEntry]], names: list[str]) -> dict:
    total = sum(e.nbytes for shard in shards for e in shard)
    return {"metadata": {"total_size": total},
            "weight_map": {e.name: name for shard, name in zip(shards, names, strict=True) for e in shard}}
