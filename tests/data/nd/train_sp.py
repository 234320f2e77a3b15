"""A tiny Llama trained on 4 micro-batches under DeepSpeed's Ulysses sequence parallelism (plain script: one process).

argv: WORKDIR (holds base/, a saved tiny Llama). The same 4 micro-batches, one optimizer step each, in the same
order: one process trains on them one by one; under sp N each rank's loader yields every N-th of them and
Accelerate's Ulysses adapter hands every rank each of them in turn, split along the sequence. The loss of a
micro-batch is the mean over its tokens: each rank's loss over its shard is weighted by the shard's tokens and the
weighted sum is divided by the micro-batch's tokens (the last shard has one label fewer: nothing follows the
sequence's last token). After the second step it saves state (Accelerate's save_state: DeepSpeed's ZeRO checkpoint
under sp) and writes the whole model gathered in the run (full.safetensors); after the fourth it loads the state
back and takes steps 3 and 4 again. Rank 0 writes result.json: the loss of every step and of the two resumed ones.
--sgd trains with SGD instead of AdamW (a wrong gradient scale shows in its losses; Adam's hide it).
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from accelerate import Accelerator
from transformers import LlamaForCausalLM

work = Path(sys.argv[1])
accelerator = Accelerator()
pc = accelerator.parallelism_config
sp = pc.sp_size if pc else 1
model = LlamaForCausalLM.from_pretrained(work / "base", attn_implementation="sdpa")
# from_pretrained returns the model in eval mode, and Accelerate registers Ulysses with disable_in_eval: in eval mode
# each rank attends over its own shard only (the second shard never sees the first), a 0.14% loss error here.
model.train()
optimizer = (torch.optim.SGD(model.parameters(), lr=0.5) if "--sgd" in sys.argv[2:]  # shows a gradient scale error
             else torch.optim.AdamW(model.parameters(), lr=1e-2))

generator = torch.Generator().manual_seed(0)
micro_batches = []
for _ in range(4):
    ids = torch.randint(0, 64, (2, 16), generator=generator)
    micro_batches.append({"input_ids": ids, "labels": ids.clone(), "position_ids": torch.arange(16).expand(2, 16)})

if sp > 1:
    # No loader to prepare (each rank builds its own), so DeepSpeed learns the micro-batch size here.
    accelerator.state.deepspeed_plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = 2
    model, optimizer = accelerator.prepare(model, optimizer)
    mine = micro_batches[accelerator.process_index::sp]  # the adapter gathers them back in the global order
    loader = accelerator.deepspeed_ulysses_dl_adapter(torch.utils.data.DataLoader(mine, batch_size=None), model)
    from deepspeed.utils import groups

    sp_group = groups._get_sequence_parallel_group()  # DeepSpeed's Ulysses group (Accelerate builds no mesh for it)
else:
    model, optimizer = accelerator.prepare(model, optimizer)
    loader = micro_batches


def sequence_parallel_loss(batch: dict) -> torch.Tensor:
    """The micro-batch's mean token loss from this rank's shard (shift_labels: the adapter shifted the whole
    sequence's labels before splitting it, so no shard loses a token at its edge)."""
    shift_labels = batch.pop("shift_labels").contiguous()  # a slice of the whole sequence's labels
    logits = model(**batch).logits
    unwrapped = accelerator.unwrap_model(model)
    loss = unwrapped.loss_function(logits=logits, labels=None, shift_labels=shift_labels,
                                   vocab_size=unwrapped.config.vocab_size)
    losses = torch.distributed.nn.functional.all_gather(loss, group=sp_group)
    tokens = (shift_labels != -100).sum()
    counts = torch.distributed.nn.functional.all_gather(tokens, group=sp_group)
    return sum(part * count for part, count in zip(losses, counts, strict=True)) / sum(counts)


def step(batch: dict) -> float:
    batch = dict(batch)  # the loss pops shift_labels; a resumed step replays the same micro-batch
    loss = sequence_parallel_loss(batch) if sp > 1 else model(**batch).loss
    accelerator.backward(loss)
    # DeepSpeed clips at the config's gradient_clipping (Accelerate fills "auto" with 1.0) inside its step; the same
    # call clips the one-process run alike (under DeepSpeed Accelerate leaves it to the engine).
    accelerator.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad()
    return loss.item()


def write_full_model(path: Path) -> None:
    """The whole model gathered from every rank, as `merge-ckpt` must rebuild it from the checkpoint."""
    from safetensors.torch import save_file

    full = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        save_file({k: v.contiguous() for k, v in full.items()}, str(path))


losses, seen = [], []
for batch in loader:
    seen.append(batch)
    losses.append(step(batch))
    if len(losses) == 2:
        accelerator.save_state(str(work / "ckpt"))
        write_full_model(work / "full.safetensors")
accelerator.load_state(str(work / "ckpt"))
resumed = [step(batch) for batch in seen[2:]]
if accelerator.is_main_process:
    (work / "result.json").write_text(json.dumps({
        "losses": losses, "resumed": resumed, "sp": sp,
        "distributed_type": str(accelerator.distributed_type), "world": dist.get_world_size() if sp > 1 else 1}))
