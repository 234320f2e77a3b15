"""The N-D plan's reasons are generated from the chosen layout (issue 45, item 2): over every layout kind, searched
or given with --layout, the reason names exactly the mesh dimensions the layout uses, and never says a dimension it
uses is not needed (it once said "no tensor, context, sequence or pipeline parallelism needed" of dp_shard 8 x tp 8 x
pp 8)."""

from __future__ import annotations

import re

import pytest

from accelkit.configs.mesh import Mesh
from accelkit.plan import nd
from accelkit.plan.estimate import CUDA_RESERVE, FRAGMENTATION

LLAMA_70B = nd.Model.llama(layers=80, hidden=8192, heads=64, kv_heads=8, vocab=128256, intermediate=28672)
SEQ = 131072


def assert_reason_matches(reason: str, layout: nd.Layout) -> None:
    used = {dim for dim, _ in nd.PARALLELISM if getattr(layout.mesh, dim) > 1}
    for dim, _ in nd.PARALLELISM:
        named = re.findall(rf"(?<![a-z_]){dim} (\d+)", reason)
        if dim in used:
            assert f"{dim} {getattr(layout.mesh, dim)}" in reason, (dim, reason)
            assert set(named) == {str(getattr(layout.mesh, dim))}, (dim, reason)
        else:
            assert not named, (dim, reason)
    # what the reason says is not needed is never a dimension the layout uses
    for clause in re.findall(r"no ([^;:]*?) parallelism needed", reason):
        said = set(re.findall(r"\((\w+)\)", clause))
        assert said and not said & used, (clause, reason)
    assert "alone fits" not in reason or not used - {"dp_shard", "dp_replicate"}, reason


def _gpu_memory_for(total: int) -> int:
    """A GPU whose usable memory (estimate.usable_gpu) is `total` bytes, give or take a byte."""
    return int((total + CUDA_RESERVE + 1) / (1 - FRAGMENTATION)) + 1


SEARCHED = sorted({kind for kind in (
    "+".join(dim for dim, _ in nd.PARALLELISM if getattr(layout.mesh, dim) > 1) + f"/{layout.backend}"
    for layout in nd.candidates(32, 4, LLAMA_70B.layers))})


def _searched_layout(kind: str) -> nd.Layout:
    dims, backend = kind.split("/")
    return next(layout for layout in nd.candidates(32, 4, LLAMA_70B.layers) if layout.backend == backend
                and "+".join(d for d, _ in nd.PARALLELISM if getattr(layout.mesh, d) > 1) == dims)


@pytest.mark.parametrize("kind", SEARCHED)
def test_a_searched_layout_reason_names_exactly_its_dimensions(kind):
    """Every kind of layout the search can choose (dp_shard, HSDP, cp, sp, tp, tp x cp, pp with dp_shard and tp),
    chosen for real: it is the first of [data-parallel sharding alone, it] that fits a GPU sized for it."""
    target = _searched_layout(kind)
    first = nd.Layout("fsdp", Mesh(dp_shard=32))
    common = {"gpus": 32, "nodes": 4, "seq_len": SEQ}
    rows = [nd.row(layout, LLAMA_70B, gpu_memory=None, **common) for layout in (first, target)]
    assert rows[1].unavailable is None
    memory = _gpu_memory_for(rows[1].total)
    advice = nd.advise(LLAMA_70B, gpu_memory=memory, layouts=[first, target], **common)
    assert advice.best is not None and advice.best.layout == (first if rows[0].total <= rows[1].total else target)
    assert_reason_matches(advice.reason, advice.best.layout)


GIVEN = ["dp_replicate=2", "dp_shard=8", "dp_replicate=2,dp_shard=4", "tp=8", "cp=4,dp_shard=2", "sp=8",
         "pp=4", "pp=2,tp=4", "dp_shard=2,cp=2,tp=2", "dp_shard=8,tp=8,pp=8", "dp_replicate=2,dp_shard=2,pp=2,tp=2"]


@pytest.mark.parametrize("text", GIVEN)
@pytest.mark.parametrize("memory", [None, 10**9, 10**13])
def test_a_given_layout_reason_names_exactly_its_dimensions(text, memory):
    """--layout: the reason says whether it fits (or cannot be judged) and what each of its dimensions does, and
    nothing about the dimensions it leaves out."""
    from accelkit.plan.layout_option import parse_layout_option

    layout = parse_layout_option(text, None, None)
    advice = nd.advise(LLAMA_70B, gpus=layout.world, nodes=1, gpu_memory=memory, seq_len=4096, layouts=[layout],
                       asked=True)
    assert advice.reason.startswith(f"{layout.describe()} was asked for (--layout); it ")
    verdict = {None: "cannot be judged", 10**9: "does not fit", 10**13: "fits"}[memory]
    assert f"it {verdict} (" in advice.reason
    assert "not needed" not in advice.reason
    assert_reason_matches(advice.reason, layout)


def test_the_issues_layout_through_the_cli_json():
    import json

    from click.testing import CliRunner

    from accelkit.commands.plan import command

    result = CliRunner().invoke(command, ["--layers", "16", "--hidden", "1024", "--heads", "16",
                                          "--gpu-memory", "141GB", "--layout", "dp_shard=8,tp=8,pp=8", "--json"],
                                standalone_mode=False)
    assert result.exception is None, result.output
    plan = json.loads(result.output)
    reason = plan["nd"]["reason"]
    assert plan["recommendation"]["reason"] == reason and plan["recommendation"]["layout"] == "dp_shard=8,tp=8,pp=8"
    assert "alone fits" not in reason and "not needed" not in reason
    assert_reason_matches(reason, nd.Layout("fsdp", Mesh(dp_shard=8, tp=8, pp=8)))
    assert "dp_shard 8 shards" in reason and "tp 8 splits" in reason and "pp 8 splits the layers" in reason
