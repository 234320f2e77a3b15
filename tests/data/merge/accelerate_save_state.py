"""Producer: an ordinary Accelerate training script that ends with `accelerator.save_state`.

Run under `accelkit launch --backend fsdp --cpu --num-processes 2 accelerate_save_state.py OUT`: Accelerate's own
FSDP2 code writes OUT/ckpt/pytorch_model_fsdp_0/ (DCP shards). The main process also writes the gathered full
state dict, OUT/expected.safetensors, and the model config, OUT/config.json.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from accelerate import Accelerator

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tiny_model import batch, tiny_model  # noqa: E402


def main() -> None:
    from safetensors.torch import save_file

    out = Path(sys.argv[1])
    accelerator = Accelerator()
    model = tiny_model(seed=11)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    for step in range(2):
        ids = batch(seed=step, rank=accelerator.process_index)
        accelerator.backward(model(input_ids=ids, labels=ids).loss)
        optimizer.step()
        optimizer.zero_grad()
    accelerator.save_state(str(out / "ckpt"))
    full = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        full.pop("lm_head.weight", None)  # tied to model.embed_tokens.weight
        save_file({k: v.contiguous() for k, v in full.items()}, str(out / "expected.safetensors"))
        accelerator.unwrap_model(model).config.save_pretrained(str(out))
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    main()
