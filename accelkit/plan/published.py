"""Published 3D-parallel runs the plan is checked against on paper (benchmarks/plan_accuracy.py prints them;
tests/unit/plan/test_pp_plan.py holds them to 10%).

- torchtitan, docs/performance.md Table 5 (commit 9dec370, 2024-12-26): Llama 3.1 405B on 512 H100 (95 GiB), FSDP 8
  x TP 8 x PP 8, local batch 32 at 8,192 tokens, full activation checkpointing; peak memory, the maximum over all
  GPUs: 82.5 GiB with 1F1B, 72.7 GiB with Interleaved1F1B. How torchtitan ran it (its code at that commit): TP with
  sequence parallelism and loss parallelism, FSDP2 with bf16 parameters and fp32 reduction, micro-batches one per
  stage of the whole pipeline (8 for 1F1B, so 4 samples each; 16 for Interleaved1F1B with 2 stages per rank, so 2
  each). torchtitan reports the allocator's peak reserved memory, so the figure compared is what the plan asks a
  GPU to have: the planned total plus the headroom it keeps (estimate.py: 1 GiB + 10%).
- GPT-3 175B (Brown et al. 2020; Narayanan et al. 2021): 96 layers, hidden 12,288, 96 heads, 2,048 tokens, trained
  as 64 (data) x 8 (pipeline) x 8 (tensor) on 4,096 GPUs: the shape only (no memory figure was published).
"""

from __future__ import annotations

from accelkit.configs import Mesh
from accelkit.plan import nd
from accelkit.plan.estimate import CUDA_RESERVE, FRAGMENTATION

TORCHTITAN_405B = {"1F1B": (4, 8, 82.5), "Interleaved1F1B": (2, 16, 72.7)}  # micro-batch, micro-batches, GiB
GPU_MEMORY = 95 * 2**30
SEQ_LEN = 8192


def llama_405b() -> nd.Model:
    return nd.Model.llama(layers=126, hidden=16384, heads=128, kv_heads=8, vocab=128256, intermediate=53248)


def torchtitan_405b(schedule: str) -> tuple[float, float]:
    """(planned GiB a GPU must have, published peak GiB) for one of Table 5's schedules; activations traced on the
    meta device like every plan row."""
    from accelkit.plan.activations.profile import traced
    from accelkit.plan.models import ShapeFlags, resolve_model
    from accelkit.plan.planner import compute_for

    micro_batch, microbatches, published = TORCHTITAN_405B[schedule]
    spec = resolve_model(None, ShapeFlags(126, 16384, 128, 8, 128256, 53248), None)
    profile = traced(spec, compute_for("fsdp", "bf16-mixed"), micro_batch, SEQ_LEN, "cuda")
    layout = nd.Layout("fsdp", Mesh(pp=8, dp_shard=8, tp=8), sequence_parallel=True, schedule=schedule,
                       microbatches=microbatches)
    row = nd.row(layout, llama_405b(), gpus=512, nodes=64, gpu_memory=GPU_MEMORY, seq_len=SEQ_LEN,
                 micro_batch=micro_batch, profile=profile, reduce_bytes=4)
    return (row.total + CUDA_RESERVE) / (1 - FRAGMENTATION) / 2**30, published


def gpt3_175b() -> nd.Model:
    """GPT-3 175B's tensors, named like a Llama's so the TP plan applies: fused attention as q/k/v/o, a 4h MLP
    (up, down), learned positions, two norms per layer, the output head tied to the embedding."""
    hidden, layers, vocab, positions = 12288, 96, 50257, 2048
    per_layer = {"self_attn.q_proj.weight": (hidden, hidden), "self_attn.k_proj.weight": (hidden, hidden),
                 "self_attn.v_proj.weight": (hidden, hidden), "self_attn.o_proj.weight": (hidden, hidden),
                 "mlp.up_proj.weight": (4 * hidden, hidden), "mlp.down_proj.weight": (hidden, 4 * hidden),
                 "input_layernorm.weight": (hidden,), "post_attention_layernorm.weight": (hidden,)}
    tensors = [("model.embed_tokens.weight", (vocab, hidden)), ("model.embed_positions.weight", (positions, hidden))]
    tensors += [(f"model.layers.{i}.{name}", shape) for i in range(layers) for name, shape in per_layer.items()]
    tensors += [("model.norm.weight", (hidden,))]
    return nd.Model(tuple(tensors), layers, hidden, 96, 96, vocab)
