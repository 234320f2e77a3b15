"""`accelkit bench --layouts` on real gloo ranks (issue 22, item 5): two layouts of world size 2 through launch's
N-D path (dp_replicate 2 under DDP, dp_shard 2 under FSDP2), each measured over a time window every rank agreed on,
with the collectives of one step counted in the ranks and checked against the model's own bytes."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from helpers import DATA
from helpers.faults import run_fault
from PIL import Image

from accelkit.ranks.probes.results import read_results

COUNTED = DATA / "bench" / "counted_train.py"
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
