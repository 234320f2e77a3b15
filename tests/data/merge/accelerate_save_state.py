"""Producer: an ordinary Accelerate training script that calls `accelerator.save_state` after each of two steps.

Run under `accelkit launch --backend fsdp --cpu --num-processes 2 accelerate_save_state.py OUT`: Accelerate's own
FSDP2 code writes OUT/ckpt-step1/ and OUT/ckpt/ (step 2): pytorch_model_fsdp_0/ and optimizer_0/ (DCP shards) and
random_states_<rank>.pkl, and the prepared scheduler's scheduler.bin. After each save the checkpoint gets the
manifest accelkit's templates write (the block below is a copy of theirs; tests/unit/templates checks it). The main
process also writes the gathered full state dict, OUT/expected.safetensors, and the model config, OUT/config.json.
Accelerate's other FSDP2 sharded format is written from the same trained model: OUT/per_rank/
pytorch_model_fsdp_0_rank{0,1}.bin (`save_fsdp_model(..., use_dcp=False)`: each rank's torch.save of its DTensors).
"""

from __future__ import annotations

import hashlib
import json
import sys
import uuid
from pathlib import Path

import torch
from accelerate import Accelerator

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tiny_model import batch, tiny_model  # noqa: E402

# >>> shared block "manifest": the same in every template (source: templates/minimal/train.py; tested)
MANIFEST_NAME = "accelkit-manifest.json"


def write_manifest(accelerator: Accelerator, checkpoint_dir: Path, step: int, run_id: str,
                   batch: dict | None = None) -> None:
    """Once every process has finished saving, the main process records what the checkpoint is."""
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        write_manifest_file(checkpoint_dir, step, run_id, accelerator.num_processes, batch)
    accelerator.wait_for_everyone()


def write_manifest_file(checkpoint_dir: Path, step: int, run_id: str, world_size: int,
                        batch: dict | None = None) -> None:
    """The record of a complete checkpoint: run id, step, world size, the batch (`batch_record`: what a resume on
    another number of processes keeps), and the size and sha256 of every file. `accelkit merge-ckpt` checks it, so a
    file from another run or step, a damaged copy or bit rot is caught. Written last and atomically: a checkpoint
    without one is incomplete."""
    files = {}
    for path in sorted(p for p in checkpoint_dir.rglob("*") if p.is_file() and p.name != MANIFEST_NAME):
        digest = hashlib.sha256()
        with path.open("rb") as handle:
            while block := handle.read(1 << 20):
                digest.update(block)
        files[path.relative_to(checkpoint_dir).as_posix()] = {"size": path.stat().st_size, "sha256": digest.hexdigest()}
    manifest = {
        "format": "accelkit-checkpoint-manifest",
        "run_id": run_id,
        "step": step,
        "world_size": world_size,
        **(batch or {}),
        "files": files,
    }
    partial = checkpoint_dir / f".{MANIFEST_NAME}.partial"
    partial.write_text(json.dumps(manifest, indent=1) + "\n")
    partial.replace(checkpoint_dir / MANIFEST_NAME)


# <<< shared block "manifest"


def main() -> None:
    from accelerate.utils import save_fsdp_model
    from safetensors.torch import save_file

    out = Path(sys.argv[1])
    accelerator = Accelerator()
    model = tiny_model(seed=11)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    # A warmup schedule, prepared: save_state writes it as scheduler.bin, and its learning rate changes every step.
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: (step + 1) / 4)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    run_id = uuid.uuid4().hex
    for step in range(2):
        ids = batch(seed=step, rank=accelerator.process_index)
        with accelerator.accumulate(model):  # also counts Accelerate's step, which save_state records per rank
            accelerator.backward(model(input_ids=ids, labels=ids).loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        checkpoint = out / ("ckpt" if step == 1 else f"ckpt-step{step + 1}")
        accelerator.save_state(str(checkpoint))
        write_manifest(accelerator, checkpoint, step + 1, run_id)
    save_fsdp_model(accelerator.state.fsdp_plugin, accelerator, model, str(out / "per_rank"), use_dcp=False)
    full = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        full.pop("lm_head.weight", None)  # tied to model.embed_tokens.weight
        save_file({k: v.contiguous() for k, v in full.items()}, str(out / "expected.safetensors"))
        accelerator.unwrap_model(model).config.save_pretrained(str(out))
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    main()
