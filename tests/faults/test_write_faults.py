"""Writing outputs where they cannot be written: config, convert and init name the real cause (read-only file
system, permission denied, a file in the way) and the path, leave nothing behind and never touch the input."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from helpers import DATA
from helpers.faults import invoke_fault, run_fault

SCRIPT = DATA / "convert" / "corpus" / "mnist_style.py"


@pytest.fixture
def ro_dir(tmp_path: Path) -> Path:
    target = tmp_path / "readonly"
    target.mkdir()
    return target


@pytest.mark.parametrize("command", ["config", "convert", "init"])
def test_read_only_target_names_the_cause_and_the_path(command: str, tmp_path: Path, ro_dir: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.read_text())
    args = {
        "config": ["config", "--backend", "ddp", "-o", str(ro_dir / "ddp.yaml")],
        "convert": ["convert", str(script), "-o", str(ro_dir / "train_accelerate.py")],
        "init": ["init", str(ro_dir / "proj"), "--template", "minimal"],
    }[command]
    result = run_fault(args, watch=[tmp_path], readonly=ro_dir)
    line = result.assert_refused("read-only")
    assert str(ro_dir) in line and "accelkit-tmp" not in line


def test_a_file_where_a_folder_should_be(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    result = invoke_fault(["config", "--backend", "ddp", "-o", str(tmp_path / "afile" / "ddp.yaml")], watch=[tmp_path])
    result.assert_refused("is a file, not a folder")


def test_init_force_keeps_a_backup_of_each_edited_file(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    first = invoke_fault(["init", str(project), "--template", "minimal"], watch=[tmp_path], expect="ok")
    assert first.returncode == 0, first.stderr
    train = project / "train.py"
    edited = train.read_text() + "\n# my edit\n"
    train.write_text(edited)
    (project / "notes.txt").write_text("mine")
    result = invoke_fault(["init", str(project), "--template", "minimal", "--force"], watch=[tmp_path], expect="ok")
    assert result.returncode == 0, result.stderr
    assert "Replaced" in result.stdout and "train.py.bak" in result.stdout
    assert (project / "train.py.bak").read_text() == edited
    assert "# my edit" not in train.read_text()
    assert (project / "notes.txt").read_text() == "mine"
    # Only the edited file was backed up: identical files are left alone.
    assert sorted(str(Path(p).relative_to(project)) for p in result.created) == ["train.py.bak"]


def test_sigterm_during_init_leaves_nothing(tmp_path: Path) -> None:
    """SIGTERM unwinds like Ctrl-C: the staging folder is removed, the target never appears."""
    project = tmp_path / "proj"
    # Stop the command as soon as the CLI is running: before, during or after staging, nothing half-made remains.
    result = run_fault(["init", str(project), "--template", "causal-lm"], watch=[tmp_path],
                       send_signal=(0.6, signal.SIGTERM), kind="signal", expect="signal")
    # -15: the signal came before Python got as far as accelkit's handler (a loaded machine starts slowly)
    assert result.returncode in (0, 143, -15), result.stderr
    assert not result.leftovers and not result.orphans
    if result.returncode != 0:
        assert not project.exists() and result.created == []
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]
