"""Communication per GPU per optimizer step: the bytes each GPU sends over the data-parallel collectives, with the
ring algorithms NCCL uses (all-reduce of D bytes sends 2(N-1)/N x D; all-gather and reduce-scatter (N-1)/N x D),
the convention nccl-tests and cluster admins publish bandwidth in. Modelled, not measured.

Per strategy (P parameters, K accumulation steps, c compute bytes, g gradient bytes):
- DDP: one all-reduce of the gradients per step (Accelerate skips the sync during accumulation): 2(N-1)/N x P x g.
- FSDP2 full shard: every micro-batch all-gathers each unit for the forward and, except the root and tail, again
  for the backward; gradients are reduce-scattered once per step: K x (N-1)/N x (P + P_resharded) x c + (N-1)/N x
  P x c. grad-op gathers once per micro-batch. Hybrid does this within a node and all-reduces each node's shard
  across nodes: 2(M-1)/M x P/n x c more (n GPUs per node, M nodes).
- ZeRO-1: one reduce-scatter of the gradients and one all-gather of the updated 16-bit parameters per step, the
  same volume as DDP in 16 bits; ZeRO-2 reduces every micro-batch; ZeRO-3 gathers the parameters for the forward
  and the backward of every micro-batch and reduce-scatters the gradients (3 x (N-1)/N x P x 2 per micro-batch;
  the ZeRO paper's 1.5x of DDP).
- CPU offload adds host<->GPU copies (PCIe), reported apart: the sharded parameters up and gradients down.
"""

from __future__ import annotations

from dataclasses import dataclass

from accelkit.plan.buffers import unit_sizes
from accelkit.plan.catalog import Strategy
from accelkit.plan.shape import ModelShape
from accelkit.plan.states import Dtypes


@dataclass(frozen=True)
class Traffic:
    network: int  # bytes each GPU sends per optimizer step
    host: int  # bytes copied between host and GPU per step (offload)


def ring(world: int) -> float:
    return (world - 1) / world if world > 1 else 0.0


def traffic(strategy: Strategy, shape: ModelShape, dt: Dtypes, compute_bytes: int, gpus: int, nodes: int,
            accumulation: int) -> Traffic:
    params, trainable = shape.parameters, shape.trainable
    host = 0.0
    if strategy.family == "torch":
        if not strategy.distributed:
            return Traffic(0, 0)
        return Traffic(round(2 * ring(gpus) * trainable * dt.grad), 0)
    if strategy.family == "fsdp":
        shard = gpus // nodes if strategy.sharding == "hybrid" else gpus
        if shape.units:
            units = unit_sizes(shape, shard)
            every = sum(e for e, _, _ in units)
            regathered = sum(e for e, reshard, _ in units if reshard) if strategy.sharding != "grad-op" else 0
        else:
            every, regathered = params, params
        gathers = accumulation * ring(shard) * (every + regathered) * compute_bytes
        reduce = ring(shard) * trainable * compute_bytes
        across = 2 * ring(nodes) * trainable / shard * compute_bytes if strategy.sharding == "hybrid" else 0
        if strategy.offload:
            host = accumulation * 2 * params / shard * dt.param + trainable / shard * dt.grad
        return Traffic(round(gathers + reduce + across), round(host))
    low = dt.param  # DeepSpeed communicates parameters and gradients in its parameter dtype (16-bit if mixed)
    stage = strategy.zero_stage
    if stage == 1:
        network = ring(gpus) * trainable * low * 2
    elif stage == 2:
        network = ring(gpus) * trainable * low * (accumulation + 1)
    else:
        network = accumulation * 3 * ring(gpus) * params * low
    if strategy.offload:
        host = accumulation * 2 * params / gpus * low + trainable / gpus * 4 + params / gpus * low
    return Traffic(round(network), round(host))
