"""Train a tiny Llama and a tiny BERT (built from configs) for one optimizer step each, with Accelerate.

The measuring probe (accelkit.plan.measure.probe) records what every rank holds after each model's step. To
measure many cases per launch (CPU rehearsals are slow on small machines), the script trains the models one after
the other (`accelerator.free_memory()` between them) and can change the backend's setting between rounds:
`--zero-stages 1,2` rebuilds DeepSpeed's engine with each ZeRO stage, `--fsdp-modes full,grad-op` switches FSDP2's
reshard_after_forward. Each engine is built by Accelerate's own prepare() from the plugin's (changed) settings.
"""

import argparse

import torch
from accelerate import Accelerator
from tiny_models import build, embeddings_in_their_own_unit
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--batch", type=int, default=2)
parser.add_argument("--seq", type=int, default=24)
parser.add_argument("--models", default="llama,bert")
parser.add_argument("--zero-stages", default="")
parser.add_argument("--fsdp-modes", default="")
args = parser.parse_args()

accelerator = Accelerator()


def train_one_step(name: str) -> None:
    torch.manual_seed(0)
    model = build(name)
    if accelerator.is_fsdp2:
        accelerator.state.fsdp_plugin.transformer_cls_names_to_wrap = None  # the plugin remembers the last model's
        embeddings_in_their_own_unit(model)
    no_decay = ("bias", "norm")  # the usual two groups (as accelkit's templates and the HF Trainer do)
    groups = [{"params": [p for n, p in model.named_parameters() if not any(k in n.lower() for k in no_decay)]},
              {"params": [p for n, p in model.named_parameters() if any(k in n.lower() for k in no_decay)],
               "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=1e-3)
    samples = args.batch * accelerator.num_processes
    ids = torch.randint(0, 250, (samples, args.seq), generator=torch.Generator().manual_seed(1))
    labels = ids if name == "llama" else torch.arange(samples) % 3
    loader = DataLoader(TensorDataset(ids, labels), batch_size=args.batch)  # a per-device batch of args.batch
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    model.train()
    batch_ids, batch_labels = next(iter(loader))
    loss = model(input_ids=batch_ids, labels=batch_labels).loss
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    accelerator.print(f"{name} loss {loss.item():.4f}", flush=True)
    del model, optimizer, loader, loss
    accelerator.free_memory()


rounds = [None]
if args.zero_stages:
    rounds = [("zero", int(stage)) for stage in args.zero_stages.split(",")]
elif args.fsdp_modes:
    rounds = [("fsdp", mode) for mode in args.fsdp_modes.split(",")]
for setting in rounds:
    if setting and setting[0] == "zero":
        accelerator.state.deepspeed_plugin.deepspeed_config["zero_optimization"]["stage"] = setting[1]
    elif setting:
        accelerator.state.fsdp_plugin.reshard_after_forward = setting[1] == "full"
    for name in args.models.split(","):
        train_one_step(name)
