"""The textbook activation estimate, used when a model cannot be traced (and shown beside the trace in
benchmarks/plan_accuracy.py): Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
Models" (2022), for a GPT-style layer in 16-bit without recomputation: s*b*h*(34 + 5*a*s/h) bytes per layer
(s sequence, b micro-batch, h hidden, a heads). Flash attention removes the 5*a*s/h term (no attention matrix);
full recomputation keeps the layer input (2*s*b*h) per layer plus one layer's activations. The logits the loss
needs are added in fp32 (s*b*vocab*4, kept for the backward of the softmax).
"""

from __future__ import annotations


def korthikanti(dims: dict[str, int], micro_batch: int, seq_len: int, checkpointing: bool,
                flash: bool = True) -> int | None:
    needed = ("hidden_size", "num_hidden_layers", "num_attention_heads")
    if any(key not in dims for key in needed):
        return None
    s, b, h = seq_len, micro_batch, dims["hidden_size"]
    layers, heads = dims["num_hidden_layers"], dims["num_attention_heads"]
    per_layer = s * b * h * (34 + (0 if flash else 5 * heads * s / h))
    logits = s * b * dims.get("vocab_size", 0) * 4
    if checkpointing:
        return int(layers * 2 * s * b * h + per_layer + logits)
    return int(layers * per_layer + logits)
