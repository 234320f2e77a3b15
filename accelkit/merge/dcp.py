"""Reader for torch.distributed.checkpoint (DCP) directories: `.metadata` + `__{rank}_{i}.distcp` files.

FSDP1/FSDP2 sharded state dicts, Accelerate's `pytorch_model_fsdp_0/`, torchtitan-style `{"model": ...}` saves.
`.metadata` (read with an allowlist unpickler: no pickled code runs) gives every tensor's global shape and dtype and,
per chunk, the file, byte offset and length of the item holding it. Every item is itself a `torch.save` archive
(see records). When the checkpoint is opened, everything the metadata claims is checked against the files (see
`dcp_layout`); then a tensor's bytes are read straight from the item records, with their CRC-32 checked.

FSDP shards tensors by rows, so a tensor's bytes are its chunks' bytes back to back and are streamed in pieces.
Other layouts (chunks split along another dimension, strided local tensors) are assembled in memory from the same
checked records; items written through DCP storage transforms (compression, ...) are read with DCP's own `dcp.load`.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from accelkit.errors import AccelkitError, clip
from accelkit.merge import dcp_layout
from accelkit.merge.light_dcp import output_names
from accelkit.merge.source import CheckpointSource, Segment, TensorEntry, lazy_segment, record_segment

METADATA_FILE = dcp_layout.METADATA_FILE


def is_dcp_dir(path: Path) -> bool:
    return path.is_dir() and (path / METADATA_FILE).is_file()


class DCPSource(CheckpointSource):
    def __init__(self, path: Path) -> None:
        super().__init__(format_name="torch DCP (torch.distributed.checkpoint)", root=path, ties_from_config=True)
        self._metadata = dcp_layout.read_metadata(path)
        md = self._metadata
        tensor_fqns = [fqn for fqn, item in md.state_dict_metadata.items() if dcp_layout.is_tensor_item(item)]
        skipped = [fqn for fqn, item in md.state_dict_metadata.items() if not dcp_layout.is_tensor_item(item)]
        self._out_to_fqn = output_names(self._metadata, tensor_fqns, self.notes)
        for out_name, fqn in self._out_to_fqn.items():
            item = md.state_dict_metadata[fqn]
            self.entries.append(TensorEntry(out_name, tuple(item.size), item.properties.dtype))
        if skipped:
            self.notes.append(f"skipped {len(skipped)} non-tensor entries (e.g. {skipped[0]})")
        self.layout = dcp_layout.check_dcp_layout(path, md, set(self._out_to_fqn.values()))
        self.files = [*self.layout.files, path / METADATA_FILE]
        self.world_size = self.layout.world_size
        self.checks.extend(self.layout.checks)


    def segments(self, name: str) -> list[Segment]:
        fqn = self._out_to_fqn[name]
        entry = self.entry_by_name[name]
        chunks = self.layout.chunks[fqn]
        if any(c.transformed for c in chunks):
            return [lazy_segment(entry.nbytes, lambda: self._load_with_dcp(fqn, entry))]
        if all(c.is_row_block for c in chunks):
            return [record_segment(self.reader, c.record, c.data_offset, c.nbytes)
                    for c in sorted(chunks, key=lambda c: c.offsets[0] if c.offsets else 0)]
        return [lazy_segment(entry.nbytes, lambda: self._assemble(fqn, entry))]

    def _assemble(self, fqn: str, entry: TensorEntry) -> torch.Tensor:
        """A tensor whose chunks are not row blocks: place each checked chunk at its offsets, as DCP does."""
        out = torch.empty(entry.shape, dtype=entry.dtype)
        for chunk in self.layout.chunks[fqn]:
            span = chunk.storage_span_bytes
            raw = torch.empty(span, dtype=torch.uint8)
            self.reader.read(chunk.record, chunk.data_offset, memoryview(raw.numpy()))
            local = torch.as_strided(raw.view(entry.dtype), chunk.sizes, chunk.strides)
            target = out
            for dim, (start, size) in enumerate(zip(chunk.offsets, chunk.sizes, strict=True)):
                target = target.narrow(dim, start, size)
            target.copy_(local)
        return out

    def _load_with_dcp(self, fqn: str, entry: TensorEntry) -> torch.Tensor:
        """Items written through DCP storage transforms: DCP's own loader undoes them (no checksum to check)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException  # a BaseException, not an Exception

        target = {fqn: torch.empty(entry.shape, dtype=entry.dtype)}
        try:
            with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
                warnings.simplefilter("ignore", UserWarning)
                metadata = dcp_layout.read_metadata(self.root, real=True)
                dcp.load(target, storage_reader=dcp_layout.cached_reader(self.root, metadata), no_dist=True)
        except (Exception, CheckpointException) as exc:
            _reraise_interrupt(exc)
            raise AccelkitError(f"cannot read tensor {fqn!r} from {self.root}: a shard is corrupt "
                                f"({_first_line(exc)})",
                                hint="re-copy the checkpoint's .distcp files from the machine that wrote them") \
                from None
        return target[fqn]


def _reraise_interrupt(exc: BaseException) -> None:
    """DCP wraps every failure, Ctrl-C included, in a CheckpointException; let an interrupt stay one."""
    for wrapped in getattr(exc, "failures", {}).values():
        if isinstance(wrapped[0], KeyboardInterrupt):
            raise KeyboardInterrupt from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return clip(text.splitlines()[-1] if text else type(exc).__name__, 200)

