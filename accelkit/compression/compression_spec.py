"""What `--grad-compression` asks for, and the one place a launch carries it to the ranks.

Accelerate has no config key and no launch flag for DDP communication hooks or FSDP2's reduce dtype (they exist only
as Python: `DistributedDataParallelKwargs(comm_hook=...)`, `MixedPrecisionPolicy(reduce_dtype=...)`). accelkit keeps
the choice in one documented place: the environment variable ACCELKIT_GRAD_COMPRESSION, e.g.

    fp16 | bf16 | powersgd:rank=4,start=0

`accelkit launch` exports it to every rank; accelkit's templates read it and pass Accelerate the handler or policy;
`accelkit config` writes it into the YAML as a comment line (`# accelkit-grad-compression: ...`, which Accelerate
ignores) that `accelkit launch --config FILE` reads back. DeepSpeed's int8 (ZeRO++) lives in the DeepSpeed JSON
instead, where DeepSpeed itself reads it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from accelkit.errors import AccelkitError

ENV_VAR = "ACCELKIT_GRAD_COMPRESSION"
COMMENT_KEY = "accelkit-grad-compression"
METHODS = ("none", "fp16", "bf16", "powersgd", "int8")
REDUCE_DTYPES = ("fp32", "bf16", "fp16")
DEFAULT_POWERSGD_RANK = 1
DEFAULT_POWERSGD_START = 1000  # torch's PowerSGDState default (start_powerSGD_iter)
# Ceilings (issue 46: rank 10^11 and start step 10^20 were accepted). PowerSGD's factors are (n x r) and (m x r):
# published runs use ranks 1-32, and past a layer's smaller side a higher rank sends more than the gradient itself.
MAX_POWERSGD_RANK = 1024
MAX_POWERSGD_START = 10**9  # optimizer steps; no run gets there, so a larger start would never compress


@dataclass(frozen=True)
class CompressionSpec:
    """One gradient-compression choice. `method`: one of METHODS (fp16/bf16 under FSDP mean the reduce dtype)."""

    method: str = "none"
    powersgd_rank: int = DEFAULT_POWERSGD_RANK
    powersgd_start_step: int = DEFAULT_POWERSGD_START

    @property
    def active(self) -> bool:
        return self.method != "none"

    def env_value(self) -> str:
        """The text of ACCELKIT_GRAD_COMPRESSION (and of the config comment)."""
        if self.method == "powersgd":
            return f"powersgd:rank={self.powersgd_rank},start={self.powersgd_start_step}"
        return self.method

    def label(self) -> str:
        """How a table names it: `powersgd r4 @0`."""
        if self.method == "powersgd":
            return f"powersgd r{self.powersgd_rank} @{self.powersgd_start_step}"
        return self.method

    def powersgd_state_options(self) -> dict[str, object]:
        """PowerSGDState's keyword arguments. torch allows error feedback and warm start only from iteration 2 on
        (PowerSGDState raises otherwise), so an earlier start turns both off."""
        options: dict[str, object] = {"matrix_approximation_rank": self.powersgd_rank,
                                      "start_powerSGD_iter": self.powersgd_start_step}
        if self.powersgd_start_step <= 1:
            options.update(use_error_feedback=False, warm_start=False)
        return options


NONE = CompressionSpec()


def parse_env_value(text: str, where: str = ENV_VAR) -> CompressionSpec:
    """`powersgd:rank=4,start=0` -> CompressionSpec; AccelkitError naming `where` on anything else."""
    method, _, rest = text.strip().partition(":")
    method = method.strip().lower()
    if method not in METHODS:
        raise AccelkitError(f"{where}: unknown gradient compression {text.strip()!r}",
                            hint=f"use one of {', '.join(METHODS)} (powersgd:rank=R,start=S for PowerSGD)")
    values = {"rank": DEFAULT_POWERSGD_RANK, "start": DEFAULT_POWERSGD_START}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        match = re.fullmatch(r"(rank|start)=(\d+)", item)
        if not match or method != "powersgd":
            raise AccelkitError(f"{where}: {item!r} is not a setting of {method}",
                                hint="only powersgd takes settings: powersgd:rank=R,start=S")
        values[match.group(1)] = int(match.group(2))
    return CompressionSpec(method, values["rank"], values["start"])


def from_options(method: str | None, rank: int | None, start: int | None) -> CompressionSpec:
    """The spec the command-line options ask for (None: not given). PowerSGD settings without PowerSGD are refused:
    they would be dropped silently."""
    chosen = method or "none"
    for value, flag in ((rank, "--powersgd-rank"), (start, "--powersgd-start-step")):
        if value is not None and chosen != "powersgd":
            raise AccelkitError(f"{flag} applies only to --grad-compression powersgd (got {chosen})",
                                hint=f"add --grad-compression powersgd, or drop {flag}")
    if rank is not None and rank < 1:
        raise AccelkitError(f"--powersgd-rank must be at least 1 (got {rank})",
                            hint="PowerSGD's rank is the number of columns of its low-rank factors: 1, 2, 4, ...")
    if start is not None and start < 0:
        raise AccelkitError(f"--powersgd-start-step must be 0 or more (got {start})",
                            hint="0 compresses from the first step; torch's default is 1000")
    if rank is not None and rank > MAX_POWERSGD_RANK:
        raise AccelkitError(f"--powersgd-rank {rank} is above {MAX_POWERSGD_RANK}: factors that wide send more "
                            "bytes than the gradients they approximate",
                            hint="use a small rank (1, 2, 4 ... 32 is the usual range)")
    if start is not None and start > MAX_POWERSGD_START:
        raise AccelkitError(f"--powersgd-start-step {start} is above {MAX_POWERSGD_START:,} optimizer steps: "
                            "PowerSGD would never start compressing",
                            hint="give the step from which to compress (torch's default is 1000), or drop "
                                 "--grad-compression powersgd")
    return CompressionSpec(chosen, DEFAULT_POWERSGD_RANK if rank is None else rank,
                           DEFAULT_POWERSGD_START if start is None else start)


def compression_comment_line(spec: CompressionSpec) -> str:
    return f"# {COMMENT_KEY}: {spec.env_value()}"


def read_compression_comment(text: str, where: str) -> CompressionSpec | None:
    """The spec a written config carries in its comment line, or None."""
    match = re.search(rf"^#\s*{COMMENT_KEY}:\s*(\S+)\s*$", text, flags=re.MULTILINE)
    return parse_env_value(match.group(1), f"{where} ({COMMENT_KEY})") if match else None
