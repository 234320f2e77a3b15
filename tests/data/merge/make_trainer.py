"""Producer: transformers' own Trainer with FSDP (sharded state dict), 4 steps, a checkpoint every 2.

Run under `accelkit launch --backend fsdp --cpu --num-processes 2 make_trainer.py OUT`: the real Trainer writes
OUT/checkpoint-2/ and OUT/checkpoint-4/: pytorch_model_fsdp_0/ and optimizer_0/ (DCP shards), scheduler.pt,
rng_state_<rank>.pth per process, trainer_state.json (global_step) and training_args.bin. The main process also
writes the gathered full state dict of step 4, OUT/expected.safetensors.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tiny_model import tiny_model  # noqa: E402


class Tokens(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, 101, (16,), generator=torch.Generator().manual_seed(index))
        return {"input_ids": ids, "labels": ids.clone()}


def main(out: Path) -> None:
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(
        output_dir=str(out), max_steps=4, save_steps=2, save_strategy="steps", per_device_train_batch_size=2,
        learning_rate=1e-3, lr_scheduler_type="linear", warmup_steps=1, logging_steps=100, report_to=[],
        use_cpu=True, seed=0, dataloader_num_workers=0, disable_tqdm=True, save_only_model=False,
    )
    trainer = Trainer(model=tiny_model(), args=args, train_dataset=Tokens())
    trainer.train()
    if trainer.accelerator.is_main_process:
        (out / "DONE").write_text("ok\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
