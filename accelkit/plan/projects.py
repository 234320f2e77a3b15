"""A project made by `accelkit init` as MODEL: the model its train.py builds by default.

The project is recognised by its train.py's first docstring line, which is the template's description (the same
registry `accelkit init --list` reads). Its model comes from the project's own functions (imported from train.py,
so a project whose model was edited is planned as edited), built on the meta device; the default sequence length
and per-device batch come from its argument parser.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

from accelkit.errors import AccelkitError
from accelkit.plan.models import ModelSpec, hf_inputs, hf_step


def find_project(path: Path) -> tuple[Path, str] | None:
    directory = path if path.is_dir() else None
    if directory is None or not (directory / "train.py").is_file():
        return None
    try:
        docstring = ast.get_docstring(ast.parse((directory / "train.py").read_text(encoding="utf-8")))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    first = docstring.strip().splitlines()[0].strip() if docstring else ""
    from accelkit.scaffold import list_templates

    for template in list_templates():
        if template.description == first:
            return directory, template.name
    return None


def _load(train_py: Path):
    name = f"accelkit_plan_project_{abs(hash(str(train_py)))}"
    spec = importlib.util.spec_from_file_location(name, train_py)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(train_py.parent))
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise AccelkitError(f"cannot import {train_py}: {type(exc).__name__}: {exc}",
                            hint="fix the script, or plan from the model's config.json instead") from None
    finally:
        sys.path.remove(str(train_py.parent))
    return module


def _needs(module, train_py: Path, *names: str) -> None:
    missing = [n for n in names if not hasattr(module, n)]
    if missing:
        raise AccelkitError(f"{train_py} no longer defines {', '.join(missing)} (from its template)",
                            hint="plan from the model's config.json instead, or restore the function")


def spec_from_project(directory: Path, template: str) -> ModelSpec:
    train_py = directory / "train.py"
    module = _load(train_py)
    if hasattr(module, "load_dataset"):  # the model needs labels and words, not the datasets machinery
        from accelkit.plan.project_data import load_in_memory

        module.load_dataset = load_in_memory
    _needs(module, train_py, "parse_args")
    args = module.parse_args([])
    label = f"{directory} (accelkit project, template {template})"
    spec = ModelSpec(label=label, inputs=hf_inputs, step=hf_step, script=train_py,
                     micro_batch=getattr(args, "per_device_batch_size", None))
    if getattr(args, "model", None):
        raise AccelkitError(f"{train_py} defaults to the pretrained model {args.model}",
                            hint=f"plan it by name: accelkit plan {args.model} ...")
    if template == "causal-lm":
        _needs(module, train_py, "build_tokenizer_and_model")
        spec.build = lambda: module.build_tokenizer_and_model(args)[1]
        spec.seq_len = args.block_size
    elif template == "seq-classification":
        _needs(module, train_py, "build_tokenizer_and_model", "load_raw_datasets", "label_names")
        raw = module.load_raw_datasets(args)
        labels = module.label_names(raw, args.label_column)
        spec.build = lambda: module.build_tokenizer_and_model(args, raw, labels)[1]
        spec.seq_len = args.max_length
    elif template == "image-classification":
        _needs(module, train_py, "build_processor_and_model", "load_raw_datasets")
        raw = module.load_raw_datasets(args)
        labels = raw["train"].features[args.label_column].names
        spec.build = lambda: module.build_processor_and_model(args, labels)[1]
        spec.sequence_input = False
    elif template == "minimal":
        _needs(module, train_py, "MLPClassifier", "IN_FEATURES", "NUM_CLASSES")
        spec.build = lambda: module.MLPClassifier(module.IN_FEATURES, args.hidden_size, module.NUM_CLASSES)
        spec.inputs = lambda model, micro_batch, seq_len: _mlp_batch(module, micro_batch)
        spec.step = _mlp_step
        spec.sequence_input = False
    else:
        raise AccelkitError(f"the plan does not know template `{template}` yet",
                            hint="plan from the model's config.json, or describe it with shape flags")
    return spec


def _mlp_batch(module, micro_batch: int) -> dict:
    import torch

    return {"x": torch.zeros((micro_batch, module.IN_FEATURES), device="meta"),
            "y": torch.zeros((micro_batch,), dtype=torch.long, device="meta")}


def _mlp_step(model, batch: dict):
    """The minimal template's step: cross-entropy on the model's logits, computed in the script."""
    import torch

    logits = model(batch["x"])
    return torch.nn.functional.cross_entropy(logits, batch["y"]), logits
