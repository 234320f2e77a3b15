"""The one place accelkit reads a transformers config.json or builds a model from a config: never a model folder's
own code, never a question on stdin.

A config.json whose `auto_map` names Python files (of its folder, or of another Hub repository) asks transformers to
import and run them; with `trust_remote_code` unset transformers asks on stdin, and runs them on "y". accelkit never
runs them: a config carrying `auto_map` (at any depth: sub-configs too) is refused before transformers reads it,
naming the entry, and every call into transformers passes `trust_remote_code=False` as well (transformers then
raises instead of prompting), so nothing here depends on what transformers decides.

Used by `plan` (MODEL as a folder, config.json or Hub id) and `merge-ckpt` (the tied weights the config's class
declares); `init`, `bench` and `convert` load no configs or models themselves.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from accelkit.errors import AccelkitError

CONFIG_FILE = "config.json"
# Size fields a transformers config falls back to its class defaults for (Llama: 6.74B) when config.json omits them.
SHAPE_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")


class CustomCodeRefused(AccelkitError):
    """config.json names Python code of its own (auto_map); accelkit does not run it."""


def config_file(path: Path) -> Path:
    return path / CONFIG_FILE if path.is_dir() else path


def read_raw(path: Path) -> dict[str, Any]:
    """config.json (or a folder holding it) as a dict, with one clear error per way it can be wrong."""
    file = config_file(path)
    hint = "give a transformers config.json (or the folder holding it)"
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AccelkitError(f"{file} does not exist", hint=hint) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise AccelkitError(f"cannot read {file}: {getattr(exc, 'strerror', None) or exc}", hint=hint) from None
    except json.JSONDecodeError as exc:
        raise AccelkitError(f"{file} is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})",
                            hint=hint) from None
    if not isinstance(raw, dict):
        raise AccelkitError(f"{file} holds a JSON {type(raw).__name__}, not an object of config fields", hint=hint)
    return raw


def custom_code_entry(raw: Any, where: str = "") -> str | None:
    """The first `auto_map` entry anywhere in a config (e.g. `AutoModelForCausalLM: modeling_x.MyModel`), or None."""
    if isinstance(raw, dict):
        auto_map = raw.get("auto_map")
        if auto_map:
            if isinstance(auto_map, dict):
                key, value = next(iter(auto_map.items()))
                value = ", ".join(v for v in value if v) if isinstance(value, list) else value
                return f"{where}auto_map {key}: {value}"
            return f"{where}auto_map: {auto_map}"
        for key, value in raw.items():
            found = custom_code_entry(value, f"{where}{key}.") if isinstance(value, dict) else None
            if found:
                return found
    return None


def refuse_custom_code(raw: dict[str, Any], file: Path | str) -> None:
    entry = custom_code_entry(raw)
    if entry is None:
        return
    native = _native_model_type(raw.get("model_type"))
    also = f"; transformers has its own `{raw['model_type']}` classes: if they are the same model, plan a copy of " \
           "config.json without auto_map" if native else ""
    raise CustomCodeRefused(
        f"{file} names custom code ({entry}), which accelkit never runs",
        hint="describe the model with --layers, --hidden and --heads (a Llama-shaped model) or --params N" + also)


def _native_model_type(model_type: Any) -> bool:
    if not isinstance(model_type, str):
        return False
    from transformers import CONFIG_MAPPING

    return model_type in CONFIG_MAPPING


# Sizes no model has below 1 (a few configs use -1 for "off" in other fields, e.g. sliding windows: not listed).
_SIZES = frozenset({"hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "intermediate_size",
                    "num_key_value_heads", "head_dim", "max_position_embeddings", "n_embd", "n_head", "n_layer",
                    "n_positions", "n_inner", "d_model", "ffn_dim", "num_layers", "num_heads", "d_ff", "d_kv"})


def refuse_impossible_sizes(raw: Any, file: Path, where: str = "") -> None:
    """A size in config.json (hidden_size, num_attention_heads, ...) that no model can have: negative, or 0 for
    the four that shape every model. Refused by name before transformers turns it into a tensor error."""
    if not isinstance(raw, dict):
        return
    for key, value in raw.items():
        if isinstance(value, dict):
            refuse_impossible_sizes(value, file, f"{where}{key}.")
            continue
        if key not in _SIZES or isinstance(value, bool) or not isinstance(value, int):
            continue
        if value < 0 or (value == 0 and key in SHAPE_FIELDS):
            raise AccelkitError(f"{file}: {where}{key} is {value}, which no model can have",
                                hint=f"set {key} to a positive whole number (the model's real {key})")


def load_model_config(path: Path):
    """A transformers config from a folder or config.json: custom code refused, nothing prompted, errors in words."""
    file = config_file(path)
    raw = read_raw(file)
    refuse_custom_code(raw, file)
    refuse_impossible_sizes(raw, file)
    if "model_type" not in raw:
        raise AccelkitError(f"{file} has no `model_type`, so transformers cannot tell which architecture it is",
                            hint='add the architecture\'s model_type (e.g. "model_type": "llama")')
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(file), trust_remote_code=False)
    except Exception as exc:  # transformers' and huggingface_hub's validation errors, in words without class names
        raise AccelkitError(f"cannot read the model config {file}: {describe_error(exc)}",
                            hint="fix that field of config.json") from None


def defaulted_shape_fields(raw: dict[str, Any], config) -> list[str]:
    """The size fields config.json does not give (transformers fills them with its class defaults)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    attribute_map = getattr(text, "attribute_map", {}) or {}
    given = set(_all_keys(raw))
    return [name for name in SHAPE_FIELDS
            if hasattr(text, name) and name not in given and attribute_map.get(name) not in given]


def _all_keys(raw: Any) -> list[str]:
    if not isinstance(raw, dict):
        return []
    return [*raw, *(k for v in raw.values() for k in _all_keys(v))]


def model_builder(config):
    """A function that builds the class config.json names (else the causal-LM or base auto class) from the
    config, weights unset (call it under `torch.device("meta")`). Only transformers' own classes are used."""
    import transformers

    refuse_custom_code(config.to_dict(), "the model config")
    architectures = getattr(config, "architectures", None) or []
    cls = next((getattr(transformers, name) for name in architectures if hasattr(transformers, name)), None)

    def build():
        try:
            return build_any()
        except AccelkitError:
            raise
        except (RuntimeError, ValueError, TypeError, ZeroDivisionError, AttributeError, IndexError) as exc:
            # sizes transformers accepts in the config but cannot build a model of (e.g. hidden_size not a multiple
            # of num_attention_heads): the config's fault, in one line
            raise AccelkitError(f"transformers cannot build the model this config describes: {describe_error(exc)}",
                                hint="fix the sizes in config.json (hidden_size a multiple of num_attention_heads, "
                                     "every size a positive whole number)") from None

    def build_any():
        if cls is not None:
            return cls(config)
        for auto in (transformers.AutoModelForCausalLM, transformers.AutoModel):
            try:
                return auto.from_config(config, trust_remote_code=False)
            except ValueError:
                continue
        raise AccelkitError(f"transformers has no model class for model_type `{config.model_type}`",
                            hint="upgrade transformers, or describe the model with --layers, --hidden and --heads")

    return build


_CLASS_PREFIX = re.compile(r"^\s*(?:[A-Za-z_][\w.]*(?:Error|Exception|Warning)):\s*")


def describe_error(exc: BaseException) -> str:
    """An exception in words: the line that says what is wrong, without exception class names (huggingface_hub's
    strict dataclasses put a header first and `TypeError: ...` below it)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return "no reason given"
    detail = [line for line in lines[1:] if _CLASS_PREFIX.match(line)]
    text = (detail[-1] if detail else lines[0])
    while _CLASS_PREFIX.match(text):
        text = _CLASS_PREFIX.sub("", text, count=1)
    return text.rstrip(":")
