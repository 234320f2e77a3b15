"""Count the bytes a forward pass keeps for the backward: the one definition of "activations" in accelkit.

    with ActivationCounter(model) as counter:
        loss, outputs = step(model, batch)
        counter.hold(loss, outputs)
    counter.result()

What counts, each storage once (views and the same tensor saved by several ops share one storage):
- every tensor autograd saves for the backward (`torch.autograd.graph.saved_tensors_hooks`);
- the inputs of checkpointed layers (non-reentrant activation checkpointing keeps them alive to recompute the
  layer, outside autograd's saved tensors), found with forward pre-hooks on checkpointed modules;
- the outputs the script holds until its backward (loss, logits), given to `hold()`.
What does not: parameters (counted as parameters) and tensors derived from them by views or dtype casts, i.e. the
bf16 copies autocast makes of fp32 weights, reported apart as `weight_copies` (they live until the backward too).

The same counter measures real forward passes (tests, `accelkit plan --measure`) and runs the plan's trace on the
meta device, so both sides of every comparison count the same thing.
"""

from __future__ import annotations

from dataclasses import dataclass

# Autograd nodes that only view or cast their single input: a saved tensor reached through them from a parameter's
# AccumulateGrad is that parameter (or its autocast copy), not an activation.
_VIEW_NODES = {"TBackward0", "ViewBackward0", "TransposeBackward0", "PermuteBackward0", "ExpandBackward0",
               "AliasBackward0", "UnsqueezeBackward0", "SqueezeBackward0", "SqueezeBackward1",
               "ReshapeAliasBackward0", "AsStridedBackward0", "UnsafeViewBackward0"}
_CAST_NODES = {"ToCopyBackward0", "CloneBackward0"}


@dataclass(frozen=True)
class ActivationCount:
    saved: int  # bytes autograd saved for the backward (activations proper), checkpointed layer inputs included
    outputs: int  # bytes of outputs the script holds (loss, logits) not already saved
    weight_copies: int  # bytes of parameter casts saved for the backward (autocast's bf16 copies of fp32 weights)
    largest_layer: int  # bytes saved inside the largest checkpointable layer (what recomputing one layer holds)
    layers: int  # checkpointable layers seen

    @property
    def total(self) -> int:
        return self.saved + self.outputs


def storage_of(tensor):
    """A tensor's storage (DTensors: their local shard's), or None for storage-less tensors. Holding it keeps
    the storage alive, so its identity cannot be reused by a later allocation while it is being counted."""
    local = getattr(tensor, "_local_tensor", None)
    if local is not None:
        tensor = local
    try:
        return tensor.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def storage_key(tensor) -> tuple[int, int] | None:
    """(identity, bytes) of a tensor's storage; None for storage-less tensors."""
    storage = storage_of(tensor)
    return None if storage is None else (storage._cdata, storage.nbytes())


def parameter_link(tensor) -> str | None:
    """'param' when `tensor` is a parameter or a view of one, 'cast' when it is a dtype cast of one, else None."""
    if tensor.requires_grad and tensor.grad_fn is None:
        return "param"
    kind = "param"
    node = tensor.grad_fn
    for _ in range(6):
        if node is None:
            return None
        name = type(node).__name__
        if name == "AccumulateGrad":
            return kind
        if name in _CAST_NODES:
            kind = "cast"
        elif name not in _VIEW_NODES:
            return None
        following = [fn for fn, _ in node.next_functions if fn is not None]
        if len(following) != 1:
            return None
        node = following[0]
    return None


def is_checkpointed(module) -> bool:
    """A layer that recomputes its forward in the backward: transformers' gradient checkpointing or torch's
    checkpoint_wrapper (what Accelerate's FSDP activation checkpointing applies)."""
    if type(module).__name__ == "CheckpointWrapper":
        return True
    return bool(getattr(module, "gradient_checkpointing", False)) and module.training and \
        hasattr(module, "_gradient_checkpointing_func")


class ActivationCounter:
    """See the module docstring. `layer_types`: class names whose instances are layers (for `largest_layer`)."""

    def __init__(self, model, layer_types: tuple[str, ...] = ()) -> None:
        import torch

        self._torch = torch
        self.model = model
        self.layer_types = set(layer_types)
        self.saved: dict[int, int] = {}
        self.copies: dict[int, int] = {}
        self.outputs: dict[int, int] = {}
        self._kept: list = []  # every storage counted or excluded, alive until the counter goes
        self.param_storages = {self._keep(p)[0] for p in model.parameters() if storage_of(p) is not None}
        self._layer_stack: list[int] = []
        self._layer_bytes: dict[int, int] = {}
        self._layer_seen: dict[int, set[int]] = {}
        self._handles: list = []
        self._hooks = None

    def _keep(self, tensor) -> tuple[int, int] | None:
        storage = storage_of(tensor)
        if storage is None:
            return None
        self._kept.append(storage)
        return storage._cdata, storage.nbytes()

    # -- what autograd saves -----------------------------------------------------------------------------------
    def _pack(self, tensor):
        key = self._keep(tensor)
        if key is None or key[0] in self.param_storages:
            return tensor
        link = parameter_link(tensor)
        if link == "param":
            return tensor
        if link == "cast":
            self.copies.setdefault(*key)
            return tensor
        self.saved.setdefault(*key)
        if self._layer_stack:
            layer = self._layer_stack[-1]
            seen = self._layer_seen.setdefault(layer, set())
            if key[0] not in seen:
                seen.add(key[0])
                self._layer_bytes[layer] = self._layer_bytes.get(layer, 0) + key[1]
        return tensor

    def _held_input(self, module, args, kwargs) -> None:
        for value in (*args, *kwargs.values()):
            if isinstance(value, self._torch.Tensor) and parameter_link(value) is None:
                key = self._keep(value)
                if key is not None and key[0] not in self.param_storages:
                    self.saved.setdefault(*key)

    # -- layers ------------------------------------------------------------------------------------------------
    def _enter_layer(self, module, args, kwargs) -> None:
        self._layer_stack.append(id(module))

    def _leave_layer(self, module, args, kwargs, output) -> None:
        if self._layer_stack and self._layer_stack[-1] == id(module):
            self._layer_stack.pop()

    def __enter__(self) -> ActivationCounter:
        for module in self.model.modules():
            if is_checkpointed(module):
                self._handles.append(module.register_forward_pre_hook(self._held_input, with_kwargs=True))
            if type(module).__name__ in self.layer_types:
                self._handles.append(module.register_forward_pre_hook(self._enter_layer, with_kwargs=True))
                self._handles.append(module.register_forward_hook(self._leave_layer, with_kwargs=True))
        self._hooks = self._torch.autograd.graph.saved_tensors_hooks(self._pack, lambda tensor: tensor)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def hold(self, *values) -> None:
        """Outputs the script keeps until its backward (loss, logits): counted unless already saved."""
        for tensor in _tensors(values, self._torch.Tensor):
            key = self._keep(tensor)
            if key is not None and key[0] not in self.saved and key[0] not in self.param_storages:
                self.outputs.setdefault(*key)

    def release(self) -> None:
        """Let go of the storages held for counting (call once the result is taken)."""
        self._kept.clear()

    def result(self) -> ActivationCount:
        return ActivationCount(saved=sum(self.saved.values()), outputs=sum(self.outputs.values()),
                               weight_copies=sum(self.copies.values()),
                               largest_layer=max(self._layer_bytes.values(), default=0),
                               layers=len(self._layer_bytes))


def _tensors(value, tensor_type):
    if isinstance(value, tensor_type):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item, tensor_type)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item, tensor_type)
    elif hasattr(value, "to_tuple"):  # transformers ModelOutput
        yield from _tensors(value.to_tuple(), tensor_type)
