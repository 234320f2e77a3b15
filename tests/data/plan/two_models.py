"""Train a tiny Llama and a tiny BERT (built from configs) for one optimizer step each, with Accelerate.

The measuring probe (accelkit.plan.measure.probe) records what every rank holds after each model's step; the
models are trained one after the other in one launch (`accelerator.free_memory()` between them, so DeepSpeed
builds a second engine), to measure two shapes for the price of one job.
"""

import argparse

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, BertConfig, LlamaConfig

parser = argparse.ArgumentParser()
parser.add_argument("--batch", type=int, default=2)
parser.add_argument("--seq", type=int, default=24)
parser.add_argument("--models", default="llama,bert")
args = parser.parse_args()

CONFIGS = {
    # vocab 258 and 4 layers: shapes that do not divide evenly among 4 ranks (FSDP2 and ZeRO padding show)
    "llama": LlamaConfig(vocab_size=258, hidden_size=64, intermediate_size=176, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64),
    "bert": BertConfig(vocab_size=301, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                       num_attention_heads=4, max_position_embeddings=64, num_labels=3),
}
BUILD = {"llama": AutoModelForCausalLM.from_config, "bert": AutoModelForSequenceClassification.from_config}

accelerator = Accelerator()
for name in args.models.split(","):
    torch.manual_seed(0)
    model = BUILD[name](CONFIGS[name])
    if accelerator.is_fsdp2:  # as accelkit's templates do: the embedding is a unit of its own
        accelerator.state.fsdp_plugin.transformer_cls_names_to_wrap = None  # the plugin remembers the last model's
        embed = model.get_input_embeddings()
        around = {type(m).__name__ for m in model.modules() if m is not embed and embed in list(m.modules())}
        model._no_split_modules = [n for n in (model._no_split_modules or []) if n not in around]
    no_decay = ("bias", "norm")
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
