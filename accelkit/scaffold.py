"""List the training templates and copy one into a new project, with an Accelerate config and a README.

A template is a directory templates/<name>/ holding a runnable train.py (plus README.md and any data it needs).
Its one-line description is the first line of train.py's module docstring: the template is the only registry.
"""

from __future__ import annotations

import ast
import os
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from accelkit.command_result import CommandResult
from accelkit.errors import AccelkitError
from accelkit.resources import templates_dir
from accelkit.shellwords import command_line

CONFIG_FILE = "accelerate_config.yaml"
PROJECT_README = "README.md"
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", "outputs", ".ipynb_checkpoints")


@dataclass(frozen=True)
class Template:
    name: str
    path: Path
    description: str


@dataclass(frozen=True)
class Project:
    """What `init_project` wrote."""

    directory: Path
    template: Template
    config_path: Path
    backend: str
    num_processes: int
    commands: dict[str, str]  # purpose -> command, relative to the project directory
    replaced: list[tuple[Path, Path]] = field(default_factory=list)  # --force: (file replaced, its .bak backup)


def _description(train_py: Path) -> str:
    try:
        docstring = ast.get_docstring(ast.parse(train_py.read_text(encoding="utf-8")))
    except (OSError, SyntaxError, UnicodeDecodeError):
        docstring = None
    return docstring.strip().splitlines()[0].strip() if docstring else "(no description: train.py has no docstring)"


def list_templates() -> list[Template]:
    """Every templates/<name>/ that holds a train.py, sorted by name."""
    root = templates_dir()
    if not root.is_dir():
        return []
    return [
        Template(path.name, path, _description(path / "train.py"))
        for path in sorted(root.iterdir())
        if path.is_dir() and (path / "train.py").is_file()
    ]


def find_template(name: str) -> Template:
    templates = list_templates()
    for template in templates:
        if template.name == name:
            return template
    available = ", ".join(t.name for t in templates) or "(none found)"
    raise AccelkitError(f"unknown template `{name}`; available: {available}",
                        hint="run `accelkit init --list` to see each template with its description")


def _check_target(directory: Path, force: bool) -> None:
    if directory.exists() and not directory.is_dir():
        raise AccelkitError(f"{directory} exists and is not a directory", hint="choose another project directory")
    if directory.is_dir() and any(directory.iterdir()) and not force:
        raise AccelkitError(f"{directory} is not empty",
                            hint="choose a new directory, or pass --force to write the template files into it "
                                 "(files with the same names are replaced; others are kept)")


def _project_commands(backend: str, num_processes: int) -> dict[str, str]:
    from accelkit.configs import Backend

    rehearsal_backend = backend if Backend(backend).needs_gpus else Backend.DDP.value
    return {
        "try it on this machine (one process)": "python train.py --max-steps 20",
        f"launch with {CONFIG_FILE} ({backend}, {num_processes} process(es))":
            f"accelkit launch --config {CONFIG_FILE} train.py",
        f"rehearse {rehearsal_backend} on 2 CPU processes (no GPU needed)":
            f"accelkit launch --backend {rehearsal_backend} --cpu --num-processes 2 train.py --max-steps 20",
        "continue an interrupted run from its last checkpoint":
            f"accelkit launch --config {CONFIG_FILE} train.py --resume-from-checkpoint latest",
        "merge a checkpoint (N = its step) into one safetensors directory":
            "accelkit merge-ckpt outputs/checkpoint-N -o merged/",
    }


def _readme(name: str, template: Template, init_line: str, commands: dict[str, str]) -> str:
    lines = [
        f"# {name}",
        "",
        f"Made by `{init_line}` from the `{template.name}` template: {template.description}",
        "",
        "## Commands for this project",
        "",
        "Run them from this directory. Checkpoints go to `outputs/checkpoint-<step>`, the final model (safetensors,",
        "loadable with `from_pretrained`) to `outputs/final`. `python train.py --help` lists every flag.",
        "",
        "```bash",
    ]
    for purpose, command in commands.items():
        lines += [f"# {purpose}", command]
    lines += [
        "```",
        "",
        f"`{CONFIG_FILE}` is a plain Accelerate config (`accelerate launch --config_file {CONFIG_FILE} train.py` "
        "works too). Make configs for other setups with `accelkit config` (e.g. `accelkit config --backend fsdp "
        "--num-processes 8 -o fsdp.yaml`).",
        "",
    ]
    template_readme = template.path / "README.md"
    if template_readme.is_file():
        lines += ["---", "", template_readme.read_text(encoding="utf-8").rstrip(), ""]
    return "\n".join(lines)


def init_project(directory: Path, template_name: str, backend: str = "ddp", num_processes: int | None = None,
                 force: bool = False) -> Project:
    """Copy a template into `directory`, with an Accelerate config for `backend` and a README of commands.

    Everything is written into a staging directory first: a failure leaves `directory` as it was. With --force into
    a non-empty directory, each file the template replaces is kept beside it as NAME.bak (listed in `replaced`).
    """
    from accelkit.configs import ConfigOptions, resolve_config, write_config
    from accelkit.fsio import StagedOutput, write_error

    template = find_template(template_name)
    directory = Path(directory)
    _check_target(directory, force)
    config = resolve_config(ConfigOptions(backend=backend, num_processes=num_processes))  # validates before any write
    init_line = command_line("accelkit", "init", directory,
                             flags=[("--template", template.name), ("--backend", backend),
                                    ("--num-processes", num_processes)])
    processes = config.num_processes
    commands = _project_commands(backend, processes)

    staged = StagedOutput(directory, is_dir=True)
    replaced: list[tuple[Path, Path]] = []
    try:
        with staged as staging:
            _copy_tree(template.path, staging)
            (staging / PROJECT_README).write_text(_readme(directory.name, template, init_line, commands),
                                                  encoding="utf-8")
            write_config(config, staging / CONFIG_FILE, init_line)
            if directory.is_dir() and any(directory.iterdir()):
                replaced = _merge_into(staging, directory)
            else:
                if directory.is_dir():
                    directory.rmdir()
                staged.commit()
    except OSError as exc:
        raise write_error(exc, directory) from None
    return Project(directory, template, directory / CONFIG_FILE, backend, processes, commands, replaced)


def _copy_tree(source: Path, target: Path) -> None:
    """Copy a template folder (without caches and outputs); an OSError stops at once with its errno intact."""
    ignored = IGNORED(str(source), [p.name for p in source.iterdir()])
    for entry in sorted(source.iterdir()):
        if entry.name in ignored:
            continue
        if entry.is_dir():
            (target / entry.name).mkdir()
            _copy_tree(entry, target / entry.name)
        else:
            shutil.copy2(entry, target / entry.name)


def _backup_name(path: Path) -> Path:
    backup = path.with_name(path.name + ".bak")
    n = 1
    while backup.exists():
        backup = path.with_name(f"{path.name}.bak.{n}")
        n += 1
    return backup


def _merge_into(staging: Path, directory: Path) -> list[tuple[Path, Path]]:
    """--force into a non-empty directory: put the template's files in place, keep every other file, and keep each
    file that is replaced by a different one as NAME.bak beside it. Returns (replaced file, its backup) pairs."""
    from accelkit.fsio import writable_target

    sources = sorted(staging.rglob("*"))
    for source in sources:  # every refusal (a FIFO, a device, a folder where a file goes) before the first write
        writable_target(directory / source.relative_to(staging), is_dir=source.is_dir())
    replaced: list[tuple[Path, Path]] = []
    for source in sources:
        target = directory / source.relative_to(staging)
        if source.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        if target.is_file() and target.read_bytes() != source.read_bytes():
            backup = _backup_name(target)
            os.replace(target, backup)
            replaced.append((target, backup))
        shutil.copy2(source, target)
    return replaced


def run_init(directory: Path | None, template: str | None, *, backend: str = "ddp", num_processes: int | None = None,
             force: bool = False, listing: bool = False) -> CommandResult:
    """`accelkit init` as one call: the template list (`listing`), or a new project and what to run next."""
    result = CommandResult()
    if listing:
        templates = list_templates()
        width = max((len(t.name) for t in templates), default=0)
        for known in templates:
            result.out(f"{known.name.ljust(width)}  {known.description}")
        return result.err("\nStart a project with `accelkit init DIR --template NAME [--backend B]`.")
    if template is None:
        raise AccelkitError("no template given", hint="pass --template NAME; `accelkit init --list` shows them")
    assert directory is not None  # the CLI asks for DIRECTORY
    project = init_project(directory, template, backend=backend, num_processes=num_processes, force=force)
    result.out(f"Created {directory}/ from template `{project.template.name}` with {project.config_path.name} "
               f"({project.backend}, {project.num_processes} process(es)).")
    for replaced, backup in project.replaced:
        result.out(f"Replaced {replaced} (your version is kept as {backup.name}).")
    result.out(f"\nNext (see {directory}/README.md):\n  cd {shlex.quote(str(directory))}")
    for purpose, line in project.commands.items():
        result.out(f"  {line:<90}  # {purpose}")
    return result
