"""`plan --layout "dp_shard=8,tp=8,pp=8" [--pp-schedule S] [--microbatches M]`: one given layout, in bench's layout
syntax (accelkit/bench/layouts.py parses every dimension it knows; `pp=N`, the pipeline, is taken off first),
checked before anything is built."""

from __future__ import annotations

import re

from accelkit.errors import AccelkitError
from accelkit.plan import nd
from accelkit.plan.pipeline import DEFAULT_SCHEDULE, Pipeline, default_microbatches, schedule_name

EXAMPLE = 'e.g. --layout "dp_shard=8,tp=8,pp=8"'
_PP = re.compile(r"\s*pp(?:[_-]size)?\s*=\s*(\S*)\s*", re.IGNORECASE)


def parse_layout_option(text: str, schedule: str | None, microbatches: int | None) -> nd.Layout:
    from accelkit.bench import parse_layout

    items = [item for item in text.split(",")]
    pp_items = [item for item in items if _PP.fullmatch(item)]
    if len(pp_items) > 1:
        raise AccelkitError(f"--layout: pp is given twice in {text.strip()!r}", hint="give each dimension once")
    pp = 1
    if pp_items:
        size = _PP.fullmatch(pp_items[0]).group(1)
        if not size.isdigit() or int(size) < 1:
            raise AccelkitError(f"--layout: {pp_items[0].strip()!r}: a size is a whole number of 1 or more",
                                hint="use pp=1 (or leave pp out) for no pipeline")
        pp = int(size)
    rest = ",".join(item for item in items if item not in pp_items)
    try:
        base = parse_layout(rest) if rest.strip() else parse_layout("dp_replicate=1")
    except AccelkitError as exc:
        raise AccelkitError(exc.message.replace("--layouts:", "--layout:"),
                            hint=(exc.hint or "").replace("--layouts", "--layout").replace(
                                '"dp_shard=4;dp_shard=2,tp=2"', '"dp_shard=8,tp=8,pp=8"')) from None
    if pp == 1 and (schedule is not None or microbatches is not None):
        given = "--pp-schedule" if schedule is not None else "--microbatches"
        raise AccelkitError(f"{given} needs a pipeline: --layout has no pp dimension",
                            hint=f"add pp=N to --layout, {EXAMPLE}")
    name = schedule_name(schedule) if schedule is not None else DEFAULT_SCHEDULE
    pipeline = Pipeline(pp, name, microbatches if microbatches is not None else default_microbatches(pp, name))
    backend = base.natural_backend
    if backend == "deepspeed" and pp > 1:
        raise AccelkitError("--layout: pp does not compose with sp (Ulysses runs under DeepSpeed, the pipeline "
                            "under torch's mesh)", hint="split the sequence with cp instead, or drop pp")
    return nd.Layout(backend, dp_replicate=base.dp_replicate, dp_shard=base.dp_shard, tp=base.tp, cp=base.cp,
                     sp=base.sp, pipeline=pipeline)


def check_world(layout: nd.Layout, gpus: int | None, nodes: int) -> int:
    """The GPUs the layout is for: its product, which --num-processes (when given) must equal."""
    if layout.world < 2:
        raise AccelkitError(f"--layout {layout.name} is one process: there is nothing to lay out",
                            hint=f"give sizes whose product is 2 or more, {EXAMPLE}")
    if gpus is not None and gpus != layout.world:
        raise AccelkitError(f"--layout {layout.name} multiplies to {layout.world} GPUs, not --num-processes {gpus}",
                            hint=f"drop --num-processes (the layout sets it) or give a layout of {gpus} GPUs")
    if layout.world % nodes:
        raise AccelkitError(f"--layout {layout.name}: {layout.world} GPUs do not spread evenly over --num-machines "
                            f"{nodes}", hint=f"give a layout whose sizes multiply to a multiple of {nodes}")
    return layout.world
