"""Every writer refuses to replace what is not a regular file: a FIFO, a character device (a copy of /dev/null's
node, made in a temp dir), a folder where a file goes, a link to nothing. A symbolic link to a regular file is
written through: the link stays, its target gets the new content. Run as root, a rename over a device node would
otherwise turn it into a regular file (what `--write-config /dev/full --force` did)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from helpers import DATA
from helpers.faults import invoke_fault, run_fault

SCRIPT = DATA / "convert" / "corpus" / "mnist_style.py"


def make_special(path: Path, kind: str) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # the numbers of /dev/null
    elif kind == "dangling link":
        path.symlink_to(path.parent / "missing-target")
    elif kind == "folder":
        path.mkdir()
        (path / "keep.txt").write_text("mine")


def command_for(writer: str, target: Path, tmp_path: Path) -> list[str]:
    script = tmp_path / "train.py"
    if not script.exists():
        script.write_text(SCRIPT.read_text())
    return {
        "config": ["config", "--backend", "ddp", "-o", str(target), "--force"],
        "plan": ["plan", "--params", "125M", "--gpus", "2", "--gpu-memory", "24GiB", "--write-config", str(target),
                 "--force"],
        "convert": ["convert", str(script), "-o", str(target), "--force"],
        "launch --slurm": ["launch", "--cpu", "--backend", "ddp", "--slurm", str(target), "--force", "--nodes", "2",
                           "--gpus-per-node", "1", str(script)],
    }[writer]


KIND_WORDS = {"fifo": "a FIFO", "device": "a character device", "dangling link": "does not exist",
              "folder": "a folder"}


KINDS = ["fifo", "device", "dangling link", "folder"]
WRITERS = ["config", "plan", "convert", "launch --slurm"]
# One kind per writer in the fast loop (every writer and every kind met once), in process; the whole matrix in real
# processes with the slow tests.
FAST = {(w, KINDS[i]) for i, w in enumerate(WRITERS)}


@pytest.mark.parametrize(("writer", "kind"), [pytest.param(w, k, marks=() if (w, k) in FAST else pytest.mark.slow)
                                              for w in WRITERS for k in KINDS])
def test_writers_refuse_what_is_not_a_regular_file(writer: str, kind: str, tmp_path: Path) -> None:
    target = tmp_path / ("job.sbatch" if writer == "launch --slurm" else "out.yaml" if writer != "convert"
                         else "out.py")
    make_special(target, kind)
    run = invoke_fault if (writer, kind) in FAST else run_fault
    result = run(command_for(writer, target, tmp_path), watch=[tmp_path])
    if kind == "folder" and result.returncode == 2:  # click's own check of a file option (dir_okay=False)
        line = result.assert_refused("is a directory", exit_code=2, hint=False)
    else:
        line = result.assert_refused(KIND_WORDS[kind] if kind != "folder" else "folder")
    assert str(target) in line


def test_merge_output_refuses_a_device_and_a_fifo(tmp_path: Path) -> None:
    import torch

    source = tmp_path / "model.pt"
    torch.save({"w": torch.arange(6.0).reshape(2, 3)}, source)
    for kind, name in (("device", "out.safetensors"), ("fifo", "out2.safetensors")):
        target = tmp_path / name
        make_special(target, kind)
        result = invoke_fault(["merge-ckpt", str(source), "-o", str(target), "--force"], watch=[tmp_path])
        result.assert_refused(KIND_WORDS[kind])


def test_init_force_refuses_a_fifo_inside_the_project_before_writing_anything(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    (project / "mine.txt").write_text("mine")
    make_special(project / "train.py", "fifo")  # a copy onto it would block forever
    result = invoke_fault(["init", str(project), "--template", "minimal", "--force"], watch=[tmp_path])
    result.assert_refused("a FIFO")


def test_bench_refuses_a_fifo_where_its_results_go(tmp_path: Path) -> None:
    out = tmp_path / "results"
    out.mkdir()
    make_special(out / "bench.json", "fifo")
    script = tmp_path / "train.py"
    script.write_text("print('never run')\n")
    result = invoke_fault(["bench", "--cpu", "--num-processes", "1", "-o", str(out), "--force", str(script)],
                          watch=[tmp_path])
    result.assert_refused("a FIFO")


@pytest.mark.parametrize("writer", ["config", "convert"])
def test_a_link_to_a_regular_file_is_written_through(writer: str, tmp_path: Path) -> None:
    real = tmp_path / "real" / ("out.yaml" if writer == "config" else "out.py")
    real.parent.mkdir()
    real.write_text("old\n")
    link = tmp_path / real.name
    link.symlink_to(real)
    result = invoke_fault(command_for(writer, link, tmp_path), watch=[tmp_path], expect="ok")
    assert result.returncode == 0, result.stderr
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert real.read_text() != "old\n" and real.is_file()
    assert sorted(result.changed) == [str(real)]
    result.assert_clean(owned=[real])


def test_convert_in_place_through_a_link_keeps_the_link(tmp_path: Path) -> None:
    real = tmp_path / "src" / "train.py"
    real.parent.mkdir()
    real.write_text(SCRIPT.read_text())
    link = tmp_path / "train.py"
    link.symlink_to(real)
    result = invoke_fault(["convert", str(link), "--in-place"], watch=[tmp_path], expect="ok")
    assert result.returncode == 0, result.stderr
    assert link.is_symlink() and "Accelerator" in real.read_text()
