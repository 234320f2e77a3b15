"""The manifest accelkit's templates write beside every checkpoint, and its verification.

After `save_state`, once every rank has finished writing, the main process writes `accelkit-manifest.json` in the
checkpoint folder: a run id, the step, the world size, and the size and sha256 of every file of the checkpoint.
When merge-ckpt finds one around its input, the checkpoint must be exactly what was saved:

- every file the merge reads is listed and has its listed sha256 (bit rot, a bad copy, or a file from another run
  or step fails here whatever its format);
- every other listed file exists with its listed size (a missing or replaced optimizer or RNG file is reported,
  without reading it whole);
- the world size is the checkpoint's.

Files are hashed up front, several at a time, before anything is written.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from accelkit.errors import AccelkitError
from accelkit.merge.counters import Counted, FolderCounters
from accelkit.merge.records import input_read_error

MANIFEST_FILE = "accelkit-manifest.json"
FORMAT = "accelkit-checkpoint-manifest"
SEARCH_LEVELS = 2  # the manifest sits in checkpoint-N/; the weights may be in checkpoint-N/<folder>/<tag>/
_HASH_BLOCK = 8 * 1024 * 1024


@dataclass(frozen=True)
class Manifest:
    path: Path
    run_id: str
    step: int | None
    world_size: int | None
    files: dict[str, tuple[int, str]]  # relative path -> (size, sha256)

    @property
    def folder(self) -> Path:
        return self.path.parent


def find(weights_dir: Path) -> Manifest | None:
    """The manifest of the checkpoint holding `weights_dir` (the folder or file merge reads), if there is one."""
    folder = weights_dir if weights_dir.is_dir() else weights_dir.parent
    for _ in range(SEARCH_LEVELS + 1):
        if (folder / MANIFEST_FILE).is_file():
            return load(folder / MANIFEST_FILE)
        if folder.parent == folder:
            break
        folder = folder.parent
    return None


def load(path: Path) -> Manifest:
    bad = AccelkitError(f"{path} is not a valid accelkit checkpoint manifest", hint="it was damaged after the save; "
                        "restore it from the machine that wrote the checkpoint, or remove it to merge without it")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise input_read_error(exc, path) from None
    except ValueError:
        raise bad from None
    try:
        if raw["format"] != FORMAT:
            raise bad
        files = {str(rel): (int(entry["size"]), str(entry["sha256"])) for rel, entry in raw["files"].items()}
        step, world = raw.get("step"), raw.get("world_size")
        return Manifest(path, str(raw.get("run_id", "")), int(step) if step is not None else None,
                        int(world) if world is not None else None, files)
    except (KeyError, TypeError, ValueError, AttributeError):
        raise bad from None


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    buffer = bytearray(_HASH_BLOCK)
    view = memoryview(buffer)
    try:
        with open(path, "rb", buffering=0) as handle:
            while n := handle.readinto(buffer):
                digest.update(view[:n])
    except OSError as exc:
        raise input_read_error(exc, path) from None
    return digest.hexdigest()


def signed_checks(root: Path, files: Callable[[], list[Path]] | None, world_size: int | None,
                  steps: FolderCounters) -> list[str]:
    """The manifest's check lines, in both paths: its hashes verified against `files()` (with no `files`, for
    --inspect, only said to be there); its step joins the folder's step counters."""
    signed = find(root)
    if signed is None:
        return []
    if signed.step is not None:
        steps.taken.insert(0, Counted(float(signed.step), signed.path, "step"))
    return [unverified_line(signed)] if files is None else verify_manifest(signed, files(), world_size)


def unverified_line(manifest: Manifest) -> str:
    """The check line of a manifest found but not hashed (--inspect reads no tensor data)."""
    return f"manifest {manifest.path} (run {manifest.run_id[:12]}, step {manifest.step}): verified when merging"


def verify_manifest(manifest: Manifest, read_files: list[Path], world_size: int | None) -> list[str]:
    """Check the checkpoint against its manifest (see the module docstring); return what was checked."""
    hint = ("the checkpoint is not what was saved: re-copy it from the machine that wrote it, or merge an earlier "
            "checkpoint")
    root = manifest.folder.resolve()
    to_hash: dict[str, Path] = {}
    for file in read_files:
        try:
            rel = file.resolve().relative_to(root).as_posix()
        except ValueError:
            continue
        if rel not in manifest.files:
            raise AccelkitError(f"{file} is not listed in {manifest.path}: it was added after the save", hint=hint)
        to_hash[rel] = file
    for rel, (size, _) in sorted(manifest.files.items()):
        file = manifest.folder / rel
        try:
            actual = file.stat().st_size
        except FileNotFoundError:
            raise AccelkitError(f"{file}, listed in {manifest.path.name}, is missing", hint=hint) from None
        except OSError as exc:
            raise input_read_error(exc, file) from None
        if actual != size:
            raise AccelkitError(f"{file} has {actual} bytes, {manifest.path.name} says {size}: it changed after the "
                                "save or comes from another run or step", hint=hint)
    if manifest.world_size is not None and world_size is not None and manifest.world_size != world_size:
        raise AccelkitError(f"{manifest.path} was written by a {manifest.world_size}-process run but the checkpoint "
                            f"holds {world_size} ranks: files of different runs are mixed", hint=hint)
    workers = max(1, min(len(to_hash), os.cpu_count() or 1, 4))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="accelkit-hash") as pool:
        digests = dict(zip(to_hash, pool.map(sha256_of, to_hash.values()), strict=True))
    for rel, digest in sorted(digests.items()):
        if digest != manifest.files[rel][1]:
            raise AccelkitError(f"{to_hash[rel]} does not match its sha256 in {manifest.path.name}: it changed after "
                                "the save (bit rot, a bad copy) or comes from another run or step", hint=hint)
    step = f", step {manifest.step}" if manifest.step is not None else ""
    return [f"manifest {manifest.path.name} (run {manifest.run_id[:12]}{step}): sha256 of the {len(digests)} files "
            f"merged, size of all {len(manifest.files)} files listed"]
