"""The sandbox `convert --check` runs scripts in: real copies, links resolved so no path inside it leads back to the
user's files, the size limit checked before anything is copied (the runs themselves are in
tests/faults/test_convert_faults.py)."""

from __future__ import annotations

import os
from pathlib import Path

import click
import pytest

from accelkit.commands.supervision_options import Seconds
from accelkit.convert.check.lines import ConvertedLines
from accelkit.convert.check.sandbox import plan_sandbox
from accelkit.errors import AccelkitError


def _tree(root: Path) -> tuple[Path, Path]:
    """A user's project: a script, data in a subfolder, a link to a data folder outside it, a link inside it."""
    project, outside = root / "project", root / "datasets"
    (project / "data" / "deep").mkdir(parents=True)
    outside.mkdir()
    (project / "train.py").write_text("print('hi')\n")
    (project / "data" / "a.txt").write_text("a")
    (project / "data" / "deep" / "b.txt").write_text("b")
    (outside / "big.bin").write_bytes(b"x" * 100)
    (outside / "back").symlink_to(project / "data")  # from the linked folder back into the tree
    (project / "shared").symlink_to(outside)
    (project / "one.bin").symlink_to(outside / "big.bin")
    (project / "alias").symlink_to("data")  # relative, inside
    (project / "self").symlink_to(".")  # a cycle
    (project / "up").symlink_to("..")  # a folder holding the tree
    (project / "gone").symlink_to("nowhere")  # to nothing, inside
    (project / "later").symlink_to(outside / "not_yet.txt")  # to nothing, outside: a write would create it there
    (project / "__pycache__").mkdir()
    (project / "__pycache__" / "train.cpython-312.pyc").write_bytes(b"\0")
    (project / "venv").mkdir()
    (project / "venv" / "pyvenv.cfg").write_text("home = /usr\n")
    os.mkfifo(project / "pipe")
    return project, outside


def test_the_sandbox_is_real_copies_and_no_path_in_it_leads_back(tmp_path: Path) -> None:
    project, outside = _tree(tmp_path)
    plan = plan_sandbox(project, project / "train.py")
    box = plan.materialize(tmp_path / "box")
    assert box.cwd == tmp_path / "box" / "work" and box.script == box.cwd / "train.py"
    assert not box.script.exists()  # the check writes the script's copy (the original's, or the conversion)
    for path in [box.cwd, *box.cwd.rglob("*")]:  # whatever a path in the sandbox resolves to stays in the sandbox
        assert Path(os.path.realpath(path)).is_relative_to(tmp_path / "box"), path
    assert not (box.cwd / "data").is_symlink() and (box.cwd / "data" / "deep" / "b.txt").read_text() == "b"
    assert (box.cwd / "shared").is_dir() and not (box.cwd / "shared").is_symlink()  # a link out: copied
    assert (box.cwd / "shared" / "back").is_symlink()  # ... and its link back points at the copy of data/
    assert os.path.realpath(box.cwd / "shared" / "back") == str(box.cwd / "data")
    assert (box.cwd / "one.bin").read_bytes() == b"x" * 100 and not (box.cwd / "one.bin").is_symlink()
    assert os.readlink(box.cwd / "alias") == "data" and os.path.realpath(box.cwd / "self") == str(box.cwd)
    assert os.readlink(box.cwd / "gone") == "nowhere"
    assert not os.path.lexists(box.cwd / "later") and any("later (a link to" in x for x in plan.left_out)
    assert not (box.cwd / "up").exists() and any("up (a link to" in x for x in plan.left_out)
    assert not (box.cwd / "__pycache__").exists() and not (box.cwd / "venv").exists()
    assert not (box.cwd / "pipe").exists() and any("pipe (not a regular file)" in x for x in plan.left_out)
    # writes, appends, deletes and renames in the sandbox leave the user's files as they were
    (box.cwd / "data" / "a.txt").write_text("changed")
    with open(box.cwd / "shared" / "big.bin", "ab") as f:
        f.write(b"more")
    (box.cwd / "data" / "deep" / "b.txt").rename(box.cwd / "data" / "c.txt")
    (box.cwd / "one.bin").unlink()
    assert (project / "data" / "a.txt").read_text() == "a" and (project / "data" / "deep" / "b.txt").exists()
    assert (outside / "big.bin").read_bytes() == b"x" * 100
    box.remove()
    assert not (tmp_path / "box").exists()


def test_a_script_outside_the_working_directory_runs_from_a_copy_of_its_folder(tmp_path: Path) -> None:
    work, scripts = tmp_path / "work", tmp_path / "scripts"
    work.mkdir()
    scripts.mkdir()
    (work / "input.txt").write_text("in")
    (scripts / "train.py").write_text("")
    (scripts / "helper.py").write_text("X = 1\n")
    box = plan_sandbox(work, scripts / "train.py").materialize(tmp_path / "box")
    assert box.cwd == tmp_path / "box" / "work" and (box.cwd / "input.txt").read_text() == "in"
    assert box.script == tmp_path / "box" / "script" / "train.py"
    assert (box.script.parent / "helper.py").read_text() == "X = 1\n"


def test_a_tree_over_the_limit_is_refused_before_anything_is_copied(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    (project / "train.py").write_text("")
    (project / "data" / "shard.bin").write_bytes(b"x" * 5000)
    (project / "notes.txt").write_text("n" * 100)
    with pytest.raises(AccelkitError) as caught:
        plan_sandbox(project, project / "train.py", limit=4096)
    message, hint = caught.value.message, caught.value.hint or ""
    assert f"copy of the working directory {project}" in message and "more than 4.00 KiB" in message
    assert "--sandbox-limit limit" in message and "data/ 4.88 KiB" in message
    assert "--sandbox-limit" in hint and "only the script and the data it reads" in hint
    assert sorted(p.name for p in tmp_path.iterdir()) == ["project"]


def test_a_sandbox_that_does_not_fit_the_temp_folder_is_refused(tmp_path: Path, monkeypatch) -> None:
    import shutil
    from collections import namedtuple

    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("")
    (project / "data.bin").write_bytes(b"x" * 1000)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**6, 10**6, 1000))
    with pytest.raises(AccelkitError, match="needs 1000 B in .* and only 1000 B is free"):
        plan_sandbox(project, project / "train.py").materialize(tmp_path / "box")
    assert not (tmp_path / "box").exists()


def test_a_hang_in_a_conversion_is_shown_at_the_original_line() -> None:
    original = "import torch\nmodel = M()\nfor x in data:\n    step(x)\n"
    converted = ("import torch\nfrom accelerate import Accelerator\naccelerator = Accelerator()\nmodel = M()\n"
                 "model = accelerator.prepare(model)\nfor x in data:\n    step(x.cpu())\n")
    lines = ConvertedLines.mapped("train.py", original, converted)
    assert lines.where("train.py", 6, "main") == "train.py:3 in main"  # unchanged: the original's line
    assert lines.where("train.py", 7, "main") == ("train.py:4 in main (as converted: line 7 of the conversion)")
    assert lines.where("train.py", 5, "<module>") == ("line 5 of the converted train.py, added by the conversion "
                                                      "after line 2, in <module>")
    assert lines.where("helper.py", 9, "f") == "helper.py:9 in f"  # another file: its own lines
    assert ConvertedLines.named("train.py", "mine.py").where("train.py", 7, "main") == "mine.py:7 in main"


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "NaN"])
def test_a_duration_is_a_finite_number(text: str) -> None:
    with pytest.raises(click.BadParameter, match="not a finite number of seconds"):
        Seconds(minimum=0).convert(text, None, None)
    assert Seconds(minimum=1).convert("2.5", None, None) == 2.5
