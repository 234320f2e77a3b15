"""Converted corpus scripts really run: same losses as the originals on one process, and real 2-rank runs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import DATA

from accelkit.convert import convert_source

CONVERT_DATA = DATA / "convert"
CORPUS = sorted((CONVERT_DATA / "corpus").glob("*.py"))
RESULT_LINE = re.compile(r"^[A-Z][A-Z-]+ ")  # LOSS ..., EVAL ..., SAMPLE ..., SAVED ... (not library warnings)


@pytest.fixture(scope="session")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("converted")
    for script in CORPUS:
        (out / script.name).write_text(convert_source(script.read_text(), filename=script.name).code)
    return out


def _results(lines: list[str]) -> list[str]:
    return [line for line in lines if RESULT_LINE.match(line)]


def test_converted_scripts_print_the_same_losses_on_one_process(converted: Path, tmp_path: Path) -> None:
    # one interpreter runs all originals, another all converted scripts (the two run at the same time)
    env = {**os.environ, "CKPT_DIR": str(tmp_path)}
    runs = {}
    for label, scripts in {"original": CORPUS, "converted": [converted / p.name for p in CORPUS]}.items():
        out = tmp_path / f"{label}.json"
        cmd = [sys.executable, str(CONVERT_DATA / "runner.py"), str(out), *map(str, scripts)]
        runs[label] = (out, subprocess.Popen(cmd, cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True))
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
        assert _results(new["lines"]) == expected, script.name


def test_converted_scripts_train_on_two_cpu_processes(converted: Path, tmp_path: Path) -> None:
    procs = {
        name: subprocess.Popen([sys.executable, "-m", "accelkit", "launch", "--cpu", "--backend", "ddp",
                                "--num-processes", "2", str(converted / f"{name}.py")],
                               cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name in ("mnist_style", "trainer_gpu_id")
    }
    outputs = {}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=400)
        assert proc.returncode == 0, f"{name}\n{stdout}\n{stderr}"
        outputs[name] = _results(stdout.splitlines())
    mnist = outputs["mnist_style"]
    # 48 training samples, batch 8, 2 ranks -> 3 steps per epoch, printed by the main process only
    assert [line.split(" loss=")[0] for line in mnist if line.startswith("LOSS")] == [
        f"LOSS epoch={e} step={s}" for e in (1, 2) for s in range(3)]
    # gather_for_metrics: the evaluation covers all 16 test samples, not one rank's 8
    evals = [line for line in mnist if line.startswith("EVAL")]
    assert len(evals) == 2 and all(line.endswith("seen=16") for line in evals)
    trainer = [line for line in outputs["trainer_gpu_id"] if line.startswith("LOSS")]
    assert len(trainer) == 4  # 40 samples, batch 10, 2 ranks, 2 epochs
