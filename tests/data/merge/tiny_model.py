"""The tiny causal LM every merge-ckpt producer trains: a Llama built from a config, tied embeddings, odd sizes.

Odd sizes (vocab 101, intermediate 37) make flat ZeRO partitions and FSDP shards need padding, which is where
merging goes wrong first.
"""

from __future__ import annotations

import torch


def tiny_config():
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=101, hidden_size=32, intermediate_size=37, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                       tie_word_embeddings=True)


def tiny_model(seed: int = 0):
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(tiny_config())


def batch(seed: int = 0, rank: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1000 * seed + rank)
    return torch.randint(0, 101, (2, 16), generator=gen)
