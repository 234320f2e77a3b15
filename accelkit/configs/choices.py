"""The closed sets of values accelkit models, each defined once: backends, precisions, FSDP and DeepSpeed choices.

A leaf module (standard library only): the click options of `accelkit config` and `accelkit launch` take their
choices from here without importing anything heavy, and every other package reads the same definitions.
Each value is spelled as on accelkit's command line; `.accelerate` (where it differs) is the spelling of an
Accelerate config file.
"""

from __future__ import annotations

from enum import Enum


class Choice(str, Enum):
    """A command-line choice: compares equal to its text, prints as its text."""

    def __str__(self) -> str:
        return self.value

    @property
    def accelerate(self) -> str:
        """The spelling in an Accelerate config file (`SHARD_GRAD_OP` for grad-op), where it differs."""
        return _ACCELERATE_SPELLING.get((type(self), self.value), self.value)

    @classmethod
    def values(cls) -> tuple[str, ...]:
        return tuple(member.value for member in cls)


class Backend(Choice):
    SINGLE = "single"
    CPU = "cpu"  # plain multi-process CPU DDP
    DDP = "ddp"
    FSDP = "fsdp"
    DEEPSPEED = "deepspeed"

    @property
    def distributed_type(self) -> str:
        """Accelerate's `distributed_type` for this backend (a one-process cpu config is written as NO)."""
        return self.accelerate

    @property
    def needs_gpus(self) -> bool:
        """Accelerate starts this backend on GPUs (without them, only a CPU rehearsal can run it)."""
        return self in (Backend.DDP, Backend.FSDP, Backend.DEEPSPEED)

    @property
    def rehearsal(self) -> Backend:
        """The backend whose real code runs on CPU ranks when this one is rehearsed (cpu runs as DDP over gloo)."""
        return Backend.DDP if self is Backend.CPU else self

    @classmethod
    def of(cls, distributed_type: object, use_cpu: bool = False) -> Backend | None:
        """The backend an Accelerate config describes, or None for types accelkit does not model (XLA, ...)."""
        name = str(getattr(distributed_type, "value", distributed_type)).upper()
        if name == "NO":
            return cls.CPU if use_cpu else cls.SINGLE
        return next((backend for backend in cls if backend.distributed_type == name), None)


_DISTRIBUTED_TYPES = {Backend.SINGLE: "NO", Backend.CPU: "MULTI_CPU", Backend.DDP: "MULTI_GPU",
                      Backend.FSDP: "FSDP", Backend.DEEPSPEED: "DEEPSPEED"}


class MixedPrecision(Choice):
    NO = "no"
    FP16 = "fp16"
    BF16 = "bf16"


class Sharding(Choice):
    FULL = "full"
    GRAD_OP = "grad-op"
    NO = "no"
    HYBRID = "hybrid"


class WrapPolicy(Choice):
    TRANSFORMER = "transformer"
    SIZE = "size"
    NONE = "none"


class StateDict(Choice):
    SHARDED = "sharded"
    FULL = "full"


class OffloadDevice(Choice):
    NONE = "none"
    CPU = "cpu"
    NVME = "nvme"


# (choice class, value) -> spelling: members of different classes share values ("full", "none"), and a str-valued
# member hashes and compares as its text.
_ACCELERATE_SPELLING: dict[tuple[type, str], str] = {
    **{(Backend, backend.value): dtype for backend, dtype in _DISTRIBUTED_TYPES.items()},
    # FSDP1's fsdp_sharding_strategy
    **{(Sharding, value): spelled for value, spelled in (("full", "FULL_SHARD"), ("grad-op", "SHARD_GRAD_OP"),
                                                         ("no", "NO_SHARD"), ("hybrid", "HYBRID_SHARD"))},
    **{(WrapPolicy, value): spelled for value, spelled in (("transformer", "TRANSFORMER_BASED_WRAP"),
                                                           ("size", "SIZE_BASED_WRAP"), ("none", "NO_WRAP"))},
    **{(StateDict, value): spelled for value, spelled in (("sharded", "SHARDED_STATE_DICT"),
                                                          ("full", "FULL_STATE_DICT"))},
}
FSDP_VERSIONS = (1, 2)
ZERO_STAGES = (0, 1, 2, 3)
# The backends Accelerate's launcher offers for context and sequence parallelism (`--parallelism_config_cp_backend`,
# `--parallelism_config_sp_backend`); a unit test keeps them equal to the installed Accelerate's choices.
CP_BACKENDS = ("torch",)
SP_BACKENDS = ("deepspeed",)


def from_accelerate(kind: type[Choice], text: object) -> Choice | None:
    """The choice a config file's spelling stands for (`SHARD_GRAD_OP` -> Sharding.GRAD_OP), or None."""
    wanted = str(text).strip()
    for member in kind:
        if wanted.upper() == member.accelerate.upper() or wanted.lower() == member.value:
            return member
    return None
