"""The data-loader side of the bench probe: how long each rank is blocked waiting for a batch, and how many samples
(and tokens, when a batch carries `input_ids`) it received.

Only the outermost iteration is timed: Accelerate's prepared loaders (DataLoaderShard, DataLoaderDispatcher,
SkipDataLoader) iterate a plain torch DataLoader inside, and a plain DataLoader is also hooked for scripts that do
not prepare theirs. The time blocked in `next()` of the outermost iterator is what the training loop waits for:
worker latency, a slow `__getitem__`, collation, Accelerate's one-batch look-ahead and the copy to the device.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from accelkit.ranks.probes import after_import


@dataclass
class BatchSize:
    samples: int
    tokens: int  # 0 when the batch has no `input_ids`


def _first_tensor(batch: object, depth: int = 0):
    """The first tensor in a batch (a tensor, a sequence or a mapping of them), or None."""
    if hasattr(batch, "shape") and hasattr(batch, "dim"):
        return batch
    if depth > 3:
        return None
    if isinstance(batch, Mapping):
        values = list(batch.values())
    elif isinstance(batch, (list, tuple)):
        values = list(batch)
    else:
        return None
    for value in values:
        found = _first_tensor(value, depth + 1)
        if found is not None:
            return found
    return None


def batch_size(batch: object) -> BatchSize:
    """Samples = the leading dimension of the batch's first tensor (`input_ids` first when present); tokens = the
    number of elements of `input_ids` (padding included, as tokens/s is usually counted)."""
    input_ids = None
    if isinstance(batch, Mapping) or hasattr(batch, "keys"):
        try:
            input_ids = batch["input_ids"]
        except (KeyError, TypeError, IndexError):
            input_ids = None
    tensor = input_ids if hasattr(input_ids, "shape") else _first_tensor(batch)
    if tensor is None or tensor.dim() == 0:
        samples = len(batch) if isinstance(batch, (list, tuple)) and not hasattr(batch, "_fields") else 1
        return BatchSize(samples=samples, tokens=0)
    tokens = int(input_ids.numel()) if hasattr(input_ids, "numel") else 0
    return BatchSize(samples=int(tensor.shape[0]), tokens=tokens)


# callback(loader_id, started, finished, size) after every batch the outermost iterator yields.
FetchCallback = Callable[[int, float, float, BatchSize], None]


class _TimedIterator:
    """Wraps the iterator a loader's __iter__ returned; times every next() and reports the batch."""

    __slots__ = ("_inner", "_loader_id", "_hooks", "_since")

    def __init__(self, inner, loader_id: int, hooks: LoaderHooks, since: float) -> None:
        self._inner = inner
        self._loader_id = loader_id
        self._hooks = hooks
        self._since = since  # when iter(loader) was called: starting workers is data loading too

    def __iter__(self):
        return self

    def __next__(self):
        hooks = self._hooks
        hooks._local.inside = True
        started, self._since = self._since or time.perf_counter(), 0.0
        try:
            batch = next(self._inner)
        finally:
            hooks._local.inside = False
        finished = time.perf_counter()
        hooks.report(self._loader_id, started, finished, batch)
        return batch

    def __len__(self):
        return len(self._inner)

    def __getattr__(self, name):  # e.g. torch's _BaseDataLoaderIter attributes some scripts read
        return getattr(self._inner, name)


class LoaderHooks:
    """Patches the `__iter__` of torch's DataLoader and of Accelerate's prepared loaders (once imported)."""

    ACCELERATE_LOADERS = ("DataLoaderShard", "DataLoaderDispatcher", "SkipDataLoader")

    def __init__(self, on_fetch: FetchCallback) -> None:
        self.on_fetch = on_fetch
        self.counting_seconds = 0.0  # the hooks' own cost, reported as the probe's overhead
        self._local = threading.local()

    def install(self) -> None:
        after_import("torch.utils.data.dataloader", self._hook_torch)
        after_import("accelerate.data_loader", self._hook_accelerate)

    def report(self, loader_id: int, started: float, finished: float, batch: object) -> None:
        size = batch_size(batch)
        self.on_fetch(loader_id, started, finished, size)
        self.counting_seconds += time.perf_counter() - finished

    def _wrap(self, owner: type) -> None:
        original = owner.__dict__.get("__iter__")
        if original is None or getattr(original, "_accelkit_bench", False):
            return
        hooks = self

        def __iter__(self):
            if getattr(hooks._local, "inside", False):  # a loader iterated inside another one: not the outermost
                return original(self)
            since = time.perf_counter()
            hooks._local.inside = True  # a subclass's __iter__ calling super().__iter__() is one loader
            try:
                inner = original(self)
            finally:
                hooks._local.inside = False
            return _TimedIterator(inner, id(self), hooks, since)

        __iter__._accelkit_bench = True
        __iter__.__wrapped__ = original
        owner.__iter__ = __iter__

    def _hook_torch(self) -> None:
        from torch.utils.data.dataloader import DataLoader  # the package itself may still be initialising

        self._wrap(DataLoader)

    def _hook_accelerate(self) -> None:
        import accelerate.data_loader as data_loader

        for name in self.ACCELERATE_LOADERS:
            owner = getattr(data_loader, name, None)
            if isinstance(owner, type):
                self._wrap(owner)
