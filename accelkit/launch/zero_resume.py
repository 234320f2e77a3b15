"""A DeepSpeed ZeRO checkpoint written by N ranks, resumed on M: read before any rank starts, converted once.

DeepSpeed refuses to load ZeRO optimizer partitions written by another data-parallel world size ("Automatic
adjustment of ZeRO's optimizer state partitioning with a new world size is not currently supported"), on every
rank, after the job has started. Its universal checkpoint format (one folder per parameter: fp32 weights and each
optimizer state, unpartitioned) loads at any world size. So, when the script is told to resume
(`--resume-from-checkpoint latest|DIR`, as the templates are) from a ZeRO checkpoint of another world size, launch:

- reads the checkpoint's layout (the tag folder `latest` names, one optimizer-state file per rank, the ZeRO stage
  from rank 0's file through accelkit's pickle reader; the manifest's world size when there is one);
- converts it with DeepSpeed's own converter (`deepspeed.checkpoint.ds_to_universal`), once, into
  `<checkpoint>-universal/<checkpoint name>/` beside the original (written to a temporary folder, then renamed; an
  existing copy is reused). The inner folder keeps the checkpoint's name, from which the scripts read the step;
  `latest` never picks the copy (its name is not `checkpoint-<step>`);
- hands the ranks the copy (the script's `--resume-from-checkpoint` argument) and a DeepSpeed config with
  `checkpoint: {load_universal: true}`.

What is not converted is refused in one line before anything is written.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from accelkit.errors import AccelkitError
from accelkit.merge import read_zero_checkpoint
from accelkit.script_flags import flag_value, set_flag

RESUME_FLAG = "--resume-from-checkpoint"
OUTPUT_FLAG = "--output-dir"
MANIFEST_NAME = "accelkit-manifest.json"  # what the templates write last (their shared block "manifest")
CHECKPOINT_NAME = re.compile(r"checkpoint-(\d+)")  # the templates' checkpoint folders
UNIVERSAL_SUFFIX = "-universal"
UNIVERSAL_MARKER = Path("zero") / "optimizer_state.pt"  # in the tag folder, written by ds_to_universal


@dataclass(frozen=True)
class ZeroResume:
    """What launch does for a resume at another world size: the copy the ranks load, and the line saying so."""

    checkpoint: Any  # accelkit.merge.ZeroCheckpoint: the layout read
    copy: Path  # the checkpoint folder the ranks load (inside the `-universal` folder)
    converted: bool  # False: an earlier launch's copy is reused
    line: str


# the script's flags as argparse reads them (accelkit.script_flags), under the names this module's callers use
script_option, with_script_option = flag_value, set_flag


def resume_checkpoint(args: tuple[str, ...], script: Path) -> Path | None:
    """The checkpoint folder the script will resume from, by the templates' rule: a folder given, or for "latest"
    the newest `checkpoint-<step>` in the output folder with a manifest (any when none has one)."""
    resume = script_option(args, RESUME_FLAG)
    if not resume:
        return None
    if resume != "latest":
        path = Path(resume).expanduser()
        return path if path.is_dir() else None
    output = script_option(args, OUTPUT_FLAG)
    output_dir = Path(output).expanduser() if output else script.parent / "outputs"
    if not output_dir.is_dir():
        return None
    found = [(int(m.group(1)), p) for p in output_dir.iterdir()
             if p.is_dir() and (m := CHECKPOINT_NAME.fullmatch(p.name))]
    complete = [(step, p) for step, p in found if (p / MANIFEST_NAME).is_file()]
    return max(complete or found)[1] if found else None


def universal_copy_path(checkpoint: Path) -> Path:
    """Where the universal copy of `checkpoint` lives: beside it, the inner folder keeping its name."""
    return checkpoint.parent / f"{checkpoint.name}{UNIVERSAL_SUFFIX}" / checkpoint.name


def _universal_tag(path: Path) -> str | None:
    """The tag folder of a universal checkpoint (what ds_to_universal writes) in a save_state folder, else None."""
    latest = path / "latest"
    tag = latest.read_text().strip() if latest.is_file() else None
    return tag if tag and is_universal_copy(path, tag) else None


def is_universal_copy(copy: Path, tag: str) -> bool:
    return (copy / tag / UNIVERSAL_MARKER).is_file()


def plan_zero_resume(args: tuple[str, ...], script: Path, world_size: int, *,
                     dry_run: bool = False) -> ZeroResume | None:
    """For a script resuming from a ZeRO checkpoint of another world size: where its universal copy is (to be
    converted unless an earlier launch made it) and the line that says so. None when nothing is to be done.
    Writes nothing."""
    found = resume_checkpoint(args, script)
    if found is not None and _universal_tag(found) is not None:  # the copy itself, given by hand: load it as one
        given = SimpleNamespace(path=found, tag=_universal_tag(found), stage=0, world_size=0)  # no rank files
        return ZeroResume(checkpoint=given, copy=found, converted=False,
                          line=f"{found} is a DeepSpeed universal checkpoint: the ranks load it with load_universal")
    checkpoint = read_zero_checkpoint(found) if found is not None else None
    if checkpoint is None or checkpoint.world_size == world_size:
        return None
    copy = universal_copy_path(checkpoint.path)
    converted = not is_universal_copy(copy, checkpoint.tag)
    if converted and copy.parent.exists():
        raise AccelkitError(f"{copy.parent} exists but holds no universal copy of {checkpoint.path.name}",
                            hint="remove it (accelkit writes the universal copy there)")
    how = "converted by an earlier launch"
    if converted:
        how = "a dry run: not converted yet" if dry_run else "converting it now"
    line = (f"{checkpoint.path.name} was written by {checkpoint.world_size} ZeRO-{checkpoint.stage} ranks; resuming "
            f"on {world_size} from its universal copy {copy.parent} ({how}, with DeepSpeed's ds_to_universal)")
    return ZeroResume(checkpoint=checkpoint, copy=copy, converted=converted, line=line)


def make_universal_copy(resume: ZeroResume) -> None:
    """Write the planned universal copy, unless an earlier launch did."""
    if resume.converted:
        convert_to_universal(resume.checkpoint, resume.copy)


def convert_to_universal(checkpoint: Any, copy: Path) -> None:
    """`copy`: the checkpoint's own files (scheduler, RNG states, config) and, as its tag folder, DeepSpeed's
    universal conversion of the rank files. Staged in a temporary folder beside it, renamed when complete."""
    from accelkit.fsio import StagedOutput

    staged = StagedOutput(copy.parent, is_dir=True)
    with staged as staging:
        inner = staging / checkpoint.path.name
        inner.mkdir()
        for item in checkpoint.path.iterdir():
            # The manifest describes the original's files, not the copy's; the tag folder is converted below.
            if item.name in (checkpoint.tag, MANIFEST_NAME):
                continue
            (shutil.copytree if item.is_dir() else shutil.copy2)(item, inner / item.name)
        _run_ds_to_universal(checkpoint.path / checkpoint.tag, inner / checkpoint.tag)
        _write_copy_manifest(checkpoint.path / MANIFEST_NAME, inner)
        staged.commit()


def _write_copy_manifest(original: Path, inner: Path) -> None:
    """The original's manifest (run, step, world size, the batch the templates keep on another number of processes)
    with the copy's own files, so the resumed run reads what wrote the checkpoint and a check of the copy holds."""
    if not original.is_file():
        return
    manifest = json.loads(original.read_text())
    files = {}
    for path in sorted(p for p in inner.rglob("*") if p.is_file()):
        with path.open("rb") as handle:
            files[path.relative_to(inner).as_posix()] = {"size": path.stat().st_size,
                                                          "sha256": hashlib.file_digest(handle, "sha256").hexdigest()}
    manifest["files"] = files
    (inner / MANIFEST_NAME).write_text(json.dumps(manifest, indent=1) + "\n")


def _run_ds_to_universal(tag_dir: Path, output: Path) -> None:
    """DeepSpeed's converter, called as a library in this process (one worker: no process pool to start).
    `inject_missing_state`: checkpoints of plain PyTorch models (not Megatron's) carry no universal-checkpoint
    info block, which the converter otherwise asserts on."""
    from argparse import Namespace

    from deepspeed.checkpoint import ds_to_universal

    args = Namespace(input_folder=str(tag_dir), output_folder=str(output), num_extract_workers=1,
                     num_merge_workers=1, keep_temp_folder=False, strict=True, inject_missing_state=True)
    said = io.StringIO()
    try:
        with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
            ds_to_universal.main(args)
    except Exception as exc:  # noqa: BLE001 - DeepSpeed's own failure, said in one line
        raise AccelkitError(f"DeepSpeed's ds_to_universal could not convert {tag_dir}: {type(exc).__name__}: {exc}",
                            hint="resume on the world size that wrote the checkpoint") from None
