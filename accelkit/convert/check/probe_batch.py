"""The equivalence run of `convert --check` (probe side): the original on one process at the conversion's global
batch. Every DataLoader the script builds with a batch size gets that size times the converted run's world size,
whether the size came from a flag, a constant or a default, so the check needs no knowledge of the script's
arguments; each change is recorded, and the check's line says which batches were compared."""

from __future__ import annotations

import functools

from accelkit.convert.check.record import Record


def scale_batches(record: Record, world: int) -> None:
    """Patch DataLoader.__init__ (subclasses included) so that its batch size is `world` times the script's."""
    from torch.utils.data import dataloader

    init = dataloader.DataLoader.__init__
    if getattr(init, "_accelkit_check", False):
        return

    @functools.wraps(init)
    def init_at_global_batch(loader, dataset, *args, **kwargs):
        if kwargs.get("batch_sampler") is None and not (len(args) > 3 and args[3] is not None):
            if args and isinstance(args[0], int):
                record.batch_scaled.append([args[0], args[0] * world])
                args = (args[0] * world, *args[1:])
            elif not args and isinstance(kwargs.get("batch_size", 1), int):
                size = kwargs.get("batch_size", 1)  # DataLoader's own default is 1
                record.batch_scaled.append([size, size * world])
                kwargs["batch_size"] = size * world
        init(loader, dataset, *args, **kwargs)

    init_at_global_batch._accelkit_check = True
    dataloader.DataLoader.__init__ = init_at_global_batch
