"""Where a pipeline-parallel layout lives, since Accelerate has no key for it: one line of text, read by the ranks.

Accelerate's ParallelismConfig has no `pp` dimension (its `prepare_pippy` is forward-only inference), and it refuses
sizes that do not multiply to the number of processes. So with `--pp-size N` accelkit writes no parallelism_config
and keeps the whole mesh in one place: the environment variable ACCELKIT_PIPELINE, e.g.

    pp=2,schedule=1f1b,microbatches=4,dp_shard=2,tp=2

`accelkit launch` exports it to every rank; accelkit's templates read it, build one DeviceMesh (pp, dp_shard, tp) and
train with torch.distributed.pipelining; `accelkit config` writes it into the YAML as a comment line
(`# accelkit-pipeline: ...`, which Accelerate ignores) that `accelkit launch --config FILE` reads back. With plain
`accelerate launch`, set the variable yourself (the YAML's header says what to set).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from accelkit.errors import AccelkitError
from accelkit.pipeline_schedules import DEFAULT_SCHEDULE as DEFAULT
from accelkit.pipeline_schedules import default_microbatches, parse_schedule

ENV_VAR = "ACCELKIT_PIPELINE"
COMMENT_KEY = "accelkit-pipeline"
DEFAULT_SCHEDULE = DEFAULT.name  # the schedules, their spellings and the micro-batch rules: accelkit.pipeline_schedules
_SIZES = ("pp", "dp_shard", "tp")


@dataclass(frozen=True)
class PipelineSpec:
    """One pipeline layout: `pp` stage groups, the schedule, microbatches per batch, and the FSDP2/TP sizes inside
    each stage group."""

    pp: int
    schedule: str = DEFAULT_SCHEDULE
    microbatches: int = 0  # 0: the default, one per stage
    dp_shard: int = 1
    tp: int = 1

    @property
    def stages_per_rank(self) -> int:
        return stages_per_rank(self.schedule)

    @property
    def stages(self) -> int:
        return self.pp * self.stages_per_rank

    def env_value(self) -> str:
        m = self.microbatches or default_microbatches(self.pp, self.schedule)
        return f"pp={self.pp},schedule={self.schedule},microbatches={m},dp_shard={self.dp_shard},tp={self.tp}"


def stages_per_rank(schedule: str | None) -> int:
    return parse_schedule(schedule or DEFAULT_SCHEDULE).stages_per_rank


def of_parallelism(p: Any) -> PipelineSpec | None:
    """The pipeline a ParallelismSettings asks for, or None without one."""
    if p is None or p.pp <= 1:
        return None
    return PipelineSpec(pp=p.pp, schedule=p.pp_schedule or DEFAULT_SCHEDULE,
                        microbatches=p.microbatches or default_microbatches(p.pp, p.pp_schedule),
                        dp_shard=p.dp_shard, tp=p.tp)


def parse_pipeline(text: str, where: str = ENV_VAR) -> PipelineSpec:
    """`pp=2,schedule=1f1b,microbatches=4,dp_shard=1,tp=1` -> PipelineSpec; AccelkitError naming `where`."""
    values: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        match = re.fullmatch(r"(pp|dp_shard|tp|microbatches)=(\d+)|schedule=([A-Za-z0-9_-]+)", item)
        if not match:
            raise AccelkitError(f"{where}: {item!r} is not a pipeline setting",
                                hint="write pp=N,schedule=S,microbatches=M,dp_shard=D,tp=T")
        if match.group(3) is not None:
            values["schedule"] = parse_schedule(match.group(3), f"{where}: schedule").name
        else:
            values[match.group(1)] = int(match.group(2))
    if values.get("pp", 0) < 2:
        raise AccelkitError(f"{where}: a pipeline needs pp=2 or more", hint="write pp=N with N >= 2")
    return PipelineSpec(**values)


def pipeline_comment_line(spec: PipelineSpec) -> str:
    return f"# {COMMENT_KEY}: {spec.env_value()}"


def read_pipeline_comment(text: str, where: str) -> PipelineSpec | None:
    """The pipeline a written config carries in its comment line, or None."""
    match = re.search(rf"^#\s*{COMMENT_KEY}:\s*(\S+)\s*$", text, flags=re.MULTILINE)
    return parse_pipeline(match.group(1), f"{where} ({COMMENT_KEY})") if match else None


def header_lines(config: Any) -> list[str]:
    """The YAML lines that carry a config's pipeline (none without one)."""
    spec = of_parallelism(getattr(config, "parallelism", None))
    if spec is None:
        return []
    return [f"# Pipeline parallelism: accelkit launch reads the next line; with accelerate launch set {ENV_VAR}="
            f"{spec.env_value()} (accelkit templates build the pp x dp_shard x tp mesh from it)",
            pipeline_comment_line(spec)]


def pipeline_with_config_comment(options: Any, labels: dict[str, str], config_file: Any) -> tuple[Any, dict]:
    """`options` plus the pipeline a config written by `accelkit config` carries (options given win)."""
    from dataclasses import replace

    from accelkit.configs.comment_lines import comment_spec

    if options.pp_size is not None:
        return options, labels
    spec = comment_spec(config_file, read_pipeline_comment)
    if spec is None:
        return options, labels
    m = spec.microbatches or default_microbatches(spec.pp, spec.schedule)
    given = {name: value for name, value in (("pp_size", spec.pp), ("pp_schedule", spec.schedule),
                                             ("microbatches", m),
                                             ("dp_shard_size", spec.dp_shard), ("tp_size", spec.tp))
             if getattr(options, name) is None}
    return replace(options, **given), {**labels, **{name: str(config_file) for name in given}}

