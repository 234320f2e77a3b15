"""Where a process's data comes from: every pass over a DataLoader (which dataset, which sample indices, complete
or not, how many optimizer steps ran during it) and, for scripts without DataLoaders, fingerprints of the inputs
the models train on.

Loaders are followed at the two levels that exist in every stack: the user-facing `iter(loader)` (torch's
DataLoader, Accelerate's DataLoaderShard & co., patched per class) tells when a pass starts, how many batches the
script took and whether it reached the end; torch's `_BaseDataLoaderIter._next_index` (in the main process, with
or without workers) tells which dataset indices the sampler handed out, whatever sharding sits in between.
"""

from __future__ import annotations

import hashlib
import sys
import zlib
from collections.abc import Callable, Iterator
from typing import Any

from accelkit.convert.check.frames import innermost_user_function
from accelkit.convert.check.record import Pass, Record

MAX_INDICES = 2_000_000  # per process: a check runs a few steps, this only guards against giant samplers
MAX_FINGERPRINTS = 200_000
MAX_FINGERPRINT_ELEMENTS = 16_000_000  # larger inputs are not fingerprinted (hashing would dominate the step)


class LoaderTracker:
    def __init__(self, record: Record, on_batch: Callable[[], None], on_start: Callable[[Pass], None],
                 on_end: Callable[[Pass], None]) -> None:
        self.record = record
        self.on_batch = on_batch
        self.on_start = on_start
        self.on_end = on_end
        self.loader_of: dict[int, int] = {}  # id(dataset) -> loader index (order of first pass)
        self._keep: list[Any] = []  # the datasets, alive, so their ids are never reused
        self.active: dict[int, Pass] = {}  # loader index -> its latest pass that has not ended
        self.depth = 0  # > 0 while the outer iterator runs (inner DataLoaders are not new passes)
        self.tag = ""  # "<loader>:<pass>:in" or "...:end": the last loader event, for printed lines
        self.indices_kept = 0
        self.rows_kept = 0
        self.rng_at_start: dict[int, str] = {}  # id(pass) -> torch's generator once the pass began
        # equivalence run: "loader:pass" -> the batches to hand out instead of the sampler's (the ranks' together)
        self.replay: dict[str, list[list[int]]] = {}
        self.replayed: dict[int, int] = {}  # id(pass) -> batches handed out from `replay`

    # -- hooks -----------------------------------------------------------------------------------------------
    def hook_torch(self) -> None:
        from torch.utils.data import dataloader

        self._patch_iter(dataloader.DataLoader)
        original = dataloader._BaseDataLoaderIter._next_index
        tracker = self

        def _next_index(it):
            index = original(it)  # drawn all the same: the generators advance as without a replay
            index = tracker._replay(getattr(it, "_dataset", None), index)
            tracker._fetched(getattr(it, "_dataset", None), index)
            return index

        dataloader._BaseDataLoaderIter._next_index = _next_index

    def hook_accelerate(self) -> None:
        from accelerate import data_loader

        for name in ("DataLoaderShard", "DataLoaderDispatcher", "SkipDataLoader"):
            cls = getattr(data_loader, name, None)
            if cls is not None and "__iter__" in cls.__dict__:
                self._patch_iter(cls)

    def _patch_iter(self, cls: type) -> None:
        original = cls.__dict__["__iter__"]
        if getattr(original, "_accelkit_check", False):
            return
        tracker = self

        def __iter__(loader):
            if tracker.depth:
                return original(loader)
            record = tracker._start(loader)
            tracker.depth += 1
            try:
                inner = original(loader)
            finally:
                tracker.depth -= 1
            # after the loader's own seed draw (every `iter(loader)` takes one): what changes it now is the script
            tracker.rng_at_start[id(record)] = rng_digest()
            return _PassIterator(tracker, record, inner)

        __iter__._accelkit_check = True
        cls.__iter__ = __iter__

    # -- events ----------------------------------------------------------------------------------------------
    def _start(self, loader) -> Pass:
        dataset = getattr(loader, "dataset", None)
        key = self.loader_of.get(id(dataset))
        if key is None:
            key = self.loader_of[id(dataset)] = len(self.loader_of)
            self._keep.append(dataset)
            _draw_per_sample(loader, dataset, lambda key=key: self.active[key].number if key in self.active else -1)
        number = sum(1 for p in self.record.passes if p.loader == key)
        record = Pass(loader=key, number=number, length=_length(loader), dataset_length=_length(dataset),
                      batch_size=_batch_size(loader), owner=innermost_user_function(), stream=_is_stream(dataset),
                      replacement=_with_replacement(loader))
        self.record.passes.append(record)
        self.active[key] = record
        self.tag = f"{key}:{number}:in"
        self.on_start(record)
        return record

    def _replay(self, dataset, index):
        """The equivalence run's batch: the N ranks' batches of the same step together, in the order they took
        them (a shuffled loader draws another order on one process than Accelerate's shards); the sampler's own
        batch when there is nothing (left) to replay."""
        key = self.loader_of.get(id(dataset))
        record = self.active.get(key) if key is not None else None
        if record is None or not self.replay or isinstance(index, int):
            return index
        batches = self.replay.get(f"{record.loader}:{record.number}", [])
        taken = self.replayed.get(id(record), 0)
        if taken >= len(batches):
            return index
        self.replayed[id(record)] = taken + 1
        return list(batches[taken])

    def _fetched(self, dataset, index) -> None:
        key = self.loader_of.get(id(dataset))
        record = self.active.get(key) if key is not None else None
        if record is None or index is None or self.indices_kept >= MAX_INDICES:
            return
        if isinstance(index, int):
            record.indices.append(index)
            self.indices_kept += 1
        else:
            try:
                values = [int(i) for i in index]
            except (TypeError, ValueError):
                return
            record.indices.extend(values)
            self.indices_kept += len(values)

    def _batch(self, record: Pass, batch: Any = None) -> None:
        record.batches += 1
        if record.stream and self.rows_kept < MAX_FINGERPRINTS:
            self.rows_kept += _count_rows(record.rows, batch)
        self.tag = f"{record.loader}:{record.number}:in"
        self.on_batch()

    def _end(self, record: Pass) -> None:
        record.complete = True
        record.draws = self.rng_at_start.pop(id(record), None) not in (None, rng_digest())
        if self.active.get(record.loader) is record:
            del self.active[record.loader]
        self.tag = f"{record.loader}:{record.number}:end"
        self.on_end(record)

    def on_step(self) -> None:
        for record in self.active.values():
            record.steps += 1

    def progress(self) -> list[int] | None:
        """[loader, pass, batches taken, batches in the pass] of the pass that is feeding the training now."""
        if not self.active:
            return None
        record = self.active[max(self.active, key=lambda k: self.record.passes.index(self.active[k]))]
        return [record.loader, record.number, record.batches, record.length]


class _PassIterator:
    """What `iter(loader)` returns under the probe: the real iterator, observed."""

    def __init__(self, tracker: LoaderTracker, record: Pass, inner: Iterator) -> None:
        self._tracker = tracker
        self._record = record
        self._inner = inner

    def __iter__(self):
        return self

    def __next__(self):
        self._tracker.depth += 1
        try:
            item = next(self._inner)
        except StopIteration:
            self._tracker._end(self._record)
            raise
        finally:
            self._tracker.depth -= 1
        self._tracker._batch(self._record, item)
        return item

    def __len__(self) -> int:
        return len(self._inner)  # type: ignore[arg-type]

    def __getattr__(self, name: str):
        return getattr(self._inner, name)


def _is_stream(dataset) -> bool:
    """An IterableDataset (Accelerate's shards of one too): the sampler hands out no indices to follow."""
    return any(c.__name__ == "IterableDataset" for c in type(dataset).__mro__)


def _first_tensor(batch: Any, depth: int = 0):
    import torch

    if isinstance(batch, torch.Tensor):
        return batch
    if depth < 3 and isinstance(batch, dict):
        batch = list(batch.values())
    if depth < 3 and isinstance(batch, (list, tuple)):
        for item in batch:
            found = _first_tensor(item, depth + 1)
            if found is not None:
                return found
    return None


def _count_rows(rows: dict[str, int], batch: Any) -> int:
    """Count a hash of each sample of a batch (the rows of its first tensor); return how many were counted."""
    tensor = _first_tensor(batch)
    if tensor is None or tensor.dim() == 0 or tensor.numel() > MAX_FINGERPRINT_ELEMENTS:
        return 0
    for key in _row_hashes(tensor):
        rows[key] = rows.get(key, 0) + 1
    return int(tensor.shape[0])


def _row_hashes(tensor) -> list[str]:
    import torch

    tensor = tensor.detach().to("cpu")
    if tensor.layout != torch.strided:  # a sparse input (a graph's features or adjacency): hashed by its values
        tensor = tensor.to_dense()
    flat = tensor.contiguous().reshape(tensor.shape[0], -1)
    if flat.dtype == torch.bfloat16:
        flat = flat.float()
    return [hashlib.blake2b(row.tobytes(), digest_size=8).hexdigest() for row in flat.numpy()]


def _length(obj) -> int:
    try:
        return int(len(obj))
    except Exception:  # IterableDataset, generators: no length
        return -1


def _batch_size(loader) -> int:
    size = getattr(loader, "batch_size", None)
    if size is None:
        size = getattr(getattr(loader, "batch_sampler", None), "batch_size", None)
    return int(size) if isinstance(size, int) else -1


def fingerprint_rows(record: Record, args: tuple) -> list[str]:
    """Count a short hash of each sample (row) of the first tensor a model is called with; return the hashes."""
    import torch

    tensor = next((a for a in args if isinstance(a, torch.Tensor)), None)
    if tensor is None or tensor.dim() == 0 or tensor.numel() > MAX_FINGERPRINT_ELEMENTS:
        return []
    if len(record.fingerprints) >= MAX_FINGERPRINTS:
        return []
    keys = _row_hashes(tensor)
    for key in keys:
        record.fingerprints[key] = record.fingerprints.get(key, 0) + 1
    return keys


def step_digest(keys: list[str]) -> str:
    """One hash for the set of inputs a step trained on (the same on two ranks = the same batch)."""
    return hashlib.blake2b("".join(sorted(keys)).encode(), digest_size=8).hexdigest() if keys else ""


def _with_replacement(loader) -> bool:
    """The loader draws samples with replacement (`RandomSampler(replacement=True)`), also once prepared (the
    sampler sits inside Accelerate's batch sampler shards)."""
    seen, stack = 0, [loader]
    while stack and seen < 8:
        node = stack.pop()
        seen += 1
        if getattr(node, "replacement", False) is True:
            return True
        stack += [child for name in ("sampler", "batch_sampler") if (child := getattr(node, name, None)) is not None
                  and child is not node]
    return False


def _draw_per_sample(loader, dataset, pass_number: Callable[[], int]) -> None:
    """A dataset that draws random numbers in `__getitem__` (pytorch/examples' siamese test set picks each pair's
    partner with `random.randint`) draws them, in both runs of the check, from generators seeded by the sample's
    index and the loader's pass (its epoch), and the global generators are put back afterwards: one process
    and N processes then see the same sample for the same index, so their metrics can be compared exactly (drawn
    from the running streams, they differ by the draw: 23 against 24 correct of 24). Datasets of torch's own
    classes draw nothing; a class that cannot be subclassed, or workers started by `spawn` (which would pickle the
    class made here), are left as they are."""
    import multiprocessing

    cls = type(dataset)
    getitem = getattr(cls, "__getitem__", None)
    if getitem is None or cls.__module__.startswith("torch.utils.data"):
        return
    context = getattr(loader, "multiprocessing_context", None) or multiprocessing.get_start_method(allow_none=True)
    if getattr(loader, "num_workers", 0) and str(getattr(context, "_name", context)) != "fork":
        return
    def __getitem__(self, index):
        states = _rng_states()
        _seed_all(zlib.crc32(f"{index!r}:{pass_number()}".encode()))
        try:
            return getitem(self, index)
        finally:
            _restore_rng_states(states)

    try:
        dataset.__class__ = type(cls.__name__, (cls,), {"__getitem__": __getitem__, "__module__": cls.__module__,
                                                        "__qualname__": cls.__qualname__})
    except TypeError:
        return


def _rng_states() -> tuple:
    import random

    import torch

    numpy = sys.modules.get("numpy")
    return (torch.random.get_rng_state(), random.getstate(),
            numpy.random.get_state(legacy=True) if numpy is not None else None)


def _seed_all(seed: int) -> None:
    import random

    import torch

    torch.random.default_generator.manual_seed(seed)
    random.seed(seed)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(seed)


def _restore_rng_states(states: tuple) -> None:
    import random

    import torch

    torch_state, python_state, numpy_state = states
    torch.random.set_rng_state(torch_state)
    random.setstate(python_state)
    if numpy_state is not None:
        sys.modules["numpy"].random.set_state(numpy_state)


def rng_digest() -> str:
    """A digest of the global generators a dataset draws from (torch's default CPU generator, Python's `random`,
    numpy's legacy `np.random`): it changes when anything draws from one of them (pytorch/examples' siamese test
    set picks its pairs with `random.randint` in `__getitem__`)."""
    import random

    import torch

    digest = hashlib.sha1(torch.random.get_rng_state().numpy().tobytes())
    digest.update(repr(random.getstate()).encode())
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        digest.update(repr(numpy.random.get_state(legacy=True)).encode())
    return digest.hexdigest()
