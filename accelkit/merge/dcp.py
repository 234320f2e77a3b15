"""Reader for torch.distributed.checkpoint (DCP) directories: `.metadata` + `__{rank}_{i}.distcp` files.

FSDP1/FSDP2 sharded state dicts, Accelerate's `pytorch_model_fsdp_0/`, torchtitan-style `{"model": ...}` saves.
`.metadata` gives every tensor's global shape and dtype and, per chunk, the file, byte offset and length; that is
checked up front (files present, long enough, none from another run). Each tensor is then loaded with DCP's own
load machinery (`dcp.load`, `no_dist=True`, no process group) into a state dict holding just that tensor, so
memory stays at about one tensor however large the checkpoint is.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch

from accelkit.errors import AccelkitError
from accelkit.merge.source import CheckpointSource, TensorEntry

METADATA_FILE = ".metadata"
_DISTCP = re.compile(r"^__(\d+)_(\d+)\.distcp$")
# Top-level keys under which Accelerate and training frameworks nest the model in a DCP state dict.
_MODEL_KEYS = ("model", "module", "state_dict")


def is_dcp_dir(path: Path) -> bool:
    return path.is_dir() and (path / METADATA_FILE).is_file()


def _read_metadata(path: Path):
    from torch.distributed.checkpoint import FileSystemReader

    try:
        return FileSystemReader(str(path)).read_metadata()
    except Exception as exc:
        raise AccelkitError(f"cannot read {path / METADATA_FILE}: it is truncated or corrupt ({type(exc).__name__})",
                            hint="re-copy the checkpoint directory from the machine that wrote it") from None


class DCPSource(CheckpointSource):
    def __init__(self, path: Path) -> None:
        super().__init__(format_name="torch DCP (torch.distributed.checkpoint)", root=path, ties_from_config=True)
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        self._metadata = _read_metadata(path)
        md = self._metadata
        tensor_fqns = [fqn for fqn, item in md.state_dict_metadata.items() if isinstance(item, TensorStorageMetadata)]
        skipped = [fqn for fqn, item in md.state_dict_metadata.items() if not isinstance(item, TensorStorageMetadata)]
        self._out_to_fqn = self._output_names(tensor_fqns)
        for out_name, fqn in self._out_to_fqn.items():
            item = md.state_dict_metadata[fqn]
            self.entries.append(TensorEntry(out_name, tuple(item.size), item.properties.dtype))
        if skipped:
            self.notes.append(f"skipped {len(skipped)} non-tensor entries (e.g. {skipped[0]})")
        self._check_files()

    def _output_names(self, fqns: list[str]) -> dict[str, str]:
        """Output name -> DCP fqn. A state dict saved as {"model": model_sd, ...} is unnested to model_sd."""
        paths = {fqn: tuple(self._metadata.planner_data.get(fqn, (fqn,))) for fqn in fqns} \
            if self._metadata.planner_data else {fqn: (fqn,) for fqn in fqns}
        tops = {p[0] for p in paths.values() if len(p) > 1}
        nested = all(len(p) > 1 for p in paths.values()) and paths
        if nested:
            top = next((k for k in _MODEL_KEYS if k in tops), None)
            if top is not None:
                others = sorted(tops - {top})
                note = f'tensors are nested under "{top}"; the "{top}." prefix is dropped'
                if others:
                    note += f" and {', '.join(others)} entries are skipped"
                self.notes.append(note)
                return {".".join(str(x) for x in p[1:]): fqn for fqn, p in paths.items() if p[0] == top}
        return {fqn: fqn for fqn in fqns}

    def _check_files(self) -> None:
        """Every chunk's file exists and is long enough; no .distcp file from another run is mixed in."""
        needed: dict[str, int] = {}
        for info in self._metadata.storage_data.values():
            needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
        for rel, end in sorted(needed.items()):
            file = self.root / rel
            if not file.is_file():
                raise AccelkitError(f"shard {file} named in {METADATA_FILE} is missing",
                                    hint="copy every rank's .distcp file into the checkpoint directory")
            if file.stat().st_size < end:
                raise AccelkitError(f"shard {file} is truncated ({file.stat().st_size} bytes, {METADATA_FILE} "
                                    f"needs at least {end})", hint="re-copy this file from the machine that wrote it")
            self.files.append(file)
        ranks = {int(m.group(1)) for rel in needed if (m := _DISTCP.match(rel))}
        self.world_size = (max(ranks) + 1) if ranks else None
        strays = sorted(p.name for p in self.root.iterdir() if _DISTCP.match(p.name) and p.name not in needed)
        if strays:
            raise AccelkitError(f"{self.root} holds shards not named in its {METADATA_FILE} ({', '.join(strays[:4])}): "
                                "they come from a run with a different world size or step",
                                hint="copy the checkpoint into a clean directory with only the files of one save")
        self.files.append(self.root / METADATA_FILE)

    def read(self, names: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException  # a BaseException, not an Exception

        reader = _cached_reader(self.root, self._metadata)
        by_name = self.entry_by_name
        for name in names:
            entry = by_name[name]
            fqn = self._out_to_fqn[name]
            target = {fqn: torch.empty(entry.shape, dtype=entry.dtype)}
            try:
                with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
                    warnings.simplefilter("ignore", UserWarning)
                    dcp.load(target, storage_reader=reader, no_dist=True)
            except (Exception, CheckpointException) as exc:
                _reraise_interrupt(exc)
                raise AccelkitError(f"cannot read tensor {fqn!r} from {self.root}: a shard is corrupt "
                                    f"({_first_line(exc)})",
                                    hint="re-copy the checkpoint's .distcp files from the machine that wrote them") \
                    from None
            yield name, target.pop(fqn)


def _reraise_interrupt(exc: BaseException) -> None:
    """DCP wraps every failure, Ctrl-C included, in a CheckpointException; let an interrupt stay one."""
    for wrapped in getattr(exc, "failures", {}).values():
        if isinstance(wrapped[0], KeyboardInterrupt):
            raise KeyboardInterrupt from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[-1] if text else type(exc).__name__)[:200]


def _cached_reader(path: Path, metadata):
    """A FileSystemReader that does not re-read `.metadata` for every tensor."""
    from torch.distributed.checkpoint import FileSystemReader

    class CachedMetadataReader(FileSystemReader):
        def __init__(self, path: Path, metadata) -> None:
            super().__init__(str(path))
            self._cached_metadata = metadata

        def read_metadata(self):
            return self._cached_metadata

    return CachedMetadataReader(path, metadata)
