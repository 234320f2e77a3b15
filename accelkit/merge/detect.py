"""Recognise a checkpoint layout and explain the decision, so the user sees what was merged and why.

Order matters: the most specific layouts first. Each branch appends a sentence to `why`.
"""

from __future__ import annotations

import re
from pathlib import Path

from accelkit.errors import AccelkitError
from accelkit.merge import dcp, deepspeed, hf_sharded, single_file
from accelkit.merge.source import CheckpointSource

_ACCELERATE_FSDP = re.compile(r"^pytorch_model_fsdp_(\d+)$")

SUPPORTED = (
    "a torch DCP folder (.metadata + __*_*.distcp; or an Accelerate save_state folder with pytorch_model_fsdp_0/), "
    "a DeepSpeed ZeRO checkpoint (folder with `latest`, or a tag folder with *_optim_states.pt), "
    "HF sharded safetensors (*.safetensors.index.json), a .safetensors file, or a .bin/.pt/.pth state dict"
)


def _accelerate_model_dirs(path: Path) -> dict[int, Path]:
    found = {}
    for p in path.iterdir():
        m = _ACCELERATE_FSDP.match(p.name)
        if m and dcp.is_dcp_dir(p):
            found[int(m.group(1))] = p
    return found


def open_source(path: Path, tag: str | None = None, model_index: int | None = None) -> CheckpointSource:
    if not path.exists():
        raise AccelkitError(f"input {path} does not exist", hint="pass the checkpoint folder or file to merge")
    why: list[str] = []
    source = _detect(path, tag, model_index, why)
    source.notes[:0] = why
    return source


def _detect(path: Path, tag: str | None, model_index: int | None, why: list[str]) -> CheckpointSource:
    if path.is_file():
        if path.name.endswith(".safetensors.index.json"):
            why.append(f"{path.name} is a safetensors index")
            return hf_sharded.SafetensorsSource(path)
        if path.suffix == ".safetensors":
            why.append(f"{path.name} is a safetensors file")
            return hf_sharded.SafetensorsSource(path)
        if path.suffix in single_file.SUFFIXES:
            why.append(f"{path.name} is a torch state-dict file (loaded with weights_only=True)")
            return single_file.TorchFileSource(path)
        raise AccelkitError(f"{path} is not a checkpoint file merge-ckpt reads", hint=f"supported: {SUPPORTED}")
    if dcp.is_dcp_dir(path):
        why.append(f"{path.name}/ holds {dcp.METADATA_FILE} and .distcp shards: a torch DCP checkpoint")
        return dcp.DCPSource(path)
    models = _accelerate_model_dirs(path)
    if models:
        index = model_index if model_index is not None else 0
        if index not in models:
            raise AccelkitError(f"no pytorch_model_fsdp_{index}/ in {path}",
                                hint=f"--model-index takes one of {sorted(models)}")
        chosen = models[index]
        how = "--model-index" if model_index is not None else "the first model"
        extra = f" ({len(models)} models saved; pick another with --model-index)" if len(models) > 1 else ""
        kind = "a Trainer checkpoint folder" if (path / "trainer_state.json").is_file() else \
            "an Accelerate save_state folder"
        why.append(f"{path.name}/ is {kind}: merging {chosen.name}/ ({how}){extra}")
        return dcp.DCPSource(chosen)
    if model_index is not None:
        raise AccelkitError("--model-index applies only to Accelerate save_state folders with FSDP models",
                            hint=f"{path} has no pytorch_model_fsdp_N/ folders")
    if (path / "latest").is_file() or tag is not None or deepspeed.is_deepspeed_tag_dir(path):
        why.append(f"{path.name}/ is a DeepSpeed checkpoint (latest file / *_optim_states.pt)")
        return deepspeed.DeepSpeedSource(path, tag)
    # Accelerate's DeepSpeed save_state: <ckpt>/pytorch_model/ holds `latest` or the tag folders.
    if (path / "pytorch_model").is_dir() and ((path / "pytorch_model" / "latest").is_file()
                                              or deepspeed.is_deepspeed_tag_dir(path / "pytorch_model")):
        why.append(f"{path.name}/ is an Accelerate save_state folder with a DeepSpeed checkpoint in pytorch_model/")
        return deepspeed.DeepSpeedSource(path / "pytorch_model", tag)
    if (index := hf_sharded.find_index(path)) is not None:
        why.append(f"{path.name}/ holds {index.name}: HF sharded safetensors")
        return hf_sharded.SafetensorsSource(path)
    singles = sorted(p for p in path.iterdir() if p.is_file() and p.suffix == ".safetensors")
    if len(singles) == 1:
        why.append(f"{path.name}/ holds one safetensors file, {singles[0].name}")
        return hf_sharded.SafetensorsSource(singles[0])
    bins = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in single_file.SUFFIXES)
    if len(bins) == 1:
        why.append(f"{path.name}/ holds one torch state-dict file, {bins[0].name}")
        return single_file.TorchFileSource(bins[0])
    listing = ", ".join(sorted(p.name + ("/" if p.is_dir() else "") for p in path.iterdir())[:8]) or "nothing"
    raise AccelkitError(f"{path} is not a checkpoint layout merge-ckpt knows (found: {listing})",
                        hint=f"supported: {SUPPORTED}")
