"""An offline stand-in for tiktoken (not installed here), opt-in for the convert corpus scripts that use it
(manifest `standins`): a byte-level encoder under GPT-2's encoding names. Token ids are the UTF-8 bytes (0-255);
the vocabulary size and the end-of-text id are GPT-2's, so models sized for `enc.n_vocab` keep their shapes. It
trains nothing useful: the corpus checks data-parallel equivalence, not language modelling."""

from __future__ import annotations

GPT2_VOCAB = 50257
GPT2_EOT = 50256


class Encoding:
    def __init__(self, name: str) -> None:
        self.name, self.n_vocab, self.eot_token = name, GPT2_VOCAB, GPT2_EOT
        self.max_token_value = GPT2_VOCAB - 1
        self._special_tokens = {"<|endoftext|>": GPT2_EOT}

    def encode(self, text: str, *, allowed_special=(), disallowed_special="all") -> list[int]:
        return list(text.encode("utf-8"))

    def encode_ordinary(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_ordinary_batch(self, texts: list[str], **kwargs) -> list[list[int]]:
        return [self.encode_ordinary(t) for t in texts]

    def decode(self, tokens) -> str:
        # ids above a byte (sampled from a model sized for GPT-2's vocabulary) have no text here
        return bytes(int(t) for t in tokens if 0 <= int(t) < 256).decode("utf-8", errors="replace")


def get_encoding(name: str) -> Encoding:
    return Encoding(name)


def encoding_for_model(model: str) -> Encoding:
    return Encoding("gpt2")
