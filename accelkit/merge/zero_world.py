"""The layout of a DeepSpeed ZeRO checkpoint as Accelerate's save_state writes it (`path/<tag>/` with one optimizer-
state file per rank), read without unpickling code: its tag, ZeRO stage and world size, for `accelkit launch`'s resume
on another world size (accelkit.launch.zero_resume). A missing rank file, tensor-parallel files or a manifest of
another world size are refused here, with the merge's words."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from accelkit.errors import AccelkitError
from accelkit.merge.manifest import MANIFEST_FILE as MANIFEST_NAME


@dataclass(frozen=True)
class ZeroCheckpoint:
    """A DeepSpeed checkpoint as Accelerate's save_state writes it: `path/<tag>/` holds DeepSpeed's files."""

    path: Path
    tag: str
    stage: int
    world_size: int


def read_zero_checkpoint(path: Path) -> ZeroCheckpoint | None:
    """The DeepSpeed layout of a save_state folder; None when it holds no ZeRO rank files (not DeepSpeed's, or
    already universal). A missing rank file, tensor-parallel files or a manifest of another world size: refused."""
    from accelkit.merge import deepspeed_layout as layout

    latest = path / "latest"
    if not latest.is_file():
        return None
    tag = latest.read_text().strip()
    tag_dir = path / tag
    if not tag_dir.is_dir() or not any(layout.OPTIM.match(p.name) for p in tag_dir.iterdir()):
        return None
    optim_files = layout.ranked(tag_dir, layout.OPTIM, "optimizer-state")
    world = len(optim_files)
    manifest = path / MANIFEST_NAME
    if manifest.is_file():
        try:
            written_by = json.loads(manifest.read_text()).get("world_size")
        except (OSError, ValueError, AttributeError):
            raise AccelkitError(f"{manifest} is not a readable manifest", hint=layout.ONE_SAVE) from None
        if isinstance(written_by, int) and written_by != world:
            raise AccelkitError(f"{path.name}'s manifest says {written_by} processes wrote it, but {tag_dir} holds "
                                f"{world} ranks' optimizer states: files of different runs",
                                hint=layout.ONE_SAVE)
    return ZeroCheckpoint(path=path, tag=tag, stage=_zero_stage(optim_files[0]), world_size=world)


def _zero_stage(optim_file: Path) -> int:
    """The ZeRO stage rank 0's optimizer state records (read without unpickling code: accelkit.merge)."""
    from accelkit.merge.deepspeed import read_archive
    from accelkit.merge.deepspeed_layout import enum_value

    state = read_archive(optim_file).obj
    stage = enum_value((state.get("optimizer_state_dict") or {}).get("zero_stage")) if isinstance(state, dict) else None
    if not isinstance(stage, int):
        raise AccelkitError(f"{optim_file} records no ZeRO stage: it is not a DeepSpeed ZeRO optimizer state",
                            hint="resume from a checkpoint written by DeepSpeed's save_checkpoint (save_state)")
    return stage


