"""Producer: a torch DCP checkpoint of the tiny model sharded with FSDP2 (`fully_shard`) on 2 gloo ranks.

Run with `python -m torch.distributed.run --nproc_per_node 2 make_fsdp2_dcp.py OUT`. Writes OUT/dcp/ (the
sharded model state dict saved with torch.distributed.checkpoint), OUT/verl/model_world_size_2_rank_{0,1}.pt (each
rank's `torch.save(model.state_dict())`, DTensor shards, as RL frameworks such as verl save) and, from rank 0,
OUT/dcp_expected.safetensors: the full state dict gathered after training, to compare both against. Also writes the
model's config.json beside the checkpoint so merge-ckpt can find it, and OUT/placements/: per-rank files of tensors
`distribute_tensor` placed every other way (columns, a 2-D mesh, replicated, a plain buffer), with
OUT/placements_expected.safetensors, the tensors before they were distributed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tiny_model import batch, tiny_model  # noqa: E402


def main() -> None:
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.fsdp import fully_shard

    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = tiny_model(seed=7)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(2):
        ids = batch(seed=step, rank=rank)
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    dcp.save(get_model_state_dict(model), checkpoint_id=str(out / "dcp"))
    (out / "verl").mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), out / "verl" / f"model_world_size_2_rank_{rank}.pt")
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        full.pop("lm_head.weight", None)  # tied to model.embed_tokens.weight
        save_file({k: v.contiguous() for k, v in full.items()}, str(out / "dcp_expected.safetensors"))
        model.config.save_pretrained(str(out))
    save_placements(out, rank)
    if rank == 0:
        (out / "DONE").write_text("ok\n")
    dist.barrier()
    dist.destroy_process_group()


def save_placements(out: Path, rank: int) -> None:
    """Tensors sharded as TP and HSDP shard them (along columns, on two mesh dims, replicated on one): what FSDP2's
    rows alone do not show, saved per rank as the model's files are."""
    from safetensors.torch import save_file
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    torch.manual_seed(3)
    full = {"rows": torch.randn(5, 7), "columns": torch.randn(5, 7), "replicated": torch.randn(3),
            "two_dims": torch.randn(4, 6), "hsdp": torch.randn(9, 2), "buffer": torch.arange(4.0)}
    line, grid = init_device_mesh("cpu", (2,)), init_device_mesh("cpu", (1, 2))
    placed = {"rows": distribute_tensor(full["rows"], line, [Shard(0)]),
              "columns": distribute_tensor(full["columns"], line, [Shard(1)]),
              "replicated": distribute_tensor(full["replicated"], line, [Replicate()]),
              "two_dims": distribute_tensor(full["two_dims"], grid, [Shard(0), Shard(1)]),
              "hsdp": distribute_tensor(full["hsdp"], grid, [Replicate(), Shard(0)]), "buffer": full["buffer"]}
    (out / "placements").mkdir(parents=True, exist_ok=True)
    torch.save(placed, out / "placements" / f"model_world_size_2_rank_{rank}.pt")
    if rank == 0:
        save_file(full, str(out / "placements_expected.safetensors"))


if __name__ == "__main__":
    main()
