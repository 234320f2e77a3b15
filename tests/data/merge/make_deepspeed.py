"""Producer: DeepSpeed ZeRO-1/2/3 checkpoints of the tiny model, trained for two steps on 2 CPU ranks.

Run with `DS_ACCELERATOR=cpu python -m torch.distributed.run --nproc_per_node 2 make_deepspeed.py OUT [STAGES]`.
For each stage it writes OUT/zero{stage}/ (engine.save_checkpoint after each step: tag folders global_step1 and
global_step2, `latest` naming the second) and, from rank 0, the full fp32 state dict the engine holds after
training, OUT/zero{stage}_expected.safetensors, to compare against; and the model's OUT/config.json. A second
ZeRO-2 run of the same model with another seed, OUT/zero2_other/global_step2, gives the fault tests rank files of
"another run" with every shape equal. OUT/zero{stage}_bf16/ are the same stages trained in bf16 (bf16 weights in the
model states, fp32 masters in bf16_zero_pp_rank_* optimizer files); their reference is DeepSpeed's own zero_to_fp32.
One process group serves all stages so the JIT-built comm op and imports are paid once.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tiny_model import batch, tiny_model  # noqa: E402


def train_and_save(stage: int, out: Path, name: str | None = None, seed: int | None = None,
                   bf16: bool = False) -> None:
    import deepspeed
    from safetensors.torch import save_file

    name = name or f"zero{stage}"
    model = tiny_model(seed=stage if seed is None else seed)
    model.model.norm.weight.requires_grad_(False)  # a frozen parameter: stored outside the optimizer partitions
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
        **({"bf16": {"enabled": True}} if bf16 else {}),
    }
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-2)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    rank = torch.distributed.get_rank()
    for step in range(2):
        ids = batch(seed=step if seed is None else seed + step, rank=rank)
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        engine.save_checkpoint(str(out / name), tag=f"global_step{step + 1}")
    if seed is not None or bf16:
        torch.distributed.barrier()
        return
    if stage == 3:
        with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
            full = {k: v.detach().clone() for k, v in engine.module.state_dict().items()}
    else:
        full = {k: v.detach().clone() for k, v in engine.module.state_dict().items()}
    if rank == 0:
        full.pop("lm_head.weight", None)  # tied to model.embed_tokens.weight (safetensors stores it once)
        save_file(full, str(out / f"zero{stage}_expected.safetensors"))
    torch.distributed.barrier()


def main() -> None:
    out = Path(sys.argv[1])
    stages = [int(s) for s in (sys.argv[2] if len(sys.argv) > 2 else "1,2,3").split(",")]
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    out.mkdir(parents=True, exist_ok=True)
    for stage in stages:
        train_and_save(stage, out)
    if 2 in stages:
        train_and_save(2, out, name="zero2_other", seed=99)
    for stage in stages:
        train_and_save(stage, out, name=f"zero{stage}_bf16", bf16=True)
    if int(os.environ.get("RANK", "0")) == 0:
        from tiny_model import tiny_config

        tiny_config().save_pretrained(str(out))  # found by merge-ckpt two folders above the tag folder
        (out / "DONE").write_text("ok\n")
    torch.distributed.barrier()


if __name__ == "__main__":
    main()
    # Every file is written and closed. Skip the interpreter's teardown: with seven engines and the gloo group still
    # alive, a rank once aborted in it ("terminate called without an active exception", SIGABRT) after all was saved.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
