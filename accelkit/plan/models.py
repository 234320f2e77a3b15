"""MODEL -> a ModelSpec: how to build the model on the meta device, feed it a batch and get its loss.

MODEL is a local directory or config.json of a transformers model, a Hub id (only config.json is fetched), a project
made by `accelkit init` (see projects.py), or nothing with shape flags (a Llama-shaped model built from them) or a
bare parameter count.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accelkit.errors import AccelkitError

SHAPE_HINT = "or describe the model with --layers, --hidden and --heads (a Llama-shaped model), or --params N"
# Class-name endings whose forward takes `labels` and returns the loss; value: labels per sequence or per token.
LABELS = {"ForCausalLM": "token", "ForMaskedLM": "token", "ForTokenClassification": "token",
          "ForConditionalGeneration": "token", "ForSequenceClassification": "sequence",
          "ForImageClassification": "sequence", "ForQuestionAnswering": None, "ForPreTraining": None}


@dataclass
class ModelSpec:
    label: str  # what the user gave, as the output names it
    build: Callable[[], Any] | None = None  # builds the model (call under `torch.device("meta")`)
    inputs: Callable[[Any, int, int], dict] | None = None  # (model, micro_batch, seq_len) -> a meta batch
    step: Callable[[Any, dict], tuple[Any, Any]] | None = None  # (model, batch) -> (loss, outputs)
    parameters: int | None = None  # a bare count (no build)
    seq_len: int | None = None  # the project's default sequence length
    micro_batch: int | None = None  # the project's default per-device batch
    script: Path | None = None  # the project's train.py
    sequence_input: bool = True  # False: the input size is fixed by the model (images; set when it is built)
    max_positions: int | None = None  # the config's max_position_embeddings (None: not limited, or not known)
    notes: list[str] = field(default_factory=list)


# -- transformers models --------------------------------------------------------------------------------------------
def hf_build(config) -> Callable[[], Any]:
    """Build the class config.json names from the config, weights unset (see accelkit.hfmodel: no custom code)."""
    from accelkit.hfmodel import model_builder

    return model_builder(config)


def hf_inputs(model, micro_batch: int, seq_len: int) -> dict:
    """A meta batch for a transformers model: token ids (or pixels) plus labels when its forward computes a loss."""
    import torch

    config = model.config
    kind = next((v for k, v in LABELS.items() if type(model).__name__.endswith(k)), None)
    batch: dict = {}
    name = getattr(model, "main_input_name", "input_ids")
    if name == "input_ids":
        batch["input_ids"] = torch.zeros((micro_batch, seq_len), dtype=torch.long, device="meta")
    elif name == "pixel_values":
        size = getattr(config, "image_size", 224)
        height, width = (size, size) if isinstance(size, int) else tuple(size)
        channels = getattr(config, "num_channels", 3)
        batch["pixel_values"] = torch.zeros((micro_batch, channels, height, width), device="meta")
    else:
        raise AccelkitError(f"{type(model).__name__} takes `{name}` inputs, which the plan cannot trace yet",
                            hint="activations are then not modelled; " + SHAPE_HINT)
    if kind == "token":
        batch["labels"] = torch.zeros((micro_batch, seq_len), dtype=torch.long, device="meta")
    elif kind == "sequence":
        regression = getattr(config, "num_labels", 2) == 1
        batch["labels"] = torch.zeros((micro_batch,), dtype=torch.float if regression else torch.long, device="meta")
    return batch


def hf_step(model, batch: dict):
    outputs = model(**batch)
    return getattr(outputs, "loss", None), outputs


def _hf_spec(label: str, config, notes: list[str] | None = None) -> ModelSpec:
    return ModelSpec(label=label, build=hf_build(config), inputs=hf_inputs, step=hf_step, notes=list(notes or []))


def spec_from_config_file(path: Path, label: str) -> ModelSpec:
    """A transformers config read by accelkit's one loader (custom code refused), checked for missing sizes."""
    from accelkit import hfmodel

    config = hfmodel.load_model_config(path)
    raw = hfmodel.read_raw(path)
    defaulted = hfmodel.defaulted_shape_fields(raw, config)
    if len(defaulted) == len(hfmodel.SHAPE_FIELDS):
        raise AccelkitError(f"{hfmodel.config_file(path)} gives none of {', '.join(defaulted)}: transformers would "
                            f"fill them with {type(config).__name__}'s defaults, a model nobody asked for",
                            hint="give the config.json of the model you train (with its sizes), " + SHAPE_HINT)
    notes = [f"config.json does not give {', '.join(defaulted)}: {type(config).__name__}'s defaults are used ("
             + ", ".join(f"{name} {_text(config, name)}" for name in defaulted) + ")"] if defaulted else []
    spec = _hf_spec(label, config, notes)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    positions = getattr(text, "max_position_embeddings", None)
    spec.max_positions = positions if isinstance(positions, int) and positions > 0 else None
    return spec


def _text(config, name: str):
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return getattr(text, name, None)


def spec_from_local(path: Path) -> ModelSpec:
    if path.is_dir() and not (path / "config.json").is_file():
        raise AccelkitError(f"{path} holds neither config.json nor an accelkit project (train.py from a template)",
                            hint="point MODEL at a model directory or its config.json, " + SHAPE_HINT)
    return spec_from_config_file(path, f"{path} (config.json)")


# -- the Hub ---------------------------------------------------------------------------------------------------------
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")


def looks_like_repo_id(text: str) -> bool:
    return bool(_REPO_ID.fullmatch(text)) and ".." not in text and not text.endswith((".json", ".py"))


HUB_CONNECT_SECONDS = 3.0


def _refuse_unreachable_hub(repo_id: str, fetch: str) -> None:
    """Offline (no name resolution, no route, refused): one line now, instead of huggingface_hub's five retries
    (six warning lines and ~23 s of back-off) before the same verdict. One TCP connect to the Hub's endpoint."""
    import os
    import socket
    from urllib.parse import urlsplit

    from huggingface_hub import constants

    if os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE"):
        return  # huggingface_hub says offline itself, at once
    if any(os.environ.get(name) for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY",
                                              "all_proxy")):
        return  # through a proxy a direct connection proves nothing: huggingface_hub decides
    url = urlsplit(constants.ENDPOINT)
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=HUB_CONNECT_SECONDS).close()
    except OSError as exc:
        reason = "the name does not resolve" if isinstance(exc, socket.gaierror) else \
            "timed out" if isinstance(exc, TimeoutError) else exc.strerror or type(exc).__name__
        raise AccelkitError(f"cannot fetch config.json of `{repo_id}` from the Hugging Face Hub: offline ({host} "
                            f"unreachable: {reason.lower()}) and not in the local cache", hint=fetch) from None


def spec_from_hub(repo_id: str) -> ModelSpec:
    """Fetch only config.json (cached by huggingface_hub like any download), with one clear error per failure."""
    from huggingface_hub import errors as hub
    from huggingface_hub import hf_hub_download

    fetch = (f"connect to the Hub, or fetch it once (`hf download {repo_id} config.json`) and pass the folder, "
             f"{SHAPE_HINT}")
    # Most specific first: a gated repo is a RepositoryNotFoundError, an offline miss an EntryNotFoundError.
    failures = [
        (hub.GatedRepoError, f"{repo_id} is a gated model on the Hugging Face Hub",
         f"accept its terms on huggingface.co and log in (`hf auth login`), {SHAPE_HINT}"),
        (hub.RepositoryNotFoundError, f"unknown model `{repo_id}`: not a local path, and no such repository on "
                                      "the Hugging Face Hub",
         f"check the spelling (private models need `hf auth login`), {SHAPE_HINT}"),
        ((hub.LocalEntryNotFoundError, hub.OfflineModeIsEnabled),
         f"cannot fetch config.json of `{repo_id}` from the Hugging Face Hub: offline and not in the local cache",
         fetch),
        (hub.EntryNotFoundError, f"{repo_id} on the Hugging Face Hub has no config.json",
         f"pass the config of the architecture it uses, {SHAPE_HINT}"),
    ]
    try:
        try:  # the cache first: no network at all when config.json was fetched before
            path = hf_hub_download(repo_id, "config.json", local_files_only=True)
        except (hub.LocalEntryNotFoundError, hub.OfflineModeIsEnabled, FileNotFoundError):
            _refuse_unreachable_hub(repo_id, fetch)
            path = hf_hub_download(repo_id, "config.json")
    except AccelkitError:
        raise
    except Exception as exc:  # network, HTTP and cache errors: each named below, anything else as it is
        for kinds, message, hint in failures:
            if isinstance(exc, kinds):
                raise AccelkitError(message, hint=hint) from None
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise AccelkitError(f"cannot fetch config.json of `{repo_id}` from the Hugging Face Hub: {first}",
                            hint=fetch) from None
    return spec_from_config_file(Path(path), f"{repo_id} (config.json from the Hugging Face Hub)")


# -- shape flags -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ShapeFlags:
    """`accelkit plan`'s shape flags, a Llama-shaped model (None: not given)."""

    layers: int | None = None
    hidden: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    vocab: int | None = None
    intermediate: int | None = None

    def given(self) -> dict[str, int]:
        return {k: v for k, v in vars(self).items() if v is not None}


def llama_intermediate(hidden: int) -> int:
    """Llama's MLP width: 2/3 of 4h, rounded up to a multiple of 256 (11008 for h=4096)."""
    return 256 * -(-int(8 * hidden / 3) // 256)


def _llama_spec(label: str, layers: int, hidden: int, heads: int, kv_heads: int, vocab: int, intermediate: int,
                notes: list[str], max_positions: int = 4096) -> ModelSpec:
    from transformers import LlamaConfig

    config = LlamaConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, vocab_size=vocab, intermediate_size=intermediate,
                         max_position_embeddings=max_positions, architectures=["LlamaForCausalLM"])
    return _hf_spec(label, config, notes)


def _shape_words(layers: int, hidden: int, heads: int, kv_heads: int, intermediate: int, vocab: int) -> str:
    return (f"{layers} layers, hidden {hidden}, {heads} heads ({kv_heads} kv), MLP {intermediate}, "
            f"vocab {vocab}")


def _refuse_impossible_shape(flags: ShapeFlags) -> None:
    """Sizes no model has (accelkit/limits.py): a typo, refused before a model of them is built."""
    from accelkit.limits import MAX_LAYERS, MAX_VOCAB, MAX_WIDTH

    for name, value in flags.given().items():
        ceiling = MAX_LAYERS if name == "layers" else MAX_VOCAB if name == "vocab" else MAX_WIDTH
        flag = "--" + name.replace("_", "-")
        if value < 1:
            raise AccelkitError(f"{flag} {value} must be at least 1", hint=f"e.g. {flag} 32")
        if value > ceiling:
            raise AccelkitError(f"{flag} {value:,} is beyond any model (the plan stops at {ceiling:,})",
                                hint=f"check {flag}: e.g. --layers 32 --hidden 4096 --heads 32 for a 7B model")


def spec_from_shape(flags: ShapeFlags) -> ModelSpec:
    _refuse_impossible_shape(flags)
    missing = [f"--{name}" for name in ("layers", "hidden", "heads") if getattr(flags, name) is None]
    if missing:
        raise AccelkitError(f"a model shape needs {', '.join(missing)} too",
                            hint="give --layers, --hidden and --heads (and optionally --kv-heads, --vocab, "
                                 "--intermediate), or a config, or --params N")
    if flags.hidden % flags.heads:
        raise AccelkitError(f"--hidden {flags.hidden} is not divisible by --heads {flags.heads}",
                            hint="each attention head gets hidden/heads dimensions: pick values that divide")
    kv_heads = flags.kv_heads or flags.heads
    if flags.heads % kv_heads:
        raise AccelkitError(f"--heads {flags.heads} is not a multiple of --kv-heads {kv_heads}",
                            hint="grouped-query attention shares each key/value head among heads/kv-heads heads")
    notes = []
    intermediate = flags.intermediate or llama_intermediate(flags.hidden)
    if flags.intermediate is None:
        notes.append(f"--intermediate not given: {intermediate} (Llama's 8h/3 rounded up to a multiple of 256)")
    vocab = flags.vocab or 32000
    if flags.vocab is None:
        notes.append("--vocab not given: 32000 (Llama 2's tokenizer)")
    label = "Llama-shaped: " + _shape_words(flags.layers, flags.hidden, flags.heads, kv_heads, intermediate, vocab)
    return _llama_spec(label, flags.layers, flags.hidden, flags.heads, kv_heads, vocab, intermediate, notes)


def spec_from_count(parameters: int) -> ModelSpec:
    """A bare count planned as the Llama shape of that size (llama_shape_for): model states then come from real
    tensors (FSDP padding, ZeRO partitions, Adafactor's factors, ZeRO-3's persistent parameters), and unit sizes,
    gather buffers and activations from that shape, which the output names."""
    from accelkit.plan.llama_sizes import llama_shape_for

    shape = llama_shape_for(parameters)
    words = _shape_words(shape.layers, shape.hidden, shape.heads, shape.kv_heads, shape.intermediate, shape.vocab)
    note = (f"--params gives no architecture: unit sizes, gather buffers and activations are those of a Llama shape "
            f"of {shape.parameters:,} parameters ({words}; {shape.basis}); give the model's config.json for its own")
    spec = _llama_spec(f"{parameters:,} parameters (--params), planned as a Llama shape: {words}", shape.layers,
                       shape.hidden, shape.heads, shape.kv_heads, shape.vocab, shape.intermediate, [note],
                       max_positions=1 << 20)
    spec.parameters = parameters
    return spec


# -- MODEL -----------------------------------------------------------------------------------------------------------
def resolve_model(model: str | None, shape: ShapeFlags, parameters: int | None) -> ModelSpec:
    """The spec for what the user named. Exactly one of MODEL, shape flags or --params."""
    given = [what for what, present in (("MODEL", model is not None), ("shape flags", bool(shape.given())),
                                        ("--params", parameters is not None)) if present]
    if len(given) > 1:
        raise AccelkitError(f"{' and '.join(given)} both describe the model", hint="give only one of them")
    if not given:
        raise AccelkitError("no model given", hint="name a model directory, config.json, Hub id or accelkit "
                                                   "project, " + SHAPE_HINT)
    if parameters is not None:
        return spec_from_count(parameters)
    if model is None:
        return spec_from_shape(shape)
    path = Path(model).expanduser()
    if path.exists():
        from accelkit.plan.projects import find_project, spec_from_project

        project = find_project(path)
        if project is not None:
            return spec_from_project(*project)
        return spec_from_local(path)
    if looks_like_repo_id(model):
        return spec_from_hub(model)
    raise AccelkitError(f"unknown model `{model}`: no such file or directory, and not a Hugging Face Hub id",
                        hint="check the path, " + SHAPE_HINT)
