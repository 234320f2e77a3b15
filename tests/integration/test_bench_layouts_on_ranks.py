"""`accelkit bench --layouts` on real gloo ranks (issue 22, item 5): two layouts of world size 2 through launch's
N-D path (dp_replicate 2 under DDP, dp_shard 2 under FSDP2), each measured over a time window every rank agreed on,
with the collectives of one step counted in the ranks and checked against the model's own bytes. And a pipeline
beside FSDP2 at world size 4 (issue 34, item 6): the bubble each stage measured, and its point-to-point bytes
counted in the ranks equal to the plan's figure."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from helpers import DATA, REPO_ROOT
from helpers.faults import run_fault
from PIL import Image

from accelkit.ranks.probes.results import read_results

COUNTED = DATA / "bench" / "counted_train.py"
TEMPLATE = REPO_ROOT / "templates" / "causal-lm" / "train.py"
MIN_TIME = 0.5
pytestmark = pytest.mark.slow


def test_two_layouts_of_world_size_two(tmp_path: Path) -> None:
    out = tmp_path / "results"
    result = run_fault(["bench", "--cpu", "--layouts", "dp_replicate=2;dp_shard=2", "--warmup", "2", "--steps", "5",
                        "--min-time", str(MIN_TIME), "-o", str(out), str(COUNTED), "--batch", "8"],
                       watch=[tmp_path], cwd=tmp_path, kind="bench run", expect="ok", timeout=400)
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    assert not result.orphans and not result.leftovers and not result.touched_outside([out])
    data = json.loads((out / "bench.json").read_text())
    assert data["layouts"] == ["dp_replicate=2", "dp_shard=2"] and data["min_time_s"] == MIN_TIME
    replicate, shard = data["runs"]
    assert (replicate["backend"], shard["backend"]) == ("ddp", "fsdp")
    assert replicate["layout"]["dp_replicate"] == 2 and shard["layout"]["dp_shard"] == 2
    for run, folder, kind in ((replicate, "ddp-dp_replicate2", "MULTI_CPU"), (shard, "fsdp-dp_shard2", "FSDP")):
        assert run["status"] == "ok" and run["num_processes"] == 2
        ranks = read_results(out / "runs" / folder, "bench")
        assert len(ranks) == 2 and {rank["distributed_type"] for rank in ranks} == {kind}
        # the window: every rank stopped after the same step, once both --steps and --min-time were reached
        assert len({len(rank["steps"]) for rank in ranks}) == 1 and {rank["window"] for rank in ranks} == {"time"}
        assert run["steps"] >= 5 and run["measured_time_s"] >= MIN_TIME
        # one statistic: samples/s is samples per step over the median step
        step = run["step_time_s"]
        assert run["samples_per_s"] == pytest.approx(run["samples"] / run["steps"] / step["median"])
        assert run["samples"] == run["steps"] * 2 * 8 and step["p25"] <= step["median"] <= step["p75"]
        assert run["peak_memory_bytes"] > 0
    # communication of one step, counted in the ranks: DDP all-reduces every gradient byte once; FSDP2 (one unit:
    # the whole model) all-gathers the parameters and reduce-scatters the gradients, each the model's full size
    grads = replicate["gradient_bytes"]
    assert grads == shard["gradient_bytes"] and grads > 0
    # (keys: collective @ group size / rank stride; at world size 2 every group of 2 is the world)
    assert replicate["comm_per_step"]["all_reduce@2/1"] == {"calls": 1, "bytes": grads}
    assert shard["comm_per_step"]["all_gather@2/1"]["bytes"] == grads
    assert shard["comm_per_step"]["reduce_scatter@2/1"]["bytes"] == grads
    assert "all_reduce@2/1" not in shard["comm_per_step"]
    assert set(shard["comm_per_dimension"]) <= {"world", "other"} and shard["comm_per_dimension"]["world"] >= 2 * grads
    # the table: a row per layout, relative throughput against the first, the collectives listed
    lines = result.stdout.splitlines()
    header = next(line for line in lines if line.startswith("layout"))
    assert header.split()[:2] == ["layout", "backend"] and "comm/step" in header and "vs first" in header
    assert any(line.startswith("dp_replicate=2 ") and "1.00x" in line for line in lines)
    assert any(line.startswith("dp_shard=2 (fsdp): one step's collectives per rank: all_gather over world (2 ranks)")
               for line in lines)
    rows = list(csv.DictReader((out / "bench.csv").open()))
    assert [row["layout"] for row in rows] == ["dp_replicate=2", "dp_shard=2"]
    with Image.open(out / "scaling.png") as image:
        assert image.format == "PNG" and image.size == (1000, 400)


def test_a_pipeline_layout_beside_fsdp2(tmp_path: Path) -> None:
    """dp_shard 4 vs dp_shard 2 x pp 2 (1F1B, 4 micro-batches) of the causal-lm template (2 decoder layers, hidden
    64): each stage sends one micro-batch's hidden state (8 / 4 rows x 32 tokens x 64 x fp32 = 16 KiB) per
    micro-batch, forward on stage 0 and the gradient back on stage 1: 64 KiB per step, counted in the ranks."""
    out = tmp_path / "results"
    result = run_fault(["bench", "--cpu", "--layouts", "dp_shard=4;dp_shard=2,pp=2", "--pp-schedule", "1f1b",
                        "--microbatches", "4", "--warmup", "2", "--steps", "3", "--min-time", "0", "-o", str(out),
                        str(TEMPLATE), "--block-size", "32", "--per-device-batch-size", "8", "--max-steps", "100",
                        "--log-every", "100", "--output-dir", str(tmp_path / "train")],
                       watch=[tmp_path], cwd=tmp_path, kind="bench run", expect="ok", timeout=500)
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    assert not result.orphans and not result.leftovers
    data = json.loads((out / "bench.json").read_text())
    fsdp, pipeline = data["runs"]
    assert (fsdp["backend"], pipeline["backend"]) == ("fsdp", "fsdp") and fsdp["pipeline"] is None
    assert pipeline["status"] == "ok" and pipeline["layout"]["pp"] == 2 and pipeline["steps"] >= 3
    assert pipeline["step_time_s"]["median"] > 0
    # every rank reads the global batch (2 x 8) and takes its slice: the batch is counted once
    assert pipeline["samples"] == pipeline["steps"] * 16
    figures = pipeline["pipeline"]
    assert figures["schedule"] == "1F1B" and figures["microbatches"] == 4
    assert figures["planned_bubble"] == pytest.approx(1 / 5)  # (p-1)/(m+p-1)
    assert [stage["stages"] for stage in figures["stages"]] == [[0], [1]]
    for stage in figures["stages"]:
        assert 0 < stage["bubble"] < 1  # measured: 1 - busy / schedule time over the measured steps
        assert stage["p2p_bytes_per_step"] == stage["p2p_computed_bytes_per_step"] == 4 * 2 * 32 * 64 * 4
    # the sends went over the pp dimension (2 ranks, dp_shard 2 apart), as the mesh lays them out
    assert set(pipeline["comm_per_dimension"]) >= {"pp", "dp_shard"}
    lines = result.stdout.splitlines()
    header = next(line for line in lines if line.startswith("layout"))
    assert "bubble/stage (plan)" in header and "p2p/step (plan)" in header
    row = next(line for line in lines if line.startswith("dp_shard=2,pp=2 "))
    assert "(20%)" in row and "64.0 KiB (64.0 KiB)" in row
    assert any(line.startswith("dp_shard=2,pp=2 (fsdp): pipeline 1F1B, 4 micro-batches, planned bubble 20%; "
                               "stage 0: bubble ") for line in lines)
