"""`accelkit bench --grad-compression --layouts` (issue 35, item 3 per layout), without starting ranks: which runs the
bench makes (launch's own checks decide where a compression applies), which counted collectives are gradient traffic
in each layout, and how a compression that does not apply shows in the table, the JSON and the CSV."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from helpers import REPO_ROOT

from accelkit.bench.compression import (
    CompressionRow,
    compare,
    compression_table,
    gradient_dimension,
    layout_bytes,
    run_compression_bench,
)
from accelkit.bench.compression_runs import NOT_APPLICABLE, CompressionRun, plan_runs
from accelkit.bench.launching import launch_settings
from accelkit.compression.compression_spec import CompressionSpec
from accelkit.configs import ConfigOptions
from accelkit.configs.mesh import Mesh

SCRIPT = str(REPO_ROOT / "templates" / "minimal" / "train.py")
SHAPES = [[64, 16], [64], [4, 64], [4]]


@pytest.mark.parametrize(("layout", "dimension", "gradient"), [
    ("dp_replicate=2", "world", True),
    ("dp_shard=2,tp=2", "dp_shard", True),
    ("dp_shard=2,tp=2", "tp", False),  # activation gradients of the tensor-parallel matmuls
    ("dp_shard=2,tp=2", "world", False),
    ("dp_shard=2,cp=2", "dp_shard_cp", True),  # FSDP shards over the context-parallel ranks too
    ("dp_shard=2,cp=2", "cp", False),
    ("dp_replicate=2,dp_shard=2", "dp_replicate", True),  # HSDP's all-reduce of the shards
    ("dp_replicate=2,sp=2", "sp", False),
    ("dp_replicate=2", None, False),
])
def test_gradient_traffic_is_the_data_parallel_dimensions(layout: str, dimension: str | None, gradient: bool) -> None:
    assert gradient_dimension(Mesh.parse(layout), dimension) is gradient


def testlayout_bytes_count_only_gradient_collectives_and_compute_the_plain_layouts() -> None:
    tp = Mesh.parse("dp_shard=2,tp=2")  # ranks row-major: tp innermost (stride 1), dp_shard stride 2
    counted, computed = layout_bytes({"reduce_scatter@2/2": 1000, "all_reduce@2/1": 500, "all_gather@2/2": 70},
                                      tp, "fsdp", CompressionSpec("bf16"), SHAPES, 5)
    assert (counted, computed) == (1000, None)  # tp's all-reduce and the weight all-gather are not gradients
    ddp = Mesh.parse("dp_replicate=2")
    counted, computed = layout_bytes({"all_reduce@2/1": 1234}, ddp, "ddp", CompressionSpec("fp16"), SHAPES, 3)
    assert counted == 1234 and computed == 2 * (64 * 16 + 64 + 4 * 64 + 4)
    shard = Mesh.parse("dp_shard=2")
    _, computed = layout_bytes({}, shard, "fsdp", CompressionSpec("none"), SHAPES, 3)
    assert computed == 4 * (64 * 16 + 64 + 4 * 64 + 4)


def test_a_compression_a_layout_cannot_take_is_a_row_saying_why(tmp_path: Path) -> None:
    """launch's checks, per layout: PowerSGD runs beside DDP's dp_replicate and is not applicable under FSDP2's
    dp_shard, in the check's own words; the uncompressed runs of both layouts are planned."""
    settings = launch_settings(ConfigOptions(), None, True)
    places = [("ddp", Mesh.parse("dp_replicate=2")), ("fsdp", Mesh.parse("dp_shard=2"))]
    runs = plan_runs(settings, [CompressionSpec("powersgd", 4, 0)], places, 2, SCRIPT, ())
    table = {(run.layout_name, run.spec.method): run.not_applicable for run in runs}
    assert table[("dp_replicate=2", "none")] is None and table[("dp_shard=2", "none")] is None
    assert table[("dp_replicate=2", "powersgd")] is None
    assert table[("dp_shard=2", "powersgd")].startswith("--grad-compression powersgd is not an FSDP option")
    bf16 = plan_runs(settings, [CompressionSpec("bf16")], places[:1], 2, SCRIPT, ())
    assert "bf16_compress_hook refuses gloo" in bf16[1].not_applicable


def test_not_applicable_rows_reach_the_table_json_and_csv_without_a_launch(tmp_path: Path) -> None:
    layout = Mesh.parse("dp_shard=2")
    runs = [CompressionRun("fsdp", CompressionSpec("powersgd", 1, 0), layout, "PowerSGD is a DDP hook")]
    rows = run_compression_bench(script=SCRIPT, script_args=(), specs=(), backends=(), num_processes=2, cpu=True,
                                 output=tmp_path, steps=5, progress=lambda line: None, runs=runs)
    assert rows[0].status == NOT_APPLICABLE + "PowerSGD is a DDP hook" and not (tmp_path / "runs").exists()
    assert json.loads((tmp_path / "compression.json").read_text())["rows"][0]["layout"] == "dp_shard=2"
    written = list(csv.DictReader((tmp_path / "compression.csv").open()))
    assert written[0]["layout"] == "dp_shard=2" and written[0]["status"].startswith(NOT_APPLICABLE)
    assert any("dp_shard=2" in line and "not applicable: PowerSGD is a DDP hook" in line
               for line in compression_table(rows))


def test_rows_compare_within_their_own_layout() -> None:
    rows = [CompressionRow("none", "ddp", 2, "dp_replicate=2", bytes_per_step=100, final_loss=1.0),
            CompressionRow("none", "fsdp", 2, "dp_shard=2", bytes_per_step=80, final_loss=2.0),
            CompressionRow("fp16", "ddp", 2, "dp_replicate=2", bytes_per_step=50, final_loss=1.5),
            CompressionRow("fp16", "fsdp", 2, "dp_shard=2", bytes_per_step=40, final_loss=2.25)]
    compare(rows)
    assert [(r.bytes_vs_none, r.loss_delta) for r in rows[2:]] == [(0.5, 0.5), (0.5, 0.25)]


def test_reduce_dtype_applies_to_the_fsdp_layouts_only() -> None:
    settings = launch_settings(ConfigOptions(), None, True)
    places = [("ddp", Mesh.parse("dp_replicate=2")), ("fsdp", Mesh.parse("dp_shard=2"))]
    runs = plan_runs(settings, [CompressionSpec("bf16")], places, 2, SCRIPT, (), reduce_dtype=True)
    reasons = {(run.layout_name, run.spec.method): run.not_applicable for run in runs}
    assert reasons[("dp_replicate=2", "bf16")].startswith("--reduce-dtype is FSDP2's reduce dtype")
    assert reasons[("dp_shard=2", "bf16")] is None
