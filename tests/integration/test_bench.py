"""`accelkit bench` on real gloo ranks: templates under ddp, fsdp and deepspeed at 1 and 2 processes, the probe's
counts against the scripts' own logging, the data-bound diagnosis, and --comm against a direct all_reduce timing.
Each launch is checked for several things at once (the budget is a few minutes on two cores)."""

from __future__ import annotations

import csv
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import DATA, REPO_ROOT
from helpers.faults import run_fault
from PIL import Image

from accelkit.ranks.probes.results import read_results

COUNTED = DATA / "bench" / "counted_train.py"
REQUIRED = {"num_processes": int, "backend": str, "steps": int, "samples_per_s": float, "speedup": float,
            "efficiency": float, "data_wait_share": float, "peak_memory_bytes": int}


def bench(work: Path, *args: str, timeout: float = 900):
    window = [] if "--min-time" in args else ["--min-time", "0"]  # exactly --steps: the counts are checked
    result = run_fault(["bench", "--cpu", "-o", str(work / "results"), *window, *args], watch=[work], cwd=work,
                       kind="bench run", expect="ok", timeout=timeout)
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    assert not result.orphans, result.orphans  # the step limit stopped every rank; nothing outlived the command
    assert not result.touched_outside([work / "results", work / "train-out"])
    assert not result.leftovers, result.leftovers
    return result, json.loads((work / "results" / "bench.json").read_text())


def run_folder(work: Path, run: dict) -> Path:
    return work / "results" / "runs" / f"{run['backend']}-np{run['num_processes']}"


# The backend matrix on the minimal template; the causal LM (tokens per second from its input_ids) under one
# backend: what bench does per backend does not depend on the template.
@pytest.mark.parametrize(("template", "backends"),
                         [("minimal", ("ddp", "fsdp", "deepspeed")), ("causal-lm", ("fsdp",))])
def test_templates_under_every_backend_at_one_and_two_ranks(template: str, backends: tuple[str, ...],
                                                            tmp_path: Path) -> None:
    warmup, steps, count = 1, 2, 2 * len(backends)
    result, data = bench(tmp_path, "--compare-backends", ",".join(backends), "--num-processes", "1,2",
                         "--warmup", str(warmup), "--steps", str(steps), str(REPO_ROOT / "templates" / template /
                                                                            "train.py"),
                         "--log-every", "1", "--output-dir", str(tmp_path / "train-out"))
    runs = data["runs"]
    assert [(r["backend"], r["num_processes"]) for r in runs] == [(b, n) for b in backends for n in (1, 2)]
    for run in runs:
        assert run["status"] == "ok", run
        for key, kind in REQUIRED.items():
            assert isinstance(run[key], kind), (key, run)
        assert set(run["step_time_s"]) >= {"median", "p90"} and run["steps"] == steps
        log = (run_folder(tmp_path, run) / "output.log").read_text()
        # The script's own log: one "step k |" line per optimizer step, and the effective batch it trains with.
        logged_steps = [int(k) for k in re.findall(r"step (\d+) \| loss", log)]
        assert logged_steps == list(range(1, warmup + steps + 1)), (run["backend"], run["num_processes"])
        effective = int(re.search(r"effective batch (\d+) =", log).group(1))
        ranks = read_results(run_folder(tmp_path, run), "bench")
        assert len(ranks) == run["num_processes"]
        for rank in ranks:  # stopped cleanly at the limit, every rank after the same steps
            assert rank["reason"] == "step limit" and [s["step"] for s in rank["steps"]] == logged_steps
            assert sum(s["seconds"] for s in rank["steps"]) < run["wall_time_s"]
        per_step = [sum(rank["steps"][i]["samples"] for rank in ranks) for i in range(warmup + steps)]
        assert per_step == [effective] * (warmup + steps)
        assert run["samples"] == effective * steps
        # one statistic: samples per step over the median step time
        assert run["samples_per_s"] == pytest.approx(run["samples"] / run["steps"] / run["step_time_s"]["median"])
        if template == "causal-lm":  # batches carry input_ids: tokens = samples x block size
            tokens = int(re.search(r"\((\d+) tokens\)", log).group(1))
            assert run["tokens"] == tokens * steps and run["tokens_per_s"] > run["samples_per_s"]
        else:
            assert run["tokens_per_s"] is None
    # DDP's one-process run launches no backend (a plain process); FSDP and DeepSpeed shard even on one
    expected = {"ddp": ["single", "ddp"], "fsdp": ["fsdp", "fsdp"], "deepspeed": ["deepspeed", "deepspeed"]}
    assert [r["launched_backend"] for r in runs] == [b for backend in backends for b in expected[backend]]
    for one, two in zip(runs[::2], runs[1::2], strict=True):  # speedup against the backend's own 1-process run
        assert one["speedup"] == 1.0
        assert two["speedup"] == pytest.approx(two["samples_per_s"] / one["samples_per_s"])
        assert two["efficiency"] == pytest.approx(two["speedup"] / 2)
    table = result.stdout.splitlines()
    assert table[0].startswith("CPU rehearsal figures")
    assert len([x for x in table if re.match(r"\w+ +[12] ", x)]) == count
    # a progress line per run
    assert len(re.findall(rf"^bench: \[\d/{count}\] .* ms/step", result.stderr, re.M)) == count
    rows = list(csv.DictReader((tmp_path / "results" / "bench.csv").open()))
    assert [int(r["num_processes"]) for r in rows] == [1, 2] * len(backends)
    with Image.open(tmp_path / "results" / "scaling.png") as image:
        assert image.format == "PNG" and image.size == (1000, 400)


def test_counts_and_times_match_the_scripts_own_and_comm_predicts_the_step(tmp_path: Path) -> None:
    """Accumulation 2, an evaluation loader between steps, 2 ddp ranks; --comm at the same world size, its
    all-reduce checked against a direct timing of torch.distributed.all_reduce."""
    warmup, steps, size, iters = 1, 4, 2**20, 40
    _, data = bench(tmp_path, "--comm", "--comm-sizes", f"16K:{size}", "--comm-iters", str(iters), "--backend", "ddp",
                    "--num-processes", "2", "--warmup", str(warmup), "--steps", str(steps), str(COUNTED),
                    "--accumulation", "2", "--eval-every", "2", "--batch", "8")
    (run,) = data["runs"]
    log = (run_folder(tmp_path, run) / "output.log").read_text()
    ranks = read_results(run_folder(tmp_path, run), "bench")
    for rank in ranks:
        r = rank["rank"]
        logged = [tuple(map(float, m)) for m in re.findall(
            rf"RANK {r} STEP (\d+) SAMPLES (\d+) TOKENS (\d+) T ([\d.]+)", log)]
        assert [int(x[0]) for x in logged] == list(range(1, warmup + steps + 1)) and f"RANK {r} DONE" not in log
        assert [s["samples"] for s in rank["steps"]] == [16] * 5 and logged[-1][1] == 16 * 5
        assert sum(s["tokens"] for s in rank["steps"]) == logged[-1][2]
        assert rank["other_samples"] == 2 * 16  # two evaluations of 32 samples split over 2 ranks
        # The measured steps add up to the script's own clock between the end of warmup and the last step.
        script_seconds = logged[-1][3] - logged[warmup - 1][3]
        probe_seconds = sum(s["seconds"] for s in rank["steps"][warmup:])
        assert probe_seconds == pytest.approx(script_seconds, rel=0.05, abs=0.02)
    params = int(re.search(r"RANK 0 PARAMS (\d+)", log).group(1))
    assert run["gradient_bytes"] == params * 4

    (comm,) = data["comm"]
    rows = {(row["op"], row["size_bytes"]): row for row in comm["results"]}
    assert {op for op, _ in rows} == {"all_reduce", "all_gather", "reduce_scatter"}
    for (op, row_size), row in rows.items():  # nccl-tests: algbw = size / time, busbw = algbw x factor
        factor = 1.0 if op == "all_reduce" else 0.5  # 2(N-1)/N and (N-1)/N at N = 2
        assert row["algbw_gbs"] == pytest.approx(row_size / (row["time_us"] * 1e-6) / 1e9)
        assert row["busbw_gbs"] == pytest.approx(row["algbw_gbs"] * factor)
    # The prediction: the all-reduce row nearest the gradient bytes; 2(N-1)/N = 1 at N = 2, so D / busbw.
    nearest = min((row for (op, _), row in rows.items() if op == "all_reduce"),
                  key=lambda row: abs(math.log(row["size_bytes"] / (params * 4))))
    assert run["comm_busbw_gbs"] == pytest.approx(nearest["busbw_gbs"])
    assert run["predicted_comm_s"] == pytest.approx(params * 4 / (nearest["busbw_gbs"] * 1e9))

    direct = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
                             str(DATA / "bench" / "direct_allreduce.py"), str(size), str(iters)], capture_output=True,
                            text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=tmp_path)
    assert direct.returncode == 0, direct.stderr[-3000:]
    fastest, _, slowest = (float(v) for v in re.search(r"SECONDS (\S+) (\S+) (\S+)", direct.stdout).groups())
    # busbw = size / time (x 2(N-1)/N = 1). The same collective timed two ways on a shared machine: within 3x of
    # the range the direct timing itself spans, not the same figure.
    low, high = size / slowest / 1e9, size / fastest / 1e9
    assert low / 3 < rows[("all_reduce", size)]["busbw_gbs"] < high * 3, (low, high)


def test_data_bound_and_compute_bound_are_told_apart(tmp_path: Path) -> None:
    """One sweep: compute-heavy steps at 1 process, the same script with a slow __getitem__ at 2."""
    result, data = bench(tmp_path, "--backend", "ddp", "--num-processes", "1,2", "--warmup", "1", "--steps", "4",
                         str(COUNTED), "--compute", "300", "--compute-at-world-size", "1", "--hidden", "256", "--batch",
                         "4", "--slow-data", "0.02", "--slow-data-at-world-size", "2")
    compute_bound, data_bound = data["runs"]
    assert compute_bound["data_wait_share"] < 0.15 and data_bound["data_wait_share"] > 0.6
    notes = [line for line in result.stdout.splitlines() if "waiting for data" in line]
    assert len(notes) == 1 and notes[0].startswith("ddp x2: ")


@pytest.mark.parametrize(("slowdown", "phase", "words"), [("--slow-data", "data", "loading data"),
                                                          ("--slow-forward", "compute", "in forward+backward")])
def test_the_straggler_rank_and_its_phase_are_named(slowdown: str, phase: str, words: str, tmp_path: Path) -> None:
    """Rank 1 of 2 sleeps 80 ms per step in its data (4 samples x 20 ms) or in its forward: DDP's all-reduce makes
    both ranks' step times equal, the ranks' own clocks still tell which one the other waits for, and in what."""
    sleep = {"--slow-data": "0.02", "--slow-forward": "0.08"}[slowdown]
    result, data = bench(tmp_path, "--backend", "ddp", "--num-processes", "2", "--warmup", "1", "--steps", "3",
                         str(COUNTED), "--batch", "4", "--slow-rank", "1", slowdown, sleep)
    (run,) = data["runs"]
    fast, slow = run["phases_per_rank"]
    assert (fast["rank"], slow["rank"]) == (0, 1)
    for ranked in (fast, slow):  # the phases split the rank's step, measured on its own clock
        parts = ranked["data_s"] + ranked["compute_s"] + ranked["optimizer_s"] + ranked["sync_wait_s"]
        assert parts == pytest.approx(ranked["step_s"], rel=1e-6)
    assert slow[f"{phase}_s"] >= 0.08 > fast[f"{phase}_s"] * 3
    assert fast["sync_wait_s"] >= 0.05 > slow["sync_wait_s"]  # rank 0 waits for rank 1 in the gradient all-reduce
    assert run["straggler"]["rank"] == 1 and run["straggler"]["phase"] == phase
    (line,) = [line for line in result.stdout.splitlines() if "straggler:" in line]
    assert line.startswith("ddp x2: straggler: rank 1 spends ") and f"per step {words}, " in line
