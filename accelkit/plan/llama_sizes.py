"""A bare parameter count -> the Llama shape of that size (what `plan --params N` plans).

The hidden size, heads and vocabulary come from the published Llama-family model closest in size (SmolLM 135M,
TinyLlama 1.1B, Llama 2 7B/13B/70B, Llama 3.1 405B; small test-sized shapes below them); the layer count is what
that width needs for N, and the MLP width is solved so that the shape has N parameters (to within one MLP column
per layer). Beyond 405B the hidden size doubles until the layer count is at most 128.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from accelkit.errors import AccelkitError


@dataclass(frozen=True)
class Rung:
    name: str
    hidden: int
    heads: int
    kv_heads: int
    vocab: int
    layers: int
    intermediate: int


LADDER = (
    Rung("test-sized", 32, 2, 2, 256, 2, 96),
    Rung("test-sized", 64, 4, 4, 1024, 2, 176),
    Rung("test-sized", 128, 4, 4, 2048, 4, 384),
    Rung("test-sized", 256, 4, 4, 8192, 4, 688),
    Rung("SmolLM 135M", 576, 9, 3, 49152, 30, 1536),
    Rung("TinyLlama 1.1B", 2048, 32, 4, 32000, 22, 5632),
    Rung("Llama 2 7B", 4096, 32, 32, 32000, 32, 11008),
    Rung("Llama 2 13B", 5120, 40, 40, 32000, 40, 13824),
    Rung("Llama 2 70B", 8192, 64, 8, 32000, 80, 28672),
    Rung("Llama 3.1 405B", 16384, 128, 8, 128256, 126, 53248),
)
MAX_LAYERS_BEYOND_LADDER = 128


@dataclass(frozen=True)
class LlamaShape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    vocab: int
    intermediate: int
    basis: str  # which published shape it follows

    @property
    def parameters(self) -> int:
        return llama_parameters(self.layers, self.hidden, self.heads, self.kv_heads, self.vocab, self.intermediate)


def llama_parameters(layers: int, hidden: int, heads: int, kv_heads: int, vocab: int, intermediate: int) -> int:
    """LlamaForCausalLM's parameters: untied input and output embeddings, per layer q/k/v/o, gate/up/down and two
    norms, and the final norm (no biases)."""
    kv = hidden // heads * kv_heads
    per_layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * intermediate + 2 * hidden
    return 2 * vocab * hidden + hidden + layers * per_layer


def _fit(rung: Rung, parameters: int) -> LlamaShape | None:
    """The rung's width with the layers for `parameters`, the MLP width solved; None when it cannot reach it."""
    h, kv = rung.hidden, rung.hidden // rung.heads * rung.kv_heads
    fixed = 2 * rung.vocab * h + h
    attention = 2 * h * h + 2 * h * kv + 2 * h
    nominal = attention + 3 * h * rung.intermediate
    layers = max(1, round((parameters - fixed) / nominal))
    intermediate = round((parameters - fixed - layers * attention) / (3 * h * layers))
    if intermediate < 1:
        return None
    return LlamaShape(layers, h, rung.heads, rung.kv_heads, rung.vocab, intermediate,
                      f"{rung.name}'s width, depth and MLP fitted to the count" if rung.name != "test-sized"
                      else "a small Llama shape, MLP fitted to the count")


def llama_shape_for(parameters: int) -> LlamaShape:
    nominal = [llama_parameters(r.layers, r.hidden, r.heads, r.kv_heads, r.vocab, r.intermediate) for r in LADDER]
    order = sorted(range(len(LADDER)), key=lambda i: abs(math.log(parameters / nominal[i])))
    if parameters > nominal[-1]:  # beyond the largest published shape: widen until the depth stays sane
        top = LADDER[-1]
        hidden = top.hidden
        while True:
            rung = Rung("Llama 3.1 405B", hidden, hidden // 128, 8, top.vocab, top.layers,
                        top.intermediate * hidden // top.hidden)
            shape = _fit(rung, parameters)
            if shape is not None and shape.layers <= MAX_LAYERS_BEYOND_LADDER:
                if hidden != top.hidden:
                    shape = LlamaShape(**{**vars(shape), "basis": f"Llama 3.1 405B widened to hidden {hidden}, "
                                                                  "depth and MLP fitted to the count"})
                return shape
            hidden *= 2
    for index in order:
        shape = _fit(LADDER[index], parameters)
        if shape is not None:
            return shape
    floor = llama_parameters(1, LADDER[0].hidden, LADDER[0].heads, LADDER[0].kv_heads, LADDER[0].vocab, 1)
    raise AccelkitError(f"--params {parameters:,} is smaller than the smallest Llama shape the plan builds "
                        f"({floor:,} parameters: 1 layer, hidden {LADDER[0].hidden})",
                        hint="describe the model with --layers, --hidden and --heads, or give its config.json")
