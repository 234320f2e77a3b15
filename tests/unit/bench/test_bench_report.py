"""bench.json (the names issue 12 promises), bench.csv, the table, the diagnosis and scaling.png, from recorded
runs."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from PIL import Image

from accelkit.bench import api as bench_run
from accelkit.bench.launching import LaunchSettings
from accelkit.bench.report import CSV_COLUMNS, bench_csv, bench_json, run_table, scaling_diagnosis, summary_text
from accelkit.bench.spec import BenchSpec, RunSpec
from accelkit.bench.stats import summarize
from accelkit.bench.sweep import RunRecord, Sweep


def ranks(step: float, wait: float, samples: int, world: int) -> list[dict]:
    return [{"rank": r, "steps": [{"step": i, "seconds": step, "data_wait_s": wait, "samples": samples,
                                   "tokens": samples * 16} for i in range(1, 6)],
             "peak_memory_bytes": 2**30 + r, "memory_kind": "peak RSS", "gradient_bytes": 4000,
             "probe_overhead_s": 0.001} for r in range(world)]


def make_sweep(tmp_path: Path, backends=("ddp",), sizes=(1, 2, 4), waits=None) -> Sweep:
    spec = BenchSpec(script="train.py", script_args=("--x", "1"), module=False, world_sizes=sizes, backends=backends,
                     steps=4, warmup=1, cpu=True, output=tmp_path)
    sweep = Sweep(spec, LaunchSettings(options=None), {b: b for b in backends}, {}, lambda line: None,
                  lambda s: None)
    step_times = {1: 0.10, 2: 0.11, 4: 0.16}
    for run in spec.runs():
        n = run.num_processes
        wait = (waits or {}).get(n, 0.005)
        record = RunRecord(spec=run, backend=run.backend, launched="single" if n == 1 else run.backend,
                           wall_s=3.0, ranks=ranks(step_times[n], wait, 8, n))
        record.summary = summarize(record.ranks, warmup=1)
        sweep.records.append(record)
    failed = RunRecord(spec=RunSpec(9, 9, backends[0], 8, ()), backend=backends[0], launched=backends[0],
                       status="failed", exit_code=137, error="a rank was killed by SIGKILL")
    sweep.records.append(failed)
    sweep.finish()
    return sweep


def test_json_keeps_the_promised_names(tmp_path: Path) -> None:
    sweep = make_sweep(tmp_path)
    data = json.loads(json.dumps(bench_json(sweep, {"cpu_cores": 2})))
    runs = data["runs"]
    assert len(runs) == 4
    for run in runs[:3]:
        assert isinstance(run["num_processes"], int) and run["backend"] == "ddp" and run["steps"] == 4
        assert set(run["step_time_s"]) >= {"median", "p90"}
        for key in ("samples_per_s", "speedup", "efficiency", "data_wait_share"):
            assert isinstance(run[key], float), key
        assert isinstance(run["peak_memory_bytes"], int)
    one, two, four = runs[:3]
    assert one["speedup"] == 1.0 and one["launched_backend"] == "single"
    # 2 ranks x 8 samples per 0.11 s vs 8 per 0.10 s
    assert two["speedup"] == pytest.approx((16 / 0.11) / (8 / 0.10))
    assert four["efficiency"] == pytest.approx(four["speedup"] / 4)
    assert runs[3]["status"] == "failed" and runs[3]["speedup"] is None and "SIGKILL" in runs[3]["error"]


def test_csv_has_a_row_per_run(tmp_path: Path) -> None:
    rows = list(csv.DictReader(io.StringIO(bench_csv(make_sweep(tmp_path)))))
    assert tuple(rows[0]) == CSV_COLUMNS
    assert [r["num_processes"] for r in rows] == ["1", "2", "4", "8"]
    assert float(rows[1]["samples_per_s"]) == pytest.approx(16 / 0.11)
    assert rows[3]["status"] == "failed" and rows[3]["samples_per_s"] == ""


def test_table_and_diagnosis(tmp_path: Path) -> None:
    lines = summary_text(make_sweep(tmp_path, waits={4: 0.08}), make_sweep(tmp_path).spec)
    assert lines[0].startswith("CPU rehearsal figures")
    header = lines[1].split()
    assert header[:7] == ["backend", "procs", "steps", "window", "step", "median", "IQR"] and "tokens/s" in header
    assert header[-1] == "noise"
    assert lines[2].split()[:3] == ["ddp", "1", "4"] and "1.00x" in lines[2]
    assert any("ddp  8 process(es): FAILED: a rank was killed by SIGKILL" in line for line in lines)
    notes = scaling_diagnosis(make_sweep(tmp_path, waits={4: 0.08}))
    assert len(notes) == 1 and notes[0].startswith("ddp x4: 50% of each step is spent waiting for data")
    clean = make_sweep(tmp_path)  # efficiency 1/1.6 at 4 processes, little data wait
    lines = scaling_diagnosis(clean)
    assert [line.split(":")[0] for line in lines] == ["ddp x4"] and "not data-bound" in lines[0]
    clean.records[0].note = "the script ended after 4 steps"
    assert scaling_diagnosis(clean)[0] == "ddp x1: the script ended after 4 steps"


def test_png_of_the_expected_size(tmp_path: Path) -> None:
    sweep = make_sweep(tmp_path, backends=("ddp", "fsdp"))
    assert bench_run.draw(sweep) == [f"plot: {tmp_path / 'scaling.png'}"]
    with Image.open(tmp_path / "scaling.png") as image:
        assert image.format == "PNG" and image.size == (1000, 400)
        image.verify()
    compare = make_sweep(tmp_path / "compare", backends=("ddp", "fsdp"), sizes=(2,))
    (tmp_path / "compare").mkdir()
    bench_run.draw(compare)
    with Image.open(tmp_path / "compare" / "scaling.png") as image:
        assert image.size == (1000, 400)


def test_without_matplotlib_it_says_how_to_get_the_plot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench_run, "matplotlib_available", lambda: False)
    (note,) = bench_run.draw(make_sweep(tmp_path))
    assert "pip install 'accelkit[plot]'" in note and not (tmp_path / "scaling.png").exists()


def test_predicted_communication_in_the_table_and_the_diagnosis(tmp_path: Path) -> None:
    sweep = make_sweep(tmp_path)  # 4 processes: 0.16 s per step, efficiency 62%
    four = sweep.records[2]
    four.comm_predicted_s = 0.08
    lines = run_table(sweep)
    assert lines[0].split()[-3:] == ["comm", "(pred.)", "noise"]
    assert lines[3].split()[-4:] == ["80.0", "ms", "(50%)", "-"]
    assert "communication-bound" in scaling_diagnosis(sweep)[0]
    four.comm_predicted_s = 0.008
    assert "(5%" not in scaling_diagnosis(sweep)[0] and "not the interconnect" in scaling_diagnosis(sweep)[0]


def test_a_noisy_result_is_flagged_with_the_command_that_measures_longer(tmp_path: Path) -> None:
    from dataclasses import replace

    from accelkit.bench.report import noise_lines

    sweep = make_sweep(tmp_path)
    quiet = run_table(sweep)
    assert all(line.endswith("-") for line in quiet[1:4]) and not noise_lines(sweep)
    # the 2-process run now steps in 0.09 s where one process took 0.10: 111% efficiency
    two = sweep.records[1]
    two.ranks = ranks(0.09, 0.005, 8, 2)
    two.summary = summarize(two.ranks, warmup=1)
    sweep.spec = replace(sweep.spec, min_time=2.0, command_words=("accelkit", "bench", "--cpu", "--min-time", "2"),
                         script_words=("train.py", "--x", "1"))
    sweep.finish()
    assert two.scaling.efficiency == pytest.approx(10 / 9) and two.scaling.noise == ("superlinear",)
    row = next(line for line in run_table(sweep) if line.startswith("ddp          2"))
    assert row.endswith("superlinear") and "111%" in row
    lines = noise_lines(sweep)
    assert lines[0].startswith("ddp x2: NOISE? efficiency 111% is superlinear")
    assert lines[-1].endswith("accelkit bench --cpu --min-time 10 --force train.py --x 1")
    assert lines[-1] in summary_text(sweep, sweep.spec)


def test_the_straggler_line_and_the_per_rank_phases_in_the_json(tmp_path: Path) -> None:
    from accelkit.bench.stragglers import find_straggler, rank_phases

    sweep = make_sweep(tmp_path, sizes=(1, 2))
    two = sweep.records[1]
    two.ranks[1]["steps"] = [{**s, "data_wait_s": 0.09} for s in two.ranks[1]["steps"]]  # rank 1 loads slowly
    for s in two.ranks[0]["steps"]:
        s["sync_wait_s"] = 0.08  # and rank 0 waits for it at the gradient sync
    two.summary = summarize(two.ranks, warmup=1)
    two.phases = rank_phases(two.ranks, warmup=1)
    two.straggler = find_straggler(two.phases)
    notes = scaling_diagnosis(sweep)
    assert notes[0] == ("ddp x2: straggler: rank 1 spends 90.0 ms per step loading data, 18.0x the other ranks' "
                        "median (5.0 ms); the other ranks wait 80.0 ms per step for it in the gradient sync")
    assert notes[1].startswith("ddp x2: 82% of each step on rank 1 is spent waiting for data")
    run = json.loads(json.dumps(bench_json(sweep, {})))["runs"][1]
    assert [p["rank"] for p in run["phases_per_rank"]] == [0, 1]
    assert run["phases_per_rank"][0]["sync_wait_s"] == pytest.approx(0.08)
    assert run["phases_per_rank"][1]["sync_wait_s"] is None and run["phases_per_rank"][1]["data_s"] == 0.09
    assert run["straggler"]["rank"] == 1 and run["straggler"]["phase"] == "data"
