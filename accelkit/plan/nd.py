"""N-D and pipeline rows of the plan: per-GPU memory and traffic of tensor, context, sequence and pipeline
parallelism (and HSDP), and the recommendation that adds them when data-parallel sharding alone cannot fit.

A layout is Accelerate's ParallelismConfig (dp_replicate x dp_shard x cp x sp x tp = GPUs), times pp pipeline
ranks (torch.distributed.pipelining, pipeline.py). Per GPU, for the pipeline rank that needs the most:

- model states: the rank's stages' tensors (pipeline.py: layers in order, the embedding on the first stage, the
  final norm and head on the last). Every tensor the model's TP plan names (`colwise`/`rowwise`, matched like
  transformers matches `base_model_tp_plan` keys, `layers.*.mlp.up_proj`) is split over tp ranks (padded to whole
  rows); the rest (norms, embeddings unless the plan names them) stays replicated over tp. FSDP2 then shards each
  tensor over dp_shard x cp (Accelerate's `dp_shard_cp` dimension); DeepSpeed ZeRO-3 with Ulysses SP over every
  rank. Bytes per element as in states.py (Accelerate's mixed precision keeps fp32 weights, gradients and moments:
  16 bytes with AdamW).
- activations: the plan's one traced profile (activations/profile.py: what a layer keeps, what one layer holds
  while recomputed, what lives outside the layers), the same trace as the data-parallel table, on the rank's share
  of the sequence (1 / (cp x sp)). Under TP without sequence parallelism (transformers' TP plans) a layer's
  internals split over tp but its inputs, norms and dropouts do not (Korthikanti et al.'s 10 + 24/t of 34), the
  checkpointed inputs and the gathered logits not at all; with sequence parallelism (and loss parallelism, as
  torchtitan runs it) everything splits by tp. A pipeline rank keeps its in-flight stage-micro-batches' layers
  (pipeline.py: per schedule), one layer while recomputing, and the stage output torch caches for each in-flight
  micro-batch until its backward (`fwd_cache`): the hidden state a stage sends on, and on the last stage the loss
  inputs with the logits (the template passes `return_outputs=False`, so none stay after the step).
- buffers: layouts that shard like the data-parallel table (no tp, no pp) take its FSDP full-shard or ZeRO-3
  buffers (buffers.py); with tp the embeddings, final norm and head stay gathered from forward to backward plus the
  current and prefetched layer and the reducing layer's gradients, split over tp; inside a pipeline stage,
  torch.distributed.pipelining keeps FSDP2 gathered and accumulating unsharded gradients until the last
  micro-batch, so the stage's whole tp shard counts twice (16-bit weights and gradients).
- traffic per step per mesh dimension, per GPU: TP two all-reduces of the layer output per layer in forward and two
  in backward (one more forward with recomputation); CP the K/V ring (each rank receives cp-1 chunks of K and V per
  layer, forward and backward); SP Ulysses' four all-to-alls per layer each way; FSDP all-gather twice and
  reduce-scatter once of the rank's tp shard of the weights; HSDP an all-reduce of the shard across replicas; PP
  each micro-batch's hidden state forward and its gradient back at every stage boundary.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from accelkit.configs import Mesh
from accelkit.plan.activations.profile import Profile, from_formula
from accelkit.plan.estimate import CUDA_RESERVE, usable_gpu
from accelkit.plan.pipeline import DEFAULT_SCHEDULE, Pipeline
from accelkit.plan.spine import MACHINE_RANK, MAIN_ADDRESS
from accelkit.sizes import format_bytes

MOMENTS = {"adamw": 2, "sgd-momentum": 1, "sgd": 0, "adafactor": 1}
SHARDED_STYLES = ("colwise", "rowwise", "colwise_rep", "rowwise_rep", "local_colwise", "local_rowwise",
                  "packed_colwise",
                   "packed_rowwise", "colwise_gather_output", "rowwise_split_input", "embedding_rowwise")
# Llama's plan as transformers 5.x applies it: its config's base_model_tp_plan, the head's, and the input embedding
# (DistributedConfig adds `embedding_rowwise` for a model's nn.Embedding whenever the plan is not empty).
LLAMA_TP_PLAN = {"embed_tokens": "embedding_rowwise",
                 "layers.*.self_attn.q_proj": "colwise", "layers.*.self_attn.k_proj": "colwise",
                 "layers.*.self_attn.v_proj": "colwise", "layers.*.self_attn.o_proj": "rowwise",
                 "layers.*.mlp.gate_proj": "colwise", "layers.*.mlp.up_proj": "colwise",
                 "layers.*.mlp.down_proj": "rowwise", "lm_head": "colwise_gather_output"}


@dataclass(frozen=True)
class Layout:
    """A plan row's layout: the mesh (accelkit.configs.Mesh, the one N-D mesh type) and what the plan adds to it:
    the backend that runs it, TP's sequence parallelism, and the pipeline's schedule and micro-batches."""

    backend: str  # fsdp | deepspeed | ddp
    mesh: Mesh = Mesh()
    sequence_parallel: bool = False  # TP's sequence parallelism (norms, dropouts, layer inputs and logits split)
    schedule: str = DEFAULT_SCHEDULE  # the pipeline's (mesh.pp > 1), as torch names it
    microbatches: int = 1

    @property
    def pipeline(self) -> Pipeline:
        """pp ranks, schedule, micro-batches (pipeline.py)."""
        return Pipeline(self.mesh.pp, self.schedule, self.microbatches)

    @property
    def world(self) -> int:
        return self.mesh.world

    @property
    def sequence_split(self) -> int:
        return self.mesh.cp * self.mesh.sp

    @property
    def batch_replicas(self) -> int:
        """Ranks that share one batch: a TP, CP, SP group and the stages of one pipeline."""
        return self.mesh.tp * self.mesh.cp * self.mesh.sp * self.mesh.pp

    @property
    def shard_group(self) -> int:
        """The ranks each tensor is sharded over: FSDP2's dp_shard x cp; ZeRO-3 with SP: every rank."""
        if self.backend == "deepspeed":
            return self.world
        return self.mesh.dp_shard * self.mesh.cp if self.backend == "fsdp" else 1

    @property
    def name(self) -> str:
        """bench's layout syntax: `dp_shard=8,tp=8,pp=8` (ZeRO-3's data parallelism written as dp_shard)."""
        if self.backend == "deepspeed":
            return dataclasses.replace(self.mesh, dp_shard=self.world // (self.mesh.sp * self.mesh.pp)).name
        return self.mesh.name

    def describe(self) -> str:
        shard = "zero3" if self.backend == "deepspeed" else "dp_shard"
        m = self.mesh
        parts = [f"{name} {size}" for name, size in (("dp_replicate", m.dp_replicate), (shard, m.dp_shard),
                                                      ("cp", m.cp), ("sp", m.sp), ("tp", m.tp), ("pp", m.pp))
                 if size > 1]
        text = f"{self.backend}: " + (" x ".join(parts) or "1 GPU")
        return text + (f" ({self.pipeline.describe()})" if m.pp > 1 else "")

    def flags(self) -> str:
        """The `accelkit config`/`launch` flags (DeepSpeed takes only --sp-size: ZeRO's data parallelism is the
        rest of the ranks)."""
        m = self.mesh
        shard = 1 if self.backend == "deepspeed" else m.dp_shard
        sizes = [f"--{name}-size {size}" for name, size in (("dp-replicate", m.dp_replicate),
                                                             ("dp-shard", shard), ("tp", m.tp),
                                                             ("cp", m.cp), ("sp", m.sp), ("pp", m.pp))
                 if size > 1]
        if m.pp > 1:
            # spelled as `accelkit config` takes it (lower case); the plan keeps torch's class names
            sizes += [f"--pp-schedule {self.schedule.lower()}", f"--microbatches {self.microbatches}"]
        backend = "--backend deepspeed --zero-stage 3" if self.backend == "deepspeed" else f"--backend {self.backend}"
        return " ".join([backend, *sizes])


@dataclass(frozen=True)
class Model:
    """What the N-D arithmetic needs of a transformer: its tensors and dimensions."""

    tensors: tuple[tuple[str, tuple[int, ...]], ...]
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    vocab: int

    @classmethod
    def of(cls, shape) -> Model:
        """From plan's ModelShape (a model built on the meta device)."""
        dims = shape.dims
        tensors = tuple((t.name, t.shape) for t in shape.tensors or ())
        return cls(tensors, dims["num_hidden_layers"], dims["hidden_size"], dims["num_attention_heads"],
                   dims.get("num_key_value_heads", dims["num_attention_heads"]), dims.get("vocab_size", 0))

    @property
    def parameters(self) -> int:
        return sum(math.prod(shape) for _, shape in self.tensors)

    @classmethod
    def llama(cls, *, layers: int, hidden: int, heads: int, kv_heads: int, vocab: int, intermediate: int) -> Model:
        """A Llama's tensors by name, as LlamaForCausalLM names them (no model built: 70B-size shapes are instant)."""
        head_dim = hidden // heads
        kv = kv_heads * head_dim
        per_layer = {"self_attn.q_proj.weight": (hidden, hidden), "self_attn.k_proj.weight": (kv, hidden),
                     "self_attn.v_proj.weight": (kv, hidden),
                     "self_attn.o_proj.weight": (hidden, hidden), "mlp.gate_proj.weight": (intermediate, hidden),
                     "mlp.up_proj.weight": (intermediate, hidden), "mlp.down_proj.weight": (hidden, intermediate),
                     "input_layernorm.weight": (hidden,), "post_attention_layernorm.weight": (hidden,)}
        tensors = [("model.embed_tokens.weight", (vocab, hidden))]
        tensors += [(f"model.layers.{i}.{name}", shape) for i in range(layers) for name, shape in per_layer.items()]
        tensors += [("model.norm.weight", (hidden,)), ("lm_head.weight", (vocab, hidden))]
        return cls(tuple(tensors), layers, hidden, heads, kv_heads, vocab)


@dataclass(frozen=True)
class Row:
    layout: Layout
    unavailable: str | None
    states: int = 0
    activations: int = 0
    gathered: int = 0
    tp_sharded: int = 0  # parameters the TP plan splits
    tp_replicated: int = 0  # parameters every tp rank keeps whole
    traffic: Mapping[str, int] = field(default_factory=dict)  # mesh dimension -> bytes per GPU per step
    usable: int | None = None
    worst_rank: int = 0  # the pipeline rank the figures are of (the one that needs the most)
    bubble: float = 0.0  # the pipeline's idle share of a step

    @property
    def total(self) -> int:
        return self.states + self.activations + self.gathered

    @property
    def fits(self) -> bool | None:
        if self.unavailable is not None:
            return False
        return None if self.usable is None else self.total <= self.usable


def _plan_style(name: str, plan: Mapping[str, str]) -> str | None:
    """The TP style the plan gives the module owning tensor `name` (`model.layers.3.mlp.up_proj.weight`)."""
    module = name.rsplit(".", 1)[0]
    for pattern, style in plan.items():
        if fnmatch.fnmatchcase(module, pattern) or fnmatch.fnmatchcase(module, f"*.{pattern}"):
            return style
    return None


def unavailable(layout: Layout, model: Model, gpus: int, nodes: int) -> str | None:
    """Why Accelerate (or the model) cannot run this layout here, the rules of accelkit.configs.rules."""
    m = layout.mesh
    per_node = gpus // nodes
    if layout.world != gpus:
        return f"the sizes multiply to {layout.world}, not {gpus} GPUs"
    if m.tp * m.cp > per_node or per_node % (m.tp * m.cp):
        return (f"tensor/context-parallel groups of {m.tp * m.cp} would span machines ({per_node} GPUs "
                "each): refused")
    if m.tp > 1 and (model.heads % m.tp or model.kv_heads % m.tp):
        return f"{model.heads} heads / {model.kv_heads} kv heads do not split over tp {m.tp}"
    if m.sp > 1 and model.heads % m.sp:
        return f"{model.heads} heads do not split over sp {m.sp} (Ulysses splits heads)"
    if m.cp > 1 and m.sp > 1:
        return "cp and sp cannot be combined"
    if layout.backend == "deepspeed" and (m.tp > 1 or m.cp > 1 or m.pp > 1):
        return "DeepSpeed composes only sp"
    if m.pp > 1 and m.sp > 1:
        return "pp composes with dp_replicate, dp_shard, tp and cp (torch's mesh), not Ulysses sp"
    if m.pp > 1 and model.layers < layout.pipeline.stages:
        return f"{layout.pipeline.stages} stages for {model.layers} layers"
    if layout.backend == "fsdp" and m.dp_shard * m.cp == 1:
        return "FSDP has nothing to shard"
    return None


def _layer_of(name: str) -> int | None:
    match = re.search(r"\.layers\.(\d+)\.", f".{name}")
    return int(match.group(1)) if match else None


def rank_tensors(model: Model, pipeline: Pipeline, rank: int) -> list[tuple[str, tuple[int, ...]]]:
    """The tensors pipeline rank `rank` holds: its stages' layers, the embedding (tensors before the first layer)
    on stage 0, the final norm and head (tensors after the last layer) on the last stage."""
    if pipeline.ranks == 1:
        return list(model.tensors)
    splits = pipeline.layers_of_stage(model.layers)
    mine = pipeline.stages_of_rank(rank)
    layers = {i for stage in mine for i in splits[stage]}
    out, seen_layer = [], False
    for name, shape in model.tensors:
        index = _layer_of(name)
        if index is not None:
            seen_layer = True
            if index in layers:
                out.append((name, shape))
        elif (not seen_layer and 0 in mine) or (seen_layer and pipeline.stages - 1 in mine):
            out.append((name, shape))
    return out


def row(layout: Layout, model: Model, *, gpus: int, nodes: int, gpu_memory: int | None, seq_len: int,
        micro_batch: int = 1, checkpointing: bool = True, optimizer: str = "adamw",
        tp_plan: Mapping[str, str] = LLAMA_TP_PLAN, profile: Profile | None = None, compute_bytes: int = 2,
        reduce_bytes: int | None = None, buffers: Mapping[str, int] | None = None) -> Row:
    """One layout's worst rank. `profile`: the traced activations of one micro-batch on one GPU (the formula's
    when None); `reduce_bytes`: the dtype FSDP2 accumulates unsharded gradients in across a pipeline's
    micro-batches (Accelerate's policy: the compute dtype; torchtitan reduces in fp32); `buffers`: per backend,
    the data-parallel table's buffers for the same shard group (buffers.py's unit-by-unit model), used for the
    layouts that shard like it (no tp, no pp)."""
    why = unavailable(layout, model, gpus, nodes)
    if why is not None:
        return Row(layout, why)
    if layout.mesh.pp > 1 and layout.backend != "fsdp":
        # the template's pipeline recomputes its layers only on --activation-checkpointing, FSDP's switch: a pipeline
        # alone (ddp) keeps every layer's activations, and is priced so
        checkpointing = False
    if profile is None:
        profile = from_formula({"hidden_size": model.hidden, "num_hidden_layers": model.layers,
                                "vocab_size": model.vocab}, micro_batch, seq_len)
    worst: Row | None = None
    ranks = range(layout.mesh.pp)
    for rank in ranks:
        candidate = _rank_row(layout, model, rank, gpu_memory, seq_len, micro_batch, checkpointing, optimizer,
                              tp_plan, profile, compute_bytes, reduce_bytes or compute_bytes)
        if worst is None or candidate.total > worst.total:
            worst = candidate
    if buffers is not None and layout.backend in buffers and layout.mesh.tp == 1 and layout.mesh.pp == 1:
        worst = dataclasses.replace(worst, gathered=buffers[layout.backend])
    return worst


def _rank_row(layout: Layout, model: Model, rank: int, gpu_memory: int | None, seq_len: int, micro_batch: int,
              checkpointing: bool, optimizer: str, tp_plan: Mapping[str, str], profile: Profile,
              compute_bytes: int, reduce_bytes: int) -> Row:
    tp, group, pipeline = layout.mesh.tp, layout.shard_group, layout.pipeline
    weight, grad, moments = 4, 4, 4 * MOMENTS[optimizer]  # fp32 (Accelerate mixed precision)
    if layout.backend == "deepspeed":
        weight, grad, moments = 2, 2, 4 + 4 * MOMENTS[optimizer]  # 16-bit weights/gradients, fp32 master + moments
    tensors = rank_tensors(model, pipeline, rank)
    sharded = replicated = local = whole_grads = unsharded = 0
    layer_sizes: dict[int, int] = {}
    outside = 0
    for name, shape in tensors:
        numel = math.prod(shape)
        rows = shape[0] if shape else 1  # dim 0 of this rank's TP shard: what FSDP2 splits
        style = _plan_style(name, tp_plan) if tp > 1 else None
        if style in SHARDED_STYLES:
            sharded += numel
            if style == "embedding_rowwise" and group == 1:
                # Measured (transformers 5.23, torch 2.13, TP alone): the embedding's gradient stays whole on each rank.
                whole_grads += numel - math.ceil(shape[0] / tp) * math.prod(shape[1:])
            # colwise splits a Linear's output rows (dim 0), rowwise its input columns (last dim); padded to whole
            dim = len(shape) - 1 if "rowwise" in style and style != "embedding_rowwise" and len(shape) > 1 else 0
            numel = numel // shape[dim] * math.ceil(shape[dim] / tp)
            rows = math.ceil(shape[0] / tp) if dim == 0 else rows
        else:
            replicated += numel
        if layout.backend == "fsdp" and group > 1:
            # FSDP2 shards each tensor by dim-0 rows, the first ranks one row more: an odd vocabulary's embedding
            # puts half a row more on rank 0 than an even split of its elements (measured: the causal-lm template
            # under dp_shard 2 x pp 2, benchmarks/plan_accuracy.py)
            local += math.ceil(rows / group) * (numel // rows if rows else 0)
        else:
            local += math.ceil(numel / group)
        unsharded += numel
        index = _layer_of(name)
        if index is None:
            outside += numel
        else:
            layer_sizes[index] = layer_sizes.get(index, 0) + numel
    states = local * (weight + grad + moments) + whole_grads * grad
    # activations: the profile's parts, scaled to this rank's tokens, tp split and pipeline share
    split = layout.sequence_split
    sp_tp = layout.sequence_parallel
    layer = profile.layer / split * ((1 / tp) if sp_tp else (10 + 24 / tp) / 34)
    kept = profile.kept / split / (tp if sp_tp else 1)
    rest = profile.rest / split / (tp if sp_tp else 1)
    stage_layers = pipeline.layers_of_stage(model.layers)
    per_stage = max(len(stage_layers[stage]) for stage in pipeline.stages_of_rank(rank))
    in_flight = pipeline.in_flight(rank) * per_stage  # layer-micro-batches kept for the backward
    last = pipeline.stages - 1 in pipeline.stages_of_rank(rank)
    head_in_flight = pipeline.head_in_flight() if last else 0
    # the last stage's loss inputs per micro-batch in flight: what its norm, head and loss save, and its logits,
    # which torch's stage caches (fwd_cache) until that micro-batch's backward
    head = rest * head_in_flight
    # every other stage caches its output, the hidden state it sent on, until that micro-batch's backward too
    boundary = seq_len / split * micro_batch * model.hidden * compute_bytes / (tp if sp_tp else 1)
    sent = boundary * max(pipeline.in_flight(rank) - head_in_flight, 0) if pipeline.ranks > 1 else 0
    activations = (in_flight * kept + layer if checkpointing else in_flight * layer) + head + sent
    # gathered weights (16-bit, this rank's tp shard)
    largest = max(layer_sizes.values(), default=0)
    if group > 1 and pipeline.ranks > 1 and pipeline.microbatches > 1:
        # torch.distributed.pipelining turns FSDP2's resharding and gradient sync off for every micro-batch but the
        # last: the stage stays gathered and accumulates unsharded gradients
        gathered = unsharded * (compute_bytes + reduce_bytes)
    elif group > 1:
        # root and tail (embeddings, final norm, head) gathered forward to backward, the current and prefetched
        # layer, and the reducing layer's unsharded gradients with its reduce-scatter input (buffers.py)
        gathered = (outside + 2 * largest) * compute_bytes + 2 * largest * compute_bytes
    else:
        gathered = 0
    s = seq_len / split
    traffic = _traffic(layout, model, local, s, micro_batch, checkpointing)
    if pipeline.ranks > 1:
        traffic["pp"] = int(pipeline.p2p_sends() * boundary)
    return Row(layout, None, states=states, activations=int(activations), gathered=int(gathered),
               tp_sharded=sharded, tp_replicated=replicated, traffic=traffic, usable=usable_gpu(gpu_memory),
               worst_rank=rank, bubble=pipeline.bubble)


def _traffic(layout: Layout, model: Model, local: int, s: float, b: int, checkpointing: bool) -> dict[str, int]:
    out: dict[str, int] = {}
    act = s * b * model.hidden * 2  # one layer's output, 16-bit
    passes = 3 if checkpointing else 2  # forward, recomputed forward, backward
    if layout.mesh.tp > 1:
        out["tp"] = int(model.layers * 2 * passes * act * 2 * (layout.mesh.tp - 1) / layout.mesh.tp)
    if layout.mesh.cp > 1:
        kv = s * b * model.hidden * model.kv_heads / model.heads * 2 * 2  # K and V, 16-bit
        out["cp"] = int(model.layers * passes * kv * (layout.mesh.cp - 1))
    if layout.mesh.sp > 1:
        out["sp"] = int(model.layers * 4 * passes * act * (layout.mesh.sp - 1) / layout.mesh.sp)
    if layout.shard_group > 1:
        name = "dp_shard_cp" if layout.backend == "fsdp" else "zero"
        out[name] = int(3 * local * layout.shard_group * 2 * (layout.shard_group - 1) / layout.shard_group)
    if layout.mesh.dp_replicate > 1:
        out["dp_replicate"] = int(2 * local * 4 * (layout.mesh.dp_replicate - 1) / layout.mesh.dp_replicate)
    return out


@dataclass(frozen=True)
class NdAdvice:
    best: Row | None  # None: nothing fits
    rows: tuple[Row, ...]
    reason: str
    commands: tuple[str, ...] = ()


def candidates(gpus: int, nodes: int, layers: int | None = None) -> list[Layout]:
    """Data-parallel sharding first, then splitting the sequence (CP, then SP), then TP, then pipelines (with
    FSDP and TP inside a stage, 1F1B over one micro-batch per stage): the least communication first."""
    per_node = gpus // nodes
    splits = [n for n in (2, 4, 8, 16, 32, 64) if n <= gpus and gpus % n == 0]
    out = [Layout("fsdp", Mesh(dp_shard=gpus))]
    if nodes > 1:
        out.append(Layout("fsdp", Mesh(dp_replicate=nodes, dp_shard=per_node)))
    out += [Layout("fsdp", Mesh(dp_shard=gpus // c, cp=c)) for c in splits if c <= per_node and c < gpus]
    out += [Layout("deepspeed", Mesh(dp_shard=gpus // s, sp=s)) for s in splits]  # ZeRO-3's data parallelism: the rest
    out += [Layout("fsdp", Mesh(dp_shard=gpus // t, tp=t), sequence_parallel=False) for t in splits
            if t <= per_node and t < gpus]
    out += [Layout("fsdp", Mesh(dp_shard=gpus // (t * c), tp=t, cp=c)) for t in splits for c in splits
            if t * c <= per_node and t * c < gpus]
    for p in splits:
        if layers is not None and layers < p:
            continue
        for t in [1, *splits]:
            if t <= per_node and p * t < gpus and gpus % (p * t) == 0:
                out.append(Layout("fsdp", Mesh(pp=p, dp_shard=gpus // (p * t), tp=t), schedule="1F1B", microbatches=p))
    return out


# The mesh dimensions a layout can use, in the order the layouts are written, with the kind of parallelism each is
PARALLELISM = (("dp_replicate", "replicated data"), ("dp_shard", "sharded data"), ("cp", "context"),
               ("sp", "sequence"), ("tp", "tensor"), ("pp", "pipeline"))


def dimension_uses(layout: Layout, seq_len: int, bubble: float = 0.0) -> list[tuple[str, int, str]]:
    """(dimension, size, what it does here) for every mesh dimension the layout uses (size > 1), in PARALLELISM's
    order: the reasons are built from these, so they name exactly the dimensions of the layout."""
    m = layout.mesh
    zero = layout.backend == "deepspeed"
    why = {
        "dp_replicate": (f"replicates each shard group {m.dp_replicate} times (HSDP: only the gradient all-reduce "
                         "crosses the groups)" if layout.shard_group > 1 else
                         f"replicates the model over {m.dp_replicate} GPUs (gradients all-reduced)"),
        "dp_shard": (f"ZeRO-3 shards parameters, gradients and optimizer states over {layout.world} GPUs" if zero
                     else "shards parameters, gradients and optimizer states over "
                          + (f"dp_shard x cp = {m.dp_shard * m.cp} GPUs" if m.cp > 1 else f"{m.dp_shard} GPUs")),
        "cp": f"splits the {seq_len:,}-token sequence over {m.cp} GPUs (ring attention)",
        "sp": f"splits the {seq_len:,}-token sequence over {m.sp} GPUs (Ulysses all-to-all"
              + (f", under ZeRO-3 over all {layout.world} GPUs)" if zero and m.dp_shard == 1 else ")"),
        "tp": f"splits each layer's weights and activations over {m.tp} GPUs",
        "pp": f"splits the layers into {layout.pipeline.stages} stages over {m.pp} GPUs ({layout.pipeline.describe()}, "
              f"a bubble of {bubble:.0%} of each step)",
    }
    return [(dim, getattr(m, dim), why[dim]) for dim, _ in PARALLELISM if getattr(m, dim) > 1]


def _uses(layout: Layout, best: Row, seq_len: int) -> str:
    uses = dimension_uses(layout, seq_len, best.bubble)
    if not uses:
        return "one GPU, no parallelism"
    return "; ".join(f"{dim} {size} {why}" for dim, size, why in uses)


def _unneeded(layout: Layout) -> str:
    """The kinds of model parallelism the layout does not use, as `no tensor (tp) or pipeline (pp) parallelism
    needed`; empty when it uses them all."""
    kinds = [f"{kind} ({dim})" for dim, kind in PARALLELISM[2:] if getattr(layout.mesh, dim) == 1]
    if not kinds:
        return ""
    listed = kinds[0] if len(kinds) == 1 else ", ".join(kinds[:-1]) + f" or {kinds[-1]}"
    return f"; no {listed} parallelism needed"


def _reason(best: Row, rows: tuple[Row, ...], seq_len: int) -> str:
    """Why the search chose `best` (the first of `rows`, in order of least communication, that fits), from the
    dimensions it uses: the ones it does not use were not needed (an earlier, cheaper layout would have fit)."""
    first = rows[0]
    layout = best.layout
    total = format_bytes(best.total)
    model_parallel = [dim for dim, _ in PARALLELISM[2:] if getattr(layout.mesh, dim) > 1]
    if not model_parallel:  # judged by the layout itself, not by its place in the list
        head = f"data-parallel sharding alone fits ({layout.describe()}, {total} per GPU)"
    elif layout.mesh.pp > 1:
        head = (f"the model's states per GPU need splitting by layers: {layout.describe()} needs {total} per GPU "
                f"(pipeline rank {best.worst_rank})")
    elif layout.sequence_split > 1:
        head = (f"the {seq_len:,}-token activations do not fit with data-parallel sharding alone "
                f"({format_bytes(first.activations)} per GPU); splitting the sequence over {layout.sequence_split} "
                f"GPUs ({layout.describe()}) needs {total}")
    else:
        head = f"one layer's weights and activations need splitting: {layout.describe()} needs {total} per GPU"
    return f"{head}: {_uses(layout, best, seq_len)}{_unneeded(layout)}"


def asked_reason(row_: Row, seq_len: int) -> str:
    """The reason for a layout the user gave (--layout): whether it fits, and what each of its dimensions does;
    nothing about dimensions it leaves out (no search compared them)."""
    verdict = {True: "fits", False: "does not fit", None: "cannot be judged (no GPU memory given)"}[row_.fits]
    return (f"{row_.layout.describe()} was asked for (--layout); it {verdict} ({format_bytes(row_.total)} per GPU): "
            f"{_uses(row_.layout, row_, seq_len)}")


def launch_flags(layout: Layout, gpus: int, nodes: int, precision: str | None, checkpointing: bool) -> str:
    """Every flag the planned job needs: the layout, the processes, the precision, checkpointing (FSDP's config
    switch; DeepSpeed runs it from the script)."""
    flags = [layout.flags(), f"--num-machines {nodes} --num-processes {gpus}"]
    if nodes > 1:
        flags.append(f"--main-process-ip {MAIN_ADDRESS}")
    if precision is not None:
        flags.append(f"--mixed-precision {precision}")
    if checkpointing and layout.backend == "fsdp":
        flags.append("--activation-checkpointing")
    return " ".join(flags)


def advise(model: Model, *, gpus: int, nodes: int, gpu_memory: int | None, seq_len: int, micro_batch: int = 1,
           checkpointing: bool = True, optimizer: str = "adamw",
           tp_plan: Mapping[str, str] = LLAMA_TP_PLAN, profile: Profile | None = None, precision: str | None = None,
           layouts: list[Layout] | None = None, buffers: Mapping[str, int] | None = None,
           asked: bool = False) -> NdAdvice:
    """The first layout of `layouts` (default: `candidates`) that fits, with the config/launch commands; rows for
    every layout. `precision`: Accelerate's --mixed-precision value the commands carry; `asked`: `layouts` is the
    one layout the user gave (--layout), whose reason then says what it is, not why a search chose it."""
    layouts = layouts if layouts is not None else candidates(gpus, nodes, model.layers)
    rows = tuple(row(layout, model, gpus=gpus, nodes=nodes, gpu_memory=gpu_memory, seq_len=seq_len,
                     micro_batch=micro_batch, checkpointing=checkpointing, optimizer=optimizer, tp_plan=tp_plan,
                     profile=profile, buffers=buffers)
                 for layout in layouts)
    best = next((r for r in rows if r.fits), None)
    if asked and best is None:
        return NdAdvice(None, rows, asked_reason(rows[0], seq_len))
    if best is None:
        smallest = min((r for r in rows if r.unavailable is None), key=lambda r: r.total, default=None)
        need = f" (the smallest, {smallest.layout.describe()}, needs {format_bytes(smallest.total)} per GPU)" \
            if smallest else ""
        return NdAdvice(None, rows, f"no layout fits in {format_bytes(usable_gpu(gpu_memory) or 0)} per GPU{need}: "
                                    "add GPUs, shorten the sequence, or offload")
    reason = asked_reason(best, seq_len) if asked else _reason(best, rows, seq_len)
    per_node = gpus // nodes
    if best.layout.mesh.sp > per_node:
        sp = best.layout.mesh.sp
        reason += (f"; sp {sp} spans {sp // per_node} machines, so Ulysses' all-to-all crosses the network (cp and tp "
                   "stay within a machine)")
    if checkpointing and best.layout.backend != "fsdp":
        reason += ("; activation checkpointing: call model.gradient_checkpointing_enable() in the script (only "
                   "FSDP configs switch it on)")
    return NdAdvice(best, rows, reason, layout_commands(best.layout, gpus, nodes, precision, checkpointing))


def layout_commands(layout: Layout, gpus: int, nodes: int, precision: str | None,
                    checkpointing: bool) -> tuple[str, str]:
    """The `accelkit config` and `accelkit launch` lines of a layout, as printed (valid as printed: a test runs
    them); on several machines each machine gives its own rank to the launch."""
    flags = launch_flags(layout, gpus, nodes, precision, checkpointing)
    rank = f" --machine-rank {MACHINE_RANK}" if nodes > 1 else ""
    return f"accelkit config {flags} -o nd.yaml", f"accelkit launch {flags}{rank} train.py"


def describe_row(r: Row) -> str:
    if r.unavailable:
        return f"{r.layout.describe():<40} refused: {r.unavailable}"
    verdict = {True: "fits", False: "does not fit", None: "?"}[r.fits]
    split = f", TP splits {r.tp_sharded:,} params, {r.tp_replicated:,} replicated" if r.layout.mesh.tp > 1 else ""
    if r.layout.mesh.pp > 1:
        split += (f", pipeline rank {r.worst_rank}, bubble {r.bubble:.1%}, point-to-point "
                  f"{format_bytes(r.traffic.get('pp', 0))} per step")
    return (f"{r.layout.describe():<40} states {format_bytes(r.states)}, activations {format_bytes(r.activations)}, "
            f"gathered {format_bytes(r.gathered)}: {format_bytes(r.total)} per GPU, {verdict}{split}")


__all__ = ["CUDA_RESERVE", "PARALLELISM", "Layout", "Model", "NdAdvice", "Pipeline", "Row", "advise", "asked_reason",
           "candidates", "describe_row", "dimension_uses", "launch_flags", "rank_tensors", "row"]
