"""Locate templates/ and accelerate_configs/ in a checkout (read live) or inside an installed wheel."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

_CHECKOUT_ROOT = Path(__file__).resolve().parent.parent


def _data_dir(name: str) -> Path:
    # A checkout or editable install reads the top-level folder directly, so edits show up without reinstalling.
    live = _CHECKOUT_ROOT / name
    if live.is_dir() and (_CHECKOUT_ROOT / "pyproject.toml").is_file():
        return live
    # A wheel installs the folder as accelkit/<name> (see pyproject.toml's package-dir).
    return Path(str(resources.files("accelkit") / name))


def templates_dir() -> Path:
    return _data_dir("templates")


def configs_dir() -> Path:
    return _data_dir("accelerate_configs")
