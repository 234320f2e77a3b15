"""One module per item of the migration checklist. Each exposes `apply(ctx, facts, plan, options)`, reads the
original tree and records edits in the plan; the order below matters (prepare placement looks at what earlier
transforms removed, and the Accelerator is placed before every use the others introduced)."""

from __future__ import annotations

from accelkit.convert.transforms import (
    accelerator,
    batches,
    decisions,
    devices,
    distributed,
    metrics,
    prepare,
    saving,
    seeding,
    training,
)

TRANSFORMS = [distributed.apply, devices.apply, training.apply, metrics.apply, prepare.apply, saving.apply,
              seeding.apply, batches.apply, decisions.apply, accelerator.apply]
