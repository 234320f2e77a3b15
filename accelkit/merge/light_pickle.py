"""The restricted unpicklers (no torch): a DCP `.metadata`, the `data.pkl` of torch.save archives, DeepSpeed's.

Both are pickles naming torch classes. Importing torch to rebuild them costs seconds, more than merging the bytes;
the merge only needs plain facts from them (shapes, dtypes, offsets, which storage record holds a tensor). The
unpicklers here build light stand-ins for an explicit list of names and refuse every other global, persistent id or
opcode target with `Refused` (a `pickle.UnpicklingError`): nothing is imported and no pickled code ever runs, so a
crafted file's `__reduce__` payload is refused, not executed. What the archive unpicklers refuse, the readers open
with torch's `weights_only` loader (records, torch_files), which reads it or says what is wrong with it.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from accelkit.merge.dtypes import COMPLEX, LIGHT, STORAGES, TABLE


class Refused(pickle.UnpicklingError):
    """The pickle names something the light reader does not build (never imported, never called)."""


@dataclass(frozen=True)
class DType:
    """A torch dtype by name (`torch.float32` -> DType("float32"))."""

    name: str


class _Record:
    """A stand-in for a DCP metadata class: keeps the state pickle gives it, runs no code of the real class."""

    def __init__(self, *args: Any) -> None:
        self.args = args

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, dict):
            self.__dict__.update(state)
        elif type(self).__name__ == "TensorProperties" and isinstance(state, tuple) and len(state) >= 2:
            self.dtype, self.layout = state[0], state[1]  # (dtype, layout, requires_grad, memory format, pin_memory)
        else:
            self.state = state


# The modules of DCP's metadata classes (torch 2.2 - 2.13; _shard for older ShardedTensor saves): their classes are
# built as `_Record` stand-ins (or, for DCP's own loader, as the real classes); every other global is refused.
_DCP_MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem",
                "torch.distributed._shard.metadata", "torch.distributed._shard.sharded_tensor.metadata")
_STAND_INS: dict[tuple[str, str], type] = {}


def _stand_in(module: str, name: str) -> type:
    if (module, name) not in _STAND_INS:
        _STAND_INS[module, name] = type(name, (_Record,), {"__module__": module})
    return _STAND_INS[module, name]


def _size(values: Any = ()) -> tuple:
    """torch.Size(values) as a plain tuple of ints."""
    out = tuple(values)
    if not all(type(v) is int for v in out):
        raise Refused("torch.Size of non-integers")
    return out


def _path(*parts: Any) -> str:
    """A pickled pathlib path (the checkpoint id DCP records) as text."""
    if not all(isinstance(part, str) for part in parts):
        raise Refused("a path of non-strings")
    return "/".join(parts)


_PATHS = {("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"),
          ("pathlib", "PureWindowsPath")}
_BUILTINS = {("collections", "OrderedDict"), ("builtins", "set"), ("builtins", "frozenset")}


def _layout(name: Any) -> str:
    """torch.serialization._get_layout(name): the layout's name (a strided tensor's is "torch.strided")."""
    if not isinstance(name, str):
        raise Refused("a layout that is not a name")
    return name


def light_dtype(name: str) -> DType | None:
    """A torch dtype by name (None: refused): those safetensors stores, and complex ones (read, then refused)."""
    return DType(name) if name in TABLE or name in COMPLEX else None


class MetadataUnpickler(pickle.Unpickler):
    """The one reader of a DCP `.metadata`, for both paths: builds only what it is made of, refuses every other
    global and persistent id with `Refused` ("<module>.<name> is not part of DCP metadata"), never importing it.

    `dtype` turns a torch dtype's name into what the caller wants (`light_dtype`, or torch's dtype for DCP's own
    loader, which `real=True` gives DCP's real classes, torch.Size and paths), else `_Record` stand-ins, tuples and
    text."""

    def __init__(self, handle: Any, dtype: Callable[[str], Any] = light_dtype, real: bool = False) -> None:
        super().__init__(handle)
        self.dtype, self.real = dtype, real

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _BUILTINS:
            return super().find_class(module, name)
        if module == "torch" and name != "Size" and (dtype := self.dtype(name)) is not None:
            return dtype
        known = {("torch", "Size"): _size, ("torch.serialization", "_get_layout"): _layout,
                 **dict.fromkeys(_PATHS, _path)}
        if (module, name) in known:
            return super().find_class(module, name) if self.real else known[module, name]
        if module in _DCP_MODULES and name.isidentifier() and not name.startswith("__"):
            if not self.real:
                return _stand_in(module, name)
            found = super().find_class(module, name)
            if isinstance(found, type):
                return found
        raise Refused(f"{module}.{name} is not part of DCP metadata")

    def persistent_load(self, pid: Any) -> Any:  # pickle's own words, as the torch path has always said them
        raise Refused("A load persistent id instruction was encountered, but no persistent_load function was "
                      "specified.")


def load_metadata(data: bytes) -> Any:
    metadata = MetadataUnpickler(io.BytesIO(data)).load()
    if type(metadata) is not _stand_in("torch.distributed.checkpoint.metadata", "Metadata"):
        raise Refused("not DCP metadata")
    return metadata


@dataclass(frozen=True)
class StorageRef:
    """One storage of a torch.save archive: the record `data/<key>`, holding `numel` elements of `dtype`."""

    key: str
    dtype: str
    numel: int


@dataclass(frozen=True)
class TensorRef:
    """A tensor of a torch.save archive: where its elements are in which storage (no byte of it read)."""

    storage: StorageRef
    storage_offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]

    @property
    def is_contiguous(self) -> bool:
        expected = 1
        for size, stride in zip(reversed(self.shape), reversed(self.stride), strict=True):
            if size != 1 and stride != expected:
                return False
            expected *= size
        return True

    @property
    def numel(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count


def _rebuild_tensor_v2(storage: Any, storage_offset: Any, size: Any, stride: Any, requires_grad: Any = False,
                       backward_hooks: Any = None, metadata: Any = None) -> TensorRef:
    if not isinstance(storage, StorageRef) or type(storage_offset) is not int:
        raise Refused("a tensor without a storage")
    shape, strides = _size(size), _size(stride)
    if len(shape) != len(strides) or backward_hooks or metadata:
        raise Refused("a tensor with hooks or metadata")
    return TensorRef(storage, storage_offset, shape, strides)


def _ordered_dict(*args: Any) -> dict:
    if args:
        raise Refused("OrderedDict with arguments")
    return {}


class _StorageType:
    def __init__(self, dtype: str) -> None:
        self.dtype = dtype


class ArchiveUnpickler(pickle.Unpickler):
    """Builds the `data.pkl` of a torch.save archive holding plain tensors (as `TensorRef`s); anything else is
    refused: parameters, subclasses, quantized or sparse tensors, and every class outside this list."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor_v2
        if (module, name) == ("collections", "OrderedDict"):
            return _ordered_dict
        if module == "torch" and name in STORAGES:
            return _StorageType(STORAGES[name])
        raise Refused(f"{module}.{name} in a tensor archive")

    def persistent_load(self, pid: Any) -> StorageRef:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                and isinstance(pid[1], _StorageType) and isinstance(pid[2], str) and pid[3] == "cpu"
                and type(pid[4]) is int):
            raise Refused("a storage that is not a plain CPU storage")
        return StorageRef(pid[2], pid[1].dtype, pid[4])


def load_archive_pickle(data: bytes) -> Any:
    return ArchiveUnpickler(io.BytesIO(data)).load()


class _StateDict(dict):
    """collections.OrderedDict as torch state dicts pickle it: a dict that may carry a `_metadata` attribute."""

    def __setstate__(self, state: Any) -> None:
        if not isinstance(state, dict):
            raise Refused("unexpected state for an OrderedDict")
        self.__dict__.update(state)


def _state_dict(*args: Any) -> dict:
    if args:
        raise Refused("OrderedDict with arguments")
    return _StateDict()


class ForeignStandIn:
    """An inert object for one of the few DeepSpeed classes its checkpoints name (never imported): it keeps the
    arguments it was called with (an enum's value) and the state pickle gives it (a fragment's numel and start)."""

    args: tuple = ()
    state: Any = None

    def __init__(self, *args: Any) -> None:
        self.args = args

    def __setstate__(self, state: Any) -> None:
        self.state = state

    @property
    def value(self) -> Any:
        return self.args[0] if self.args else None


# The only DeepSpeed classes its ZeRO checkpoints contain (deepspeed 0.14 - 0.19), as torch_files allowlists them.
_FOREIGN = {tuple(dotted.rsplit(".", 1)): type(dotted.rsplit(".", 1)[1], (ForeignStandIn,),
                                                {"__module__": dotted.rsplit(".", 1)[0]})
            for dotted in ("deepspeed.runtime.zero.config.ZeroStageEnum",
                           "deepspeed.runtime.fp16.loss_scaler.LossScaler",
                           "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
                           "deepspeed.utils.tensor_fragment.fragment_address")}
_TENSOR_TYPE = object()  # torch.Tensor, named by _rebuild_from_type_v2 for a plain tensor with attributes


def _rebuild_from_type_v2(func: Any, new_type: Any, args: Any, state: Any) -> TensorRef:
    """A plain tensor saved with Python attributes (DeepSpeed's `ds_id` on ZeRO-3 flat groups): the attributes are
    dropped, as the merge never reads them; any other type (a subclass) is refused."""
    if func is not _rebuild_tensor_v2 or new_type is not _TENSOR_TYPE or not isinstance(args, tuple):
        raise Refused("a tensor subclass")
    if state is not None and not isinstance(state, dict):
        raise Refused("a tensor with unexpected state")
    return _rebuild_tensor_v2(*args)


class DeepSpeedUnpickler(ArchiveUnpickler):
    """Builds the `data.pkl` of DeepSpeed's model and optimizer states: plain tensors (as `TensorRef`s), state
    dicts, sizes, dtypes, and inert stand-ins for the four DeepSpeed classes torch_files allowlists. Nothing else."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("collections", "OrderedDict"):
            return _state_dict
        if (module, name) in _FOREIGN:
            return _FOREIGN[module, name]
        if (module, name) == ("torch._tensor", "_rebuild_from_type_v2"):
            return _rebuild_from_type_v2
        if (module, name) == ("torch", "Tensor"):
            return _TENSOR_TYPE
        if (module, name) == ("torch", "Size"):
            return _size
        if module == "torch" and name in LIGHT:
            return DType(name)
        return super().find_class(module, name)


def load_deepspeed_pickle(data: bytes) -> Any:
    return DeepSpeedUnpickler(io.BytesIO(data)).load()
