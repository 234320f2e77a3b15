"""Communication of one training step, counted in the rank: every collective the step issues (DDP's bucketed
all-reduce, FSDP2's all-gathers and reduce-scatters, DTensor's tensor-parallel all-reduces, DeepSpeed's, the
script's own), with its bytes and the size of the group it ran on.

All of them reach torch's dispatcher as `c10d::*` ops (the eager `torch.distributed` calls and the C++ reducer
alike) or `_c10d_functional::*` ops (DTensor, functional collectives), so one TorchDispatchMode sees them, whatever
library issued them. The mode costs a Python call per tensor operation, so the probe counts one warmup step only
(never a measured one).

Bytes follow nccl-tests' `size`: the full buffer (all-reduce: the tensor; all-gather: the gathered output;
reduce-scatter: the input before scattering).
"""

from __future__ import annotations

from typing import Any

# op name -> (which argument holds the full buffer, how many times to scale it: "group" = by the group's size)
_FULL_BUFFER = {
    "allreduce_": (0, None), "allreduce_coalesced_": (0, None), "all_reduce": (0, None),
    "all_reduce_coalesced": (0, None), "allgather_": (0, None), "_allgather_base_": (0, None),
    "allgather_coalesced_": (0, None), "allgather_into_tensor_coalesced_": (0, None),
    "all_gather_into_tensor": (0, "group"), "all_gather_into_tensor_coalesced": (0, "group"),
    "reduce_scatter_": (1, None), "_reduce_scatter_base_": (1, None), "reduce_scatter_tensor_coalesced_": (1, None),
    "reduce_scatter_tensor": (0, None), "reduce_scatter_tensor_coalesced": (0, None),
    "broadcast_": (0, None), "broadcast": (0, None), "alltoall_": (1, None), "alltoall_base_": (1, None),
    "all_to_all_single": (0, None), "reduce_": (0, None), "gather_": (1, None), "scatter_": (0, None),
    "send": (0, None), "recv_": (0, None), "_allgather_base": (0, None),
}
_NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional")
# a readable name per family, the way nccl-tests and the table name them
_FAMILY = {"allreduce": "all_reduce", "all_reduce": "all_reduce", "allgather": "all_gather",
           "all_gather": "all_gather", "reduce_scatter": "reduce_scatter", "broadcast": "broadcast",
           "alltoall": "all_to_all", "all_to_all": "all_to_all"}


def _tensor_bytes(value: Any) -> int:
    if hasattr(value, "element_size") and hasattr(value, "numel"):
        return int(value.numel()) * int(value.element_size())
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(item) for item in value)
    return 0


def collective_family(op_name: str) -> str:
    bare = op_name.lstrip("_")
    return next((name for prefix, name in _FAMILY.items() if bare.startswith(prefix)), bare.rstrip("_"))


def _group(args: tuple, kwargs: dict) -> tuple[int, int] | None:
    """(size, stride) of the group an op runs on, from its ProcessGroup argument (c10d ops) or group name
    (functional ones); stride = the distance between consecutive ranks of the group (1 for a tensor-parallel group
    of neighbours), which tells the mesh dimension apart from another of the same size. None: not found."""
    for value in (*args, *kwargs.values()):
        group = None
        try:
            if type(value).__name__ == "ScriptObject" and value._type().name().endswith("ProcessGroup"):
                from torch.distributed import ProcessGroup

                group = ProcessGroup.unbox(value)  # c10d ops carry the group boxed as a TorchScript object
            elif isinstance(value, str) and value:
                from torch.distributed.distributed_c10d import _resolve_process_group

                group = _resolve_process_group(value)
        except Exception:  # noqa: BLE001 - a ScriptObject of another kind (a ReduceOp), a string that names no group
            continue
        if group is not None:
            return int(group.size()), group_stride(group)
    return None


def group_stride(group) -> int:
    try:
        from torch.distributed import get_process_group_ranks

        ranks = get_process_group_ranks(group)
    except Exception:  # noqa: BLE001 - a group this rank cannot list
        return 0
    steps = {b - a for a, b in zip(ranks, ranks[1:], strict=False)}
    return steps.pop() if len(steps) == 1 else 0


def group_key(op_family: str, group: tuple[int, int] | None) -> str:
    """`all_reduce@2/1`: the collective, its group's size and rank stride (`all_reduce` when unknown)."""
    return f"{op_family}@{group[0]}/{group[1]}" if group else op_family


def parse_key(key: str) -> tuple[str, int | None, int | None]:
    op, _, where = key.partition("@")
    size, _, stride = where.partition("/")
    return op, int(size) if size.isdigit() else None, int(stride) if stride.isdigit() else None


def collective_bytes(op_name: str, args: tuple, kwargs: dict) -> int:
    where, scale = _FULL_BUFFER.get(op_name, (0, None))
    data = args[where] if len(args) > where else None
    size = _tensor_bytes(data)
    if scale == "group":
        group = args[1] if len(args) > 1 and isinstance(args[1], int) else None
        size *= group or 1
    return size


class CommCounter:
    """Counts the collectives issued between `start()` and `stop()` on this thread (and the autograd threads it
    starts). `totals`: {"op@group_size/rank_stride": {"calls": n, "bytes": b}}."""

    def __init__(self) -> None:
        self.totals: dict[str, dict[str, int]] = {}
        self._mode = None

    def start(self) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        counter = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                if func.namespace in _NAMESPACES:
                    counter.add(func.overloadpacket.__name__, args, kwargs)
                return func(*args, **kwargs)

        self._mode = _Mode()
        self._mode.__enter__()

    def add(self, op_name: str, args: tuple, kwargs: dict) -> None:
        if op_name not in _FULL_BUFFER:  # barriers, waits, autograd wrappers: no data moved
            return
        key = group_key(collective_family(op_name), _group(args, kwargs))
        entry = self.totals.setdefault(key, {"calls": 0, "bytes": 0})
        entry["calls"] += 1
        entry["bytes"] += collective_bytes(op_name, args, kwargs)

    def stop(self) -> dict[str, dict[str, int]]:
        if self._mode is not None:
            self._mode.__exit__(None, None, None)
            self._mode = None
        return self.totals
