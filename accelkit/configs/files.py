"""Config files on disk: load one the way `accelerate launch` does (syntax errors with their line and column), and
check one (`accelkit config --check`): Accelerate's own loader, what only a file can get wrong, and the rule set."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from accelkit.configs import rules
from accelkit.configs.findings import ERROR, Finding, raise_first_error
from accelkit.configs.reader import read_config, read_layer
from accelkit.configs.resolved import FILE, Source
from accelkit.errors import AccelkitError

# Findings that already say why Accelerate's loader refuses a file.
_LOADER_EXPLAINED = ("unknown-key", "missing-distributed-type")


def load_yaml(path: Path) -> dict[str, Any]:
    """The mapping in a YAML config file. AccelkitError for an empty path, a missing or unreadable file, a syntax
    error (naming the file, line and column) or a file that is not a mapping."""
    import yaml

    if str(path) in ("", "."):
        raise AccelkitError("the config path is empty", hint="give the path of an Accelerate config YAML file")
    path = Path(path)
    if not path.is_file():
        what = "is a folder, not a" if path.is_dir() else "does not exist: no such"
        raise AccelkitError(f"config file {path} {what} file",
                            hint="write one with `accelkit config -o FILE`, or check the path")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise AccelkitError(f"config file {path} cannot be read: {reason}",
                            hint="check the file's permissions and that it is UTF-8 text") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise AccelkitError(_yaml_error(path, exc), hint="fix the YAML syntax at that line and column") from None
    if not isinstance(raw, dict):
        raise AccelkitError(f"{path} does not hold a YAML mapping of config keys",
                            hint="regenerate it with `accelkit config -o FILE`")
    return raw


def _yaml_error(path: Path, exc: Exception) -> str:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
    problem = getattr(exc, "problem", None) or (str(exc).splitlines() or [type(exc).__name__])[0]
    context = getattr(exc, "context", None)
    return f"{where}: not valid YAML: {problem}" + (f" ({context})" if context else "")


def _accelerate_loader(path: Path) -> Exception | None:
    """Accelerate's own loader (what `accelerate launch --config_file` calls): None when it accepts the file."""
    from accelerate.commands.config.config_args import load_config_from_file

    try:
        load_config_from_file(str(path))
    except Exception as exc:  # its errors are ValueError/TypeError/KeyError; report any, never crash
        return exc
    return None


def _loader_finding(path: Path, found: list[Finding]) -> list[Finding]:
    failure = _accelerate_loader(path)
    if failure is None or any(f.code in _LOADER_EXPLAINED for f in found):
        return []
    return [Finding("accelerate-refuses", ERROR, f"Accelerate's loader refuses the file: {failure}",
                    "fix the value it names (or regenerate with `accelkit config`)")]


def _written_for_cluster_job(path: Path) -> bool:
    from accelkit.configs.render import is_cluster_template_text

    try:
        return is_cluster_template_text(path.read_text(errors="replace")[:2000])
    except OSError:
        return False


def check_config(path: Path) -> list[Finding]:
    """Every finding for the config file at `path` as `accelerate launch` would use it: Accelerate's loader, what
    the file gets wrong, and the rule set (empty: no problem). AccelkitError when it cannot be read as YAML."""
    path = Path(path)
    raw = load_yaml(path)
    resolved, found = read_config(raw, Source(FILE, str(path)))
    if resolved is not None:
        if resolved.num_machines > 1 and _written_for_cluster_job(path):
            resolved = dataclasses.replace(resolved, per_machine=False)
        resolved, pipeline_found = _with_pipeline(path, resolved)
        found = found + pipeline_found + rules.check_rules(resolved)
    found += _compression_findings(path, resolved) if resolved is not None else []
    return _loader_finding(path, found) + found


def load_accelerate_config(path: Path) -> dict[str, Any]:
    """The config dict in `path`, once Accelerate's loader and the file checks accept it (AccelkitError if not).
    The rule set runs later, on the config a command builds from it (options given on the command line may
    change the verdict); `check_config` shows every finding."""
    path = Path(path)
    raw = load_yaml(path)
    found = read_layer(raw, Source(FILE, str(path))).findings
    found = _loader_finding(path, found) + found
    raise_first_error(found, prefix=f"{path}: ", more=f": `accelkit config --check {path}`")
    return raw


def _with_pipeline(path: Path, resolved: Any) -> tuple[Any, list[Finding]]:
    """The config with the pipeline its `# accelkit-pipeline:` line carries (accelkit.configs.pipeline_spec), so the
    rule set checks it as `accelkit launch --config` will run it."""
    from accelkit.configs.pipeline_spec import COMMENT_KEY, read_pipeline_comment
    from accelkit.configs.resolved import ParallelismSettings

    try:
        spec = read_pipeline_comment(path.read_text(encoding="utf-8", errors="replace"), str(path))
    except AccelkitError as exc:
        return resolved, [Finding("pipeline-line", ERROR, f"the {COMMENT_KEY} line: {exc.message}", exc.hint or "")]
    if spec is None:
        return resolved, []
    if resolved.parallelism is not None:
        return resolved, [Finding("pipeline-and-parallelism-config", ERROR, f"{path} has both an {COMMENT_KEY} line "
                                  "and a parallelism_config: a pipeline's mesh lives in the comment line alone",
                                  "regenerate it with `accelkit config ... --pp-size N`")]
    layout = ParallelismSettings(dp_shard=spec.dp_shard, tp=spec.tp, pp=spec.pp, pp_schedule=spec.schedule,
                                 microbatches=spec.microbatches or spec.pp)
    origin = Source(FILE, f"{path} ({COMMENT_KEY})")
    sources = {**resolved.sources, **{name: origin for name in ("pp_size", "pp_schedule", "microbatches",
                                                                 "dp_shard_size", "tp_size")}}
    return dataclasses.replace(resolved, parallelism=layout, sources=sources), []


def _compression_findings(path: Path, resolved: Any) -> list[Finding]:
    """The gradient compression a config written by `accelkit config` carries in its comment line, checked against
    the file's backend (accelkit.compression)."""
    from accelkit.compression.checks import check_backend
    from accelkit.compression.compression_spec import read_compression_comment

    try:
        spec = read_compression_comment(path.read_text(encoding="utf-8", errors="replace"), str(path))
        if spec is not None:
            check_backend(spec, resolved)
    except AccelkitError as exc:
        return [Finding("grad-compression", ERROR, f"the accelkit-grad-compression line: {exc.message}",
                        exc.hint or "")]
    return []
