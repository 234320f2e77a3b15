"""The torch adapter of the merge: the readers that need torch, opened for the format recognised, and a `--dtype` cast.

api.open_checked calls `open_source` for what the torch-free readers do not read, decided before anything is
written (detect's note says why the format was recognised, so the user sees what was merged); the one writer loop
(stream) then copies their tensors as it copies every other (byte ranges where they are, segments torch materialises
where they are not), with `cast` when `--dtype` asks for one.
"""

from __future__ import annotations

import contextlib
import gc
import warnings
from typing import TYPE_CHECKING

import torch

from accelkit.merge import dcp, deepspeed, hf_sharded, torch_files

if TYPE_CHECKING:
    from accelkit.merge.api import Detected
    from accelkit.merge.source import CheckpointSource


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


def cast(data: memoryview, stored: str, target: str, dest: memoryview) -> None:
    """`--dtype`: the `stored` values of `data` as `target` values in `dest`, as torch's `.to` makes them (torch warns
    that a mapped window is read-only: it is only read)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        values = torch.frombuffer(data, dtype=getattr(torch, stored))
    torch.frombuffer(dest, dtype=getattr(torch, target)).copy_(values)


@contextlib.contextmanager
def lean_process():
    """What a streaming copy needs from the process, restored afterwards (for in-process callers).

    One torch thread: every operation here (a cast, a chunk placed) runs at memory speed, and idle OpenMP workers spin
    on the second core the writer thread needs. No cyclic garbage collection: the merge makes no cycles, and
    collections triggered by unpickling thousands of small metadata objects cost more than the merge of a small
    model."""
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
