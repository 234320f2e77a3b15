"""Converted corpus scripts really run: the same losses as the originals on one process, and the "Try it" command
convert prints runs as printed (2-process runs of every corpus script are in test_convert_check.py)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import DATA, run_accelkit

from accelkit.convert.codemod import convert_source

CONVERT_DATA = DATA / "convert"
CORPUS = sorted((CONVERT_DATA / "corpus").glob("*.py")) + sorted((CONVERT_DATA / "shapes").glob("*.py"))
# a DistributedSampler(seed=0) becomes the DataLoader's own shuffle, which prepare() keeps in step across processes:
# every sample once per epoch (what --check proves on 2 ranks), in another permutation than the sampler's
NEW_ORDER = {"ddp_torchrun.py"}
NUMBERS = re.compile(r"-?\d+\.\d+")
RESULT_LINE = re.compile(r"^[A-Z][A-Z-]+( |$)")  # LOSS ..., EVAL ..., SAMPLE ..., SAVED ... (not library warnings)


@pytest.fixture(scope="session")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("converted")
    for script in CORPUS:
        (out / script.name).write_text(convert_source(script.read_text(), filename=script.name).code)
    return out


def _results(lines: list[str]) -> list[str]:
    return [line for line in lines if RESULT_LINE.match(line)]


def test_converted_scripts_print_the_same_losses_on_one_process(converted: Path, tmp_path: Path) -> None:
    # one interpreter runs all originals, another all converted scripts (the two run at the same time, each in a
    # folder of its own: several scripts write files)
    runs = {}
    for label, scripts in {"original": CORPUS, "converted": [converted / p.name for p in CORPUS]}.items():
        out = tmp_path / f"{label}.json"
        cwd = tmp_path / label
        cwd.mkdir()
        env = {**os.environ, "CKPT_DIR": str(cwd), "MPLBACKEND": "Agg"}
        cmd = [sys.executable, str(CONVERT_DATA / "runner.py"), str(out), *map(str, scripts)]
        runs[label] = (out, subprocess.Popen(cmd, cwd=cwd, env=env, stderr=subprocess.PIPE, text=True))
    results = {}
    for label, (out, proc) in runs.items():
        _, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr
        results[label] = {Path(k).name: v for k, v in json.loads(out.read_text()).items()}
    for script in CORPUS:
        original, new = results["original"][script.name], results["converted"][script.name]
        assert original["status"] == 0 and new["status"] == 0, script.name
        expected = _results(original["lines"])
        assert any(line.startswith("LOSS ") for line in expected), script.name
        if script.name in NEW_ORDER:  # the same lines, other numbers: the samples come in another order
            assert [NUMBERS.sub("#", line) for line in _results(new["lines"])] == \
                [NUMBERS.sub("#", line) for line in expected], script.name
            continue
        assert _results(new["lines"]) == expected, script.name


def test_the_printed_try_it_command_works_as_printed(tmp_path: Path) -> None:
    """A library and the script that uses it, converted as a user would; then the command convert prints."""
    for name in ("trainlib.py", "train_main.py"):
        shutil.copy(CONVERT_DATA / "library" / name, tmp_path / name)
    run_accelkit("convert", "trainlib.py", "--in-place", cwd=tmp_path, check=True)
    assert "\naccelerator = Accelerator()" not in (tmp_path / "trainlib.py").read_text()  # nothing at import time
    proc = run_accelkit("convert", "train_main.py", cwd=tmp_path, check=True)
    printed = next(line for line in proc.stdout.splitlines() if line.startswith("Try it: "))
    command = shlex.split(printed[len("Try it: "):])
    assert command == ["accelkit", "launch", "--cpu", "--num-processes", "2", "train_main_accelerate.py"]
    run = subprocess.run([sys.executable, "-m", "accelkit", *command[1:]], cwd=tmp_path, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = _results(run.stdout.splitlines())
    # 64 samples, batch 8, 2 processes: 4 steps per epoch, 2 epochs, printed by the main process only
    assert len([line for line in lines if line.startswith("LOSS")]) == 8, run.stdout
    assert lines[-1] == "DONE" and lines.count("DONE") == 1
    assert (tmp_path / "trained.pt").is_file()


def test_a_converted_torchrun_ddp_script_runs_under_fsdp(tmp_path: Path) -> None:
    """Issue #23: the DDP script's conversion is backend-neutral: on 2 FSDP2 CPU ranks it trains, evaluates and
    saves the full state dict it gathered on every process (a state dict asked for under `if rank == 0:` hung)."""
    shutil.copy(CONVERT_DATA / "corpus" / "ddp_torchrun.py", tmp_path / "ddp_torchrun.py")
    run_accelkit("convert", "ddp_torchrun.py", cwd=tmp_path, check=True)
    proc = run_accelkit("launch", "--cpu", "--backend", "fsdp", "--num-processes", "2", "ddp_torchrun_accelerate.py",
                        cwd=tmp_path, env={"CKPT_DIR": str(tmp_path), "PYTHONWARNINGS": "ignore"}, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = _results(proc.stdout.splitlines())
    assert len([line for line in lines if line.startswith("LOSS")]) == 6, proc.stdout  # 3 steps x 2 epochs, rank 0
    assert len([line for line in lines if line.startswith("EVAL")]) == 2, proc.stdout
    import torch

    state = torch.load(tmp_path / "ddp.pt")
    assert {k: tuple(v.shape) for k, v in state.items()} == {"0.weight": (32, 6), "0.bias": (32,),
                                                            "2.weight": (2, 32), "2.bias": (2,)}
