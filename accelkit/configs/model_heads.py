"""The model's attention heads, where the model is known before any rank starts (`--model-config`, or a local model
folder the script is given), against the tensor-parallel size: transformers' TP plan splits every attention layer
by heads, so tp must divide both the attention heads and the kv heads, or every rank dies in its first forward.
Its decoder layers likewise, against the pipeline's stages (each stage holds whole layers). Read from config.json as
plain JSON: no model code runs."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from accelkit.errors import AccelkitError
from accelkit.hfmodel import config_file

# The script flags that name the model to load, as the templates and transformers' examples spell them.
MODEL_FLAGS = ("--model", "--model_name_or_path", "--model-name-or-path", "--model_path", "--model-path")


def _config_calls_in_script(path: Path) -> list[dict[str, int]]:
    """The integer keyword arguments of every `...Config(...)` call a training script makes with literal values
    (the templates' `LlamaConfig(num_hidden_layers=2, num_attention_heads=4, ...)`), read from its syntax tree:
    nothing runs. Empty when the script cannot be read or parsed."""
    import ast

    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return []
    calls = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "id", None) or getattr(node.func, "attr", None) or ""
        if name.endswith("Config"):
            calls.append({k.arg: k.value.value for k in node.keywords
                          if isinstance(k.value, ast.Constant) and isinstance(k.value.value, int)})
    return calls


def heads_in_script(path: Path) -> tuple[int, int] | None:
    """The heads of the one model config a training script builds in code with literal sizes; None when there is
    no such call, or several that disagree."""
    found = {(values["num_attention_heads"], values.get("num_key_value_heads", values["num_attention_heads"]))
             for values in _config_calls_in_script(path) if "num_attention_heads" in values}
    return found.pop() if len(found) == 1 else None


def read_heads(path: Path, option: str = "--model-config") -> tuple[int, int] | None:
    """(attention heads, kv heads) from the config.json at `path` (a file or a model folder), or from the model
    config a training script (`.py`) builds; None when there is no head count (not an attention model).
    AccelkitError when a config file cannot be read."""
    if Path(path).suffix == ".py":
        return heads_in_script(Path(path))
    for section in _config_sections(Path(path), option):
        heads = section.get("num_attention_heads")
        if isinstance(heads, int) and not isinstance(heads, bool) and heads > 0:
            kv = section.get("num_key_value_heads")
            return heads, kv if isinstance(kv, int) and not isinstance(kv, bool) and kv > 0 else heads
    return None


def model_from_script_args(args: Sequence[str], cwd: Path | None = None, script: str | None = None) -> Path | None:
    """Where the model's heads can be read before any rank starts: a local model folder with a config.json that
    the script is given (`--model ./my-model`); else, when the script is given no model at all, the script itself
    (the model config it builds in code, as the templates do); else None."""
    args = list(args)
    named = any(arg.partition("=")[0] in MODEL_FLAGS for arg in args)
    for i, arg in enumerate(args):
        name, _, value = arg.partition("=")
        if name not in MODEL_FLAGS:
            continue
        value = value or (args[i + 1] if i + 1 < len(args) else "")
        if value and ((cwd or Path.cwd()) / value / "config.json").is_file():
            return Path(value)
    if not named and script is not None and script.endswith(".py") and ((cwd or Path.cwd()) / script).is_file():
        return Path(script)
    return None


def tp_heads_problem(tp: int, heads: tuple[int, int]) -> tuple[str, str] | None:
    """(message, hint) when tensor parallelism `tp` does not split the heads, else None."""
    attention, kv = heads
    if tp <= 1 or (attention % tp == 0 and kv % tp == 0):
        return None
    fits = [d for d in range(2, attention + 1) if attention % d == 0 and kv % d == 0]
    names = f"{attention} attention heads" + (f" and {kv} kv heads" if kv != attention else "")
    fix = f"use a tp size that divides both ({', '.join(map(str, fits[:8]))})" if fits else \
        "drop tensor parallelism (no tp size splits them)"
    return (f"does not split the model's {names}: each tensor-parallel rank must hold whole heads",
            f"{fix}, or choose a model whose head counts it divides")


def _layers_in_script(path: Path) -> int | None:
    """The decoder layers of the one model config a training script builds in code with literal sizes
    (`LlamaConfig(..., num_hidden_layers=2)`); None when absent or ambiguous."""
    found = {values["num_hidden_layers"] for values in _config_calls_in_script(path) if "num_hidden_layers" in values}
    return found.pop() if len(found) == 1 else None


def read_layers(path: Path, option: str = "--model-config") -> int | None:
    """The model's decoder layers (`num_hidden_layers`) from its config.json or the script that builds it, for the
    pipeline's stage split; None when not stated. AccelkitError when a config file cannot be read."""
    if Path(path).suffix == ".py":
        return _layers_in_script(Path(path))
    for section in _config_sections(Path(path), option):
        layers = section.get("num_hidden_layers", section.get("n_layer"))
        if isinstance(layers, int) and not isinstance(layers, bool) and layers > 0:
            return layers
    return None


def _config_sections(path: Path, option: str) -> list[dict]:
    """The config.json at `path` (a file or a model folder) and its `text_config` (multimodal models keep the
    language model's sizes there), the dicts among them. AccelkitError when the file cannot be read."""
    file = config_file(path)
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise AccelkitError(f"{option} {path}: cannot read {file.name} ({reason})",
                            hint="give a model folder with a config.json, or the config.json itself") from None
    sections = (data, data.get("text_config") if isinstance(data, dict) else None)
    return [section for section in sections if isinstance(section, dict)]
