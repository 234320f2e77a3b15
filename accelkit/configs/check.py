"""Load a config file the way `accelerate launch` does, then add accelkit's findings."""

from __future__ import annotations

from pathlib import Path

from accelkit.configs.validate import Finding, problems
from accelkit.errors import AccelkitError


def _read(path: Path) -> tuple[dict | None, list[Finding]]:
    import yaml

    if not path.is_file():
        raise AccelkitError(f"config file {path} does not exist",
                            hint="write one with `accelkit config -o FILE`, or check the path")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return None, [Finding("error", f"{path} is not valid YAML: {detail}", "fix the YAML syntax at that spot")]
    if not isinstance(raw, dict):
        return None, [Finding("error", f"{path} does not hold a YAML mapping of config keys",
                              "regenerate it with `accelkit config -o FILE`")]
    return raw, []


def _accelerate_loader(path: Path) -> Exception | None:
    """Accelerate's own loader (what `accelerate launch --config_file` calls): None when it accepts the file."""
    from accelerate.commands.config.config_args import load_config_from_file

    try:
        load_config_from_file(str(path))
    except Exception as exc:  # its errors are ValueError/TypeError/KeyError; report any, never crash
        return exc
    return None


def _check(path: Path) -> tuple[dict | None, list[Finding]]:
    """The parsed file (None when it is not a YAML mapping) and its findings."""
    raw, found = _read(path)
    if raw is None:
        return None, found
    found = problems(raw)
    failure = _accelerate_loader(path)
    explained = any(f.severity == "error" and ("unknown key `" in f.message and "." not in f.message.split("`")[1]
                                               or "distributed_type" in f.message) for f in found)
    if failure is not None and not explained:
        found.insert(0, Finding("error", f"Accelerate's loader refuses the file: {failure}",
                                "fix the value it names (or regenerate with `accelkit config`)"))
    return raw, found


def check_config(path: Path) -> list[Finding]:
    """Findings for the config file at `path` (empty: Accelerate loads it and accelkit sees no problem)."""
    return _check(Path(path))[1]


def load_config(path: Path) -> dict:
    """The config dict in `path`, after Accelerate's loader and accelkit's checks accept it (AccelkitError if not).
    Warnings do not stop loading; call check_config to see them."""
    path = Path(path)
    raw, found = _check(path)
    errors = [f for f in found if f.severity == "error"]
    if errors:
        more = f" (and {len(errors) - 1} more: `accelkit config --check {path}`)" if len(errors) > 1 else ""
        raise AccelkitError(f"{path}: {errors[0].message}{more}", hint=errors[0].fix)
    return raw or {}
