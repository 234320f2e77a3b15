"""Plan accuracy for N-D layouts: `accelkit plan`'s N-D rows (accelkit/plan/nd.py) against the model-state bytes
rank 0 really holds in CPU rehearsals of a tiny Llama (tests/data/nd/train_nd.py, one AdamW step).

    python benchmarks/plan_accuracy_nd.py [--layouts tp2,hsdp2x2,fsdp4]

Each layout runs through `accelkit launch --cpu` (real gloo ranks, transformers' TP plan, FSDP2 over Accelerate's
mesh); the script reports rank 0's parameters, gradients and optimizer moments measured with `to_local()` next to the
plan's prediction for the same layout.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from accelkit.plan import nd

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "data" / "nd" / "train_nd.py"
TINY = {"layers": 2, "hidden": 32, "heads": 4, "kv_heads": 2, "vocab": 64, "intermediate": 64}
LAYOUTS = {
    "tp2": (nd.Layout("ddp", tp=2), ["--backend", "ddp", "--num-processes", "2", "--tp-size", "2"]),
    "hsdp2x2": (nd.Layout("fsdp", dp_replicate=2, dp_shard=2),
                ["--backend", "fsdp", "--num-processes", "4", "--dp-replicate-size", "2", "--dp-shard-size", "2"]),
    "fsdp4": (nd.Layout("fsdp", dp_shard=4), ["--backend", "fsdp", "--num-processes", "4", "--dp-shard-size", "4"]),
}


def save_tiny(folder: Path) -> None:
    code = ("import torch; from transformers import LlamaConfig, LlamaForCausalLM; torch.manual_seed(0); "
            f"c = LlamaConfig(vocab_size={TINY['vocab']}, hidden_size={TINY['hidden']}, "
            f"intermediate_size={TINY['intermediate']}, num_hidden_layers={TINY['layers']}, "
            f"num_attention_heads={TINY['heads']}, num_key_value_heads={TINY['kv_heads']}, "
            f"max_position_embeddings=64); LlamaForCausalLM(c).save_pretrained({str(folder)!r})")
    subprocess.run([sys.executable, "-c", code], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layouts", default="tp2,hsdp2x2,fsdp4", help=f"comma-separated: {', '.join(LAYOUTS)}")
    args = parser.parse_args()
    model = nd.Model.llama(**TINY)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        save_tiny(Path(tmp) / "base")
        for name in args.layouts.split(","):
            layout, flags = LAYOUTS[name]
            work = Path(tmp) / name
            work.mkdir()
            shutil.copytree(Path(tmp) / "base", work / "base")
            proc = subprocess.run([sys.executable, "-m", "accelkit", "launch", "--cpu", *flags, str(SCRIPT),
                                   str(work)], capture_output=True, text=True)
            if proc.returncode != 0:
                rows.append((name, layout, None, proc.stderr.strip().splitlines()[-1]))
                continue
            measured = json.loads((work / "result.json").read_text())["state_bytes"]
            rows.append((name, layout, measured, ""))
    print("Model states on rank 0 (bytes: parameters + gradients + AdamW moments), plan vs measured, tiny Llama "
          f"({model.parameters:,} parameters), CPU rehearsal over gloo")
    header = f"{'layout':<36}{'planned':>10}{'measured':>10}{'error':>8}"
    print(header)
    print("-" * len(header))
    for _name, layout, measured, failure in rows:
        planned = nd.row(layout, model, gpus=layout.world, nodes=1, gpu_memory=None, seq_len=16).states
        if measured is None:
            print(f"{layout.describe():<36}{planned:>10}{'failed':>10}  {failure}")
            continue
        total = sum(measured.values())
        print(f"{layout.describe():<36}{planned:>10}{total:>10}{(planned - total) / total * 100:>7.2f}%")


if __name__ == "__main__":
    main()
