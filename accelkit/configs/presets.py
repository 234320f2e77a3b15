"""The presets in accelerate_configs/: each file is the registry entry, its first comment line the description."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from accelkit.errors import AccelkitError
from accelkit.resources import configs_dir


@dataclass(frozen=True)
class Preset:
    name: str
    path: Path
    description: str


def _description(path: Path) -> str:
    with path.open(encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line.startswith("#"):
                return line.lstrip("#").strip()
            if line:
                break
    return "(no description: the file should start with a `# ...` comment line)"


def list_presets() -> list[Preset]:
    return [Preset(p.stem, p, _description(p)) for p in sorted(configs_dir().glob("*.yaml"))]


def preset_path(name: str) -> Path:
    import difflib

    presets = {p.name: p for p in list_presets()}
    if name in presets:
        return presets[name].path
    close = difflib.get_close_matches(name, list(presets), n=1)
    suggestion = f"did you mean `{close[0]}`? " if close else ""
    raise AccelkitError(f"unknown preset `{name}`",
                        hint=f"{suggestion}`accelkit config --list` shows the presets: {', '.join(presets)}")


def load_preset(name: str) -> dict:
    import yaml

    with preset_path(name).open(encoding="utf-8") as f:
        return yaml.safe_load(f) or {}
