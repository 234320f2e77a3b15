"""The two model shapes the plan is checked on: a tiny Llama and a tiny BERT, built from configs (no download).

Odd sizes on purpose (vocab 258 / 301, MLP 176, 3 layers): they do not divide evenly among 4 ranks, so FSDP2's
and ZeRO's padding and uneven partitions show up in the measurements.
"""

from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, BertConfig, LlamaConfig

CONFIGS = {
    "llama": LlamaConfig(vocab_size=258, hidden_size=64, intermediate_size=176, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         architectures=["LlamaForCausalLM"]),
    "bert": BertConfig(vocab_size=301, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                       num_attention_heads=4, max_position_embeddings=64, num_labels=3,
                       architectures=["BertForSequenceClassification"]),
}
CLASSES = {"LlamaForCausalLM": "llama", "BertForSequenceClassification": "bert"}


def build(name: str):
    auto = AutoModelForCausalLM if name == "llama" else AutoModelForSequenceClassification
    return auto.from_config(CONFIGS[name])


def embeddings_in_their_own_unit(model) -> None:
    """What accelkit's templates do before an FSDP2 prepare(): a wrapped class that holds the input embedding
    (BertEmbeddings) would claim it twice, so it is left out of the wrap list."""
    embed = model.get_input_embeddings()
    around = {type(m).__name__ for m in model.modules() if m is not embed and embed in list(m.modules())}
    model._no_split_modules = [n for n in (model._no_split_modules or []) if n not in around]
