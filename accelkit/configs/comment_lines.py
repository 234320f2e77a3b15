"""The comment lines accelkit writes into a config file (its pipeline, its gradient compression), read back.

A leaf module (standard library only): pipeline_spec and the compression package read these lines without importing
files.py, which imports the whole config reader (and pipeline_spec with it)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any


def comment_spec(config_file: Path | str, read_comment: Callable[[str, str], Any]) -> Any:
    """What a comment line accelkit wrote into a config file carries (its pipeline, its gradient compression),
    parsed by `read_comment(text, label)`; None when the file cannot be read or has no such line."""
    try:
        text = Path(config_file).read_text(errors="replace")
    except OSError:
        return None
    return read_comment(text, str(config_file))

