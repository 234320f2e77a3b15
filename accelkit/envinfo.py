"""What `accelkit env` reports: versions, accelerator hardware, and the default Accelerate config in effect."""

from __future__ import annotations

import platform
import sys
from importlib import metadata
from pathlib import Path

from accelkit.command_result import CommandResult

PACKAGES = ("accelkit", "torch", "accelerate", "transformers", "datasets", "deepspeed", "safetensors",
            "huggingface_hub")


def installed_version(name: str) -> str | None:
    """Installed version from package metadata, without importing the package (deepspeed imports are slow); None
    when it is not installed."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _torch_info() -> dict:
    info: dict = {"cuda_available": False, "cuda_version": None, "nccl_available": False, "nccl_version": None,
                  "gloo_available": False, "gpus": []}
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return info
    info["cuda_version"] = torch.version.cuda
    info["cuda_available"] = bool(torch.cuda.is_available())
    if dist.is_available():
        info["nccl_available"] = bool(dist.is_nccl_available())
        info["gloo_available"] = bool(dist.is_gloo_available())
    if info["cuda_available"]:
        try:
            info["nccl_version"] = ".".join(str(v) for v in torch.cuda.nccl.version())
        except Exception:  # NCCL missing from this build
            info["nccl_version"] = None
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            info["gpus"].append({"index": index, "name": props.name,
                                 "memory_gib": round(props.total_memory / 2**30, 1)})
    return info


def _default_accelerate_config() -> dict:
    """The file `accelerate launch` uses when no --config_file is given, and what it holds."""
    try:
        from accelerate.commands.config.config_args import default_config_file
    except ImportError:
        return {"path": None, "exists": False, "contents": None}
    path = Path(default_config_file)
    if not path.is_file():
        return {"path": str(path), "exists": False, "contents": None}
    try:
        import yaml

        contents = yaml.safe_load(path.read_text(encoding="utf-8"))
    except Exception as exc:  # a broken default config is itself worth reporting
        contents = {"error": f"cannot be read: {exc}"}
    return {"path": str(path), "exists": True, "contents": contents}


def collect() -> dict:
    torch_info = _torch_info()
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "versions": {name: installed_version(name) for name in PACKAGES},
        "cuda_available": torch_info["cuda_available"],
        "cuda_version": torch_info["cuda_version"],
        "nccl_available": torch_info["nccl_available"],
        "nccl_version": torch_info["nccl_version"],
        "gloo_available": torch_info["gloo_available"],
        "gpu_count": len(torch_info["gpus"]),
        "gpus": torch_info["gpus"],
        "accelerate_default_config": _default_accelerate_config(),
        "nd_layouts": _nd_layouts(),
    }


def _nd_layouts() -> list[dict]:
    """The N-D layouts the installed packages cannot run, one line each with the versions that work."""
    from accelkit.configs import installed_layout_gaps

    return [{"layout": gap.layout, "problem": gap.message, "works": gap.hint} for gap in installed_layout_gaps()]


def format_text(info: dict) -> str:
    import yaml

    def yes(value: bool) -> str:
        return "yes" if value else "no"

    lines = [f"{'python':<16}{info['python']} ({info['platform']})"]
    for name, version in info["versions"].items():
        lines.append(f"{name:<16}{version or 'not installed'}")
    cuda = f"yes (CUDA {info['cuda_version']})" if info["cuda_available"] else \
        f"no (torch built for CUDA {info['cuda_version']})" if info["cuda_version"] else "no (CPU-only torch build)"
    lines.append(f"{'cuda':<16}{cuda}")
    nccl = yes(info["nccl_available"]) + (f" ({info['nccl_version']})" if info["nccl_version"] else "")
    lines.append(f"{'nccl':<16}{nccl}")
    lines.append(f"{'gloo':<16}{yes(info['gloo_available'])}")
    lines.append(f"{'gpus':<16}{info['gpu_count']}")
    for gpu in info["gpus"]:
        lines.append(f"  [{gpu['index']}] {gpu['name']}, {gpu['memory_gib']} GiB")
    gaps = info.get("nd_layouts") or []
    lines.append(f"{'n-d layouts':<16}" + ("every layout's packages are present" if not gaps else
                                           f"{len(gaps)} cannot run here:"))
    for gap in gaps:
        lines.append(f"  {gap['problem']}; {gap['works']}")
    default = info["accelerate_default_config"]
    if default["exists"]:
        lines.append(f"accelerate default config: {default['path']}")
        body = yaml.safe_dump(default["contents"], sort_keys=False, default_flow_style=False).rstrip()
        lines.extend("  " + line for line in body.splitlines())
    else:
        where = f" ({default['path']} does not exist)" if default["path"] else ""
        lines.append(f"accelerate default config: none{where}")
    return "\n".join(lines)


def run_env(as_json: bool = False) -> CommandResult:
    """`accelkit env` as one call: the environment as text, or as JSON."""
    import json

    info = collect()
    return CommandResult().out(json.dumps(info, indent=2) if as_json else format_text(info))

