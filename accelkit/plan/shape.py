"""The shape of a model as the memory model needs it: every parameter tensor (name, shape, in order), the
optimizer's parameter groups, the FSDP2 units Accelerate would build, and the largest module ZeRO-3 gathers.

It is read from a model built on the meta device (no weights, no memory), so counts are the model's own, ties and
all, not a formula. `--params N` without a shape gives a count-only shape: model states can still be planned, not
the per-tensor padding, gather sizes or activations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

NO_DECAY_MARKERS = ("bias", "norm")  # the HF Trainer / accelkit templates idiom: no weight decay on these


@dataclass(frozen=True)
class ParamTensor:
    name: str
    shape: tuple[int, ...]
    trainable: bool = True

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Unit:
    """One FSDP2 unit (a `fully_shard` call): its parameters (indices into ModelShape.tensors) and whether its
    parameters are freed after the forward (full shard) or kept until the backward (the tail and the root)."""

    name: str
    params: tuple[int, ...]
    reshard_after_forward: bool = True


@dataclass(frozen=True)
class ModelShape:
    name: str  # the model class, e.g. LlamaForCausalLM
    source: str  # where the shape came from, said in the output
    parameters: int  # unique parameters (tied weights once)
    tensors: tuple[ParamTensor, ...] | None = None  # None: count only (--params)
    units: tuple[Unit, ...] = ()
    groups: tuple[tuple[int, ...], ...] = ()  # optimizer parameter groups (indices into tensors)
    largest_module: int = 0  # parameters owned directly by the largest module (what ZeRO-3 gathers at once)
    buffer_bytes: int = 0  # registered buffers (rotary tables, position ids): replicated on every rank
    dims: dict[str, int] = field(default_factory=dict)  # hidden_size, num_hidden_layers, ... when known
    notes: tuple[str, ...] = ()

    @property
    def exact(self) -> bool:
        return self.tensors is not None

    @property
    def trainable(self) -> int:
        if self.tensors is None:
            return self.parameters
        return sum(t.numel for t in self.tensors if t.trainable)

    def trainable_tensors(self) -> list[ParamTensor]:
        return [t for t in self.tensors or () if t.trainable]

    def with_groups(self, groups: list[list[str]]) -> ModelShape:
        """The same shape with the optimizer's groups given by parameter name (what a script really built)."""
        from dataclasses import replace

        index = {t.name: i for i, t in enumerate(self.tensors or ())}
        return replace(self, groups=tuple(tuple(index[n] for n in g if n in index) for g in groups if g))


def decay_split(tensors: tuple[ParamTensor, ...]) -> tuple[tuple[int, ...], ...]:
    """Two optimizer groups the usual way: weights decayed, biases and norm weights not (empty groups dropped)."""
    decay = tuple(i for i, t in enumerate(tensors) if t.trainable and not _no_decay(t.name))
    no_decay = tuple(i for i, t in enumerate(tensors) if t.trainable and _no_decay(t.name))
    return tuple(g for g in (decay, no_decay) if g)


def _no_decay(name: str) -> bool:
    return any(marker in name.lower() for marker in NO_DECAY_MARKERS)


def shape_from_count(parameters: int, source: str) -> ModelShape:
    return ModelShape(name="model", source=source, parameters=parameters,
                      notes=("only a parameter count was given: per-tensor padding, gather buffers and activations "
                             "are not modelled (give a config or --layers/--hidden/--heads for them)",))


def shape_from_model(model, source: str, wrap_classes: tuple[str, ...] = ()) -> ModelShape:
    """Read a (meta) model: its parameters in `named_parameters()` order, the FSDP2 units and the largest module."""
    names = [name for name, _ in model.named_parameters()]
    params = [p for _, p in model.named_parameters()]
    tensors = tuple(ParamTensor(n, tuple(p.shape), p.requires_grad) for n, p in zip(names, params, strict=True))
    position = {id(p): i for i, p in enumerate(params)}
    units, unit_notes = fsdp2_units(model, position, wrap_classes)
    largest = max((sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules()), default=0)
    buffer_bytes = sum(b.numel() * b.element_size() for b in model.buffers())
    config = getattr(model, "config", None)
    dims = {}
    if config is not None:
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                    "intermediate_size", "vocab_size", "image_size", "patch_size"):
            value = getattr(text, key, None)
            if isinstance(value, int):
                dims[key] = value
    return ModelShape(name=type(model).__name__, source=source, parameters=sum(t.numel for t in tensors),
                      tensors=tensors, units=tuple(units), groups=decay_split(tensors), largest_module=largest,
                      buffer_bytes=buffer_bytes, dims=dims, notes=tuple(unit_notes))


def fsdp2_units(model, position: dict[int, int], wrap_classes: tuple[str, ...]) -> tuple[list[Unit], list[str]]:
    """The `fully_shard` calls Accelerate's `fsdp2_prepare_model` makes (transformer wrap policy): every layer of a
    wrapped class bottom-up, the input embedding on its own when untied, the tail (final norm + output embedding)
    kept unsharded between forward and backward, and the root with the rest (also kept: PyTorch's root heuristic)."""
    notes: list[str] = []
    embed = _call(model, "get_input_embeddings")
    output = _call(model, "get_output_embeddings")
    tied = embed is not None and output is not None and getattr(embed, "weight", None) is getattr(output, "weight", 1)
    classes = set(wrap_classes or (getattr(model, "_no_split_modules", None) or ()))
    if embed is not None and not wrap_classes:
        # A wrapped class around the input embedding would claim it twice (fully_shard fails); accelkit's templates
        # drop such classes before prepare(), and so does the plan.
        around = {type(m).__name__ for m in model.modules() if m is not embed and any(c is embed for c in m.modules())}
        if classes & around:
            notes.append(f"FSDP units: {', '.join(sorted(classes & around))} hold the input embedding, so they "
                         "are not wrapped (their other parameters join the root unit)")
            classes -= around
    owned: set[int] = set()
    units: list[Unit] = []

    def take(name: str, modules: list, reshard: bool) -> None:
        ids = [position[id(p)] for m in modules for p in m.parameters() if id(p) in position]
        mine = tuple(sorted({i for i in ids if i not in owned}))
        owned.update(mine)
        if mine:
            units.append(Unit(name, mine, reshard))

    for name, module in _bottom_up(model):
        if type(module).__name__ in classes:
            take(name, [module], True)
    if embed is not None and not tied:
        take("input embedding", [embed], True)
    tail = [m for m in (_final_norm(model), *((embed, output) if tied else (output,))) if m is not None]
    if tail:
        take("final norm + output embedding", tail, False)
    take("root", [model], False)
    return units, notes


def _call(model, method: str):
    func = getattr(model, method, None)
    try:
        return func() if callable(func) else None
    except (NotImplementedError, AttributeError):
        return None


def _bottom_up(model) -> list[tuple[str, object]]:
    """Submodules children-first (the order Accelerate applies fully_shard in), without the model itself."""
    order: list[tuple[str, object]] = []

    def visit(prefix: str, module) -> None:
        for child_name, child in module.named_children():
            name = f"{prefix}.{child_name}" if prefix else child_name
            visit(name, child)
            order.append((name, child))

    visit("", model)
    return order


def _final_norm(model):
    """The base model's last direct child whose class name contains `Norm` (as Accelerate finds it)."""
    prefix = getattr(model, "base_model_prefix", "")
    base = getattr(model, prefix, None) if prefix else model
    if base is None or not hasattr(base, "named_children"):
        return None
    found = None
    for _, module in base.named_children():
        if "Norm" in type(module).__name__:
            found = module
    return found
