"""The files beside the weights that make an output directory loadable with `from_pretrained`, and tied weights.

Config, generation config and tokenizer files are looked for in the input folder and up to three folders above
(a DCP folder sits in `<run>/checkpoint-N/pytorch_model_fsdp_0/`, the config usually in `<run>/`), or taken from
`--config-from`. Tied weights: transformers stores a tied pair once (e.g. `lm_head.weight` is dropped in favour of
`model.embed_tokens.weight`) and re-ties it at load; the pairs come from the checkpoint itself (DeepSpeed's
shared_params, storage shared inside a `.bin`) or from the model class that config.json names.
"""

from __future__ import annotations

import re
from pathlib import Path

from accelkit.errors import AccelkitError

CONFIG_FILE = "config.json"
SIDE_FILES = (
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "added_tokens.json", "vocab.json", "vocab.txt", "merges.txt", "tokenizer.model", "spiece.model",
    "chat_template.jinja", "chat_template.json", "preprocessor_config.json",
)
SEARCH_LEVELS = 3
RNG_FILE = re.compile(r"^random_states_(\d+)\.pkl$")  # Accelerate's save_state: one per process
TRAINER_RNG_FILE = re.compile(r"^rng_state(?:_(\d+))?\.pth$")  # transformers' Trainer: one per process
TRAINER_STATE = "trainer_state.json"


def find_side_files(input_path: Path, config_from: Path | None) -> tuple[Path | None, list[Path]]:
    """The folder the side files come from and the files themselves (empty when none are found)."""
    if config_from is not None:
        folder = config_from.parent if config_from.is_file() else config_from
        if not folder.is_dir():
            raise AccelkitError(f"--config-from {config_from} does not exist",
                                hint="point at the folder holding config.json (or at config.json itself)")
        files = [folder / n for n in SIDE_FILES if (folder / n).is_file()]
        if not files:
            raise AccelkitError(f"no config or tokenizer files in {folder}",
                                hint=f"expected some of: {', '.join(SIDE_FILES[:4])}, ...")
        return folder, files
    folder = input_path if input_path.is_dir() else input_path.parent
    for _ in range(SEARCH_LEVELS + 1):
        files = [folder / n for n in SIDE_FILES if (folder / n).is_file()]
        if files:
            return folder, files
        if folder.parent == folder:
            break
        folder = folder.parent
    return None, []


def tied_pairs_from_config(config_file: Path, notes: list[str] | None = None) -> dict[str, str]:
    """alias -> kept name for the weights the model class of config.json ties (empty when nothing is tied).

    The class is built on the meta device by accelkit's one model loader, which never runs a model folder's own
    code: a config with custom code (auto_map) is copied as it is, and its ties are then taken from the checkpoint
    only (a note says so)."""
    from accelkit import hfmodel

    try:
        raw = hfmodel.read_raw(config_file)
    except AccelkitError:
        return {}
    if "model_type" not in raw or raw.get("tie_word_embeddings") is False:
        return {}  # nothing is tied (or transformers would not know the model): no need to import it
    try:
        hfmodel.refuse_custom_code(raw, config_file)
    except hfmodel.CustomCodeRefused:
        if notes is not None:
            notes.append(f"{config_file.name} names custom code ({hfmodel.custom_code_entry(raw)}), which accelkit "
                         "never runs: tied weights are taken from the checkpoint only")
        return {}
    import torch

    try:
        config = hfmodel.load_model_config(config_file)
        with torch.device("meta"):
            model = hfmodel.model_builder(config)()
    except Exception:
        return {}  # a model type this transformers does not know: keep every tensor
    pairs = getattr(model, "all_tied_weights_keys", None)
    if pairs is None:  # transformers < 5
        pairs = {}
        if getattr(config, "tie_word_embeddings", False):
            out, inp = model.get_output_embeddings(), model.get_input_embeddings()
            names = {id(m): n for n, m in model.named_modules()}
            if out is not None and inp is not None and id(out) in names and id(inp) in names:
                pairs[f"{names[id(out)]}.weight"] = f"{names[id(inp)]}.weight"
    return dict(pairs)


# Without config.json the model class is unknown; transformers ties the output embedding (`lm_head.weight`) to the
# input embedding of these names, and save_pretrained stores the pair once. Equal values decide (an untied head is
# initialised and trained apart from the embedding: never equal).
OUTPUT_EMBEDDING = "lm_head.weight"
INPUT_EMBEDDINGS = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight", "embed_in.weight",
                    "tok_embeddings.weight", "shared.weight")


def tie_candidates(names: list[str]) -> dict[str, str]:
    """alias -> kept name: the output embedding and the one input embedding it may be tied to, by name alone."""
    outputs = [n for n in names if n == OUTPUT_EMBEDDING or n.endswith("." + OUTPUT_EMBEDDING)]
    inputs = [n for n in names if any(n == e or n.endswith("." + e) for e in INPUT_EMBEDDINGS)]
    if len(outputs) != 1 or len(inputs) != 1:
        return {}
    return {outputs[0]: inputs[0]}


# -- a training-state save around the weights (its files are checked by savestate, with torch)
def is_training_state_name(name: str) -> bool:
    """A file only a training-state save writes beside the weights: Accelerate's RNG files, or the Trainer's RNG
    files and trainer_state.json."""
    return bool(RNG_FILE.match(name) or TRAINER_RNG_FILE.match(name)) or name == TRAINER_STATE


def find_save_state_dir(weights_dir: Path) -> Path | None:
    """The checkpoint folder around the weights (Accelerate's save_state or transformers' Trainer): it, or up to
    two folders above, with RNG files or trainer_state.json."""
    folder = weights_dir if weights_dir.is_dir() else weights_dir.parent
    for candidate in (folder, folder.parent, folder.parent.parent):
        if any(is_training_state_name(p.name) for p in listing(candidate)):
            return candidate
    return None


def listing(folder: Path) -> list[Path]:
    try:
        return list(folder.iterdir())
    except OSError:
        return []
