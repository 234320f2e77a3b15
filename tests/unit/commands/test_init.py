"""`accelkit init`: lists the templates from their own docstrings, scaffolds a project (template copied as it is,
an Accelerate config for the backend, a README with this project's commands), and never overwrites or half-writes."""

from __future__ import annotations

import ast
from pathlib import Path

import yaml
from helpers import REPO_ROOT, invoke_accelkit

TEMPLATES_DIR = REPO_ROOT / "templates"
TEMPLATES = ("causal-lm", "image-classification", "minimal", "seq-classification")


def docstring_first_line(train_py: Path) -> str:
    return ast.get_docstring(ast.parse(train_py.read_text())).splitlines()[0]


def tree(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_list_shows_every_template_with_its_docstring() -> None:
    proc = invoke_accelkit("init", "--list", check=True)
    lines = proc.stdout.strip().splitlines()
    assert [line.split()[0] for line in lines] == list(TEMPLATES)
    for name, line in zip(TEMPLATES, lines, strict=True):
        assert line.split(None, 1)[1] == docstring_first_line(TEMPLATES_DIR / name / "train.py")


def test_init_copies_template_and_writes_config_and_readme(tmp_path: Path) -> None:
    project = tmp_path / "my-run"
    proc = invoke_accelkit("init", str(project), "--template", "causal-lm", "--backend", "fsdp", "--num-processes", "4",
                        check=True)
    # The template is copied as it is (train.py, its README, its data), plus the config and the project README.
    template_files = tree(TEMPLATES_DIR / "causal-lm")
    project_files = tree(project)
    for name, content in template_files.items():
        if name != "README.md":
            assert project_files[name] == content, name
    assert set(project_files) == set(template_files) | {"accelerate_config.yaml"}

    config = yaml.safe_load((project / "accelerate_config.yaml").read_text())
    assert config["distributed_type"] == "FSDP" and config["num_processes"] == 4
    check = invoke_accelkit("config", "--check", str(project / "accelerate_config.yaml"))
    assert check.returncode == 0, check.stderr

    readme = (project / "README.md").read_text()
    for command in ("accelkit launch --config accelerate_config.yaml train.py",
                    "accelkit launch --backend fsdp --cpu --num-processes 2 train.py",
                    "accelkit merge-ckpt outputs/checkpoint-N -o merged/",
                    "--resume-from-checkpoint latest"):
        assert command in readme and command in proc.stdout
    assert (TEMPLATES_DIR / "causal-lm" / "README.md").read_text().strip() in readme  # the template's own docs
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging directory left behind


def test_init_refuses_non_empty_directory_without_force(tmp_path: Path) -> None:
    project = tmp_path / "busy"
    project.mkdir()
    (project / "train.py").write_text("# my own work\n")
    proc = invoke_accelkit("init", str(project), "--template", "minimal")
    assert proc.returncode == 1
    assert "is not empty" in proc.stderr and "--force" in proc.stderr
    assert tree(project) == {"train.py": b"# my own work\n"}  # untouched

    forced = invoke_accelkit("init", str(project), "--template", "minimal", "--force", "--backend", "deepspeed")
    assert forced.returncode == 0, forced.stderr
    assert (project / "train.py").read_bytes() == (TEMPLATES_DIR / "minimal" / "train.py").read_bytes()
    assert yaml.safe_load((project / "accelerate_config.yaml").read_text())["distributed_type"] == "DEEPSPEED"


def test_init_into_existing_empty_directory(tmp_path: Path) -> None:
    project = tmp_path / "empty"
    project.mkdir()
    invoke_accelkit("init", str(project), "--template", "seq-classification", check=True)
    assert (project / "data" / "train.csv").is_file()
    assert yaml.safe_load((project / "accelerate_config.yaml").read_text())["distributed_type"] == "MULTI_GPU"


def test_unknown_template_lists_the_available_ones_and_writes_nothing(tmp_path: Path) -> None:
    proc = invoke_accelkit("init", str(tmp_path / "x"), "--template", "gpt5")
    assert proc.returncode == 1
    assert "unknown template `gpt5`" in proc.stderr
    for name in TEMPLATES:
        assert name in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_bad_config_leaves_no_directory(tmp_path: Path) -> None:
    proc = invoke_accelkit("init", str(tmp_path / "x"), "--template", "minimal", "--backend", "single",
                        "--num-processes", "4")
    assert proc.returncode == 1 and proc.stderr.startswith("Error:")
    assert list(tmp_path.iterdir()) == []


def test_missing_template_option_is_explained(tmp_path: Path) -> None:
    proc = invoke_accelkit("init", str(tmp_path / "x"))
    assert proc.returncode == 1 and "--template" in proc.stderr
    assert list(tmp_path.iterdir()) == []
