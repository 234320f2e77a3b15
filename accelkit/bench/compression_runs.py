"""Which runs `accelkit bench --grad-compression` makes, checked before any starts: per backend (or per --layouts
layout) the uncompressed run, then each compression where it applies.

Every run is checked the way `accelkit launch` checks it (accelkit.bench.launching.check_request). A layout whose
uncompressed run cannot start is refused (the whole bench: nothing would be compared); a compression the layout's
backend cannot take (PowerSGD under FSDP, a DDP hook beside tensor parallelism, bf16 on gloo) becomes a row that says
so, in the refusal's own words, and is not launched.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from accelkit.compression.compression_spec import NONE, CompressionSpec
from accelkit.configs import Mesh
from accelkit.errors import AccelkitError

NOT_APPLICABLE = "not applicable: "  # a row's status when its compression does not apply to the layout


@dataclass(frozen=True)
class CompressionRun:
    backend: str
    spec: CompressionSpec
    layout: Mesh | None = None
    not_applicable: str | None = None  # why the compression does not apply (the run is not launched)
    hint: str | None = None  # the refusal's hint, for a bench where the compression applies to no run

    @property
    def layout_name(self) -> str:
        return self.layout.name if self.layout is not None else ""

    @property
    def folder(self) -> str:
        where = f"{self.backend}-{self.layout.slug}" if self.layout is not None else self.backend
        return f"{where}-{self.spec.label().replace(' ', '_').replace('@', 'start')}"


def spec_settings(settings: Any, spec: CompressionSpec) -> Any:
    """The launch settings of one run: the shared ones with this compression (none: no compression option)."""
    fields: dict[str, Any] = {"grad_compression": spec.method if spec.active else None}
    if spec.method == "powersgd":
        fields.update(powersgd_rank=spec.powersgd_rank, powersgd_start_step=spec.powersgd_start_step)
    return replace(settings, options=replace(settings.options, **fields))


def plan_runs(settings: Any, specs: Sequence[CompressionSpec], places: Sequence[tuple[str, Mesh | None]],
              world: int, script: str, script_args: tuple[str, ...], *, check: bool = True,
              reduce_dtype: bool = False) -> list[CompressionRun]:
    """The runs for each (backend, layout) in `places`: none first, then each active spec. With `check`, every run is
    checked as launch checks it; a failing uncompressed run raises, a failing compressed one is not applicable.
    `reduce_dtype`: the spec came from --reduce-dtype, which only FSDP2 has (a DDP layout gets no hook for it)."""
    from accelkit.bench.launching import check_request, request_for

    runs: list[CompressionRun] = []
    for backend, layout in places:
        for spec in [NONE, *(s for s in specs if s.active)]:
            reason = hint = None
            if reduce_dtype and spec.active and backend != "fsdp":
                reason = f"--reduce-dtype is FSDP2's reduce dtype, and this layout runs under {backend}"
                hint = "use --grad-compression for a DDP hook"
            elif check:
                request = request_for(spec_settings(settings, spec), backend, world, script, script_args,
                                      module=False, probes=(), layout=layout)
                try:
                    check_request(request)
                except AccelkitError as exc:
                    if not spec.active:
                        where = f"layout {layout.name} ({backend})" if layout is not None else f"--backend {backend}"
                        raise AccelkitError(f"{where}: {exc.message}", hint=exc.hint) from None
                    reason, hint = exc.message, exc.hint
            runs.append(CompressionRun(backend, spec, layout, reason, hint))
    return runs
