"""Producer: the tiny model saved by transformers' `save_pretrained` in small shards, and as one torch `.bin` file.

Run with `python make_hf.py OUT`. Writes OUT/hf/ (config.json, generation_config.json, model-0000i-of-0000N
.safetensors + model.safetensors.index.json), OUT/torch/pytorch_model.bin (torch.save of the state dict, where
the tied lm_head.weight shares storage with the embedding) and OUT/hf_expected.safetensors (the full state dict).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tiny_model import tiny_model  # noqa: E402


def main() -> None:
    import torch
    from safetensors.torch import save_file

    out = Path(sys.argv[1])
    model = tiny_model(seed=3)
    model.save_pretrained(str(out / "hf"), max_shard_size="20KB")
    (out / "torch").mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), out / "torch" / "pytorch_model.bin")
    full = {k: v.detach().clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(full, str(out / "hf_expected.safetensors"))
    (out / "DONE").write_text("ok\n")


if __name__ == "__main__":
    main()
